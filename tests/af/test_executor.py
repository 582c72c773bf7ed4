"""ComputerCallExecutor's rules without a desktop: the native call is rebuilt from the content's fields,
results acknowledge exactly the pending checks and only after a strict approval, a batch stops at its
first refusal, and a call the run record shows attempted never runs again. The sandbox side is the real
SandboxDriver over an in-memory agent that keeps every action it was sent."""

from __future__ import annotations

import asyncio
import io
import itertools
from pathlib import Path
from typing import Any

import pytest
from agent_framework import Content
from openai.types.responses import ResponseComputerToolCall
from PIL import Image
from rich.console import Console

from tests.helpers import FnSeam
from controller.af import (
    AcknowledgementError, ComputerCallExecutor, attempted_calls, check_acknowledgement, native_call,
)
from controller.agent_client import AgentScreenshot
from controller.run.approvals import SafetyCheckApprover
from controller.run.driver import SandboxDriver, ScreenshotPolicy
from controller.run.entries import Action, Approval, RunStarted, TaskRef
from controller.run.record import RunRecord, read_entries
from controller.run.recording import RecordingHooks

CHECKS = [{"id": "sc_1", "code": "malicious_instructions", "message": "The page may contain instructions."},
          {"id": "sc_2", "code": "sensitive_domain", "message": "This looks like a bank."}]


def _png(w: int = 64, h: int = 40) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (w, h), "white").save(buf, "PNG")
    return buf.getvalue()


class MemoryAgent:
    """The part of AgentClient the driver uses; keeps the input actions it was sent (settle waits aside)."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []
        self.png = _png()

    def actions(self, actions: list[dict[str, Any]]) -> None:
        self.sent += [a for a in actions if a != {"type": "wait"}]

    def screenshot(self, **_: Any) -> AgentScreenshot:
        return AgentScreenshot(self.png, "image/png", (64, 40), (0, 0, 64, 40), (64, 40))

    def release(self) -> None:
        pass


def call(call_id: str, actions: list[dict[str, Any]], checks: list[dict[str, str]] | None = None,
         **kw: Any) -> Any:
    kw.setdefault("id", f"cu_{call_id}")
    return Content.from_computer_tool_call(call_id=call_id, actions=actions, status="completed",
                                           pending_safety_checks=checks, **kw)


def click(x: int, y: int) -> dict[str, Any]:
    return {"type": "click", "x": x, "y": y, "button": "left"}


def result_for(c: Any, acked: list[dict[str, str]]) -> Any:
    shot = Content.from_uri("data:image/png;base64," + __import__("base64").b64encode(_png()).decode(),
                            media_type="image/png")
    return Content.from_computer_tool_result(call_id=c.call_id, screenshot=shot, acknowledged_safety_checks=acked)


def record_in(tmp_path: Path, name: str) -> RunRecord:
    record = RunRecord(tmp_path, name)
    record.write(RunStarted(task=TaskRef(name="af-test"), mode="offline"))
    return record


def test_the_native_call_is_rebuilt_from_the_fields_never_the_raw_representation():
    actions = [click(1, 2), {"type": "type", "text": "hi"}, {"type": "keypress", "keys": ["ctrl", "a"]}]
    other = ResponseComputerToolCall.model_validate({"type": "computer_call", "id": "cu_other", "call_id": "call_other",
                                                     "status": "completed", "actions": [click(9, 9)],
                                                     "pending_safety_checks": []})
    content = call("call_1", actions, CHECKS, raw_representation=other)
    restored = Content.from_dict(content.to_dict())
    assert restored.raw_representation is None  # as after a checkpoint
    for c in (content, restored):
        native = native_call(c)
        assert (native.id, native.call_id, native.status) == ("cu_call_1", "call_1", "completed")
        assert [a.model_dump(exclude_none=True) for a in native.actions] == actions
        assert [ch.model_dump() for ch in native.pending_safety_checks] == CHECKS


@pytest.mark.parametrize("bad", [
    [{"type": "click", "x": "1", "y": 2, "button": "left"}],  # no coercion
    [{"type": "explode"}],
    [{"type": "click", "x": 1, "y": 2}],  # the button is required
])
def test_a_call_the_model_type_refuses_is_not_rebuilt(bad):
    with pytest.raises(ValueError, match="not a valid computer call"):
        native_call(call("call_1", bad))
    with pytest.raises(ValueError, match="not a computer_tool_call"):
        native_call(Content.from_text("click"))


def test_a_hand_built_partial_acknowledgement_is_refused():
    c = call("call_1", [click(1, 1)], CHECKS)
    check_acknowledgement(c, result_for(c, CHECKS))  # exactly the pending checks: accepted
    for acked in (CHECKS[:1], CHECKS[1:], [], list(reversed(CHECKS)), CHECKS + [{"id": "sc_3"}]):
        with pytest.raises(AcknowledgementError, match="exactly those"):
            check_acknowledgement(c, result_for(c, acked))
    free = call("call_2", [click(1, 1)])
    check_acknowledgement(free, result_for(free, []))
    with pytest.raises(AcknowledgementError):
        check_acknowledgement(free, result_for(free, CHECKS[:1]))
    no_shot = Content.from_computer_tool_result(call_id="call_2", acknowledged_safety_checks=[])
    with pytest.raises(AcknowledgementError, match="screenshot"):
        check_acknowledgement(free, no_shot)


def _executor(agent: MemoryAgent, answers: list[Any], tmp_path: Path | None = None, **kw: Any):
    driver = SandboxDriver(agent, ScreenshotPolicy(max_width=64, max_height=40))
    decisions: list[Any] = []
    it = iter(answers)
    approver = SafetyCheckApprover(asker=lambda question: next(it), on_decision=decisions.append,
                                   console=Console(file=io.StringIO()))
    hooks = None
    if tmp_path is not None:
        record = record_in(tmp_path, kw.pop("name", "run"))
        hooks = RecordingHooks(record, driver)
        driver.seam = FnSeam(sent=hooks.on_screenshot)
        approver.on_decision = lambda d: (decisions.append(d), hooks.on_decision(d))
    console = io.StringIO()
    executor = ComputerCallExecutor(driver, approver, hooks=hooks, console=Console(file=console, width=300), **kw)
    return executor, decisions, console


def test_results_acknowledge_exactly_the_approved_calls_checks_for_every_answer_sequence():
    batch = [call("call_a", [click(1, 1), click(2, 2)], CHECKS), call("call_b", [click(3, 3)]),
             call("call_c", [click(4, 4)], CHECKS[1:]), call("call_d", [click(5, 5)], CHECKS[:1])]
    asked = [b for b in batch if b.pending_safety_checks]
    for answers in itertools.product(["y", "n"], repeat=len(asked)):
        agent = MemoryAgent()
        executor, decisions, _ = _executor(agent, list(answers))
        outcome = asyncio.run(executor.run_batch(batch))
        approved = list(itertools.takewhile(lambda a: a == "y", answers))
        # the calls that ran: everything before the first "n" (calls without checks are not asked)
        first_no = len(approved)
        stop = len(batch) if first_no == len(asked) else batch.index(asked[first_no])
        assert outcome.ran == list(range(stop))
        assert outcome.complete is (stop == len(batch))
        assert outcome.stopped == (None if outcome.complete else "denied")
        for index, result in zip(outcome.ran, outcome.results):
            check_acknowledgement(batch[index], result)
            assert result.acknowledged_safety_checks == (batch[index].pending_safety_checks or [])
        ran_clicks = [(a["x"], a["y"]) for a in agent.sent]
        expected = [(a["x"], a["y"]) for b in batch[:stop] for a in b.actions]
        assert ran_clicks == expected
        assert outcome.not_run == [b.call_id for b in batch[stop:]]


@pytest.mark.parametrize("answer", [1, "yes", "Yes", object()])
def test_only_exactly_true_approves(answer):
    agent = MemoryAgent()
    driver = SandboxDriver(agent, ScreenshotPolicy(max_width=64, max_height=40))
    executor = ComputerCallExecutor(driver, lambda c: answer, console=Console(file=io.StringIO()))
    outcome = asyncio.run(executor.run_batch([call("call_a", [click(1, 1)], CHECKS), call("call_b", [click(2, 2)])]))
    assert outcome.stopped == "denied" and outcome.results == [] and agent.sent == []
    assert outcome.not_run == ["call_a", "call_b"]


def test_a_call_the_record_shows_attempted_is_not_run_again(tmp_path):
    earlier = record_in(tmp_path, "earlier")
    earlier.write(Action(call_id="call_a", action="click", duration_ms=3.0))  # a crash after this driver call
    earlier.write(Approval(what="safety_check", decision="approved", by="terminal", call_id="call_x"))
    earlier.close()
    assert attempted_calls([earlier.dir]) == {"call_a", "call_x"}

    agent = MemoryAgent()
    executor, decisions, console = _executor(agent, ["y", "y"], tmp_path, earlier_records=[earlier.path])
    batch = [call("call_a", [click(1, 1), click(2, 2)], CHECKS), call("call_b", [click(3, 3)])]
    outcome = asyncio.run(executor.run_batch(batch))
    assert outcome.stopped == "already_attempted" and outcome.stopped_at == 0 and outcome.results == []
    assert agent.sent == []  # nothing of the batch reached the guest
    assert "look at the screen again" in console.getvalue()
    own = read_entries(executor.hooks.record.path)
    withdrawn = [(e.call_id, e.decision, e.by) for e in own if e.type == "approval"]
    assert withdrawn == [("call_a", "withdrawn", "cancel"), ("call_b", "withdrawn", "cancel")]
    # an approved safety-check decision counts as an attempt too
    agent2 = MemoryAgent()
    executor2, _, _ = _executor(agent2, ["y"], tmp_path, earlier_records=[earlier.path], name="run2")
    assert asyncio.run(executor2.run_batch([call("call_x", [click(1, 1)])])).stopped == "already_attempted"
    assert agent2.sent == []


def test_a_record_that_cannot_be_read_runs_nothing(tmp_path):
    broken = tmp_path / "broken" / "record.jsonl"
    broken.parent.mkdir()
    broken.write_text("{not json\n")
    agent = MemoryAgent()
    executor, _, _ = _executor(agent, ["y"], tmp_path, earlier_records=[broken])
    with pytest.raises(ValueError, match="not JSON"):
        asyncio.run(executor.run_batch([call("call_a", [click(1, 1)])]))
    assert agent.sent == []


def test_the_run_record_gets_the_calls_actions_and_screenshot(tmp_path):
    agent = MemoryAgent()
    executor, decisions, _ = _executor(agent, ["y"], tmp_path)
    outcome = asyncio.run(executor.run_batch([call("call_a", [click(1, 1), {"type": "type", "text": "secret"}],
                                                   CHECKS)]))
    assert outcome.complete
    entries = read_entries(executor.hooks.record.path)
    kinds = [(e.type, getattr(e, "call_id", None)) for e in entries if e.type != "run_started"]
    # the first capture (no model space yet in this process), the call, its approval, 2 actions + screenshot
    assert kinds == [("screenshot", None), ("computer_call", "call_a"), ("approval", "call_a"),
                     ("action", "call_a"), ("action", "call_a"), ("screenshot", "call_a"), ("action", "call_a")]
    assert "secret" not in executor.hooks.record.path.read_text()
    assert [(d.decision, d.by) for d in decisions] == [("approved", "terminal")]


@pytest.mark.parametrize("batch", [
    [call("call_a", [click(1, 1)]), call("call_a", [click(2, 2)])],
    [call("call_a", [click(1, 1)]), call("call_b", [click(2, 2)], id="cu_call_a")],
], ids=["same-call-id", "same-item-id"])
def test_a_batch_that_holds_one_call_twice_runs_nothing(batch):
    agent = MemoryAgent()
    executor, _, _ = _executor(agent, [])
    with pytest.raises(ValueError, match="appears twice in the batch"):
        asyncio.run(executor.run_batch(batch))
    assert agent.sent == []


def test_a_call_given_again_in_a_later_batch_is_not_run_again_even_without_a_record():
    agent = MemoryAgent()
    driver = SandboxDriver(agent, ScreenshotPolicy(max_width=64, max_height=40))
    executor = ComputerCallExecutor(driver, lambda c: True, console=Console(file=io.StringIO()))
    first = asyncio.run(executor.run_batch([call("call_a", [click(1, 1)])]))
    assert first.complete and agent.sent == [click(1, 1)]
    again = asyncio.run(executor.run_batch([call("call_a", [click(1, 1)])]))
    assert again.stopped == "already_attempted" and agent.sent == [click(1, 1)]
