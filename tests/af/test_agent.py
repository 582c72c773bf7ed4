"""A plain Agent Framework agent (real ``agent-framework-core`` / ``-openai``, one ``AgentSession``)
against the scripted server on loopback, its computer calls run by ComputerCallExecutor on the real
agent on Xvfb; what reached the guest is read from the probe window, what the model side got from the
server's requests."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from agent_framework import Agent
from agent_framework.openai import OpenAIChatClient

from controller.af import AgentComputerUse, StepLimit
from controller.offline.scripted_server import ScriptedModel
from controller.run.record import read_entries
from tests import scripted
from tests.af.batch_model import BatchModel

CHECKS = [{"id": "sc_1", "code": "malicious_instructions", "message": "The page may contain instructions."},
          {"id": "sc_2", "code": "sensitive_domain", "message": "This looks like a bank."}]
CALL = {"actions": [{"type": "click", "x": 101, "y": 51, "button": "left"},
                    {"type": "click", "x": 202, "y": 102, "button": "right"},
                    {"type": "type", "text": "hi"}],
        "pending_safety_checks": CHECKS}


def agent_on(server: Any) -> Any:
    chat = OpenAIChatClient(model="scripted", async_client=scripted.async_client(server))
    return Agent(client=chat, tools=[chat.get_computer_tool()], name="computer")


def inputs(events: list[dict[str, Any]]) -> list[tuple]:
    """Button presses (button, x, y) and key presses (keysym) in the order the guest got them."""
    return [(e["button"], e["x"], e["y"]) if e["type"] == "ButtonPress" else e["keysym_name"]
            for e in events if e["type"] in ("ButtonPress", "KeyPress")]


def outputs(request: dict[str, Any]) -> list[dict[str, Any]]:
    return [i for i in request["input"] if isinstance(i, dict) and i.get("type") == "computer_call_output"]


def _one_call(desk, serve, computer, answer: str):
    """One turn of an agent whose model sends :data:`CALL` then "done", its approval answered ``answer``
    at the terminal: the model, the computer, the computer use, its first session, the probe's mark
    before the turn, and the turn."""
    model = ScriptedModel([CALL, {"message": "done"}])
    server = serve(model)
    c = computer(answer)
    use = AgentComputerUse(agent_on(server), c.executor)
    first_session = use.session
    mark = desk.probe.mark()
    turn = asyncio.run(use.run(c.first_message("go"), max_responses=5))
    return model, c, use, first_session, mark, turn


def test_approved_actions_reach_the_guest_in_order_and_the_next_request_acknowledges_exactly_the_pending_ids(
        desk, serve, computer):
    model, c, use, first_session, mark, turn = _one_call(desk, serve, computer, "y")
    assert turn.stopped is None and turn.response.text == "done" and turn.responses == 2
    assert inputs(desk.settle(mark)) == [(1, 101, 51), (3, 202, 102), "h", "i"]
    assert len(model.requests) == 2 and not model.errors
    second = model.requests[1]
    # the same session: the framework continues the conversation the first response started
    assert second["previous_response_id"].startswith("resp_0000_") and use.session is first_session
    (out,) = outputs(second)
    assert out["call_id"] == "call_0000"
    assert [c["id"] for c in out["acknowledged_safety_checks"]] == ["sc_1", "sc_2"]
    assert out["acknowledged_safety_checks"] == CHECKS
    assert out["output"]["image_url"].startswith("data:image/png;base64,")
    c.finish()
    entries = read_entries(c.record_dir)
    (approval,) = [e for e in entries if e.type == "approval"]
    assert (approval.decision, approval.by, approval.check_ids) == ("approved", "terminal", ["sc_1", "sc_2"])
    assert [e.action for e in entries if e.type == "action"] == ["click", "click", "type", "screenshot"]


def test_a_denied_call_sends_no_input_and_no_result(desk, serve, computer):
    model, c, use, first_session, mark, turn = _one_call(desk, serve, computer, "n")
    assert turn.stopped is not None and turn.stopped.stopped == "denied" and turn.stopped.results == []
    assert desk.settle(mark) == []  # not a click, not a key
    assert len(model.requests) == 1  # no result was sent
    assert use.session is not first_session  # the next turn starts on a new session
    c.finish()
    (approval,) = [e for e in read_entries(c.record_dir) if e.type == "approval"]
    assert (approval.decision, approval.by) == ("denied", "terminal")
    assert not [e for e in read_entries(c.record_dir) if e.type == "action"]


def test_a_batch_is_answered_only_when_every_call_of_it_ran(desk, serve, computer):
    a = {"actions": [{"type": "click", "x": 11, "y": 12, "button": "left"}], "pending_safety_checks": CHECKS[:1]}
    b = {"actions": [{"type": "click", "x": 21, "y": 22, "button": "left"}], "pending_safety_checks": CHECKS[1:]}
    model = BatchModel([[a, b]])
    server = serve(model)
    c = computer(["y", "n"])
    use = AgentComputerUse(agent_on(server), c.executor)
    mark = desk.probe.mark()
    turn = asyncio.run(use.run(c.first_message("go"), max_responses=5))
    assert turn.stopped.stopped == "denied" and turn.stopped.ran == [0] and turn.stopped.not_run == ["call_0b"]
    assert inputs(desk.settle(mark)) == [(1, 11, 12)]  # the first call ran; the denied one did not
    assert len(model.requests) == 1  # nothing of the batch was sent: a part would not answer it


def test_the_legacy_single_action_form_runs_too(desk, serve, computer):
    model = ScriptedModel([{"action": {"type": "click", "x": 321, "y": 123, "button": "left"},
                            "pending_safety_checks": []}, {"message": "ok"}])
    server = serve(model)
    chat = OpenAIChatClient(model="scripted", async_client=scripted.async_client(server))
    tool = {"type": "computer_use_preview", "display_width": 1280, "display_height": 800, "environment": "linux"}
    c = computer(None)
    use = AgentComputerUse(Agent(client=chat, tools=[tool], name="computer"), c.executor)
    mark = desk.probe.mark()
    turn = asyncio.run(use.run(c.first_message("go"), max_responses=3))
    assert turn.stopped is None and turn.response.text == "ok"
    assert inputs(desk.settle(mark)) == [(1, 321, 123)]
    assert model.requests[0]["tools"][0]["type"] == "computer_use_preview"
    assert [o["call_id"] for o in outputs(model.requests[1])] == ["call_0000"] and not model.errors


def test_the_turn_stops_at_its_limit_of_responses(desk, serve, computer):
    turns = [{"actions": [{"type": "click", "x": 10 + i, "y": 10, "button": "left"}]} for i in range(3)]
    model = ScriptedModel(turns + [{"message": "done"}])
    server = serve(model)
    c = computer(None)
    use = AgentComputerUse(agent_on(server), c.executor)
    mark = desk.probe.mark()
    with pytest.raises(StepLimit, match="after 2 responses"):
        asyncio.run(use.run(c.first_message("go"), max_responses=2))
    assert inputs(desk.settle(mark)) == [(1, 10, 10)]  # the second response's call was not run
    assert len(model.requests) == 2
