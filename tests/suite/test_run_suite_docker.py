"""``desktop-sandbox run-suite`` end to end in Docker, as a user runs it: the pickup task four times, two at
once, passes 4 of 4 and writes JSON and JUnit; a suite interrupted with SIGINT while its runs are going
leaves every started record finished ``cancelled``. Either way nothing is left behind: no container or
network carrying the owner label of any of the suite's run processes (``desktop-sandbox.owner=<host>:<pid>``,
the label the Docker backend puts on everything a process starts), nor the sandbox label of any run.
Only this suite's sandboxes are looked at: other sandboxes may run on the same engine."""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from pathlib import Path
from typing import Any

import pytest

from controller.sandbox import LABEL_OWNER, LABEL_SANDBOX
from controller.suite import record_dir_from_log
from tests.docker._cli_run import RUNS, CliRun, read_entries

pytestmark = [pytest.mark.docker, pytest.mark.slow]

TASK = "tasks/pickup.toml"
HERE = Path(__file__).resolve().parent


def _index(run: CliRun) -> dict[str, Any] | None:
    found = sorted(run.runs.glob("suite-*/index.json"))
    if not found:
        return None
    try:
        return json.loads(found[0].read_text(encoding="utf-8"))
    except ValueError:  # never half-written (renamed into place), but be plain about it
        return None


def _pids(run: CliRun) -> list[int]:
    index = _index(run) or {"runs": []}
    return [r["pid"] for r in index["runs"] if r["pid"]]


def _labelled(client, labels: list[str]) -> list[str]:
    """Names of the containers and networks carrying one of ``labels`` (``KEY=VALUE``)."""
    names = []
    for label in labels:
        flt = {"label": label}
        names += [c.name for c in client.containers.list(all=True, ignore_removed=True, filters=flt)]
        names += [n.name for n in client.networks.list(filters=flt)]
    return names


def _owned(client, pids: list[int]) -> list[str]:
    """Containers and networks carrying the owner label of one of ``pids`` (this suite's run processes)."""
    return _labelled(client, [f"{LABEL_OWNER}={socket.gethostname()}:{pid}" for pid in pids])


def _by_sandbox(client, sandbox_ids: list[str]) -> list[str]:
    return _labelled(client, [f"{LABEL_SANDBOX}={sid}" for sid in sandbox_ids])


def _alive(pid: int) -> bool:
    """Whether process ``pid`` still runs (a zombie waiting for its parent does not)."""
    try:
        return "zombie" not in Path(f"/proc/{pid}/status").read_text().lower()
    except OSError:
        return False


def _sandbox_up(record_dir: str | None) -> bool:
    if not record_dir or not Path(record_dir, "record.jsonl").exists():
        return False
    return any(e.get("type") == "run_started" and e.get("sandbox") for e in read_entries(Path(record_dir, "record.jsonl")))


@pytest.fixture
def suite_cleanup(docker_client):
    """After a test (a failing one above all): cancel its suite as a user would (SIGTERM: the suite passes
    it on and each run removes its sandbox), within bounds; then kill what still runs and remove what
    carries the owner label of one of its run processes (only those), again until nothing more appears
    (a create the engine received before a kill may finish after it)."""
    from controller.sandbox.docker_cleanup import _remove

    runs: list[CliRun] = []
    yield runs
    for run in runs:
        if run.proc.poll() is None:
            run.proc.send_signal(signal.SIGTERM)
            try:
                run.proc.wait(timeout=150)
            except Exception:  # noqa: BLE001 - killed below
                pass
        run.close()
        pids = _pids(run)
        deadline = time.monotonic() + 60
        while any(_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.2)  # poll interval: each run tears its sandbox down
        for pid in pids:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        quiet_since, deadline = None, time.monotonic() + 30
        while time.monotonic() < deadline:
            removed = [name for pid in pids for name in
                       _remove(docker_client, {"label": f"{LABEL_OWNER}={socket.gethostname()}:{pid}"})]
            if removed:
                quiet_since = None
            elif quiet_since is None:
                quiet_since = time.monotonic()
            elif time.monotonic() - quiet_since > 3:
                break
            time.sleep(0.5)  # poll interval: watching for late creations


def test_pickup_four_times_two_at_once(docker_client, desktop_image, tmp_path, suite_cleanup):
    json_out, junit_out = tmp_path / "out" / "suite.json", tmp_path / "out" / "suite.xml"
    run = CliRun(docker_client, tmp_path, "run-suite", TASK, "--repeat", "4", "--parallel", "2", "--offline",
                 "--image", desktop_image, "--runs-dir", RUNS, "--json", json_out, "--junit", junit_out)
    suite_cleanup.append(run)
    seen: set[str] = set()

    def two_sandboxes_at_once(r: CliRun) -> bool:
        owned = _owned(docker_client, _pids(r))
        seen.update(owned)
        return sum(1 for name in owned if name.endswith("-desktop")) >= 2

    # the selector below finds this suite's sandboxes while they exist (so its empty answer later means
    # something), and two run at once
    run.wait_for("two of the suite's sandboxes at once", two_sandboxes_at_once, timeout=150)
    assert run.finish(timeout=300) == 0, run.err()[-3000:]
    report = json.loads(json_out.read_text(encoding="utf-8"))
    assert report["status"] == "passed" and report["counts"]["passed"] == 4 and report["counts"]["total"] == 4
    assert [r["repeat"] for r in report["runs"]] == [1, 2, 3, 4]
    assert (report["tasks"][0]["runs"], report["tasks"][0]["passed"]) == (4, 4)
    assert report["tasks"][0]["median_steps"] >= 7 and report["tasks"][0]["median_wall_s"] > 0
    records = [Path(r["record_dir"]) for r in report["runs"]]
    assert len(set(records)) == 4 and all(p.parent == run.runs for p in records)
    for path in records:
        finished = read_entries(path / "record.jsonl")[-1]
        assert finished["type"] == "run_finished" and finished["status"] == "passed"
    index = Path(run.stdout[-1])
    assert index.parent.parent == run.runs and json.loads(index.read_text()) == report

    xmlschema = pytest.importorskip("xmlschema", reason="xmlschema (test extra) validates the JUnit shape")
    xmlschema.XMLSchema(str(HERE / "junit.xsd")).validate(str(junit_out))
    import xml.etree.ElementTree as ET

    root = ET.parse(junit_out).getroot()
    assert (root.get("tests"), root.get("failures"), root.get("errors")) == ("4", "0", "0")
    assert len(root.findall("testsuite/testcase")) == 4
    assert "4 of 4 runs passed" in run.err()

    sandboxes = [read_entries(p / "record.jsonl")[0]["sandbox"] for p in records]
    assert all(sandboxes) and len(set(sandboxes)) == 4
    assert any(name.startswith(tuple(sandboxes)) for name in seen)
    assert _owned(docker_client, _pids(run)) == []
    assert _by_sandbox(docker_client, sandboxes) == []


def _waiting_task(directory: Path) -> Path:
    """A task whose runs wait on a ``[[ready]]`` file that never appears (each run holds its sandbox until
    it is cancelled, however fast the machine), with its offline script beside it."""
    (directory / "waits.offline.jsonl").write_text(json.dumps({"message": "done"}) + "\n", encoding="utf-8")
    path = directory / "waits.toml"
    path.write_text('name = "waits"\ninstructions = "x"\nmax_steps = 2\n[[launch]]\napp = "terminal"\n'
                    '[[ready]]\nfile = "~/never-written"\ntimeout_s = 600\n'
                    '[[checks]]\nkind = "file"\npath = "~/never.txt"\nmatch = "text"\nvalue = "x"\n'
                    '[offline]\nscript = "waits.offline.jsonl"\n', encoding="utf-8")
    return path


def test_sigint_cancels_every_run_and_leaves_nothing(docker_client, desktop_image, tmp_path, suite_cleanup):
    """Its runs wait for a ready file that never appears, so SIGINT always finds two of them going."""
    task = _waiting_task(tmp_path)
    run = CliRun(docker_client, tmp_path, "run-suite", task, "--repeat", "3", "--parallel", "2", "--offline",
                 "--image", desktop_image, "--runs-dir", RUNS, "--json", tmp_path / "suite.json")
    suite_cleanup.append(run)

    def both_sandboxes_up(r: CliRun) -> bool:
        index = _index(r)
        going = [x for x in (index or {"runs": []})["runs"] if x["status"] == "running"]
        # the index names a record folder once the run has ended; while it runs, find it by the process's log
        dirs = [str(record_dir_from_log(Path(x["log"])) or "") for x in going]
        return len(going) == 2 and all(_sandbox_up(d) for d in dirs)

    run.wait_for("two runs with their sandboxes up", both_sandboxes_up, timeout=150)
    pids = _pids(run)
    assert len(pids) == 2 and _owned(docker_client, pids)  # started, and found by the selector
    run.proc.send_signal(signal.SIGINT)
    assert run.finish(timeout=150) == 130, run.err()[-3000:]
    report = json.loads((tmp_path / "suite.json").read_text(encoding="utf-8"))
    assert report["cancelled"] and report["status"] == "cancelled"
    statuses = [r["status"] for r in report["runs"]]
    assert statuses == ["cancelled", "cancelled", "not_started"], report["runs"]
    for r in report["runs"][:2]:
        entries = read_entries(Path(r["record_dir"], "record.jsonl"))
        assert entries[0]["type"] == "run_started" and entries[0]["sandbox"]
        assert entries[-1]["type"] == "run_finished" and entries[-1]["status"] == "cancelled"
        assert entries[-1]["reason"] == "cancelled by SIGINT"
        assert any(e["type"] == "network_log" for e in entries)  # the teardown ran its course
        assert r["exit_code"] == 130
    assert report["runs"][2]["pid"] is None and report["runs"][2]["record_dir"] is None
    assert not any(_alive(pid) for pid in pids)
    assert _owned(docker_client, pids) == []
    sandboxes = [read_entries(Path(r["record_dir"], "record.jsonl"))[0]["sandbox"] for r in report["runs"][:2]]
    assert _by_sandbox(docker_client, sandboxes) == []
    assert "cancelling the suite" in run.err()


def test_a_suite_with_a_pool_claims_and_leaves_nothing(docker_client, desktop_image, tmp_path, suite_cleanup):
    """``run-suite --pool 1``: each run claims from the suite's pool or starts cold, every run passes, the
    report counts hits and cold starts as the records say, and neither a run's sandbox nor a pool sandbox
    is left (the pool's carry the suite process's owner label)."""
    json_out = tmp_path / "suite.json"
    run = CliRun(docker_client, tmp_path, "run-suite", TASK, "--repeat", "3", "--parallel", "1", "--offline",
                 "--pool", "1", "--image", desktop_image, "--runs-dir", RUNS, "--json", json_out)
    suite_cleanup.append(run)
    assert run.finish(timeout=400) == 0, run.err()[-3000:]
    report = json.loads(json_out.read_text(encoding="utf-8"))
    assert report["counts"]["passed"] == 3
    claims = [read_entries(Path(r["record_dir"], "record.jsonl"))[0].get("claim") for r in report["runs"]]
    sources = [c["source"] for c in claims]
    assert report["pool"]["hits"] == sources.count("pool") >= 1, (report["pool"], claims)
    assert report["pool"]["cold"] == sources.count("cold")
    assert all(c["claim_s"] < 2.0 for c in claims if c["source"] == "pool")
    assert "warm pool:" in run.err()
    assert json.loads(Path(run.stdout[-1]).read_text())["pool"] == report["pool"]
    sandboxes = [read_entries(Path(r["record_dir"], "record.jsonl"))[0]["sandbox"] for r in report["runs"]]
    assert len(set(sandboxes)) == 3
    assert _by_sandbox(docker_client, sandboxes) == []
    assert _labelled(docker_client, [f"{LABEL_OWNER}={run.owner}"]) == []  # the pool's own
    assert _owned(docker_client, _pids(run)) == []
