"""The live screen and a person's input through the console, on a real desktop: a private Xvfb, the real
agent and the probe window that logs what X clients receive (tests/loop/conftest.py's Desk)."""

from __future__ import annotations

import httpx

from controller.console import streams
from tests.console.conftest import LIVE_ID, Runner, make_live, wait_state

JPEG = b"\xff\xd8\xff"


def _code(resp) -> str:
    return resp.json()["error"]["code"]


def test_screen_jpg_is_a_frame_of_the_desktop(session, live_desktop):
    resp = session.get(f"/runs/{LIVE_ID}/screen.jpg")
    assert resp.status_code == 200 and resp.headers["content-type"] == "image/jpeg"
    assert resp.content.startswith(JPEG) and len(resp.content) > 1000


def test_screen_before_the_sandbox_and_after_the_run(session, runs_dir, console):
    live = make_live(runs_dir, "not-started")
    console.add_run(live)
    early = session.get("/runs/not-started/screen.jpg")
    assert early.status_code == 409 and _code(early) == "not_started"
    live.finish("error")
    late = session.get("/runs/not-started/screen.jpg")
    assert late.status_code == 409 and _code(late) == "run_finished"


def test_mjpeg_streams_frames_while_connected_and_ends_with_the_run(session, live_desktop):
    live, _runner = live_desktop
    with session.client.stream("GET", f"/runs/{LIVE_ID}/screen.mjpeg", params={"fps": 50},
                               timeout=httpx.Timeout(10.0)) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"] == f"multipart/x-mixed-replace; boundary={streams.BOUNDARY}"
        buffer = b""
        chunks = resp.iter_bytes()
        while buffer.count(b"--frame\r\n") < 3:
            buffer += next(chunks)
        parts = buffer.split(b"--frame\r\n")[1:3]
        for part in parts:
            head, _, body = part.partition(b"\r\n\r\n")
            assert b"Content-Type: image/jpeg" in head and body.startswith(JPEG)
            # the part ends at the next boundary, sent right after the frame (so a browser shows it at once)
            assert body.endswith(b"\xff\xd9\r\n")  # a whole JPEG (its end-of-image marker)
        live.finish("passed")
        for _ in chunks:  # drains, then the server ends the stream: iteration stops
            pass
    assert streams.clamp_fps(50) == 10 and streams.clamp_fps(0) == 1 and streams.clamp_fps(None) == 5
    assert streams.clamp_fps(float("nan")) == 5


def test_a_person_clicks_types_and_presses_keys_once_in_control(session, live_desktop, desktop):
    live, runner = live_desktop
    path = f"/runs/{LIVE_ID}/input"
    click = {"type": "click", "x": 321, "y": 234, "button": "left"}
    refused = session.post(path, click)
    assert refused.status_code == 409 and _code(refused) == "not_in_control"

    assert session.post(f"/runs/{LIVE_ID}/takeover").json()["state"]["state"] == "pausing"
    runner.pause_at_boundary()
    wait_state(live, "human")

    mark = desktop.probe.mark()
    resp = session.post(path, click)
    assert resp.status_code == 202 and resp.json()["action"]["x"] == 321
    desktop.probe.wait_for(lambda ev: any(e["type"] == "ButtonPress" and (e["x"], e["y"]) == (321, 234)
                                          and e["button"] == 1 for e in ev), mark)
    mark = desktop.probe.mark()
    assert session.post(path, {"type": "type", "text": "hi"}).status_code == 202
    assert session.post(path, {"type": "keypress", "keys": ["ENTER"]}).status_code == 202
    events = desktop.probe.wait_for(
        lambda ev: any(e["type"] == "KeyPress" and e["keysym_name"] == "Return" for e in ev), mark)
    typed = [e["keysym_name"] for e in events if e["type"] == "KeyPress"]
    assert typed == ["h", "i", "Return"], typed

    assert runner.human[0] == {"action": "click (321,234) left", "by": "console",
                               "input": {"type": "click", "x": 321, "y": 234, "button": "left"}}
    # the runner keeps the typed text as its length (unless the run records typed text): it gets the input whole
    assert runner.human[1:3] == [{"action": "type <2 chars>", "by": "console", "input": {"type": "type", "text": "hi"}},
                                 {"action": "keypress ENTER", "by": "console",
                                  "input": {"type": "keypress", "keys": ["ENTER"]}}], runner.human
    assert live.last_action["by"] == "human" and live.last_action["action"]["keys"] == ["ENTER"]

    for bad in ({"type": "click", "x": 5000, "y": 1, "button": "left"}, {"type": "wait"},
                {"type": "click", "x": 1, "y": 1}, {"type": "click", "x": "1", "y": 1, "button": "left"}, ["x"]):
        resp = session.post(path, bad)
        assert resp.status_code == 400 and _code(resp) == "invalid_action", (bad, resp.text)
    agent = session.post(path, {"type": "keypress", "keys": ["NoSuchKeyAnywhere"]})
    assert agent.status_code == 502 and _code(agent) == "unknown_key"
    huge = session.post(path, {"type": "type", "text": "a" * 70_000})
    assert huge.status_code == 413 and _code(huge) == "too_large"

    assert session.post(f"/runs/{LIVE_ID}/resume").status_code == 202
    runner.thread.join(10)
    assert not runner.thread.is_alive() and live.state == "running"
    again = session.post(path, click)
    assert again.status_code == 409 and _code(again) == "not_in_control"


def test_input_after_the_run_finished(session, runs_dir, console, desktop):
    live = make_live(runs_dir, "over")
    Runner(live).attach(desktop.client, desktop.size)
    console.add_run(live)
    live.finish("passed")
    resp = session.post("/runs/over/input", {"type": "click", "x": 1, "y": 1, "button": "left"})
    assert resp.status_code == 409 and _code(resp) == "run_finished"
