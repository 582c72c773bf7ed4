"""An Agent Framework workflow (real ``agent-framework-core`` / ``-openai``) whose agent's computer calls
pause it, answered by WorkflowComputerUse on the real agent on Xvfb: a checkpointed batch restored in
another process keeps its ids, order and checks and runs in the original order; one refusal cancels the
whole batch through the framework; a partial acknowledgement is refused; a call already attempted before
the restore is not run again."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from agent_framework import Content, Message
from agent_framework.exceptions import AgentInvalidResponseException

from controller.af import AcknowledgementError, WorkflowComputerUse, check_acknowledgement, computer_requests
from controller.run.record import read_entries
from tests.af.batch_model import BatchModel
from tests.af.flow import build_workflow, describe_outputs, describe_requests
from tests.af.test_agent import inputs, outputs

ROOT = Path(__file__).resolve().parents[2]
CHECKS = [{"id": "sc_a1", "code": "sensitive_action", "message": "This submits a form."},
          {"id": "sc_a2", "code": "sensitive_domain", "message": "This looks like a bank."}]
A = {"actions": [{"type": "click", "x": 31, "y": 41, "button": "left"},
                 {"type": "click", "x": 32, "y": 42, "button": "right"},
                 {"type": "click", "x": 33, "y": 43, "button": "left"}], "pending_safety_checks": CHECKS}
B = {"actions": [{"type": "click", "x": 44, "y": 54, "button": "left"}]}
B_CHECKED = {**B, "pending_safety_checks": [{"id": "sc_b1", "code": "sensitive_action", "message": "Submit?"}]}
A_CLICKS = [(1, 31, 41), (3, 32, 42), (1, 33, 43)]


def start(server: Any, checkpoints: Path, message: Any) -> tuple[Any, Any]:
    """The workflow on ``server``, run until it pauses on the batch: (workflow, its result)."""
    workflow, _ = build_workflow(server.base_url, server.key, checkpoints)
    return workflow, asyncio.run(workflow.run(message))


def resume_elsewhere(server: Any, checkpoints: Path, desk: Any, runs: Path, answer: str, *earlier: Path) -> dict:
    """Restore the latest checkpoint in a new process (tests/af/flow.py) and answer its computer requests."""
    env = dict(os.environ, DS_TEST_AGENT_TOKEN=desk.agent_proc.token, DS_TEST_SCRIPTED_KEY=server.key,
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-m", "tests.af.flow", server.base_url, str(checkpoints),
                           desk.agent_proc.base_url, str(runs), answer, *map(str, earlier)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_checkpointed_batch_restored_in_another_process_runs_with_the_same_ids_order_and_checks(
        desk, serve, computer, tmp_path):
    model = BatchModel([[A, B]])
    server = serve(model)
    _, paused = start(server, tmp_path / "checkpoints", computer(None).first_message("go"))
    before = describe_requests(paused)
    assert [r["call_id"] for r in before] == ["call_0a", "call_0b"]
    mark = desk.probe.mark()
    out = resume_elsewhere(server, tmp_path / "checkpoints", desk, tmp_path / "runs", "y")
    restored = out["restored"]
    assert [{k: r[k] for k in ("request_id", "call_id", "actions", "checks")} for r in restored] == \
        [{k: r[k] for k in ("request_id", "call_id", "actions", "checks")} for r in before]
    assert not any(r["raw"] for r in restored)  # rebuilt from the fields: nothing raw survives a checkpoint
    assert out["outcome"] == {"stopped": None, "ran": [0, 1], "not_run": []}
    assert inputs(desk.settle(mark)) == A_CLICKS + [(1, 44, 54)]
    last = model.requests[-1]
    assert [(o["call_id"], o["acknowledged_safety_checks"]) for o in outputs(last)] == [("call_0a", CHECKS),
                                                                                       ("call_0b", [])]
    assert out["pending"] == [] and out["outputs"][-1][-1]["text"] == "done"
    # the restoring process's record: the restored calls, the person's approval, the actions in order
    entries = read_entries(out["record"])
    assert [e.call_id for e in entries if e.type == "computer_call"] == ["call_0a", "call_0b"]
    assert [(e.call_id, e.decision) for e in entries if e.type == "approval"] == [("call_0a", "approved")]
    assert [(e.call_id, e.action) for e in entries if e.type == "action"] == [
        ("call_0a", "click"), ("call_0a", "click"), ("call_0a", "click"), ("call_0a", "screenshot"),
        ("call_0b", "click"), ("call_0b", "screenshot")]


def _paused_on_a_and_b(serve, computer, answer: str, tmp_path):
    """A workflow whose model asks for calls A and B in one batch, started and paused on them, its
    approvals answered ``answer``: the model, its server, the computer, the workflow and the pause."""
    model = BatchModel([[A, B]])
    server = serve(model)
    c = computer(answer)
    workflow, paused = start(server, tmp_path / "checkpoints", c.first_message("go"))
    return model, server, c, workflow, paused


def test_a_denied_request_cancels_the_rest_of_its_batch(desk, serve, computer, tmp_path):
    model, server, c, workflow, paused = _paused_on_a_and_b(serve, computer, "n", tmp_path)
    mark = desk.probe.mark()
    result = asyncio.run(WorkflowComputerUse(workflow, c.executor).answer(paused))
    assert desk.settle(mark) == []  # neither call reached the guest
    assert computer_requests(result) == []  # nothing left pending: B went with A
    (output,) = describe_outputs(result)
    assert [(o["type"], o["text"]) for o in output] == [
        ("error", "Computer call call_0a was cancelled without a result."),
        ("error", "Computer call call_0b was cancelled without a result.")]
    assert len(model.requests) == 1  # no result was sent


def test_cancelling_the_second_request_keeps_the_first_result_and_the_next_turn_starts_a_new_session(
        desk, serve, computer, tmp_path):
    model = BatchModel([[A, B_CHECKED]])
    server = serve(model)
    c = computer(["y", "n"])
    workflow, _ = build_workflow(server.base_url, server.key, tmp_path / "checkpoints")
    use = WorkflowComputerUse(workflow, c.executor)
    mark = desk.probe.mark()

    async def two_turns() -> Any:
        result = await use.run(c.first_message("go"))  # runs until it pauses on no computer call
        await workflow.run(Message(role="user", contents=[Content.from_text("look again")]))
        return result

    result = asyncio.run(two_turns())
    assert inputs(desk.settle(mark)) == A_CLICKS  # A ran; B, denied, did not
    assert use.outcomes[-1].stopped == "denied" and use.outcomes[-1].ran == [0]
    (output,) = describe_outputs(result)
    assert [(o["type"], o["call_id"]) for o in output] == [("computer_tool_result", "call_0a"), ("error", None)]
    assert [c["id"] for c in output[0]["acknowledged"]] == ["sc_a1", "sc_a2"]
    assert computer_requests(result) == []
    assert len(model.requests) == 2  # nothing of the batch was sent; then the next turn's first request
    assert "previous_response_id" not in model.requests[1]  # the next turn: a new agent session


def test_a_hand_built_partial_acknowledgement_is_rejected(serve, tmp_path):
    model = BatchModel([[A, B]])
    server = serve(model)
    workflow, paused = start(server, tmp_path / "checkpoints", Message(role="user", contents=[Content.from_text("go")]))
    a, b = computer_requests(paused)
    shot = Content.from_uri("data:image/png;base64,iVBORw0KGgo=", media_type="image/png")
    partial = Content.from_computer_tool_result(call_id=a.data.call_id, screenshot=shot,
                                                acknowledged_safety_checks=CHECKS[:1])
    with pytest.raises(AgentInvalidResponseException, match="exactly the pending safety checks"):
        asyncio.run(workflow.run(responses={a.request_id: partial}))
    with pytest.raises(AcknowledgementError, match="exactly those"):
        check_acknowledgement(a.data, partial)
    assert len(model.requests) == 1  # nothing reached the model


def test_a_restored_call_already_attempted_is_not_run_again(desk, serve, computer, tmp_path):
    model, server, c, _, paused = _paused_on_a_and_b(serve, computer, "y", tmp_path)
    # this process runs A and stops before its result is sent (as a crash would): the record has A's actions
    mark = desk.probe.mark()
    first = asyncio.run(c.executor.run_batch([computer_requests(paused)[0].data]))
    assert first.complete and inputs(desk.settle(mark)) == A_CLICKS
    c.finish("error", "stopped after the attempt")
    mark = desk.probe.mark()
    out = resume_elsewhere(server, tmp_path / "checkpoints", desk, tmp_path / "runs", "y", c.record.path)
    assert [r["call_id"] for r in out["restored"]] == ["call_0a", "call_0b"]
    assert out["outcome"] == {"stopped": "already_attempted", "ran": [], "not_run": ["call_0a", "call_0b"]}
    assert desk.settle(mark) == []  # not A again, and not B
    assert "look at the screen again" in out["console"]
    assert out["pending"] == [] and len(model.requests) == 1
    assert [o["type"] for o in out["outputs"][-1]] == ["error", "error"]
