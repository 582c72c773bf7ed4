"""run_task with a view attached (the web console's side of the run, without the browser): the approval
registry decides, the record says who answered, cancellation withdraws, take over pauses the loop at a
step boundary. Real local desktop (Xvfb + openbox + xterm + the agent), the real SDK loop against the
scripted server; the view's answers go through :class:`controller.run.live.LiveRun` exactly as the
console's HTTP handlers call it."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any, Callable

import pytest

from controller.run.live import LiveRun, NotInControl
from controller.run.entries import Action, Approval
from controller.run.record import read_entries
from controller.run.runner import RunOptions, run_task, watching
from controller.run.tasks import load_task
from tests.loop.local_sandbox import LocalSandbox
from tests.require import require_commands

ROOT = Path(__file__).resolve().parents[2]
TASKS = ROOT / "tasks"

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def _apps() -> None:
    require_commands("X", "openbox", "xterm", install="apt-get install openbox xterm")


class View:
    """Stands where the console stands: gets the LiveRun, acts on it from its own thread."""

    def __init__(self, act: Callable[[LiveRun], None]) -> None:
        self.live: LiveRun | None = None
        self.error: BaseException | None = None
        self._act = act
        self._thread: threading.Thread | None = None

    def __call__(self, live: LiveRun) -> None:
        self.live = live
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._act(self.live)
        except BaseException as exc:  # noqa: BLE001 - reported by join()
            self.error = exc

    def join(self) -> None:
        assert self._thread is not None, "the run never gave the view its LiveRun"
        self._thread.join(60)
        if self.error is not None:
            raise self.error


def wait_pending(live: LiveRun, timeout: float = 60.0):
    """The first pending request, waiting on the run's events (no polling of time)."""
    seq = 0
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pending = live.registry.pending()
        if pending:
            return pending[0]
        events = live.events_after(seq, timeout=max(0.0, deadline - time.monotonic()))
        if events:
            seq = events[-1]["seq"]
        elif live.state == "finished":
            break
    raise AssertionError(f"no approval request became pending (state {live.state})")


def _approvals(record_dir: Path) -> list[Approval]:
    return [e for e in read_entries(record_dir) if e.type == "approval"]


def _run(tmp_path: Path, view: View, **options: Any):
    task = load_task(TASKS / "approval-demo.toml")
    with LocalSandbox(openbox=True) as sb:
        outcome = run_task(task, lambda t: sb, RunOptions(runs_dir=tmp_path, live=False, terminal=False, **options),
                           views=[watching(view)])
    view.join()
    # the file check (run unless the run was cancelled) says whether the call's typing ran
    saved = any(c["passed"] for c in outcome.checks)
    return outcome, saved


@pytest.mark.parametrize("answer", ["approve", "deny"])
def test_the_console_answers_and_the_record_says_who(tmp_path, answer):
    seen: dict[str, Any] = {}

    def act(live: LiveRun) -> None:
        request = wait_pending(live)
        seen["request"] = request.as_json()
        live.registry.answer(request.id, answer, by="console")

    outcome, saved = _run(tmp_path, View(act))
    request = seen["request"]
    assert request["kind"] == "safety_check" and request["checks"][0]["code"] == "sensitive_action"
    assert request["screenshot"] and (outcome.record_dir / request["screenshot"]).is_file()
    assert any("mkdir" in a for a in request["actions"])  # the person asked sees what would be typed
    (approval,) = _approvals(outcome.record_dir)
    assert approval.by == "console" and approval.request_id == request["id"]
    assert approval.latency_ms >= 0 and approval.screenshot == request["screenshot"]
    if answer == "approve":
        assert outcome.status == "passed", outcome.reason
        assert saved and approval.decision == "approved"
    else:
        assert outcome.status == "failed" and not saved and approval.decision == "denied"
        assert outcome.reason == "safety check sensitive_action denied by console"
        assert _actions_of(outcome.record_dir, request["call_id"]) == []


def _actions_of(record_dir: Path, call_id: str) -> list[Action]:
    return [e for e in read_entries(record_dir) if e.type == "action" and e.call_id == call_id]


def test_the_deadline_denies(tmp_path):
    def act(live: LiveRun) -> None:
        wait_pending(live)  # and never answer

    outcome, saved = _run(tmp_path, View(act), approval_timeout_s=1.0)
    (approval,) = _approvals(outcome.record_dir)
    assert approval.decision == "denied" and approval.by == "timeout"
    assert 900 <= approval.latency_ms < 30_000
    assert outcome.status == "failed" and not saved


def test_cancel_withdraws_the_open_request_and_nothing_of_it_runs(tmp_path):
    seen: dict[str, Any] = {}

    def act(live: LiveRun) -> None:
        request = wait_pending(live)
        live.cancel("console")
        seen["state"] = request.state
        with pytest.raises(Exception) as refused:
            live.registry.answer(request.id, "approve", by="console")
        seen["late"] = getattr(refused.value, "status", None)

    outcome, saved = _run(tmp_path, View(act))
    assert outcome.status == "cancelled" and outcome.exit_code == 130 and not saved
    assert seen == {"state": "withdrawn", "late": 409}
    (approval,) = _approvals(outcome.record_dir)
    assert approval.decision == "withdrawn" and approval.by == "cancel"
    assert _actions_of(outcome.record_dir, approval.call_id) == []
    assert read_entries(outcome.record_dir)[-1].status == "cancelled"


def test_take_over_pauses_at_a_step_boundary_and_human_actions_are_recorded_apart(tmp_path):
    seen: dict[str, Any] = {}

    def act(live: LiveRun) -> None:
        wait_for = lambda state: _wait_state(live, state)  # noqa: E731
        wait_for("running")
        with pytest.raises(NotInControl):
            live.human_action({"type": "move", "x": 5, "y": 5})
        live.take_over()
        wait_for("human")
        seen["shown"] = live.human_action({"type": "type", "text": "secret words"})
        live.human_action({"type": "click", "x": 10, "y": 10, "button": "left"})
        live.resume()
        request = wait_pending(live)
        live.registry.answer(request.id, "deny", by="console")

    outcome, _ = _run(tmp_path, View(act))
    entries = read_entries(outcome.record_dir)
    types = [e.type for e in entries]
    human = [e for e in entries if e.type == "human_action"]
    assert [e.control for e in entries if e.type == "takeover"] == ["human", "model"]
    assert len(human) == 2 and "12 chars" in human[0].action and "click" in human[1].action
    assert "secret" not in (outcome.record_dir / "record.jsonl").read_text()
    assert seen["shown"] == {"type": "type", "text_length": 12}
    first, last = types.index("takeover"), len(types) - 1 - types[::-1].index("takeover")
    # the model did nothing meanwhile; the person's typing is held out of pictures (a redaction line)
    assert types[first + 1:last] == ["redaction", "human_action", "human_action"]
    assert "screenshot" in types[last:]  # the loop went on, with a new screenshot after the person


def _wait_state(live: LiveRun, state: str, timeout: float = 60.0) -> None:
    seq = 0
    deadline = time.monotonic() + timeout
    while live.state != state:
        if time.monotonic() > deadline or live.state == "finished":
            raise AssertionError(f"run state {live.state!r}, expected {state!r}")
        events = live.events_after(seq, timeout=max(0.0, deadline - time.monotonic()))
        if events:
            seq = events[-1]["seq"]


def test_no_human_action_runs_or_is_recorded_after_control_goes_back(desk, tmp_path):
    """Many of a person's inputs racing Resume: each either ran and was recorded before the
    ``takeover: model`` line, or was refused (409 not_in_control); none slips in after."""
    from controller.run.registry import ApprovalRegistry

    for _ in range(5):
        log: list[str] = []
        live = LiveRun("r", tmp_path, ApprovalRegistry())
        live.attach(desk.client, (desk.xvfb.width, desk.xvfb.height), cancel=lambda by: None,
                    record_human=lambda d: log.append("human"), record_control=log.append)
        live.take_over()
        parked = threading.Thread(target=live.checkpoint, args=(lambda: False,), kwargs={"screenshot": True})
        parked.start()
        _wait_state(live, "human")
        go = threading.Barrier(9)
        refused: list[int] = []

        def press() -> None:
            go.wait()
            for i in range(5):
                try:
                    live.human_action({"type": "move", "x": 10 + i, "y": 10})
                except NotInControl:
                    refused.append(i)

        presses = [threading.Thread(target=press) for _ in range(8)]
        for t in presses:
            t.start()
        go.wait()
        live.resume()
        for t in presses:
            t.join()
        parked.join(10)
        assert log[0] == "human" and "model" in log
        assert log[log.index("model"):] == ["model"], log  # nothing of the person's after it
        live.finish("passed")
