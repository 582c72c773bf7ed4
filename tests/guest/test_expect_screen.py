"""A bound approval's screen check (``POST /v1/actions`` with ``expect_screen``, wire/screen_match.py) on a
real Xvfb: the agent grabs the frame under the input lock before the first action; when the regions the
actions touch no longer show what the person was shown, nothing runs (409 ``screen_changed``, not a
pointer motion reaches the window) and the answer says how much changed; when they do, the actions run
as usual, also while something animates elsewhere on the screen."""

from __future__ import annotations

import io
import threading
import time

import httpx
import pytest
from PIL import Image, ImageOps

from controller.agent_client import AgentClient
from tests.helpers import probe_desktop
from wire.screen_match import MatchRule, bind

RULE = MatchRule()


@pytest.fixture(scope="module")
def setup(xvfb, tmp_path_factory):
    with probe_desktop(xvfb.display, tmp_path_factory.mktemp("expect-screen")) as started:
        yield started


def post(agent, body: dict) -> httpx.Response:
    return httpx.post(f"{agent.base_url}/v1/actions", json=body, timeout=30,
                      headers={"Authorization": f"Bearer {agent.token}"})


def screen(client: AgentClient) -> Image.Image:
    return Image.open(io.BytesIO(client.screenshot(format="png").data)).convert("RGB")


def clicks(probe, mark: int) -> list[dict]:
    return [e for e in probe.since(mark) if e["type"] in ("ButtonPress", "MotionNotify")]


def test_a_changed_region_runs_nothing_and_says_how_much_changed(setup):
    agent, client, desktop = setup
    probe = desktop.start_probe(pattern=True)
    try:
        shown = screen(client)
        # What the person was shown differs from the screen where the click lands: the screen changed.
        before = ImageOps.invert(shown)
        binding = bind(before, (0, 0, 1280, 800), [(300, 200)], RULE)
        mark = probe.mark()
        resp = post(agent, {"actions": [{"type": "click", "x": 300, "y": 200, "button": "left"}],
                            "expect_screen": binding.model_dump(mode="json")})
        assert resp.status_code == 409, resp.text
        err = resp.json()["error"]
        assert (err["code"], err["executed"], err["index"]) == ("screen_changed", 0, 0)
        assert err["regions"][0]["changed"] > 0.5 and "changed" in err["message"]
        # the same request bound to the screen as it is: the click reaches the window
        binding = bind(screen(client), (0, 0, 1280, 800), [(300, 200)], RULE)
        resp = post(agent, {"actions": [{"type": "click", "x": 300, "y": 200, "button": "left"}],
                            "expect_screen": binding.model_dump(mode="json")})
        assert resp.status_code == 200, resp.text
        probe.wait_for(lambda ev: any(e["type"] == "ButtonPress" and e.get("x") == 300 for e in ev), mark)
        presses = [e for e in probe.since(mark) if e["type"] == "ButtonPress"]
        assert len(presses) == 1  # the refused request pressed nothing
    finally:
        probe.stop()


class Blinker:
    """A small window of our own in a corner of the screen, repainted in alternating colours until
    stopped: something that animates elsewhere (a clock)."""

    def __init__(self, display: str) -> None:
        from Xlib import X
        from Xlib import display as xdisplay

        self.dpy = xdisplay.Display(display)
        screen = self.dpy.screen()
        self.win = screen.root.create_window(1100, 700, 120, 60, 0, screen.root_depth, X.InputOutput,
                                             X.CopyFromParent, override_redirect=True, background_pixel=0)
        self.gc = self.win.create_gc()
        self.win.map()
        self.dpy.sync()
        self.frames = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.gc.change(foreground=0xFF00FF if self.frames % 2 else 0x00FF00)
            self.win.fill_rectangle(self.gc, 0, 0, 120, 60)
            self.dpy.sync()
            self.frames += 1
            self._stop.wait(0.02)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.win.destroy()
        self.dpy.close()


def test_something_animating_elsewhere_does_not_refuse(setup, xvfb):
    agent, client, desktop = setup
    probe = desktop.start_probe(pattern=True)
    blinker = Blinker(xvfb.display)
    try:
        before = blinker.frames
        shown = screen(client)
        binding = bind(shown, (0, 0, 1280, 800), [(200, 150)], RULE)
        # the corner goes on changing between the screenshot and the action
        deadline = time.monotonic() + 10
        while blinker.frames < before + 4:
            assert time.monotonic() < deadline, "the blinking window stopped"
            time.sleep(0.01)
        resp = post(agent, {"actions": [{"type": "move", "x": 200, "y": 150}],
                            "expect_screen": binding.model_dump(mode="json")})
        assert resp.status_code == 200, resp.text
    finally:
        blinker.stop()
        probe.stop()


@pytest.mark.parametrize("mutate, problem", [
    (lambda b: {**b, "crops": b["crops"][:0]}, "crops"),
    (lambda b: {**b, "crops": ["bm90IGEgcG5n"]}, "PNG"),
    (lambda b: {**b, "size": [2560, 1600]}, "downscale"),
    (lambda b: {**b, "frame": [0, 0, 5000, 800], "size": [5000, 800]}, "screen"),
    (lambda b: {**b, "rule": {"tolerance": 999}}, "rule.tolerance"),
    (lambda b: {**b, "extra": 1}, "extra"),
])
def test_a_binding_that_cannot_be_read_is_refused_before_anything_runs(setup, mutate, problem):
    agent, client, desktop = setup
    binding = bind(screen(client), (0, 0, 1280, 800), [(10, 10)], RULE).model_dump(mode="json")
    resp = post(agent, {"actions": [{"type": "move", "x": 10, "y": 10}], "expect_screen": mutate(binding)})
    assert resp.status_code == 400, resp.text
    err = resp.json()["error"]
    assert err["code"] == "invalid_request" and problem in err["message"], err
