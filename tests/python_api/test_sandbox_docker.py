"""The public Python API (:mod:`desktop_sandbox`) on a real Docker sandbox: a point read off a scaled
screenshot lands on the screen pixel the mapping rule says (the guest's event probe sees it), bad input
is refused with nothing sent and the sandbox still usable, a confirmed action waits for the approver
(a no: nothing reaches the desktop), every call is in the run record, and closing removes the sandbox.
One sandbox for the module (a 1600x1000 screen: the 640 px screenshot is scaled by 2.5)."""

from __future__ import annotations

import asyncio
from typing import Any, Iterator

import pytest

from tests.docker._conformance import CONFORMANCE_APPS
from tests.docker.conftest import IMAGE, SESSION_ID, TEST_LABEL
from tests.python_api._probe import probe_events, wait

LOG = "/home/sandbox/api-probe.jsonl"


@pytest.fixture(scope="module")
def answers() -> dict[str, Any]:
    """What the approver says next (``verdict``) and every request it was asked (``asked``)."""
    return {"verdict": False, "asked": []}


@pytest.fixture(scope="module")
def sandbox(docker_client, desktop_image, answers, tmp_path_factory) -> Iterator[Any]:
    from desktop_sandbox import Sandbox

    def approver(request: Any) -> bool:
        answers["asked"].append(request)
        return answers["verdict"]

    runs = tmp_path_factory.mktemp("runs")
    sb = Sandbox.start(screen=(1600, 1000), image=IMAGE, runs_dir=runs, confirm_actions=["double_click"],
                       approver=approver, apps=[("probe", "--log", LOG)],
                       options={"apps_file": CONFORMANCE_APPS, "extra_labels": {TEST_LABEL: SESSION_ID}})
    try:
        wait(lambda: any(e["type"] == "ready" for e in _events(sb)), "the probe's ready line")
        yield sb
    finally:
        sb.close()


def _events(sb: Any) -> list[dict[str, Any]]:
    return probe_events(sb, LOG)


def _presses_after(sb: Any, mark: int) -> list[dict[str, Any]]:
    return [e for e in _events(sb)[mark:] if e["type"] == "ButtonPress"]


def test_a_point_of_a_scaled_screenshot_lands_where_the_rule_says(sandbox):
    shot = sandbox.screenshot(max_width=640)
    assert (shot.width, shot.height) == (640, 400) and shot.frame == (0, 0, 1600, 1000)
    assert shot.mime == "image/png" and shot.data.startswith(b"\x89PNG")
    for mx, my in ((101, 203), (639, 399), (0, 0)):
        mark = len(_events(sandbox))
        sandbox.click(mx, my)
        expect = shot.to_screen(mx, my)
        assert expect == (min(round(mx * 2.5 + 1e-9), 1599), min(int(my * 2.5 + 0.5), 999))
        press = wait(lambda: _presses_after(sandbox, mark), "the click")[0]
        assert (press["x"], press["y"]) == expect


def test_a_crop_is_a_zoom_at_full_resolution(sandbox):
    shot = sandbox.screenshot(crop=(800, 500, 200, 100), max_width=None, max_height=None)
    assert (shot.width, shot.height) == (200, 100) and shot.frame == (800, 500, 200, 100)
    mark = len(_events(sandbox))
    sandbox.click(10, 20)
    press = wait(lambda: _presses_after(sandbox, mark), "the click")[0]
    assert (press["x"], press["y"]) == (810, 520)


def test_bad_input_is_refused_with_nothing_sent_and_the_sandbox_stays_usable(sandbox):
    from desktop_sandbox import DriverError, OutOfModelBounds

    sandbox.screenshot(max_width=640)
    mark = len(_events(sandbox))
    with pytest.raises(OutOfModelBounds):
        sandbox.click(640, 10)  # one past the image's last column
    with pytest.raises(OutOfModelBounds):
        sandbox.actions([{"type": "move", "x": 5, "y": 5}, {"type": "click", "x": -1, "y": 5, "button": "left"}])
    with pytest.raises(DriverError):
        sandbox.actions([{"type": "teleport", "x": 1, "y": 1}])
    sandbox.move(320, 200)  # usable: the next call goes through
    moved = wait(lambda: [e for e in _events(sandbox)[mark:] if e["type"] == "MotionNotify"], "the move")
    assert (moved[-1]["x"], moved[-1]["y"]) == (800, 500)
    assert _presses_after(sandbox, mark) == [] and len(moved) >= 1


def test_a_confirmed_action_waits_for_the_approver(sandbox, answers):
    from desktop_sandbox import ActionDenied

    sandbox.screenshot(max_width=640)
    answers["verdict"] = False
    mark = len(_events(sandbox))
    with pytest.raises(ActionDenied):
        sandbox.double_click(100, 100)
    assert answers["asked"] and answers["asked"][-1].kind == "action"
    sandbox.move(1, 1)  # a sentinel: every event before it is logged once it is
    wait(lambda: [e for e in _events(sandbox)[mark:] if e["type"] == "MotionNotify" and e["x"] in (2, 3)], "move")
    assert _presses_after(sandbox, mark) == []  # the denied double click reached nothing
    answers["verdict"] = True
    mark = len(_events(sandbox))
    sandbox.double_click(100, 100)
    presses = wait(lambda: len(_presses_after(sandbox, mark)) >= 2 and _presses_after(sandbox, mark), "2 presses")
    assert {(p["x"], p["y"]) for p in presses} == {(250, 250)}


def test_the_async_form_drives_the_same_sandbox(sandbox):
    from desktop_sandbox import AsyncSandbox

    async def go() -> tuple[Any, int]:
        sb = AsyncSandbox(sandbox)
        shot = await sb.screenshot(max_width=320)
        mark = len(_events(sandbox))
        await sb.click(32, 20)
        return shot, mark

    shot, mark = asyncio.run(go())
    assert (shot.width, shot.height) == (320, 200)
    press = wait(lambda: _presses_after(sandbox, mark), "the click")[0]
    assert (press["x"], press["y"]) == (160, 100)


def test_the_calls_are_in_the_run_record_and_close_removes_the_sandbox(sandbox, docker_client):
    from controller.run.record import read_entries

    sandbox.type("typed secret")
    record = sandbox.record_dir / "record.jsonl"
    sandbox_id = sandbox.id
    sandbox.close()
    entries = [e.model_dump() for e in read_entries(record)]
    started = entries[0]
    assert started["type"] == "run_started" and started["mode"] == "attended" and started["runner"] == "python"
    calls = [e for e in entries if e["type"] == "computer_call"]
    assert any(c["actions"][0]["type"] == "click" for c in calls)
    typed = [c for c in calls if c["actions"][0]["type"] == "type"]
    assert typed and typed[-1]["actions"][0] == {"type": "type", "text_length": 12}
    assert "typed secret" not in record.read_text()
    assert any(e["type"] == "approval" and e["decision"] == "denied" for e in entries)
    assert entries[-1]["type"] == "run_finished" and entries[-1]["status"] == "passed"
    left = docker_client.containers.list(all=True, filters={"label": f"desktop-sandbox.sandbox={sandbox_id}"})
    assert left == []
    from desktop_sandbox import SandboxClosed

    with pytest.raises(SandboxClosed):
        sandbox.click(1, 1)
