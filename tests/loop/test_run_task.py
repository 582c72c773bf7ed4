"""run_task end to end on a local desktop (Xvfb + openbox + firefox-esr + xterm + the pickup app +
the real agent), offline: the real SDK loop against the scripted server. The same tasks run in
Docker in tests/docker/test_run_task.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from controller.run.entries import Entry
from controller.run.record import read_entries, summarize
from controller.run.runner import RunOptions, run_task
from controller.run.tasks import load_task
from tests.loop.conftest import interrupt_after_first_action
from tests.loop.local_sandbox import LocalSandbox
from tests.require import require_commands

ROOT = Path(__file__).resolve().parents[2]
TASKS = ROOT / "tasks"


@pytest.fixture
def desktop_apps() -> None:
    require_commands("X", "firefox-esr", "openbox", "xterm", install="apt-get install firefox-esr openbox xterm")


needs_desktop_apps = pytest.mark.usefixtures("desktop_apps")


def _pickup_on(sb: LocalSandbox):
    task = load_task(TASKS / "pickup.toml")
    launch = [l.model_copy(update={"args": [a.replace(":8080/", f":{sb.pickup_port}/") for a in l.args]})
              for l in task.launch]
    return task.model_copy(update={"launch": launch})


def _check_record_complete(record_dir: Path, status: str) -> list[Entry]:
    entries = read_entries(record_dir)
    types = [e.type for e in entries]
    assert types[0] == "run_started" and types[-1] == "run_finished"
    assert entries[0].runner == "sdk"
    assert entries[-1].status == status
    for kind in ("model_response", "computer_call", "action", "screenshot"):
        assert kind in types, f"no {kind} entry"
    for shot in (e for e in entries if e.type == "screenshot"):
        import hashlib

        assert hashlib.sha256((record_dir / shot.file).read_bytes()).hexdigest() == shot.sha256
    # typed text never enters the model/action side of the record (checks name their own expectations)
    text = json.dumps([e.as_json() for e in entries if e.type not in ("check", "run_finished")])
    assert "Ada Lovelace" not in text and "2 boxes of books" not in text
    return entries


@pytest.mark.slow
@needs_desktop_apps
def test_pickup_offline_passes_and_a_wrong_script_fails(tmp_path):
    with LocalSandbox(openbox=True, pickup=True) as sb:
        outcome = run_task(_pickup_on(sb), lambda t: sb, RunOptions(runs_dir=tmp_path, live=False, terminal=False))
    assert outcome.status == "passed", (outcome.reason, outcome.checks, str(outcome.record_dir))
    assert outcome.exit_code == 0 and [c["passed"] for c in outcome.checks] == [True, True, True]
    entries = _check_record_complete(outcome.record_dir, "passed")
    s = summarize(entries)
    # 7 script turns, each answered once the screen showed what it expects (waits inserted if not yet)
    assert s["steps"] == 7 + s["expectation_waits"] and s["checks_passed"] == 3 and s["usage"]["complete"]
    assert (s["expectations_met"], s["expectations_unmet"]) == (7, 0)
    bound = [c for c in entries if c.type == "check" and c.bound][0].bound
    assert list(bound.values())[0].startswith("PU-")

    # Deliberately wrong: the paste is missing, so the number never shows on the command line; the
    # scripted model waits for it (a short deadline here), gives up, and the file is never written.
    lines = (TASKS / "pickup.offline.jsonl").read_text().splitlines()
    turns = [json.loads(l.replace(', {"type": "click", "x": 640, "y": 700, "button": "wheel"}', "")) for l in lines]
    assert turns != [json.loads(l) for l in lines]
    turns[5]["expect_timeout_s"] = 3
    wrong = tmp_path / "wrong.jsonl"
    wrong.write_text("".join(json.dumps(t) + "\n" for t in turns))
    with LocalSandbox(openbox=True, pickup=True) as sb:
        bad = run_task(_pickup_on(sb), lambda t: sb,
                       RunOptions(runs_dir=tmp_path, live=False, terminal=False, script=wrong))
    assert bad.status == "failed" and bad.exit_code == 1
    assert bad.reason.startswith("screen expectation unmet at turn 5 (deadline of 3s passed): not_color #ffffff")
    (failure,) = [e for e in read_entries(bad.record_dir) if e.type == "expectation" and not e.met]
    assert failure.turn == 5 and failure.unmet[0].kind == "not_color"
    passed = [c["passed"] for c in bad.checks]
    assert passed == [True, False, False]  # the booking exists; the file is missing and matches no row


@pytest.mark.slow
@needs_desktop_apps
def test_approval_demo_denied_without_terminal_then_approved_by_opt_in(tmp_path):
    task = load_task(TASKS / "approval-demo.toml")
    with LocalSandbox(openbox=True) as sb:
        denied = run_task(task, lambda t: sb, RunOptions(runs_dir=tmp_path, live=False, terminal=False))
        assert not (sb.home / "Documents/approval.txt").exists()
    assert denied.status == "failed"
    assert denied.reason.startswith("safety check sensitive_action denied by no-approver (denied: no terminal"), denied.reason
    entries = read_entries(denied.record_dir)
    approvals = [e for e in entries if e.type == "approval"]
    assert approvals and approvals[0].decision == "denied" and approvals[0].by == "no-approver"
    call = [e for e in entries if e.type == "computer_call" and e.pending_checks][0]
    assert call.pending_checks[0]["code"] == "sensitive_action" and call.call_id == "call_0001"
    # the title-bar click ran (no check on it); none of the checked call's actions did
    assert {e.call_id for e in entries if e.type == "action"} == {"call_0000"}

    with LocalSandbox(openbox=True) as sb:
        ok = run_task(task, lambda t: sb, RunOptions(runs_dir=tmp_path, live=False, terminal=False,
                                                     approve_codes=["sensitive_action"]))
    assert ok.status == "passed", ok.reason
    entries = read_entries(ok.record_dir)
    approvals = [e for e in entries if e.type == "approval"]
    assert [a.by for a in approvals] == ["command line", "opt-in"]
    assert ok.scripted_requests is not None
    acked = [i for i in ok.scripted_requests[-1]["input"] if i.get("type") == "computer_call_output"
             and i.get("call_id") == "call_0001"]
    assert acked[0]["acknowledged_safety_checks"][0]["id"] == "sc_demo_1"


CANCEL_CHILD = r"""
import json, sys
from pathlib import Path
from controller.run.runner import run_task, RunOptions
from controller.run.tasks import FileCheck, Task
from tests.loop.conftest import interrupt_after_first_action
from tests.loop.local_sandbox import LocalSandbox
runs, script = Path(sys.argv[1]), Path(sys.argv[2])
sb = LocalSandbox().start()
print(json.dumps({"xvfb": sb.xvfb.proc.pid, "agent": sb.agent_proc.proc.pid}), flush=True)
task = Task(name="cancel", instructions="wait forever",
            checks=[FileCheck(kind="file", path="~/never", match="text", value="x")])
out = run_task(task, lambda t: sb, RunOptions(runs_dir=runs, live=False, terminal=False, script=script, max_steps=50))
print(json.dumps({"status": out.status, "dir": str(out.record_dir)}), flush=True)
sys.exit(out.exit_code)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is gone for our purposes
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


@pytest.mark.slow
def test_ctrl_c_cancels_releases_and_tears_down(tmp_path):
    script = tmp_path / "waits.jsonl"
    script.write_text("".join(json.dumps({"actions": [{"type": "move", "x": 10 + i, "y": 10},
                                                      {"type": "wait"}]}) + "\n" for i in range(40))
                      + json.dumps({"message": "never"}) + "\n")
    runs = tmp_path / "runs"
    proc = subprocess.Popen([sys.executable, "-c", CANCEL_CHILD, str(runs), str(script)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONPATH=str(ROOT)))
    pids = json.loads(proc.stdout.readline())
    out, err = interrupt_after_first_action(proc, runs)
    assert proc.returncode == 130, err  # cancelled: the shell's code for an interrupted command
    result = json.loads(out.strip().splitlines()[-1])
    assert result["status"] == "cancelled"
    entries = read_entries(result["dir"])
    assert entries[-1].type == "run_finished" and entries[-1].status == "cancelled"
    assert "SIGINT" in entries[-1].reason
    assert [e for e in entries if e.type == "check"] == []
    steps = len([e for e in entries if e.type == "model_response"])
    assert 1 <= steps < 40
    assert not _alive(pids["xvfb"]) and not _alive(pids["agent"])  # torn down


def test_live_path_uses_the_same_loop_with_the_key_from_the_environment(tmp_path, monkeypatch):
    """With OPENAI_API_KEY set the runner takes the live path: the real client built from the
    environment (here its base URL and key are a loopback scripted server's)."""
    from controller.offline.scripted_server import ScriptedModel, ScriptedServer
    from controller.run.tasks import FileCheck, Task

    model = ScriptedModel([{"actions": [{"type": "move", "x": 5, "y": 6}]}, {"message": "ok"}])
    with ScriptedServer(model) as server, LocalSandbox() as sb:
        monkeypatch.setenv("OPENAI_API_KEY", server.key)
        monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
        monkeypatch.delenv("OPENAI_MODEL", raising=False)
        (sb.home / "Documents/seed.txt").write_text("present\n")
        task = Task(name="live-path", instructions="move the pointer",
                    checks=[FileCheck(kind="file", path="~/Documents/seed.txt", match="text", value="present")])
        outcome = run_task(task, lambda t: sb, RunOptions(runs_dir=tmp_path, terminal=False))
    assert outcome.status == "passed", outcome.reason
    first = model.requests[0]
    assert first["model"] == "gpt-6-astra" and first["tools"] == [{"type": "computer"}]
    content = first["input"][0]["content"]
    assert content[0]["type"] == "input_text" and content[1]["image_url"].startswith("data:image/png;base64,")
    entries = read_entries(outcome.record_dir)
    assert entries[0].mode == "live" and entries[0].model == "gpt-6-astra"
    text = (outcome.record_dir / "record.jsonl").read_text()
    assert server.key not in text


@pytest.mark.parametrize("loop", ["sdk", "agent-framework"])
def test_an_offline_run_hands_its_client_the_key_and_shows_it_nowhere(tmp_path, monkeypatch, capfd, loop):
    """The run's scripted server admits only the key it made, which the run's client (the SDK's, or the
    Agent Framework's through ``RunOptions.loop``) carries; the key is in no file of the record and in
    nothing printed."""
    from controller.af import run_loop
    from controller.offline.scripted_server import ScriptedServer
    from controller.run import runner
    from controller.run.tasks import FileCheck, Task

    made: list[ScriptedServer] = []

    class Kept(ScriptedServer):
        """The runner's own server, kept to read its key afterwards."""

        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(runner, "ScriptedServer", Kept)
    script = tmp_path / "move.jsonl"
    script.write_text(json.dumps({"actions": [{"type": "move", "x": 5, "y": 6}]}) + "\n"
                      + json.dumps({"message": "ok"}) + "\n")
    framework = loop == "agent-framework"
    options = RunOptions(runs_dir=tmp_path / "runs", live=False, terminal=False, script=script,
                         runner=loop if framework else None)
    with LocalSandbox() as sb:
        (sb.home / "Documents/seed.txt").write_text("present\n")
        task = Task(name="offline-key", instructions="move the pointer",
                    checks=[FileCheck(kind="file", path="~/Documents/seed.txt", match="text", value="present")])
        outcome = run_task(task, lambda t: sb, options, loop=run_loop if framework else None)
    assert outcome.status == "passed", outcome.reason
    (server,) = made
    assert outcome.scripted_requests is not None and len(outcome.scripted_requests) == 2
    key = server.key.encode()
    assert [p for p in (tmp_path / "runs").rglob("*") if p.is_file() and key in p.read_bytes()] == []
    out, err = capfd.readouterr()
    assert server.key not in out + err


def test_a_sandbox_that_cannot_start_still_leaves_a_complete_record(tmp_path):
    from controller.run.tasks import FileCheck, Task

    def broken(task):
        raise RuntimeError("image desktop-sandbox:latest missing")

    task = Task(name="nostart", instructions="x", checks=[FileCheck(kind="file", path="~/x", match="text", value="")])
    outcome = run_task(task, broken,
                       RunOptions(runs_dir=tmp_path, live=False, terminal=False, script=TASKS / "pickup.offline.jsonl"))
    assert outcome.status == "error" and "image desktop-sandbox:latest missing" in outcome.reason
    assert outcome.exit_code == 1
    entries = read_entries(outcome.record_dir)
    assert [e.type for e in entries] == ["run_started", "run_finished"]
    assert entries[-1].status == "error"


def test_an_unreadable_gateway_log_is_recorded_not_hidden(tmp_path):
    """The record says when the gateway's decisions could not be collected (and shows the reason
    escaped), instead of looking like a run that made no requests; a readable log says complete."""
    import io

    from rich.console import Console

    from controller.run.tasks import FileCheck, Task

    task = Task(name="netlog", instructions="x",
                checks=[FileCheck(kind="file", path="~/Documents/seed.txt", match="text", value="present")])
    script = tmp_path / "script.jsonl"
    script.write_text(json.dumps({"message": "done"}) + "\n")
    results = {}
    for broken in (False, True):
        with LocalSandbox() as sb:
            (sb.home / "Documents/seed.txt").write_text("present\n")
            if broken:
                def unreadable():
                    raise RuntimeError("gateway gone \x1b[2J")

                sb.decision_log = unreadable
            out = io.StringIO()
            outcome = run_task(task, lambda t: sb, RunOptions(runs_dir=tmp_path / str(broken), live=False,
                                                             terminal=False, script=script),
                               Console(file=out, width=200))
        entries = read_entries(outcome.record_dir)
        [netlog] = [e for e in entries if e.type == "network_log"]
        results[broken] = (netlog, summarize(entries)["network_log_complete"], out.getvalue())
    assert results[False][0].complete is True and results[False][1] is True
    netlog, complete, console = results[True]
    assert netlog.complete is False and "gateway gone \\x1b[2J" in netlog.error and complete is False
    assert "network decisions incomplete" in console and "\x1b[2J" not in console
