"""The ``wait`` settle rule on a real Xvfb (guest/actions.py, guest/damage.py): settled once the X server
reported no drawing for the quiet window, never while something keeps drawing (however briefly), at the
cap otherwise; frame comparison only when the server has no DAMAGE extension."""

from __future__ import annotations

import threading
import time

import httpx
import pytest
from Xlib import X
from Xlib import display as xdisplay

from guest.actions import FRAME_QUIET_S, WAIT_QUIET_S
from guest.localrun import AgentProcess, Xvfb

WAIT_CAP = 2.0
#: Time allowed on top of the quiet window for the HTTP answer and a busy host.
MARGIN = 0.15


class Painter:
    """A window of its own, drawn by a thread every ``period`` s for ``duration`` s: a bar one step further
    each time, so no two frames are alike. ``flash`` > 0: instead a flash of the whole window, undone
    ``flash`` s later (a change a sampled frame almost never shows). ``last`` is the monotonic time of the
    last drawing, once it is done."""

    def __init__(self, display: str, *, period: float, duration: float, flash: float = 0.0) -> None:
        self.period, self.duration, self.flash = period, duration, flash
        self.dpy = xdisplay.Display(display)
        screen = self.dpy.screen()
        self.win = screen.root.create_window(40, 40, 200, 120, 0, screen.root_depth, X.InputOutput,
                                             X.CopyFromParent, background_pixel=screen.black_pixel,
                                             override_redirect=True)
        self.gcs = [self.win.create_gc(foreground=pixel) for pixel in (screen.black_pixel, screen.white_pixel)]
        self.win.map()
        self.dpy.sync()
        self.last = 0.0
        self.done = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _paint(self, bar: int | None) -> None:
        """The window black, with a white bar at x = ``bar`` (or all white for None)."""
        if bar is None:
            self.win.fill_rectangle(self.gcs[1], 0, 0, 200, 120)
        else:
            self.win.fill_rectangle(self.gcs[0], 0, 0, 200, 120)
            self.win.fill_rectangle(self.gcs[1], bar, 0, 4, 120)
        self.dpy.sync()
        self.last = time.monotonic()

    def _run(self) -> None:
        end = time.monotonic() + self.duration
        i = 0
        while time.monotonic() < end and not self._stop.is_set():
            if self.flash:
                self._paint(None)
                time.sleep(self.flash)
                self._paint(0)
            else:
                i += 1
                self._paint(i * 3 % 196)
            time.sleep(self.period)
        self.done.set()

    def start(self) -> Painter:
        time.sleep(0.3)  # the window's first appearance is drawing too; let it pass
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.win.destroy()
        self.dpy.close()


def wait(agent: AgentProcess, actions: list[dict] | None = None) -> tuple[bool, float, float]:
    """POST actions ending in a ``wait``: (settled, seconds the request took, monotonic end time)."""
    start = time.monotonic()
    resp = httpx.post(agent.base_url + "/v1/actions", json={"actions": [*(actions or []), {"type": "wait"}]},
                      headers={"Authorization": f"Bearer {agent.token}"}, timeout=30)
    end = time.monotonic()
    assert resp.status_code == 200, resp.text
    return resp.json()["settled"], end - start, end


@pytest.fixture(scope="module")
def agent(xvfb):
    proc = AgentProcess(xvfb.display, extra_args=["--wait-cap", str(WAIT_CAP)]).start()
    wait(proc)  # the first wait opens the agent's damage connection
    yield proc
    proc.stop()


def test_an_idle_screen_settles_after_the_quiet_window(agent):
    # Pointer motion draws nothing, so a screen nothing draws on settles after exactly the quiet window:
    # never sooner, and (the fastest of five, so a stall of a busy host does not decide it) not later
    # than the quiet window plus the HTTP round trip.
    took_all = []
    for x in (300, 301, 302, 303, 304):
        settled, took, _ = wait(agent, [{"type": "move", "x": x, "y": 300}])
        assert settled is True
        assert took >= WAIT_QUIET_S, f"an idle wait settled after {took:.3f} s, before the quiet window"
        took_all.append(took)
    assert min(took_all) < WAIT_QUIET_S + MARGIN, f"idle waits took {sorted(took_all)} s"


def test_wait_settles_one_quiet_window_after_the_drawing_stops(agent, xvfb):
    # never before the drawing stopped plus the quiet window; not much later either (the closest of
    # three tries, so one stall of a busy host does not decide it)
    afters = []
    for _ in range(3):
        painter = Painter(xvfb.display, period=0.03, duration=0.8).start()
        try:
            settled, _, end = wait(agent)
            assert painter.done.is_set(), "the wait settled while the window was still being drawn"
            assert settled is True
            after = end - painter.last
            assert after >= WAIT_QUIET_S - 0.01, \
                f"settled {after:.3f} s after the last drawing (quiet window {WAIT_QUIET_S:g} s)"
            afters.append(after)
        finally:
            painter.close()
        if after < WAIT_QUIET_S + MARGIN:
            break
    assert min(afters) < WAIT_QUIET_S + MARGIN, f"settled {sorted(afters)} s after the last drawing"


def test_brief_flashes_keep_the_screen_from_settling(agent, xvfb):
    # Every 40 ms a 2 ms flash, undone at once: sampled frames nearly always look the same, but each
    # flash is drawing the server reports, so the wait runs to the cap and says it did not settle.
    painter = Painter(xvfb.display, period=0.04, duration=WAIT_CAP + 3, flash=0.002).start()
    try:
        settled, took, _ = wait(agent)
        assert settled is False
        assert WAIT_CAP <= took < WAIT_CAP + 1.0, f"wait took {took:.2f} s, cap {WAIT_CAP:g} s"
    finally:
        painter.close()


def test_without_damage_the_wait_compares_frames(make_agent):
    server = Xvfb(640, 480, 24, args=("-extension", "DAMAGE")).start()
    try:
        agent = make_agent(server.display, extra_args=["--wait-cap", str(WAIT_CAP)])
        settled, took, _ = wait(agent, [{"type": "move", "x": 5, "y": 5}])
        assert settled is True
        assert FRAME_QUIET_S <= took < FRAME_QUIET_S + 0.5, f"an idle wait took {took:.3f} s"
        painter = Painter(server.display, period=0.03, duration=WAIT_CAP + 3).start()
        try:
            settled, took, _ = wait(agent)
            assert settled is False
            assert WAIT_CAP <= took < WAIT_CAP + 1.0
        finally:
            painter.close()
    finally:
        server.stop()
