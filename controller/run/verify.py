"""Verification: after the loop, read the guest's own state through the agent's files API and
compare it with the task's checks. Never from the model's transcript.

- file checks: ``exact`` (bytes equal), ``text`` (equal after removing trailing whitespace),
  ``regex`` (Python ``re.search`` on the UTF-8 text), ``json`` (strict JSON, compared by JSON's data model: :mod:`controller.json_semantics`);
- page checks: the text of a URL as the agent's chromium loads it (contract 8), by the file rules;
- sqlite checks: the database and its ``-wal``/``-shm`` files are copied through the files API to
  a temporary directory, opened read-only, the query is run (``bind_files`` texts bound to its
  ``?`` parameters) under an authorizer that admits only reads of that database (no ATTACH, PRAGMA,
  writes or schema changes: a query cannot touch the host's files) and the rows are compared exactly.
  The database is guest-made, so it is opened with SQLite's defences for untrusted files (no trusted
  schema, cell size checks, no mmap), the query is interrupted after ``QUERY_TIME_LIMIT_S`` and only
  the rows needed to decide (and show) the comparison are fetched.

Each result records the rule, the expected value and what was observed (bytes in hex when they
differ). A missing file, an unreadable database or a check that cannot be evaluated is a failed
check, not an exception.

Each check kind of the task schema (:data:`controller.model.checks.CHECK_KINDS`) has its runner in
:data:`RUNNERS`, checked when this module is imported (a kind without a runner, or a runner without a
kind, stops the import naming it); :func:`run_checks` dispatches through it, and a check of a kind
outside the table is :class:`controller.model.errors.UnknownKind` before any check runs -- never run
as another kind.
"""

from __future__ import annotations

import re
import sqlite3
import tempfile
import time
from pathlib import Path, PurePosixPath
from typing import Any, Callable, Protocol

from controller import json_semantics
from controller.gateway.origin import Origin
from controller.model.checks import FileCheck, PageCheck, SqliteCheck, check_guest_path, check_kind, check_runners
from controller.model.errors import DesktopSandboxError
from controller.sandbox.guest import GUEST_HOME
from controller.text import clean

MAX_OBSERVED_CHARS = 2000
MAX_HEX_BYTES = 256
MAX_OBSERVED_ROWS = 50
MAX_OBSERVED_CELL_CHARS = 200
"""A text (or hex of a blob) cell of an observed row is recorded and shown cut to this many characters
(the guest's database may hold megabytes in one value); the comparison uses the whole value."""
QUERY_TIME_LIMIT_S = 10.0
"""A check's query is interrupted after this many seconds: the database comes from the guest, which
may have replaced a table with an endless view."""


class FileReader(Protocol):
    """The part of the agent client verification uses: ``read_file(path) -> bytes``."""

    def read_file(self, path: str) -> bytes: ...


class GuestFileMissing(DesktopSandboxError, FileNotFoundError):
    """The guest has no such file (the agent answered 404)."""


def guest_path(path: str, home: str) -> str:
    """Expand a leading ``~`` to the guest user's home; the result must be absolute (POSIX).

    Raises ValueError for what :func:`controller.run.tasks.check_guest_path` refuses (relative paths,
    ``..`` segments, NUL).
    """
    if path == "~":
        return home
    check_guest_path(path)
    if path.startswith("~/"):
        path = home.rstrip("/") + path[1:]
    if not PurePosixPath(path).is_absolute():
        raise ValueError(f"guest path must be absolute or start with ~/: {path!r}")
    return path


def _read(reader: FileReader, path: str) -> bytes:
    try:
        return reader.read_file(path)
    except Exception as exc:  # the agent client's AgentError carries the HTTP status
        if getattr(exc, "status", None) == 404 or getattr(exc, "status_code", None) == 404:
            raise GuestFileMissing(path) from exc
        raise


def _hex(data: bytes) -> str:
    return data[:MAX_HEX_BYTES].hex() + ("..." if len(data) > MAX_HEX_BYTES else "")


def _shown(data: bytes) -> str:
    text = data.decode("utf-8", errors="replace")
    return text if len(text) <= MAX_OBSERVED_CHARS else text[:MAX_OBSERVED_CHARS] + "..."


def check_file(check: FileCheck, reader: FileReader, home: str) -> dict[str, Any]:
    """Run one file check; returns the ``check`` record fields (kind, target, rule, expected,
    observed, passed and, when bytes differ, observed_hex/expected_hex)."""
    path = guest_path(check.path, home)
    result: dict[str, Any] = {"kind": "file", "target": path, "rule": check.match, "expected": check.value}
    try:
        data = _read(reader, path)
    except GuestFileMissing:
        return {**result, "observed": None, "passed": False, "detail": "file does not exist"}
    except Exception as exc:
        return {**result, "observed": None, "passed": False, "detail": f"cannot read: {exc}"}
    return _compare(check.match, check.value, data, result)


def _compare(match: str, value: Any, data: bytes, result: dict[str, Any]) -> dict[str, Any]:
    """Compare ``data`` with ``value`` by the rule ``match`` (exact, text, regex, json); returns
    ``result`` with observed, passed and, when they differ, the hex of the bytes."""
    text = data.decode("utf-8", errors="replace")
    passed: bool
    detail = None
    if match == "exact":
        expected = str(value).encode("utf-8")
        passed = data == expected
        if not passed:
            result["expected_hex"] = _hex(expected)
    elif match == "text":
        passed = text.rstrip() == str(value).rstrip()
    elif match == "regex":
        try:
            passed = re.search(str(value), text) is not None
        except re.error as exc:
            passed, detail = False, f"invalid regex: {exc}"
    else:  # json
        try:
            expected_value = json_semantics.loads(value) if isinstance(value, str) else value
        except ValueError as exc:
            return {**result, "observed": _shown(data), "passed": False, "detail": f"expected value is not JSON: {exc}"}
        try:
            passed = json_semantics.equal(json_semantics.loads(text), expected_value)
        except ValueError as exc:
            passed, detail = False, f"not JSON: {exc}"
        result["expected"] = expected_value
    result.update(observed=_shown(data), passed=passed)
    if not passed:
        result["observed_hex"] = _hex(data)
    if detail:
        result["detail"] = detail
    return result


def check_page(check: PageCheck, reader: Any, home: str = "") -> dict[str, Any]:
    """Run one page check (contract 8): the text of ``check.url`` as the agent's chromium loads it
    (``reader.page_text``), compared by the file rules; a page that ended on another origin (a redirect)
    fails. Returns the ``check`` record fields. ``home`` is not used (a page has no guest path); it is
    there so every runner takes ``(check, reader, home)``."""
    result: dict[str, Any] = {"kind": "page", "target": check.url, "rule": check.match, "expected": check.value}
    try:
        page = reader.page_text(check.url)
    except Exception as exc:
        return {**result, "observed": None, "passed": False, "detail": f"cannot load the page: {exc}"}
    want = Origin.from_url(check.url)
    try:
        got = Origin.parse(str(page.get("origin", "")))
    except ValueError:
        got = None
    if got != want:
        return {**result, "observed": None, "passed": False,
                "detail": f"the page ended on another origin: {clean(str(page.get('origin')), 200)}"}
    return _compare(check.match, check.value, str(page.get("text", "")).encode("utf-8"), result)


# What a check's query may do: read (tables, columns, functions, recursive CTEs) -- nothing else.
_READ_ACTIONS = {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION, sqlite3.SQLITE_RECURSIVE}


def _read_only_authorizer(action: int, _arg1: Any, _arg2: Any, db_name: Any, _trigger: Any) -> int:
    """sqlite3 authorizer: allow reading the ``main`` database (tables, functions, CTEs); deny everything else."""
    if action not in _READ_ACTIONS:
        return sqlite3.SQLITE_DENY
    if action == sqlite3.SQLITE_READ and db_name not in (None, "main"):
        return sqlite3.SQLITE_DENY
    return sqlite3.SQLITE_OK


def _normalize(rows: Any) -> list[list[Any]]:
    out = []
    for row in rows:
        out.append([v.hex() if isinstance(v, bytes) else v for v in row])
    return out


def _shown_rows(rows: list[list[Any]]) -> list[list[Any]]:
    """``rows`` with every text cell longer than :data:`MAX_OBSERVED_CELL_CHARS` cut (``...`` marks it)."""
    cap = MAX_OBSERVED_CELL_CHARS
    return [[v[:cap] + "..." if isinstance(v, str) and len(v) > cap else v for v in row] for row in rows]


def check_sqlite(check: SqliteCheck, reader: FileReader, home: str) -> dict[str, Any]:
    """Run one sqlite check on a read-only copy of the guest database (with -wal/-shm)."""
    path = guest_path(check.path, home)
    result: dict[str, Any] = {"kind": "sqlite", "target": path, "rule": f"rows of: {check.query}",
                              "expected": check.rows}
    params: list[str] = []
    bound: dict[str, str | None] = {}
    for file in check.bind_files:
        fpath = guest_path(file, home)
        try:
            value = _read(reader, fpath).decode("utf-8", errors="replace").rstrip()
        except GuestFileMissing:
            bound[fpath] = None
            return {**result, "bound": bound, "observed": None, "passed": False,
                    "detail": f"bound file {fpath} does not exist"}
        bound[fpath] = value
        params.append(value)
    if bound:
        result["bound"] = bound
    with tempfile.TemporaryDirectory(prefix="verify-sqlite-") as tmp:
        local = Path(tmp) / PurePosixPath(path).name
        try:
            local.write_bytes(_read(reader, path))
        except GuestFileMissing:
            return {**result, "observed": None, "passed": False, "detail": "database does not exist"}
        copied = ["db"]
        for suffix in ("-wal", "-shm"):
            try:
                Path(str(local) + suffix).write_bytes(_read(reader, path + suffix))
                copied.append(suffix)
            except GuestFileMissing:
                pass
        result["copied"] = copied
        expected = _normalize(check.rows)
        deadline = time.monotonic() + QUERY_TIME_LIMIT_S
        try:
            conn = sqlite3.connect(f"file:{local}?mode=ro", uri=True)
            try:
                for pragma in ("trusted_schema = OFF", "cell_size_check = ON", "mmap_size = 0"):
                    conn.execute(f"PRAGMA {pragma}")
                conn.set_authorizer(_read_only_authorizer)
                conn.set_progress_handler(lambda: int(time.monotonic() > deadline), 1000)
                cursor = conn.execute(check.query, params)
                rows = _normalize(cursor.fetchmany(max(len(expected), MAX_OBSERVED_ROWS) + 1))
            finally:
                conn.close()
        except sqlite3.Error as exc:
            if time.monotonic() > deadline:
                detail = f"query stopped at the time limit ({QUERY_TIME_LIMIT_S:g}s)"
            else:
                detail = f"sqlite error: {exc}"
            return {**result, "observed": None, "passed": False, "detail": detail}
    return {**result, "observed": _shown_rows(rows[:MAX_OBSERVED_ROWS]), "passed": rows == expected}


Runner = Callable[[Any, Any, str], dict[str, Any]]
"""Runs one check: ``runner(check, reader, home)`` -> the ``check`` record fields (``reader``: the agent
client, ``home``: the guest user's home for ``~`` paths)."""

RUNNERS: dict[str, Runner] = {"file": check_file, "sqlite": check_sqlite, "page": check_page}
"""The runner of each check kind (:data:`controller.model.checks.CHECK_KINDS`), one each."""

check_runners(RUNNERS)


def run_checks(checks: list[Any], reader: FileReader, *, home: str = GUEST_HOME,
               on_result: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """Run every check in order; each result goes to ``on_result`` (the record) and the list.

    A check whose ``kind`` is not a check kind raises :class:`controller.model.errors.UnknownKind`
    (naming it) before any check runs: it is never run as another kind. A check that cannot be
    evaluated otherwise (a path the rules refuse, a check object built without validation) becomes a
    failed result with ``detail``; the remaining checks still run.
    """
    runners = [RUNNERS[check_kind(getattr(check, "kind", None)).name] for check in checks]
    results = []
    for check, runner in zip(checks, runners):
        try:
            result = runner(check, reader, home)
        except Exception as exc:  # noqa: BLE001 - one bad check must not hide the others' results
            result = {"kind": getattr(check, "kind", None), "target": getattr(check, "path", None),
                      "rule": getattr(check, "match", None) or getattr(check, "query", None),
                      "expected": getattr(check, "value", getattr(check, "rows", None)), "observed": None,
                      "passed": False, "detail": f"check could not be evaluated: {exc}"}
        results.append(result)
        if on_result is not None:
            on_result(result)
    return results
