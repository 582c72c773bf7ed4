"""``desktop-sandbox mcp`` over stdio, driven by the ``mcp`` package's own client, on a real Docker sandbox
of a 2560x1600 screen with the input-event probe over all of it (tests/mcp/screen-2560.toml).

One server (one MCP session, one sandbox) for the module, with ``--confirm-actions click``: every click
is asked by elicitation, answered by the client's callback as ``answers["verdict"]`` says. What reaches
the desktop is read off the probe's log through the ``read_file`` tool. The last test ends the session.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import pytest

from controller.mcp.server import TOOLS
from tests.mcp._client import (CONFORMANCE_APPS, SANDBOX_LINE, ThreadedClient, image_of, probe_events, read_record,
                               sandbox_containers, stdio_params, text_of, wait_for)

HERE = Path(__file__).resolve().parent
SCREEN = (2560, 1600)


@pytest.fixture(scope="module")
def answers() -> dict[str, Any]:
    """What the client's elicitation callback answers next (``verdict``: approve | refuse | decline |
    cancel | error) and every message it was asked (``asked``)."""
    return {"verdict": "approve", "asked": []}


@pytest.fixture(scope="module")
def server(docker_client, desktop_image, answers, tmp_path_factory) -> Iterator[dict[str, Any]]:
    from mcp.client.stdio import stdio_client
    from mcp_types import ElicitResult, ErrorData

    work = tmp_path_factory.mktemp("mcp-stdio")
    runs = work / "runs"

    async def elicit(_ctx: Any, params: Any) -> Any:
        answers["asked"].append(params.message)
        verdict = answers["verdict"]
        if verdict in ("approve", "refuse"):
            return ElicitResult(action="accept", content={"approve": verdict == "approve"})
        if verdict == "error":
            return ErrorData(code=-32603, message="the person could not be asked")
        return ElicitResult(action=verdict)

    errlog = (work / "server.stderr").open("w")
    params = stdio_params("--task", str(HERE / "screen-2560.toml"), "--apps-file", CONFORMANCE_APPS,
                          "--confirm-actions", "click", "--runs-dir", str(runs), "--image", desktop_image)
    client = ThreadedClient(stdio_client(params, errlog=errlog), elicit=elicit, name="mcp-stdio-tests")
    state: dict[str, Any] = {"client": client, "runs": runs, "stderr": work / "server.stderr"}
    try:
        state["tools"] = client.run(lambda c: c.list_tools()).tools
        state["records_before_a_call"] = list(runs.glob("*/record.jsonl"))
        wait_for(lambda: any(e["type"] == "ready" for e in probe_events(client)), "the probe's ready line")
        state["sandbox"] = SANDBOX_LINE.search((work / "server.stderr").read_text()).group(1)
        yield state
    finally:
        client.close()
        errlog.close()


def _presses_after(client: ThreadedClient, mark: int) -> list[dict[str, Any]]:
    return [e for e in probe_events(client)[mark:] if e["type"] == "ButtonPress"]


def _settled(client: ThreadedClient, mark: int) -> None:
    """Move to a sentinel point, screen px (2, 3) (a 64x64 region at the origin is shown 1:1), and wait
    until the probe logged it: every event sent before it is logged by then."""
    client.call("screenshot", {"region": [0, 0, 64, 64]})
    assert not client.call("move", {"x": 2, "y": 3}).is_error
    wait_for(lambda: [e for e in probe_events(client)[mark:]
                      if e["type"] == "MotionNotify" and (e["x"], e["y"]) == (2, 3)], "the sentinel move")


def test_the_tools_are_listed_and_the_sandbox_waits_for_the_first_call(server):
    from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS

    assert server["client"].client.protocol_version in HANDSHAKE_PROTOCOL_VERSIONS  # auto mode fell back
    tools = {t.name: t for t in server["tools"]}
    assert tuple(tools) == TOOLS
    shot = tools["screenshot"].description
    assert "1568 px" in shot and "750000 bytes" in shot and "LAST image" in shot
    assert "first tool call" in tools["click"].description
    assert server["records_before_a_call"] == []  # listing the tools started nothing


def test_a_screenshot_of_a_2560x1600_screen_stays_within_the_limits(server):
    client = server["client"]
    result = client.call("screenshot")
    assert not result.is_error, text_of(result)
    data, mime, size = image_of(result)
    assert size == (1568, 980) and max(size) <= 1568 and len(data) <= 750_000
    assert mime == "image/png" and data.startswith(b"\x89PNG")
    meta = result.structured_content
    assert meta == {"width": 1568, "height": 980, "frame": [0, 0, 2560, 1600], "screen_size": [2560, 1600],
                    "mime": "image/png", "bytes": len(data)}
    text = text_of(result)
    assert "1568x980" in text and "x=0 y=0 w=2560 h=1600" in text and "2560x1600 screen" in text


def test_a_point_read_off_the_scaled_image_lands_on_its_screen_pixel(server, answers):
    client = server["client"]
    answers["verdict"] = "approve"
    result = client.call("screenshot")
    _, _, (width, height) = image_of(result)
    for mx, my in ((101, 203), (1567, 979), (0, 0), (784, 490)):
        mark = len(probe_events(client))
        done = client.call("click", {"x": mx, "y": my})
        assert not done.is_error, text_of(done)
        expect = (min(int(mx * 2560 / width + 0.5), 2559), min(int(my * 1600 / height + 0.5), 1599))
        press = wait_for(lambda: _presses_after(client, mark), "the click")[0]
        assert (press["x"], press["y"]) == expect
        assert f"= screen px {expect}" in text_of(done)


def test_a_region_is_a_zoom_at_full_resolution(server, answers):
    client = server["client"]
    answers["verdict"] = "approve"
    result = client.call("screenshot", {"region": [1000, 600, 200, 100]})
    data, _, size = image_of(result)
    assert size == (200, 100) and result.structured_content["frame"] == [1000, 600, 200, 100]
    mark = len(probe_events(client))
    assert not client.call("click", {"x": 10, "y": 20}).is_error
    press = wait_for(lambda: _presses_after(client, mark), "the click")[0]
    assert (press["x"], press["y"]) == (1010, 620)


def test_a_click_waits_for_the_elicitation_and_a_no_sends_nothing(server, answers):
    client = server["client"]
    for verdict in ("decline", "refuse", "cancel", "error"):
        client.call("screenshot")
        answers["verdict"] = verdict
        asked = len(answers["asked"])
        mark = len(probe_events(client))
        result = client.call("click", {"x": 300, "y": 300})
        assert result.is_error and "not approved" in text_of(result), (verdict, text_of(result))
        assert len(answers["asked"]) == asked + 1 and "click (300,300) left" in answers["asked"][-1]
        _settled(client, mark)
        assert _presses_after(client, mark) == [], verdict  # nothing of the refused click reached the desktop
    answers["verdict"] = "approve"
    client.call("screenshot")
    mark = len(probe_events(client))
    assert not client.call("click", {"x": 300, "y": 300}).is_error
    press = wait_for(lambda: _presses_after(client, mark), "the approved click")[0]
    assert (press["x"], press["y"]) == (int(300 * 2560 / 1568 + 0.5), int(300 * 1600 / 980 + 0.5))


def test_each_action_tool_reaches_the_desktop_as_its_action(server):
    client = server["client"]
    client.call("screenshot")  # 1568x980 of 2560x1600

    def at(mx: int, my: int) -> tuple[int, int]:
        return int(mx * 2560 / 1568 + 0.5), int(my * 1600 / 980 + 0.5)

    def events_of(call: str, args: dict[str, Any], enough: Any) -> list[dict[str, Any]]:
        mark = len(probe_events(client))
        result = client.call(call, args)
        assert not result.is_error, (call, text_of(result))
        return wait_for(lambda: enough(probe_events(client)[mark:]) and probe_events(client)[mark:], call)

    def presses(events: list[dict[str, Any]], button: int) -> list[tuple[int, int]]:
        return [(e["x"], e["y"]) for e in events if e["type"] == "ButtonPress" and e["button"] == button]

    double = events_of("double_click", {"x": 100, "y": 100}, lambda ev: len(presses(ev, 1)) >= 2)
    assert presses(double, 1) == [at(100, 100)] * 2
    wheel = events_of("scroll", {"x": 200, "y": 150, "scroll_y": 120}, lambda ev: presses(ev, 5))
    assert set(presses(wheel, 5)) == {at(200, 150)} and not presses(wheel, 4)
    drag = events_of("drag", {"path": [{"x": 10, "y": 10}, {"x": 60, "y": 40}]},
                     lambda ev: any(e["type"] == "ButtonRelease" for e in ev))
    release = [e for e in drag if e["type"] == "ButtonRelease"][-1]
    assert presses(drag, 1) == [at(10, 10)] and (release["x"], release["y"]) == at(60, 40)
    keys = events_of("keypress", {"keys": ["CTRL", "A"]}, lambda ev: any(e["type"] == "KeyRelease" for e in ev))
    assert {"Control_L", "a"} <= {e["keysym_name"] for e in keys if e["type"] == "KeyPress"}
    typed = events_of("type", {"text": "hi"}, lambda ev: [e for e in ev if e["type"] == "KeyPress"][1:])
    assert [e["keysym_name"] for e in typed if e["type"] == "KeyPress"][:2] == ["h", "i"]
    assert not client.call("wait").is_error


def test_bad_input_is_a_tool_error_and_the_sandbox_stays_usable(server):
    client = server["client"]
    client.call("screenshot")
    out = client.call("move", {"x": 1568, "y": 10})  # one past the image's last column
    assert out.is_error and "outside the 1568x980" in text_of(out)
    region = client.call("screenshot", {"region": [2500, 0, 100, 100]})
    assert region.is_error and "inside the 2560x1600 screen" in text_of(region)
    key = client.call("keypress", {"keys": ["NO_SUCH_KEY_NAME"]})
    assert key.is_error
    drag = client.call("drag", {"path": [{"x": 1, "y": 1}]})
    assert drag.is_error  # a drag needs two points
    mark = len(probe_events(client))
    assert not client.call("move", {"x": 784, "y": 490}).is_error  # still usable
    moved = wait_for(lambda: [e for e in probe_events(client)[mark:] if e["type"] == "MotionNotify"], "the move")
    assert (moved[-1]["x"], moved[-1]["y"]) == (1280, 800)


def test_read_file_gives_text_and_refuses_outside_the_home(server):
    client = server["client"]
    result = client.call("read_file", {"path": "/home/sandbox/mcp-probe.jsonl", "max_bytes": 64})
    head, body = result.content[0].text, result.content[1].text
    assert "text (utf-8), cut at 64" in head and len(body.encode()) <= 64 and body.startswith("{")
    assert client.call("read_file", {"path": "/etc/passwd"}).is_error


def test_run_task_runs_a_model_loop_on_the_session_sandbox(server, answers):
    client = server["client"]
    outside = client.call("run_task", {"task": "../outside.toml"})
    assert outside.is_error and "under the server's current directory" in text_of(outside)
    answers["verdict"] = "approve"
    asked = len(answers["asked"])
    result = client.call("run_task", {"task": "tests/mcp/probe-move.toml"})
    assert not result.is_error, text_of(result)
    meta = result.structured_content
    assert meta["status"] == "passed", meta  # its checks: the probe saw the move and the approved click
    assert [m for m in answers["asked"][asked:] if "click (700,500) left" in m]  # the loop's click was asked
    record = Path(meta["record_dir"]) / "record.jsonl"
    assert record.is_file() and record.parent.parent == server["runs"]
    # the calls go on afterwards, in a new attended run, points in screen px until the next screenshot
    mark = len(probe_events(client))
    assert not client.call("move", {"x": 2001, "y": 1501}).is_error
    moved = wait_for(lambda: [e for e in probe_events(client)[mark:] if e["type"] == "MotionNotify"], "the move")
    assert (moved[-1]["x"], moved[-1]["y"]) == (2001, 1501)


def test_the_run_record_holds_every_call_and_the_answers(server):
    entries = read_record(server["runs"])
    started = [e for e in entries if e["type"] == "run_started" and e.get("mode") == "attended"]
    assert started and all(e["runner"] == "mcp" and e["model"] == "mcp-stdio-tests" for e in started)
    calls = [e for e in entries if e["type"] == "computer_call"]
    clicks = [a for c in calls for a in c["actions"] if a["type"] == "click"]
    assert {"type": "click", "x": 101, "y": 203, "button": "left"} in clicks
    assert {"type": "screenshot"} in [a for c in calls for a in c["actions"]]
    actions = [e for e in entries if e["type"] == "action"]
    refused = [e for e in actions if e["action"] == "move" and "outside the 1568x980" in (e["error"] or "")]
    assert refused and refused[0]["error"].startswith("refused:")  # a refused call is recorded too
    assert any(e["action"] == "click" and e["error"] is None for e in actions)
    assert any(e["action"] == "click" and e["error"] == "not approved" for e in actions)
    approvals = [e for e in entries if e["type"] == "approval" and e.get("what") == "action"]
    assert {("approved", "mcp"), ("denied", "mcp")} <= {(e["decision"], e["by"]) for e in approvals}


def test_ending_the_session_removes_the_sandbox_and_finishes_the_record(server, docker_client):
    sandbox = server["sandbox"]
    assert sandbox_containers(docker_client, sandbox)
    server["client"].close()
    wait_for(lambda: not sandbox_containers(docker_client, sandbox), "the sandbox's removal")
    records = sorted(server["runs"].glob("*/record.jsonl"))
    last = read_record(records[-1].parent.parent)  # every record, the last one finished too
    finished = [e for e in last if e["type"] == "run_finished"]
    assert len(finished) == len(records) and finished[-1]["status"] == "passed"
    assert "ended by its caller" in finished[-1]["reason"]
