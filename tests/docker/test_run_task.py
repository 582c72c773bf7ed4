"""The offline exercise end to end in Docker: run-task's code path (fresh sandbox, SDK loop against the
scripted server, verification from the guest, record, teardown). The shipped script passes; a
deliberately wrong script makes the checks fail."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from controller.run.record import read_entries, summarize
from controller.run.runner import RunOptions, run_task
from controller.run.tasks import load_task

from ._guest import guest_requests

ROOT = Path(__file__).resolve().parents[2]
TASKS = ROOT / "tasks"

pytestmark = [pytest.mark.docker, pytest.mark.slow]


@pytest.fixture
def open_sandbox(docker_client, desktop_image, test_labels):
    from controller.sandbox import SandboxSpec
    from controller.sandbox.docker import DockerOptions, DockerSandbox

    started = []
    gateway_logs: list[list[dict]] = []

    def open_(task):
        spec = SandboxSpec(screen_width=task.screen.width, screen_height=task.screen.height,
                           policy=task.network.model_dump(mode="json"))
        sb = DockerSandbox.start(spec, DockerOptions(image=desktop_image, extra_labels=test_labels),
                                 client=docker_client)
        started.append(sb)
        # Traffic the policy refuses, so the run has network decisions to record; and a spy that keeps
        # the gateway's whole log each time the runner's incremental read reached its end (the last one:
        # the log at teardown).
        guest_requests(sb, [f"http://blocked-{i}.example.test/" for i in range(2)])
        since = sb.decisions_since

        def decisions_since(start, max_lines=1000, **kw):
            lines = since(start, max_lines, **kw)
            if not lines:
                gateway_logs.append(sb.decision_log())
            return lines

        sb.decisions_since = decisions_since
        return sb

    open_.gateway_logs = gateway_logs
    yield open_, started
    for sb in started:
        sb.close()


def _gone(docker_client, sandbox_id: str) -> bool:
    from controller.sandbox import LABEL_SANDBOX

    flt = {"label": f"{LABEL_SANDBOX}={sandbox_id}"}
    return not docker_client.containers.list(all=True, ignore_removed=True, filters=flt) and not docker_client.networks.list(filters=flt)


def test_pickup_offline_exercise_passes(open_sandbox, docker_client, tmp_path):
    open_, started = open_sandbox
    outcome = run_task(load_task(TASKS / "pickup.toml"), open_, RunOptions(runs_dir=tmp_path, live=False, terminal=False))
    assert outcome.status == "passed", outcome.reason
    assert outcome.exit_code == 0
    assert [c["passed"] for c in outcome.checks] == [True, True, True]
    entries = read_entries(outcome.record_dir)
    s = summarize(entries)
    assert s["status"] == "passed" and s["steps"] == 7 + s["expectation_waits"] and s["checks_passed"] == 3
    assert (s["expectations_met"], s["expectations_unmet"]) == (7, 0)
    assert entries[0].image.startswith("sha256:")
    for shot in (e for e in entries if e.type == "screenshot"):
        assert hashlib.sha256((outcome.record_dir / shot.file).read_bytes()).hexdigest() == shot.sha256
    # every network decision the gateway logged is in the record, once, as logged; deny-all allowed none
    # the runner reads the log as the run goes and once more at teardown: the last read is the whole log
    gateway_log = open_.gateway_logs[-1]
    recorded = [(e.origin, e.decision, e.reason, e.via, e.at) for e in entries if e.type == "network"]
    assert recorded == [(d["origin"], d["decision"], d["reason"], d.get("via"), d["ts"]) for d in gateway_log]
    assert {"http://blocked-0.example.test", "http://blocked-1.example.test"} <= {r[0] for r in recorded}
    assert all(r[1] == "deny" for r in recorded)
    assert _gone(docker_client, started[0].id)  # torn down


def test_a_wrong_script_makes_the_checks_fail(open_sandbox, docker_client, tmp_path):
    open_, started = open_sandbox
    # Wrong on purpose: the booking is made for another date, and the paste into the terminal is missing
    # (so the scripted model waits for the number on the command line, here 3 s, and gives up).
    text = (TASKS / "pickup.offline.jsonl").read_text()
    wrong = text.replace('"2030-05-17"', '"2030-05-18"').replace(
        ', {"type": "click", "x": 640, "y": 700, "button": "wheel"}', "")
    assert wrong != text
    turns = [json.loads(line) for line in wrong.splitlines()]
    turns[5]["expect_timeout_s"] = 3
    script = tmp_path / "wrong.jsonl"
    script.write_text("".join(json.dumps(t) + "\n" for t in turns))
    outcome = run_task(load_task(TASKS / "pickup.toml"), open_,
                       RunOptions(runs_dir=tmp_path, live=False, terminal=False, script=script))
    assert outcome.status == "failed" and outcome.exit_code == 1
    assert outcome.reason.startswith("screen expectation unmet at turn 5"), outcome.reason
    assert [c["passed"] for c in outcome.checks] == [False, False, False]
    db_check = outcome.checks[0]
    assert db_check["observed"] == [["Ada Lovelace", "2030-05-18", "12:00-15:00", "2 boxes of books"]]
    assert read_entries(outcome.record_dir)[-1].status == "failed"
    assert _gone(docker_client, started[0].id)


def _cli(*args: str, cwd: Path, timeout: float = 300):
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"}
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run([sys.executable, "-m", "controller.cli", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, stdin=subprocess.DEVNULL, env=env)


def test_cli_approval_demo_denies_without_a_terminal_and_opt_in_approves(desktop_image, tmp_path):
    task = str(TASKS / "approval-demo.toml")
    denied = _cli("run-task", task, "--image", desktop_image, "--runs-dir", str(tmp_path), cwd=tmp_path)
    assert denied.returncode == 1, denied.stderr[-2000:]
    assert "no terminal" in denied.stderr and "sensitive_action" in denied.stderr
    record = Path(denied.stdout.strip().splitlines()[-1])
    entries = read_entries(record)
    assert entries[-1].status == "failed"
    assert [e.decision for e in entries if e.type == "approval"] == ["denied"]
    # only the title-bar click ran; none of the checked call's actions did
    assert {e.call_id for e in entries if e.type == "action"} == {"call_0000"}
    assert [e.passed for e in entries if e.type == "check"] == [False]

    approved = _cli("run-task", task, "--image", desktop_image, "--runs-dir", str(tmp_path),
                    "--approve-safety-check", "sensitive_action", cwd=tmp_path)
    assert approved.returncode == 0, approved.stderr[-2000:]
    entries = read_entries(Path(approved.stdout.strip().splitlines()[-1]))
    assert [(e.decision, e.by) for e in entries if e.type == "approval"] == [
        ("approved", "command line"), ("approved", "opt-in")]
    report = _cli("report", str(Path(approved.stdout.strip().splitlines()[-1]).parent), cwd=tmp_path)
    assert report.returncode == 0 and "passed" in report.stdout
