"""The offline scripted server follows a conversation continued with ``previous_response_id`` (as Agent
Framework's Responses client sends it): the turn, the safety-check acknowledgement and the screen
expectations are judged on the whole conversation, as the real API would."""

from __future__ import annotations

import base64
import io

from PIL import Image

from controller.offline.scripted_server import ScriptedModel

CHECK = {"id": "sc_1", "code": "sensitive_action", "message": "Submit?"}
TOOLS = [{"type": "computer"}]


def shot(colour: str = "white") -> str:
    buf = io.BytesIO()
    Image.new("RGB", (64, 40), colour).save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def output(call_id: str, acked: list[dict], colour: str = "white") -> dict:
    return {"type": "computer_call_output", "call_id": call_id, "acknowledged_safety_checks": acked,
            "output": {"type": "computer_screenshot", "image_url": shot(colour)}}


def test_a_continued_request_is_answered_as_the_whole_conversation():
    model = ScriptedModel([
        {"actions": [{"type": "click", "x": 1, "y": 1, "button": "left"}], "pending_safety_checks": [CHECK]},
        {"expect": [{"kind": "color", "x": 0, "y": 0, "w": 4, "h": 4, "rgb": "#000000"}],
         "actions": [{"type": "move", "x": 2, "y": 2}]},
        {"message": "done"},
    ])
    status, first = model.answer({"model": "m", "tools": TOOLS, "input": "go"})
    assert status == 200 and first["output"][0]["call_id"] == "call_0000"
    # only the new item, continuing the first response: turn 1 (not turn 0 again), its check acknowledged
    status, second = model.answer({"model": "m", "tools": TOOLS, "previous_response_id": first["id"],
                                   "input": [output("call_0000", [CHECK], "black")]})
    assert status == 200, second
    assert second["output"][0]["call_id"] == "call_0001"  # turn 1's expectation held on the black screenshot
    status, third = model.answer({"model": "m", "tools": TOOLS, "previous_response_id": second["id"],
                                  "input": [output("call_0001", [])]})
    assert status == 200 and third["output"][0]["content"][0]["text"] == "done"
    # the acknowledgement is still checked against the call the chain holds
    status, refused = model.answer({"model": "m", "tools": TOOLS, "previous_response_id": first["id"],
                                    "input": [output("call_0000", [])]})
    assert status == 400 and refused["error"]["code"] == "safety_checks_not_acknowledged"


def test_an_unknown_or_unstored_previous_response_is_refused():
    model = ScriptedModel([{"actions": [{"type": "wait"}]}, {"message": "done"}])
    status, body = model.answer({"model": "m", "tools": TOOLS, "previous_response_id": "resp_nope",
                                 "input": [output("call_0000", [])]})
    assert status == 400 and body["error"]["code"] == "previous_response_not_found"
    status, unstored = model.answer({"model": "m", "tools": TOOLS, "input": "go", "store": False})
    assert status == 200
    status, body = model.answer({"model": "m", "tools": TOOLS, "previous_response_id": unstored["id"],
                                 "input": [output("call_0000", [])]})
    assert status == 400 and body["error"]["code"] == "previous_response_not_found"
    status, body = model.answer({"model": "m", "tools": TOOLS, "previous_response_id": 5, "input": []})
    assert status == 400 and body["error"]["code"] == "invalid_input"
