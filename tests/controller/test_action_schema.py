"""One action schema (wire.actions), handled by every layer: for each action type the schema lists,
the guest's executor has a handler and the guest API runs an instance; the driver maps it (and every
computer action class of the openai SDK, GA and legacy) to the schema in screen px and the guest runs
it; the scripted server accepts it in a script and answers it; the progress lines, approvals and the
CLI describe or offer it. A type added to the schema but missed by a layer fails here."""

from __future__ import annotations

import json
import subprocess
import sys
import typing
from pathlib import Path

import pytest
from openai.types.responses import computer_action as sdk_ga
from openai.types.responses import response_computer_tool_call as sdk_legacy

from tests.helpers import FnSeam
from controller.commands import run_task
from controller.agent_client import AgentClient
from controller.offline.scripted_server import ScriptedModel, load_script
from controller.run.approvals import ActionGate, describe_action
from controller.run.driver import SandboxDriver, ScreenshotPolicy
from controller.run.progress import summarize_action
from guest.actions import Executor
from guest.capture import Capture
from guest.display import DisplayConnection
from guest.localrun import AgentProcess
from wire.actions import (ACTION_ADAPTER, ACTION_MODELS, ACTION_TYPES, MODELS, ActionInvalid, BaseAction,
                          parse_action)

SDK_CLASSES = [*typing.get_args(typing.get_args(sdk_ga.ComputerAction)[0]),
               *typing.get_args(typing.get_args(sdk_legacy.Action)[0])]
MODEL_SIZE = (640, 400)
"""The model image size the driver tests use: half the 1280x800 test screen, so screen px = 2 x model px."""


def _sdk_type(cls: type) -> str:
    return typing.get_args(cls.model_fields["type"].annotation)[0]


def _example(kind: str) -> dict:
    return json.loads(json.dumps(MODELS[kind].example))


def _on_screen(kind: str) -> dict:
    """The example of ``kind`` as the agent should receive it from the driver: points doubled."""
    action = parse_action(_example(kind))
    return action.with_points([(2 * x, 2 * y) for x, y in action.points()]).to_wire()


@pytest.fixture(scope="module")
def agent(xvfb):
    proc = AgentProcess(xvfb.display).start()
    yield proc
    proc.stop()


@pytest.fixture
def driver(client):
    forwarded: list[list[dict]] = []
    drv = SandboxDriver(client, ScreenshotPolicy(max_width=MODEL_SIZE[0], max_height=MODEL_SIZE[1], settle=False),
                        seam=FnSeam(forward=forwarded.append))
    drv.forwarded = forwarded  # type: ignore[attr-defined]
    drv.capture()
    assert drv.model_space.image_width == MODEL_SIZE[0] and drv.model_space.image_height == MODEL_SIZE[1]
    return drv


def test_the_schema_lists_each_model_once_with_a_valid_example():
    assert list(ACTION_TYPES) == list(MODELS) and len(ACTION_TYPES) == len(ACTION_MODELS) == len(set(ACTION_TYPES))
    for kind, model in MODELS.items():
        assert issubclass(model, BaseAction)
        assert ACTION_ADAPTER.validate_python(model.example).type == kind
        assert parse_action(model.example).type == kind
        assert parse_action(_on_screen(kind)).points() == [(2 * x, 2 * y) for x, y in
                                                           parse_action(model.example).points()]
    with pytest.raises(ActionInvalid, match="one of " + ", ".join(ACTION_TYPES)):
        parse_action({"type": "teleport"})


def test_the_schema_imports_neither_side_nor_their_dependencies():
    code = ("import sys, wire.actions; print(sorted({m.split('.')[0] for m in sys.modules} & "
            "{'guest', 'controller', 'openai', 'fastapi', 'uvicorn', 'Xlib', 'mss', 'mitmproxy', 'rich', 'PIL'}))")
    out = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[2], capture_output=True,
                         text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


# -- the guest ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ACTION_TYPES)
def test_the_guest_executor_has_a_handler_for_each_type(xvfb, kind):
    conn, capture = DisplayConnection(xvfb.display), Capture(xvfb.display)
    try:
        assert callable(Executor(conn, capture).handler(kind))
    finally:
        conn.drop()
        capture.close()


@pytest.mark.parametrize("kind", ACTION_TYPES)
def test_the_guest_api_runs_each_type(client, kind):
    assert client.actions([_example(kind)]) == 1


# -- the driver --------------------------------------------------------------------------------------

@pytest.mark.parametrize("cls", SDK_CLASSES, ids=lambda c: f"{c.__module__.rsplit('.', 1)[-1]}.{c.__name__}")
def test_the_driver_maps_each_sdk_action_class_through_the_schema(driver, cls):
    kind = _sdk_type(cls)
    assert kind in ACTION_TYPES, f"the SDK's {cls.__name__} ({kind!r}) is not in the schema"
    sdk_action = cls.model_validate(_example(kind))
    assert driver.to_screen_action(sdk_action) == _on_screen(kind)
    if kind == "screenshot":  # the SDK asks for the image itself: ComputerDriver.screenshot()
        assert driver.screenshot()["image_url"].startswith("data:image/png;base64,")
        return
    getattr(driver, kind)(sdk_action)  # the ComputerDriver method the SDK calls; the guest runs it
    assert driver.forwarded == [[_on_screen(kind)]] and driver.last_error is None


@pytest.mark.parametrize("kind", ACTION_TYPES)
def test_the_driver_maps_each_type_and_the_guest_runs_it(driver, kind):
    mapped = driver.to_screen_action(_example(kind))
    assert mapped == _on_screen(kind)
    driver._send([mapped])
    assert driver.forwarded == [[_on_screen(kind)]] and driver.last_error is None


# -- the scripted server -----------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ACTION_TYPES)
def test_the_scripted_server_accepts_and_answers_each_type(tmp_path: Path, kind):
    script = tmp_path / "s.jsonl"
    script.write_text(json.dumps({"actions": [_example(kind)]}) + "\n"
                      + json.dumps({"action": _example(kind)}) + "\n" + json.dumps({"message": "done"}) + "\n")
    turns = load_script(script)
    status, body = ScriptedModel(turns).answer({"model": "m", "input": "go", "tools": [{"type": "computer"}]})
    assert status == 200, body
    [call] = [item for item in body["output"] if item["type"] == "computer_call"]
    assert call["actions"] == [_example(kind)]


# -- descriptions: progress lines, approvals, the CLI ------------------------------------------------

@pytest.mark.parametrize("kind", ACTION_TYPES)
def test_progress_and_approvals_describe_each_type(kind):
    example = _example(kind)
    line = summarize_action(example)
    assert line.split()[0] == kind and line == describe_action(example, redact=True)
    for name, value in example.items():
        if name == "type":
            continue
        if name == "text":
            assert f"<{len(value)} chars>" in line and value not in line
            assert repr(value) in describe_action(example)
        elif name == "keys":
            assert "+".join(value) in line
        elif name in ("x", "y"):
            assert f"({example['x']},{example['y']})" in line
        elif isinstance(value, list):  # a path: its first and last point
            first, last = value[0], value[-1]
            assert f"({first['x']},{first['y']})->({last['x']},{last['y']}) {len(value)} points" in line
        else:
            assert str(value) in line, (name, line)
    asked: list[str] = []
    assert ActionGate(confirm={kind}, asker=lambda q: asked.append(q) or "y")(example) is True
    assert asked == [f"Run {describe_action(example)}?"]


@pytest.mark.parametrize("kind", ACTION_TYPES)
def test_the_cli_offers_each_type_to_confirm(kind):
    assert kind in run_task.ACTION_TYPES


def test_the_architecture_doc_carries_the_action_reference_rendered_from_the_schema():
    import re
    from pathlib import Path

    from wire import actions

    doc = (Path(__file__).resolve().parents[2] / "docs" / "ARCHITECTURE.md").read_text()
    block = re.search(r"<!-- action-reference:start -->\n(.*?)<!-- action-reference:end -->", doc, re.S)
    assert block, "docs/ARCHITECTURE.md lost its action-reference block"
    assert block.group(1) == actions.reference_markdown(), "run: python -m wire.actions, paste into the doc"
    for kind in actions.ACTION_TYPES:
        assert f"| `{kind}` |" in block.group(1)


def test_key_names_and_scroll_amounts_are_bounded_for_every_action_that_takes_them():
    """A key name over MAX_KEY_NAME_CHARS and a scroll amount past MAX_SCROLL_PX are refused by the schema
    itself, whichever action carries them, before the guest sees them (a huge scroll once made its arithmetic
    overflow, a long key name filled the record)."""
    from wire.actions import MAX_CHORD_KEYS, MAX_KEY_NAME_CHARS, MAX_SCROLL_PX, ActionInvalid, parse_action

    long_name = "A" * (MAX_KEY_NAME_CHARS + 1)
    with_keys = [{"type": "click", "x": 1, "y": 1, "button": "left"}, {"type": "double_click", "x": 1, "y": 1},
                 {"type": "move", "x": 1, "y": 1}, {"type": "scroll", "x": 1, "y": 1, "scroll_x": 0, "scroll_y": 0},
                 {"type": "drag", "path": [{"x": 1, "y": 1}, {"x": 2, "y": 2}]}, {"type": "keypress", "keys": ["a"]}]
    for action in with_keys:
        parse_action({**action, "keys": ["shift"]})  # a short name is fine
        for keys in ([long_name], ["a"] * (MAX_CHORD_KEYS + 1)):
            with pytest.raises(ActionInvalid):
                parse_action({**action, "keys": keys})
    for axis in ("scroll_x", "scroll_y"):
        for amount in (MAX_SCROLL_PX, -MAX_SCROLL_PX):
            parse_action({"type": "scroll", "x": 1, "y": 1, "scroll_x": 0, "scroll_y": 0, axis: amount})
        for amount in (MAX_SCROLL_PX + 1, -MAX_SCROLL_PX - 1, 10 ** 400):
            with pytest.raises(ActionInvalid):
                parse_action({"type": "scroll", "x": 1, "y": 1, "scroll_x": 0, "scroll_y": 0, axis: amount})


def test_the_guests_fast_path_and_a_persons_actions_derive_from_the_action_models():
    from controller.model.marks import POINTED
    from controller.run.live import HUMAN_ACTIONS
    from guest.actions import QUICK_TYPES, quick

    assert QUICK_TYPES == {"click", "double_click", "move", "scroll", "keypress", "screenshot"}
    assert HUMAN_ACTIONS == ("click", "double_click", "drag", "keypress", "move", "scroll", "type")
    assert POINTED == ("click", "double_click", "move", "scroll")
    assert quick([{"type": "click"}, {"type": "keypress"}]) and not quick([{"type": "click"}, {"type": "drag"}])
