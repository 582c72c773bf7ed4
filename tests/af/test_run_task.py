"""``run-task --runner agent-framework``: the task's loop as an Agent Framework agent, everything else
run-task's own. The pickup exercise passes, offline against the scripted server, on a local desktop
(Xvfb + openbox + firefox-esr + xterm + the pickup app) and in Docker through the command line; the
approval demo's safety check is denied without a terminal (nothing of the call runs) and approved by
the opt-in, with the same record lines as the SDK loop."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from controller.af import run_loop
from controller.run.entries import Entry
from controller.run.record import read_entries, summarize
from controller.run.runner import RunOptions, run_task
from controller.run.tasks import load_task
from tests.loop.local_sandbox import LocalSandbox
from tests.require import require_commands, unavailable

ROOT = Path(__file__).resolve().parents[2]
TASKS = ROOT / "tasks"
IMAGE = os.environ.get("DESKTOP_SANDBOX_IMAGE", "desktop-sandbox:latest")


@pytest.fixture
def desktop_apps() -> None:
    require_commands("X", "firefox-esr", "openbox", "xterm", install="apt-get install firefox-esr openbox xterm")


def _pickup_on(sb: LocalSandbox):
    task = load_task(TASKS / "pickup.toml")
    launch = [l.model_copy(update={"args": [a.replace(":8080/", f":{sb.pickup_port}/") for a in l.args]})
              for l in task.launch]
    return task.model_copy(update={"launch": launch})


def _check_passed(record_dir: Path, requests: list[dict] | None = None) -> list[Entry]:
    entries = read_entries(record_dir)
    assert entries[0].runner == "agent-framework"  # the record says which loop drove the run
    s = summarize(entries)
    assert s["status"] == "passed" and s["checks_passed"] == s["checks_total"] == 3, s
    # 7 script turns through the agent, each recorded as the SDK loop records them
    assert s["steps"] == 7 + s["expectation_waits"] and (s["expectations_met"], s["expectations_unmet"]) == (7, 0)
    calls = [e for e in entries if e.type == "computer_call"]
    assert [c.call_id for c in calls if "_wait_" not in c.call_id] == [f"call_{i:04d}" for i in range(6)]
    assert {e.call_id for e in entries if e.type == "action"} <= {c.call_id for c in calls}
    assert s["usage"]["complete"] and s["actions_failed"] == 0
    text = (record_dir / "record.jsonl").read_text()
    assert "Ada Lovelace" not in text.split('"type": "check"')[0]  # typed text never enters the record
    if requests is not None:  # every request after the first continues the conversation, as the framework does
        assert "previous_response_id" not in requests[0]
        assert all(r.get("previous_response_id", "").startswith("resp_") for r in requests[1:])
    return entries


@pytest.mark.slow
@pytest.mark.usefixtures("desktop_apps")
def test_pickup_passes_through_the_agent_framework_runner_on_a_local_desktop(tmp_path):
    with LocalSandbox(openbox=True, pickup=True) as sb:
        outcome = run_task(_pickup_on(sb), lambda t: sb,
                           RunOptions(runs_dir=tmp_path, live=False, terminal=False, runner="agent-framework"),
                           loop=run_loop)
    assert outcome.status == "passed", (outcome.reason, outcome.checks, str(outcome.record_dir))
    assert outcome.final_message and outcome.final_message.startswith("done")
    _check_passed(outcome.record_dir, outcome.scripted_requests)


@pytest.mark.slow
@pytest.mark.usefixtures("desktop_apps")
def test_approval_demo_denied_without_terminal_then_approved_by_opt_in(tmp_path):
    task = load_task(TASKS / "approval-demo.toml")
    with LocalSandbox(openbox=True) as sb:
        denied = run_task(task, lambda t: sb, RunOptions(runs_dir=tmp_path, live=False, terminal=False), loop=run_loop)
        assert not (sb.home / "Documents/approval.txt").exists()
    assert denied.status == "failed", denied.reason
    assert denied.reason.startswith("safety check sensitive_action denied by no-approver"), denied.reason
    entries = read_entries(denied.record_dir)
    (approval,) = [e for e in entries if e.type == "approval"]
    assert (approval.decision, approval.by, approval.call_id) == ("denied", "no-approver", "call_0001")
    assert {e.call_id for e in entries if e.type == "action"} == {"call_0000"}  # none of the checked call
    assert len(denied.scripted_requests) == 2  # no result was sent for the denied call

    with LocalSandbox(openbox=True) as sb:
        ok = run_task(task, lambda t: sb, RunOptions(runs_dir=tmp_path, live=False, terminal=False,
                                                     approve_codes=["sensitive_action"]), loop=run_loop)
    assert ok.status == "passed", ok.reason
    assert [a.by for a in read_entries(ok.record_dir) if a.type == "approval"] == ["command line", "opt-in"]
    acked = [i for r in ok.scripted_requests for i in r["input"]
             if isinstance(i, dict) and i.get("type") == "computer_call_output" and i.get("call_id") == "call_0001"]
    assert [c["id"] for c in acked[0]["acknowledged_safety_checks"]] == ["sc_demo_1"]


CHILD = """
import sys
from pathlib import Path
from controller.af import run_loop
from controller.run.runner import RunOptions, run_task
from tests.af.test_run_task import _pickup_on
from tests.loop.local_sandbox import LocalSandbox
with LocalSandbox(openbox=True, pickup=True) as sb:
    out = run_task(_pickup_on(sb), lambda t: sb, RunOptions(runs_dir=Path(sys.argv[1]), live=False, terminal=False),
                   loop=run_loop)
print("outcome", out.status, out.exit_code)
"""


@pytest.mark.slow
@pytest.mark.usefixtures("desktop_apps")
def test_a_signal_during_the_agent_framework_loop_ends_the_run_cancelled(tmp_path):
    from tests.loop.conftest import interrupt_after_first_action

    runs = tmp_path / "runs"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("OPENAI_API_KEY", None)
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(runs)], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    out, _ = interrupt_after_first_action(proc, runs)
    assert "outcome cancelled 130" in out, out[-3000:]
    (record,) = runs.glob("*/record.jsonl")
    entries = read_entries(record)
    assert entries[-1].type == "run_finished" and entries[-1].status == "cancelled"
    assert not [e for e in entries if e.type == "check"]
    # the loop stopped at the signal: the model was not asked again after the interrupted call
    assert len([e for e in entries if e.type == "model_response"]) <= 2


def test_an_unknown_runner_is_refused_before_anything_starts(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "controller.cli", "run-task", str(TASKS / "pickup.toml"),
                           "--runner", "agent_framework", "--runs-dir", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "--runner: unknown runner 'agent_framework' (one of sdk, agent-framework)" in proc.stderr
    assert not list(tmp_path.iterdir())


@pytest.mark.docker
@pytest.mark.slow
def test_pickup_passes_through_the_agent_framework_runner_in_docker(tmp_path):
    try:
        import docker

        client = docker.from_env()
        client.ping()
        client.images.get(IMAGE)
    except Exception as exc:  # noqa: BLE001 - no engine or no image here
        unavailable("IMAGE", f"no Docker engine or no image {IMAGE} ({exc}): build it with `make desktop`")
    from controller.sandbox import LABEL_OWNER

    env = {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "COLUMNS", "FORCE_COLOR")}
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.Popen([sys.executable, "-m", "controller.cli", "run-task", str(TASKS / "pickup.toml"),
                             "--offline", "--runner", "agent-framework", "--image", IMAGE,
                             "--runs-dir", str(tmp_path / "runs")],
                            cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    owner = f"{socket.gethostname()}:{proc.pid}"
    try:
        out, err = proc.communicate(timeout=400)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)  # the run ends cancelled and removes its sandbox
        out, err = proc.communicate(timeout=120)
        pytest.fail(f"run-task did not end within 400 s: {err[-2000:]}")
    assert proc.returncode == 0, err[-4000:]
    assert "model loop: an Agent Framework agent (agent-framework-core 1.23.0)" in err
    record = Path(out.strip().splitlines()[-1])
    entries = _check_passed(record.parent)
    assert entries[0].image.startswith("sha256:")
    left = client.containers.list(all=True, ignore_removed=True, filters={"label": f"{LABEL_OWNER}={owner}"})
    assert left == [], [c.name for c in left]
