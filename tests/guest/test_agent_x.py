"""Agent behaviour on a real Xvfb that is specific to this implementation: validation before any
event, busy timeout, wait cap, the scroll rule, X server restarts, no X connection growth."""

from __future__ import annotations

import io
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from PIL import Image
from Xlib import display as xdisplay

from controller.agent_client import AgentClient, AgentError
from guest import pointer
from guest.localrun import Xvfb
from tests.conformance.harness import AgentDesktop, AgentTarget, poll
from tests.helpers import probe_desktop
from tests.conformance.test_wait_release import ATTEMPTS, STALL_GAP_S

WAIT_CAP = 3.0
BUSY_TIMEOUT = 0.5


@pytest.fixture(scope="module")
def setup(xvfb, tmp_path_factory):
    with probe_desktop(xvfb.display, tmp_path_factory.mktemp("agent-x"),
                       ("--wait-cap", str(WAIT_CAP), "--busy-timeout", str(BUSY_TIMEOUT))) as started:
        yield started


def test_whole_request_is_validated_before_any_event(setup):
    agent, client, desktop = setup
    probe = desktop.start_probe()
    try:
        mark = probe.mark()
        with pytest.raises(AgentError) as err:
            client.actions([{"type": "keypress", "keys": ["a"]}, {"type": "click", "x": 5, "y": 5, "button": "left"},
                            {"type": "keypress", "keys": ["ctrl", "Bogus_Key"]}])
        assert (err.value.status, err.value.code, err.value.index) == (400, "unknown_key", 2)
        assert err.value.body["error"]["key"] == "Bogus_Key"
        client.actions([{"type": "move", "x": 77, "y": 77}])
        probe.wait_for(lambda ev: any(e["type"] == "MotionNotify" and e["x"] == 77 for e in ev), mark)
        assert [e for e in probe.since(mark) if e["type"] not in ("MotionNotify",)] == []
    finally:
        probe.stop()


@pytest.mark.parametrize("delta,clicks", [(1, 1), (99, 1), (114, 1), (170, 1), (172, 2), (342, 3), (-342, -3),
                                          (-1, -1), (10**6, pointer.MAX_SCROLL_CLICKS)])
def test_scroll_rule(delta, clicks):
    assert pointer.scroll_clicks(delta) == clicks
    assert pointer.scroll_clicks(0) == 0


def test_scroll_rule_on_the_wire(setup):
    agent, client, desktop = setup
    probe = desktop.start_probe()
    try:
        mark = probe.mark()
        client.actions([{"type": "scroll", "x": 50, "y": 50, "scroll_x": -200, "scroll_y": 300},
                        {"type": "move", "x": 99, "y": 99}])
        events = probe.wait_for(lambda ev: any(e["type"] == "MotionNotify" and e["x"] == 99 for e in ev), mark)
        presses = [e["button"] for e in events if e["type"] == "ButtonPress"]
        assert presses == [5, 5, 5, 6, 6]
    finally:
        probe.stop()


def test_busy_after_the_documented_timeout_and_screenshots_still_work(setup):
    agent, client, desktop = setup
    probe = desktop.start_probe(animate=30)
    try:
        result: dict[str, float] = {}

        def long_wait() -> None:
            start = time.monotonic()
            client.actions([{"type": "wait"}])
            result["wait"] = time.monotonic() - start

        t = threading.Thread(target=long_wait)
        t.start()
        # Until the wait holds the input lock, moves succeed; the first refused one is the check.
        deadline = time.monotonic() + WAIT_CAP
        while True:
            start = time.monotonic()
            try:
                client.actions([{"type": "move", "x": 5, "y": 5}])
            except AgentError as exc:
                err, waited = exc, time.monotonic() - start
                break
            assert time.monotonic() < deadline, "the wait never held the input lock"
            time.sleep(0.02)
        assert (err.status, err.code) == (409, "busy")
        assert BUSY_TIMEOUT * 0.9 <= waited < BUSY_TIMEOUT + 1.0
        with pytest.raises(AgentError) as err:
            client.release()
        assert err.value.code == "busy"
        shot = client.screenshot("jpeg", max_width=320)
        assert shot.image_size == (320, 200)
        assert client.display()["width"] == 1280
        t.join()
        # it held the lock past the refusal and ended by its cap at the latest; that it lasts the cap
        # while the screen keeps changing is tests/guest/test_wait_settle.py's (here the probe's
        # animation can stall on a loaded machine, and the screen then settles before the cap)
        assert BUSY_TIMEOUT <= result["wait"] < WAIT_CAP + 1.5, result
    finally:
        probe.stop()


def test_concurrent_screenshots_are_safe(setup):
    agent, client, desktop = setup

    def shot(i: int) -> tuple[int, int]:
        fmt = "png" if i % 2 else "jpeg"
        s = client.screenshot(fmt, max_width=640 if i % 3 else None)
        img = Image.open(io.BytesIO(s.data))
        img.load()
        return img.size

    with ThreadPoolExecutor(8) as pool:
        sizes = list(pool.map(shot, range(64)))
    assert set(sizes) <= {(1280, 800), (640, 400)} and len(sizes) == 64


def _x_clients(display: str) -> int:
    d = xdisplay.Display(display)
    try:
        return len(d.res_query_clients().clients)
    finally:
        d.close()


def test_no_x_connection_growth_over_1000_screenshots(setup, xvfb):
    agent, client, desktop = setup
    client.screenshot(crop=(0, 0, 16, 16))
    client.actions([{"type": "move", "x": 1, "y": 1}])
    fds = len(os.listdir(f"/proc/{agent.proc.pid}/fd"))
    clients = _x_clients(xvfb.display)
    for i in range(1000):
        client.screenshot("png" if i % 2 else "jpeg", crop=(i % 100, 0, 16, 16))
    for i in range(100):
        client.actions([{"type": "move", "x": i, "y": i}])
    assert _x_clients(xvfb.display) == clients
    assert len(os.listdir(f"/proc/{agent.proc.pid}/fd")) <= fds


def test_x_server_restart_gives_503_then_reconnects(make_agent):
    server = Xvfb(640, 480, 24).start()
    try:
        agent = make_agent(server.display)
        with AgentClient(agent.base_url, agent.token, timeout=20) as client:
            assert client.display() == {"width": 640, "height": 480, "depth": 24}
            client.actions([{"type": "type", "text": "é日"}, {"type": "click", "x": 3, "y": 3, "button": "left"}])
            client.screenshot()
            server.stop()
            for call in (client.display, client.screenshot, client.release,
                         lambda: client.actions([{"type": "move", "x": 1, "y": 1}]),
                         lambda: client.actions([{"type": "type", "text": "é"}])):
                with pytest.raises(AgentError) as err:
                    call()
                assert (err.value.status, err.value.code) == (503, "display_unavailable")
            assert client.livez() and agent.proc.poll() is None
            server.start(server.display)
            poll(lambda: _ok(client.display), 10, what="the agent to reconnect")
            assert client.screenshot().image_size == (640, 480)
            assert client.actions([{"type": "type", "text": "é日"}, {"type": "click", "x": 3, "y": 3,
                                                                      "button": "left"}]) == 2
            assert agent.proc.poll() is None
    finally:
        server.stop()


def _ok(call) -> bool:
    try:
        call()
        return True
    except AgentError:
        return False


def test_unused_path_is_not_a_file_root(setup):
    agent, client, desktop = setup
    with pytest.raises(AgentError) as err:
        client.read_file(str(Path(__file__)))
    assert err.value.status == 403



def _agent_with_probe(make_agent, display: str, tmp_path: Path):
    """An agent on ``display`` that may launch the event probe (``python -m guest probe``) and read
    files under ``tmp_path``."""
    return make_agent(display, apps={"probe": [sys.executable, "-m", "guest", "probe"]}, files_roots=[str(tmp_path)])


def test_keycodes_come_from_the_live_keymap(make_agent, tmp_path):
    server = Xvfb(640, 480, 24).start()
    other = xdisplay.Display(server.display)
    try:
        agent = _agent_with_probe(make_agent, server.display, tmp_path)
        with AgentClient(agent.base_url, agent.token, timeout=30) as client:
            desktop = AgentDesktop(client, str(tmp_path), display=server.display)
            probe = desktop.start_probe()
            try:
                client.actions([{"type": "type", "text": "ab"}, {"type": "move", "x": 8, "y": 8}])
                probe.wait_for(lambda ev: any(e["type"] == "MotionNotify" and e["x"] == 8 for e in ev))
                code_a, code_b = other.keysym_to_keycode(ord("a")), other.keysym_to_keycode(ord("b"))
                # Swap the keys a and b on the server.
                other.change_keyboard_mapping(code_a, [(ord("b"), ord("B"))])
                other.change_keyboard_mapping(code_b, [(ord("a"), ord("A"))])
                other.sync()
                mark = probe.mark()
                client.actions([{"type": "type", "text": "ab"}, {"type": "move", "x": 9, "y": 9}])
                events = probe.wait_for(lambda ev: any(e["type"] == "MotionNotify" and e["x"] == 9 for e in ev),
                                        mark)
                got = [(e["keycode"], e["keysym_name"]) for e in events if e["type"] == "KeyPress"]
                assert got == [(code_b, "a"), (code_a, "b")]
            finally:
                probe.stop()
                desktop.close()
    finally:
        other.close()
        server.stop()


def test_keys_that_would_stop_or_reconfigure_the_x_server_are_refused(make_agent):
    # Bound to a spare keycode and pressed, Terminate_Server makes Xvfb exit: one keypress from a model
    # would end the desktop. It and the other server-command keysyms are refused up front.
    server = Xvfb(640, 480, 24).start()
    try:
        agent = make_agent(server.display)
        with AgentClient(agent.base_url, agent.token, timeout=20) as client:
            for keys in (["Terminate_Server"], ["SlowKeys_Enable"], ["ctrl", "alt", "Pointer_EnableKeys"]):
                with pytest.raises(AgentError) as err:
                    client.actions([{"type": "keypress", "keys": keys}])
                assert (err.value.status, err.value.code) == (400, "invalid_action")
                assert err.value.body["error"]["key"] == keys[-1]
            assert server.proc.poll() is None, "the X server exited"
            assert client.display()["width"] == 640
    finally:
        server.stop()


def test_the_longest_allowed_drag_is_carried_out(setup):
    # 2,000 points alternating between opposite corners: ~320,000 motion events. Queued without
    # flushing, python-xlib's send buffer grows quadratically and the drag takes minutes.
    agent, client, desktop = setup
    from guest.actions import MAX_PATH_POINTS

    path = [{"x": (i % 2) * 1279, "y": (i % 2) * 799} for i in range(MAX_PATH_POINTS)]
    with AgentClient(agent.base_url, agent.token, timeout=60) as c:
        assert c.actions([{"type": "drag", "path": path}, {"type": "move", "x": 3, "y": 3}]) == 2


def test_a_request_past_its_deadline_stops_with_timeout_and_frees_the_input(make_agent, xvfb, tmp_path):
    # 500 'wait' actions on a changing screen would hold the input lock for 500 x the wait cap.
    agent = make_agent(xvfb.display, apps={"probe": [sys.executable, "-m", "guest", "probe"]},
                       files_roots=[str(tmp_path)],
                       extra_args=["--wait-cap", "3", "--busy-timeout", "0.5", "--request-timeout", "1"])
    with AgentClient(agent.base_url, agent.token, timeout=30) as client:
        desktop = AgentDesktop(client, str(tmp_path), display=xvfb.display)
        probe = desktop.start_probe(animate=30)
        try:
            mark = probe.mark()
            start = time.monotonic()
            with pytest.raises(AgentError) as err:
                client.actions([{"type": "wait"}] * 5 + [{"type": "move", "x": 41, "y": 41}])
            took = time.monotonic() - start
            assert (err.value.status, err.value.code) == (400, "timeout")
            assert err.value.index == 1 and err.value.body["error"]["executed"] == 1
            assert took < 3, f"the first wait ran past the request deadline ({took:.1f} s)"
            # Nothing after the deadline was sent, and the input is free again at once.
            client.actions([{"type": "move", "x": 42, "y": 42}])
            events = probe.wait_for(lambda ev: any(e["type"] == "MotionNotify" and e["x"] == 42 for e in ev), mark)
            assert not any(e["type"] == "MotionNotify" and e["x"] == 41 for e in events)
            # A single long `type` (20,000 characters no keymap holds: minutes of key rebinding) stops
            # between two keys at the deadline.
            text = "".join(chr(0x4E00 + i) for i in range(20_000))
            start = time.monotonic()
            with pytest.raises(AgentError) as err:
                client.actions([{"type": "type", "text": text}])
            assert (err.value.code, err.value.index, err.value.body["error"]["executed"]) == ("timeout", 0, 0)
            assert time.monotonic() - start < 5
            assert desktop.pressed() == ([], 0)
            client.actions([{"type": "move", "x": 43, "y": 43}])
        finally:
            probe.stop()
            desktop.close()


def test_a_restarted_agent_reuses_the_spare_keycodes_bound_before_it(make_agent, tmp_path):
    # The X server outlives the agent (supervisord restarts only the agent). The spare keycodes the
    # previous agent bound are no longer empty, yet they must stay usable, or no unmapped character
    # could ever be typed again on this display.
    server = Xvfb(640, 480, 24).start()
    try:
        first = make_agent(server.display)
        with AgentClient(first.base_url, first.token, timeout=60) as client:
            client.actions([{"type": "type", "text": "".join(chr(0x4E00 + i) for i in range(300))}])
        first.stop()
        second = _agent_with_probe(make_agent, server.display, tmp_path)
        with AgentClient(second.base_url, second.token, timeout=60) as client:
            desktop = AgentDesktop(client, str(tmp_path), display=server.display)
            probe = desktop.start_probe()
            try:
                text = "".join(chr(0x3041 + i) for i in range(60))  # hiragana: none of them bound yet
                events = probe.run_and_collect(AgentTarget(client), [{"type": "type", "text": text}])
                names = [e["keysym_name"] for e in events if e["type"] == "KeyPress" and e["keysym_name"] != "Shift_L"]
                assert names == [f"U+{ord(c):04X}" for c in text]
            finally:
                probe.stop()
                desktop.close()
    finally:
        server.stop()


def test_wait_reports_whether_the_screen_settled(setup):
    agent, client, desktop = setup
    headers = {"Authorization": f"Bearer {agent.token}"}

    def run(actions: list[dict]) -> dict:
        resp = httpx.post(agent.base_url + "/v1/actions", json={"actions": actions}, headers=headers, timeout=30)
        assert resp.status_code == 200, resp.text
        return resp.json()

    assert run([{"type": "move", "x": 3, "y": 3}]) == {"executed": 1}
    # A probe animating at 60 fps keeps the screen from settling, unless a busy host stalls the probe
    # for a quiet window: then settling is right, and the try is made again (as in the conformance
    # suite's wait tests, whose stall rule this is).
    stalls = []
    for _ in range(ATTEMPTS):
        probe = desktop.start_probe(animate=60.0)
        try:
            start = time.monotonic()
            answer = run([{"type": "wait"}, {"type": "move", "x": 4, "y": 4}])
            end = time.monotonic()
            frames = [e["t"] for e in probe.events() if e["type"] == "frame"]
        finally:
            probe.stop()
        if answer == {"executed": 2, "settled": False}:
            break
        assert answer == {"executed": 2, "settled": True}, answer
        points = [max((t for t in frames if t <= start), default=start),
                  *(t for t in frames if start < t <= end), end]
        gap = max(later - earlier for earlier, later in zip(points, points[1:]))
        assert gap >= STALL_GAP_S, f"settled while the probe kept drawing: longest gap {gap * 1000:.0f} ms"
        stalls.append(f"{gap * 1000:.0f} ms")
    else:
        pytest.fail(f"the probe's animation stalled in each of {ATTEMPTS} tries: {stalls}")
    assert run([{"type": "wait"}]) == {"executed": 1, "settled": True}


def test_actions_with_a_screenshot_answer_the_image_taken_after_them(setup):
    """``POST /v1/actions?screenshot=``: the actions run, then the screen is captured in the same
    request; the answer is the image, ``X-Executed`` and (with a ``wait``) ``X-Settled``."""
    from guest.probe import PATTERN

    agent, client, desktop = setup
    probe = desktop.start_probe(pattern=True)
    try:
        mark = probe.mark()
        step = client.actions_screenshot([{"type": "click", "x": 40, "y": 30, "button": "left"}], max_width=640)
        assert (step.executed, step.settled) == (1, None)
        shot = step.screenshot
        assert (shot.mime, shot.image_size, shot.frame, shot.screen_size) == (
            "image/png", (640, 400), (0, 0, 1280, 800), (1280, 800))
        # The ButtonPress is in the log already: the click ran (and was released) before the capture.
        assert [(e["type"], e["x"], e["y"]) for e in probe.since(mark) if e["type"].startswith("Button")] == [
            ("ButtonPress", 40, 30), ("ButtonRelease", 40, 30)]
        x, y, w, h, colour = PATTERN[4]
        step = client.actions_screenshot([{"type": "wait"}], crop=(x, y, w, h))
        assert (step.executed, step.settled) == (1, True)
        image = Image.open(io.BytesIO(step.screenshot.data)).convert("RGB")
        assert image.size == (w, h) and image.getpixel((w // 2, h // 2)) == (
            colour >> 16, (colour >> 8) & 0xFF, colour & 0xFF)
        step = client.actions_screenshot([{"type": "move", "x": 3, "y": 3}], format="jpeg", quality=50,
                                         max_width=320)
        assert (step.executed, step.screenshot.mime, step.screenshot.image_size) == (1, "image/jpeg", (320, 200))
    finally:
        probe.stop()


@pytest.mark.parametrize("query", ["screenshot=gif", "screenshot=png&quality=0", "screenshot=png&max_width=0",
                                   "screenshot=png&crop=1270,790,20,20", "screenshot=png&crop=a,b,c,d"])
def test_bad_screenshot_parameters_refuse_the_actions_before_any_event(setup, query):
    agent, client, desktop = setup
    probe = desktop.start_probe()
    try:
        mark = probe.mark()
        resp = httpx.post(f"{agent.base_url}/v1/actions?{query}",
                          json={"actions": [{"type": "click", "x": 9, "y": 9, "button": "left"}]},
                          headers={"Authorization": f"Bearer {agent.token}"}, timeout=30)
        assert resp.status_code == 400 and resp.json()["error"]["code"] == "invalid_request", resp.text
        client.actions([{"type": "move", "x": 77, "y": 77}])
        probe.wait_for(lambda ev: any(e["type"] == "MotionNotify" and e["x"] == 77 for e in ev), mark)
        assert [e for e in probe.since(mark) if e["type"].startswith("Button")] == []
    finally:
        probe.stop()


def test_a_failing_action_answers_its_error_and_no_image(setup):
    agent, client, desktop = setup
    with pytest.raises(AgentError) as err:
        client.actions_screenshot([{"type": "move", "x": 1, "y": 1}, {"type": "click", "x": 5000, "y": 1,
                                                                         "button": "left"}])
    assert (err.value.status, err.value.code, err.value.index) == (400, "out_of_bounds", 1)


def test_quick_requests_are_told_apart():
    from guest.actions import QUICK_MAX_ACTIONS, quick

    assert quick([{"type": "click", "x": 1, "y": 1}, {"type": "keypress", "keys": ["a"]}, {"type": "move"}])
    assert quick([{"type": "scroll"}, {"type": "double_click"}, {"type": "screenshot"}])
    for slow in ([{"type": "wait"}], [{"type": "type", "text": "x"}], [{"type": "drag", "path": []}],
                 [{"type": "move"}] * (QUICK_MAX_ACTIONS + 1), [], {"type": "move"}, ["move"], [{"type": 1}]):
        assert not quick(slow), slow
