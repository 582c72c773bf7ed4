"""The real SDK loop (openai.ComputerToolset) -> SandboxDriver -> real agent on Xvfb, with the real
openai.OpenAI client talking to the scripted Responses server on loopback. What reached the guest
is read from the probe window's event log; what the model side received, from the server."""

from __future__ import annotations

import base64
import re

import pytest
from openai import ComputerToolset
from openai.lib.computer import ComputerUseError

from tests.helpers import FnSeam
from controller.run.approvals import SafetyCheckApprover
from controller.run.driver import SandboxDriver, ScreenshotPolicy
from controller.run.runner import build_params
from controller.run.tasks import FileCheck, Task

TASK = Task(name="loop-test", instructions="test",
            checks=[FileCheck(kind="file", path="~/unused", match="text", value="")])
CHECKS = [
    {"id": "sc_1", "code": "malicious_instructions", "message": "The page may contain instructions."},
    {"id": "sc_2", "code": "sensitive_domain", "message": "This looks like a bank."},
]


def start(driver: SandboxDriver, legacy: bool = False) -> dict:
    return build_params(TASK, "scripted", driver.capture(), legacy)


def buttons(events, kind="ButtonPress"):
    return [(e["button"], e["x"], e["y"]) for e in events if e["type"] == kind]


def outputs(request: dict) -> list[dict]:
    return [i for i in request["input"] if isinstance(i, dict) and i.get("type") == "computer_call_output"]


def test_batched_actions_reach_the_guest_mapped_from_model_space(desk, scripted):
    driver = SandboxDriver(desk.client, ScreenshotPolicy(max_width=640, max_height=400))  # factor 2
    server, client, meter = scripted([
        {"actions": [
            {"type": "click", "x": 100, "y": 50, "button": "left"},
            {"type": "double_click", "x": 200, "y": 100},
            {"type": "click", "x": 639, "y": 399, "button": "right"},
            {"type": "scroll", "x": 10, "y": 20, "scroll_x": 0, "scroll_y": -200},
            {"type": "type", "text": "hi"},
        ]},
        {"message": "done"},
    ])
    mark = desk.probe.mark()
    response = ComputerToolset(driver).run(client, start(driver), max_steps=5)
    assert response.output_text == "done"
    events = desk.settle(mark)
    assert buttons(events) == [(1, 200, 100), (1, 400, 200), (1, 400, 200), (3, 1278, 798), (4, 20, 40),
                               (4, 20, 40)]
    typed = [e["keysym_name"] for e in events if e["type"] == "KeyPress"]
    assert typed == ["h", "i"]
    # the model side got one screenshot per call, in model px, as a data URL
    second = server.model.requests[1]
    (out,) = outputs(second)
    url = out["output"]["image_url"]
    assert url.startswith("data:image/png;base64,")
    assert meter.totals()["requests"] == 2 and meter.totals()["complete"]


def test_legacy_single_action_call(desk, scripted, driver):
    server, client, _ = scripted([
        {"action": {"type": "click", "x": 321, "y": 123, "button": "left"}, "pending_safety_checks": []},
        {"message": "ok"},
    ])
    mark = desk.probe.mark()
    ComputerToolset(driver).run(client, start(driver, legacy=True), max_steps=3)
    assert buttons(desk.settle(mark)) == [(1, 321, 123)]
    assert server.model.requests[0]["tools"][0]["type"] == "computer_use_preview"
    assert len(outputs(server.model.requests[1])) == 1


def test_approved_checks_are_acknowledged_with_ids_codes_messages_in_order(desk, scripted, driver):
    server, client, _ = scripted([
        {"actions": [{"type": "click", "x": 50, "y": 60, "button": "left"}], "pending_safety_checks": CHECKS},
        {"message": "ok"},
    ])
    decisions = []
    asked = []
    approver = SafetyCheckApprover(asker=lambda q: asked.append(q) or "yes", on_decision=decisions.append)
    mark = desk.probe.mark()
    ComputerToolset(driver).run(client, start(driver), max_steps=3, approve_safety_checks=approver)
    assert buttons(desk.settle(mark)) == [(1, 50, 60)]
    (out,) = outputs(server.model.requests[1])
    assert out["acknowledged_safety_checks"] == CHECKS
    assert len(asked) == 1
    assert [(d.decision, d.by, d.codes, d.check_ids) for d in decisions] == [
        ("approved", "terminal", ["malicious_instructions", "sensitive_domain"], ["sc_1", "sc_2"])]


def test_opt_in_codes_approve_only_when_every_check_is_covered(desk, scripted, driver):
    server, client, _ = scripted([
        {"actions": [{"type": "click", "x": 5, "y": 6, "button": "left"}], "pending_safety_checks": CHECKS},
        {"message": "ok"},
    ])
    partial = SafetyCheckApprover(asker=None, auto_codes={"malicious_instructions"})
    mark = desk.probe.mark()
    with pytest.raises(ComputerUseError, match="approval"):
        ComputerToolset(driver).run(client, start(driver), max_steps=3, approve_safety_checks=partial)
    assert desk.settle(mark) == []
    full = SafetyCheckApprover(asker=None, auto_codes={"malicious_instructions", "sensitive_domain"})
    mark = desk.probe.mark()
    ComputerToolset(driver).run(client, start(driver), max_steps=3, approve_safety_checks=full)
    assert buttons(desk.settle(mark)) == [(1, 5, 6)]
    assert outputs(server.model.requests[-1])[0]["acknowledged_safety_checks"] == CHECKS


@pytest.mark.parametrize("answer", ["n", "", "Y es", "true", None])
def test_denied_call_sends_no_input_and_acknowledges_nothing(desk, scripted, driver, answer):
    server, client, _ = scripted([
        {"actions": [{"type": "click", "x": 50, "y": 60, "button": "left"},
                     {"type": "type", "text": "secret"}], "pending_safety_checks": CHECKS[:1]},
        {"message": "ok"},
    ])
    decisions = []
    approver = SafetyCheckApprover(asker=lambda q: answer, on_decision=decisions.append)
    mark = desk.probe.mark()
    with pytest.raises(ComputerUseError, match="approval"):
        ComputerToolset(driver).run(client, start(driver), max_steps=3, approve_safety_checks=approver)
    assert desk.settle(mark) == []  # zero input events reached the guest
    assert len(server.model.requests) == 1  # nothing was sent back, so nothing acknowledged
    assert decisions[0].decision == "denied"


def test_no_terminal_and_no_approver_denies_with_a_clear_message(desk, scripted, driver, capsys):
    from rich.console import Console

    server, client, _ = scripted([
        {"actions": [{"type": "click", "x": 50, "y": 60, "button": "left"}], "pending_safety_checks": CHECKS},
        {"message": "ok"},
    ])
    decisions = []
    approver = SafetyCheckApprover(asker=None, console=Console(file=None, stderr=True, width=200),
                                   on_decision=decisions.append)
    mark = desk.probe.mark()
    with pytest.raises(ComputerUseError):
        ComputerToolset(driver).run(client, start(driver), max_steps=3, approve_safety_checks=approver)
    assert desk.settle(mark) == []
    err = capsys.readouterr().err
    assert "no terminal" in err and "--approve-safety-check" in err
    assert "malicious_instructions" in err and "This looks like a bank." in err and "click" in err
    assert decisions[0].by == "no-approver" and decisions[0].decision == "denied"


def test_max_steps_stops_before_the_last_call_runs(desk, scripted, driver):
    server, client, _ = scripted([
        {"actions": [{"type": "move", "x": 11, "y": 12}]},
        {"actions": [{"type": "move", "x": 21, "y": 22}]},
        {"actions": [{"type": "move", "x": 31, "y": 32}]},
        {"message": "never reached"},
    ])
    mark = desk.probe.mark()
    with pytest.raises(ComputerUseError, match="max_steps"):
        ComputerToolset(driver).run(client, start(driver), max_steps=2)
    moves = [(e["x"], e["y"]) for e in desk.settle(mark) if e["type"] == "MotionNotify"]
    assert (11, 12) in moves and (21, 22) not in moves and (31, 32) not in moves
    assert len(server.model.requests) == 2


def test_cancellation_stops_between_actions(desk, scripted, driver):
    server, client, _ = scripted([
        {"actions": [{"type": "move", "x": 41, "y": 42}, {"type": "move", "x": 51, "y": 52},
                     {"type": "move", "x": 61, "y": 62}]},
        {"message": "never reached"},
    ])
    flag = {"set": False}

    def observe(event):
        if event["stage"] == "action" and event["reason"] == "completed":
            flag["set"] = True  # as Ctrl-C would, after the first action

    mark = desk.probe.mark()
    with pytest.raises(ComputerUseError, match="cancelled"):
        ComputerToolset(driver).run(client, start(driver), max_steps=5, cancelled=lambda: flag["set"],
                                    on_diagnostic=observe)
    moves = [(e["x"], e["y"]) for e in desk.settle(mark) if e["type"] == "MotionNotify"]
    assert (41, 42) in moves and (51, 52) not in moves and (61, 62) not in moves
    assert len(server.model.requests) == 1


def test_missing_usage_makes_the_total_incomplete(desk, scripted, driver):
    _, client, meter = scripted([
        {"actions": [{"type": "wait"}], "usage": None},
        {"message": "ok"},
    ])
    ComputerToolset(driver).run(client, start(driver), max_steps=3)
    totals = meter.totals()
    assert totals["requests"] == 2 and totals["complete"] is False and totals["missing"] == 1
    assert totals["total_tokens"] > 0


_DATA_URL = re.compile(r"^data:(image/(?:png|jpeg));base64,([A-Za-z0-9+/]+={0,2})$")


@pytest.mark.parametrize("fmt, mime, magic", [("png", "image/png", b"\x89PNG\r\n\x1a\n"),
                                              ("jpeg", "image/jpeg", b"\xff\xd8\xff")])
def test_screenshot_is_exactly_one_data_url_matching_its_bytes(desk, fmt, mime, magic):
    import io

    from PIL import Image

    driver = SandboxDriver(desk.client, ScreenshotPolicy(format=fmt, max_width=1000, max_height=1000))
    shot = driver.screenshot()
    assert set(shot) == {"type", "image_url"} and shot["type"] == "computer_screenshot"
    url = shot["image_url"]
    assert url.count("data:") == 1 and url.count(",") == 1
    m = _DATA_URL.match(url)
    assert m and m.group(1) == mime
    data = base64.b64decode(m.group(2), validate=True)
    assert data.startswith(magic)
    with Image.open(io.BytesIO(data)) as img:
        assert img.format == fmt.upper()
        assert img.size == (1000, 625)  # 1280x800 fitted into 1000x1000
    assert (driver.model_space.image_width, driver.model_space.image_height) == (1000, 625)


def test_size_cap_reencodes_and_the_mapping_follows(desk):
    # a busy screen so PNG is large: the probe's own pattern is plain, so draw noise via a JPEG cap
    driver = SandboxDriver(desk.client, ScreenshotPolicy(format="png", max_width=1280, max_height=800,
                                                         max_bytes=3000))
    shot = driver.capture()
    assert shot.reencoded and shot.mime == "image/jpeg" and len(shot.data) <= 3000
    w, h = shot.image_size
    assert w < 1280 and h < 800 and driver.model_space.image_width == w
    url = driver.screenshot()["image_url"]
    assert url.startswith("data:image/jpeg;base64,")
    # a click at the model image's centre lands at the screen's centre
    mark = desk.probe.mark()
    driver.click({"type": "click", "x": w // 2, "y": h // 2, "button": "left"})
    (press,) = buttons(desk.settle(mark))
    assert abs(press[1] - 640) <= 1280 / w and abs(press[2] - 400) <= 800 / h


def test_crop_and_factor_2_scroll_keeps_sign_and_sends_no_wheel_for_zero(desk):
    driver = SandboxDriver(desk.client, ScreenshotPolicy(max_width=500, max_height=300,
                                                         crop=(100, 50, 1000, 600)))
    shot = driver.capture()
    assert shot.image_size == (500, 300) and (shot.frame.x, shot.frame.y) == (100, 50)
    mark = desk.probe.mark()
    driver.scroll({"type": "scroll", "x": 10, "y": 20, "scroll_x": 0, "scroll_y": -5})
    events = desk.settle(mark)
    assert buttons(events) == [(4, 120, 90)]  # wheel up: the sign is kept; pointer mapped with offset
    moves = [(e["x"], e["y"]) for e in events if e["type"] == "MotionNotify"]
    assert moves[-1] == (120, 90)
    mark = desk.probe.mark()
    driver.scroll({"type": "scroll", "x": 10, "y": 20, "scroll_x": 0, "scroll_y": 0})
    assert buttons(desk.settle(mark)) == []


def test_out_of_model_bounds_sends_nothing_and_names_the_model_size(desk, driver):
    driver.policy = ScreenshotPolicy(max_width=683, max_height=1000)
    driver.capture()
    assert (driver.model_space.image_width, driver.model_space.image_height) == (683, 427)
    mark = desk.probe.mark()
    for bad in ({"type": "click", "x": 683, "y": 10, "button": "left"},
                {"type": "drag", "path": [{"x": 1, "y": 1}, {"x": 5, "y": 427}]}):
        with pytest.raises(ValueError, match="683x427"):
            getattr(driver, bad["type"])(bad)
    assert desk.settle(mark) == []


@pytest.mark.parametrize("action", [
    {"type": "click", "x": 1, "y": 1, "button": "left", "force": True},
    {"type": "drag", "path": [{"x": 1, "y": 1}]},
    {"type": "keypress", "keys": []},
    {"type": "teleport", "x": 1, "y": 1},
])
def test_unsupported_input_raises(desk, driver, action):
    from controller.run.driver import DriverError

    driver.capture()
    forwarded: list[list[dict]] = []
    driver.seam = FnSeam(forward=forwarded.append)
    mark = desk.probe.mark()
    with pytest.raises(DriverError):
        driver.to_screen_action(action)
    # Through the ComputerDriver method the SDK calls (teleport has none; any method checks the type given).
    with pytest.raises(DriverError) as err:
        getattr(driver, action["type"], driver.move)(action)
    assert driver.last_error == str(err.value)
    assert forwarded == [], "nothing may be sent to the agent"
    assert desk.settle(mark) == []


def test_pointer_action_before_any_screenshot_raises(desk):
    from controller.run.driver import ModelSpaceUnknown

    driver = SandboxDriver(desk.client)
    with pytest.raises(ModelSpaceUnknown):
        driver.click({"type": "click", "x": 1, "y": 1, "button": "left"})
