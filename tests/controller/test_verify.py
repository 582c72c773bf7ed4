"""Verification through a real agent's files API: file rules, SQLite with its WAL, bound files."""

from __future__ import annotations

import sqlite3

import pytest

from controller.agent_client import AgentClient
from controller.run.tasks import FileCheck, SqliteCheck
from controller.run.verify import check_file, check_sqlite, guest_path, run_checks


@pytest.fixture
def home(tmp_path):
    h = tmp_path / "home"
    (h / "Documents").mkdir(parents=True)
    return h


@pytest.fixture
def reader(xvfb, make_agent, home):
    agent = make_agent(xvfb.display, files_roots=[str(home)])
    client = AgentClient(agent.base_url, agent.token)
    yield client
    client.close()


def fc(match, value, path="~/Documents/out.txt"):
    return FileCheck(kind="file", path=path, match=match, value=value)


def test_guest_path_expands_home_and_refuses_relative_paths():
    assert guest_path("~/a/b", "/home/sandbox") == "/home/sandbox/a/b"
    assert guest_path("/etc/x", "/home/sandbox") == "/etc/x"
    with pytest.raises(ValueError):
        guest_path("a/b", "/home/sandbox")


def test_file_rules(reader, home):
    (home / "Documents/out.txt").write_bytes(b"PU-123456\n")
    h = str(home)
    assert check_file(fc("exact", "PU-123456\n"), reader, h)["passed"]
    assert check_file(fc("text", "PU-123456"), reader, h)["passed"]
    assert check_file(fc("regex", r"^PU-[0-9]{6}$"), reader, h)["passed"]
    bad = check_file(fc("exact", "PU-123456"), reader, h)
    assert not bad["passed"]
    assert bad["observed_hex"] == b"PU-123456\n".hex() and bad["expected_hex"] == b"PU-123456".hex()
    assert bad["rule"] == "exact" and bad["expected"] == "PU-123456" and bad["observed"] == "PU-123456\n"
    assert not check_file(fc("text", "PU-12345"), reader, h)["passed"]
    assert not check_file(fc("regex", r"^PU-[0-9]{7}$"), reader, h)["passed"]


def test_json_rule(reader, home):
    (home / "Documents/out.txt").write_text('{"a": [1, 2], "b": "x"}')
    h = str(home)
    assert check_file(fc("json", {"b": "x", "a": [1, 2]}), reader, h)["passed"]
    assert check_file(fc("json", '{"a": [1, 2], "b": "x"}'), reader, h)["passed"]
    assert not check_file(fc("json", {"a": [2, 1], "b": "x"}), reader, h)["passed"]
    (home / "Documents/out.txt").write_text("not json")
    result = check_file(fc("json", {}), reader, h)
    assert not result["passed"] and "not JSON" in result["detail"]


EXPECTED_RECEIPT = {"paid": True, "items": 2, "refund": False, "note": None}


@pytest.mark.parametrize("observed, passes", [
    ('{"paid": true, "items": 2, "refund": false, "note": null}', True),
    ('{"note": null, "refund": false, "items": 2.0, "paid": true}', True),  # 2 and 2.0: one JSON number
    ('{"paid": 1, "items": 2, "refund": false, "note": null}', False),  # 1 is a number, not true
    ('{"paid": true, "items": 2, "refund": 0, "note": null}', False),  # 0 is not false
    ('{"paid": true, "items": 2, "refund": false, "note": 0}', False),  # 0 is not null
    ('{"paid": true, "items": 2, "refund": false, "note": false}', False),  # false is not null
    ('{"paid": true, "items": true, "refund": false, "note": null}', False),  # true is not a number
    ('{"paid": true, "items": 2, "refund": false, "note": null, "paid": true}', False),  # duplicate key
    ('{"paid": false, "items": 2, "refund": false, "note": null, "paid": true}', False),  # not the last one's
    ('{"paid": true, "items": NaN, "refund": false, "note": null}', False),  # NaN is not JSON
    ('{"paid": true, "items": 2, "refund": false}', False),  # a key missing
    ('{"paid": true, "items": 2, "refund": false, "note": null, "x": 1}', False),  # a key more
])
def test_json_rule_compares_by_json_semantics(reader, home, observed, passes):
    (home / "Documents/out.txt").write_text(observed)
    result = check_file(fc("json", EXPECTED_RECEIPT), reader, str(home))
    assert result["passed"] is passes, result
    invalid = observed.count('"paid"') > 1 or "NaN" in observed  # duplicate keys and NaN make no JSON
    assert ("not JSON" in result.get("detail", "")) is invalid


def test_json_rule_nested_arrays_and_booleans_in_arrays(reader, home):
    (home / "Documents/out.txt").write_text('[1, [true, false], {"a": [0]}]')
    h = str(home)
    assert check_file(fc("json", [1.0, [True, False], {"a": [0]}]), reader, h)["passed"]
    assert not check_file(fc("json", [True, [True, False], {"a": [0]}]), reader, h)["passed"]
    assert not check_file(fc("json", [1, [1, 0], {"a": [0]}]), reader, h)["passed"]
    assert not check_file(fc("json", [1, [True, False], {"a": [False]}]), reader, h)["passed"]


def test_missing_file_fails_the_check_instead_of_raising(reader, home):
    result = check_file(fc("text", "x", path="~/Documents/none.txt"), reader, str(home))
    assert result["passed"] is False and result["observed"] is None and "does not exist" in result["detail"]


def test_sqlite_reads_rows_still_in_the_wal(reader, home):
    db = home / "app.db"
    writer = sqlite3.connect(db)
    writer.execute("PRAGMA journal_mode=WAL")
    writer.execute("PRAGMA wal_autocheckpoint=0")
    writer.execute("CREATE TABLE t (conf TEXT, name TEXT)")
    writer.commit()
    writer.execute("INSERT INTO t VALUES ('PU-100001', 'Ada')")
    writer.commit()  # the row lives in app.db-wal only while this connection stays open
    try:
        assert (home / "app.db-wal").stat().st_size > 0
        check = SqliteCheck(kind="sqlite", path="~/app.db", query="SELECT conf, name FROM t", rows=[["PU-100001", "Ada"]])
        result = check_sqlite(check, reader, str(home))
        assert result["passed"], result
        assert "-wal" in result["copied"]
        wrong = check.model_copy(update={"rows": [["PU-100002", "Ada"]]})
        result = check_sqlite(wrong, reader, str(home))
        assert not result["passed"] and result["observed"] == [["PU-100001", "Ada"]]
    finally:
        writer.close()
    # the guest's database is untouched by verification (opened read-only, on a copy)
    assert sqlite3.connect(db).execute("SELECT count(*) FROM t").fetchone() == (1,)


def test_sqlite_bind_files_ties_a_file_to_a_row(reader, home):
    db = home / "app.db"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE t (conf TEXT)")
        conn.execute("INSERT INTO t VALUES ('PU-100001')")
    check = SqliteCheck(kind="sqlite", path="~/app.db", query="SELECT count(*) FROM t WHERE conf = ?",
                        rows=[[1]], bind_files=["~/Documents/out.txt"])
    h = str(home)
    (home / "Documents/out.txt").write_text("PU-100001\n")
    result = check_sqlite(check, reader, h)
    assert result["passed"] and result["bound"] == {f"{h}/Documents/out.txt": "PU-100001"}
    (home / "Documents/out.txt").write_text("PU-999999\n")
    assert check_sqlite(check, reader, h)["observed"] == [[0]]
    (home / "Documents/out.txt").unlink()
    result = check_sqlite(check, reader, h)
    assert not result["passed"] and "does not exist" in result["detail"]


def test_bad_query_or_missing_database_fail_cleanly(reader, home):
    h = str(home)
    missing = SqliteCheck(kind="sqlite", path="~/none.db", query="SELECT 1", rows=[[1]])
    assert check_sqlite(missing, reader, h)["detail"] == "database does not exist"
    with sqlite3.connect(home / "app.db") as conn:
        conn.execute("CREATE TABLE t (x)")
    bad = SqliteCheck(kind="sqlite", path="~/app.db", query="SELECT nope FROM t", rows=[])
    assert "sqlite error" in check_sqlite(bad, reader, h)["detail"]


def test_run_checks_reports_each_result_in_order(reader, home):
    (home / "Documents/out.txt").write_text("hello")
    seen = []
    results = run_checks([fc("text", "hello"), fc("text", "bye")], reader, home=str(home), on_result=seen.append)
    assert [r["passed"] for r in results] == [True, False] and seen == results


@pytest.mark.parametrize("query", [
    "DELETE FROM t",
    "WITH gone AS (SELECT 1) DELETE FROM t",
    "UPDATE t SET x = 2",
    "INSERT INTO t VALUES (3)",
    "DROP TABLE t",
    "PRAGMA writable_schema = 1",
    "CREATE TABLE u (y)",
])
def test_sqlite_queries_that_write_are_refused_and_nothing_changes(reader, home, query):
    """The loader refuses these; verification refuses them again (read-only authorizer), even on the copy."""
    with sqlite3.connect(home / "app.db") as conn:
        conn.execute("CREATE TABLE t (x)")
        conn.execute("INSERT INTO t VALUES (1)")
    check = SqliteCheck.model_construct(kind="sqlite", path="~/app.db", query=query, rows=[], bind_files=[])
    result = check_sqlite(check, reader, str(home))
    assert not result["passed"] and "sqlite error" in result["detail"], result
    with sqlite3.connect(home / "app.db") as conn:
        assert conn.execute("SELECT x FROM t").fetchall() == [(1,)]


def test_sqlite_attach_cannot_reach_host_files(reader, home, tmp_path):
    """ATTACH would open a file on the host running verification; the authorizer refuses it."""
    with sqlite3.connect(home / "app.db") as conn:
        conn.execute("CREATE TABLE t (x)")
    host_db = tmp_path / "host-secret.db"
    with sqlite3.connect(host_db) as conn:
        conn.execute("CREATE TABLE secret (v)")
        conn.execute("INSERT INTO secret VALUES ('s3cr3t')")
    for query in (f"ATTACH '{host_db}' AS h", f"SELECT v FROM h.secret"):
        check = SqliteCheck.model_construct(kind="sqlite", path="~/app.db", query=query, rows=[], bind_files=[])
        result = check_sqlite(check, reader, str(home))
        assert not result["passed"] and "s3cr3t" not in str(result)


def test_a_check_that_raises_fails_alone_and_the_others_still_run(reader, home):
    """Checks built without validation (model_construct) that cannot be evaluated fail with a detail."""
    (home / "Documents/out.txt").write_text("hello")
    relative = FileCheck.model_construct(kind="file", path="Documents/out.txt", match="text", value="hello")
    bad_json = FileCheck.model_construct(kind="file", path="~/Documents/out.txt", match="json", value="{nope")
    results = run_checks([relative, bad_json, fc("text", "hello")], reader, home=str(home))
    assert [r["passed"] for r in results] == [False, False, True]
    assert "absolute" in results[0]["detail"] and "JSON" in results[1]["detail"]


def _in_thread(fn, timeout_s: float = 120.0):
    """Run fn in a thread; fail (instead of hanging the suite) if it does not return."""
    import threading

    box: dict = {}
    thread = threading.Thread(target=lambda: box.update(result=fn()), daemon=True)
    thread.start()
    thread.join(timeout_s)
    assert not thread.is_alive(), "verification did not return"
    return box["result"]


def test_a_hostile_database_cannot_hang_verification(reader, home, monkeypatch):
    """The guest controls the database: a table replaced by an endless view must fail the check, not
    stall the run."""
    import controller.run.verify as verify

    monkeypatch.setattr(verify, "QUERY_TIME_LIMIT_S", 1.0)
    with sqlite3.connect(home / "app.db") as conn:
        conn.execute("CREATE VIEW pickups AS WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n) "
                     "SELECT i AS id FROM n")
    check = SqliteCheck(kind="sqlite", path="~/app.db", query="SELECT count(*) FROM pickups", rows=[[1]])
    result = _in_thread(lambda: check_sqlite(check, reader, str(home)))
    assert not result["passed"] and "time limit" in result["detail"], result


def test_a_huge_result_is_not_read_whole(reader, home):
    """Only as many rows as can decide the comparison (and be shown) are fetched."""
    with sqlite3.connect(home / "app.db") as conn:
        conn.execute("CREATE VIEW many AS WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n) "
                     "SELECT i FROM n")
    check = SqliteCheck(kind="sqlite", path="~/app.db", query="SELECT i FROM many", rows=[[1], [2]])
    result = _in_thread(lambda: check_sqlite(check, reader, str(home)))
    assert not result["passed"] and result["observed"][:3] == [[1], [2], [3]]


def test_sqlite_observed_cells_are_cut_but_compared_whole(reader, home):
    """A guest database can hold megabytes in one value: the record and the console get it cut, the
    comparison sees all of it."""
    from controller.run.verify import MAX_OBSERVED_CELL_CHARS

    big = "A" * 1_000_000
    with sqlite3.connect(home / "app.db") as conn:
        conn.execute("CREATE TABLE t (v TEXT, b BLOB)")
        conn.execute("INSERT INTO t VALUES (?, ?)", (big, b"\x01" * 500_000))
    short = "A" * MAX_OBSERVED_CELL_CHARS
    wrong = check_sqlite(SqliteCheck(kind="sqlite", path="~/app.db", query="SELECT v, b FROM t",
                                     rows=[[short, "01"]]), reader, str(home))
    assert not wrong["passed"]  # the cut value is not what is compared
    [[text, blob]] = wrong["observed"]
    assert text == short + "..." and blob == "01" * (MAX_OBSERVED_CELL_CHARS // 2) + "..."
    whole = check_sqlite(SqliteCheck(kind="sqlite", path="~/app.db", query="SELECT v FROM t",
                                     rows=[[big]]), reader, str(home))
    assert whole["passed"] and len(whole["observed"][0][0]) == MAX_OBSERVED_CELL_CHARS + 3
