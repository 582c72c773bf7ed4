"""The ``wait`` settle rule on a real Xvfb (guest/actions.py, guest/damage.py): settled once the X server
reported no drawing for the quiet window, never while something keeps drawing (however briefly), at the
cap otherwise; frame comparison only when the server has no DAMAGE extension.

The drawing comes from a thread of this process, which a busy host can stall for longer than the quiet
window: the screen is then really quiet, and an agent that settles is right. So each drawing's time is
kept, and a wait that settled while the painter was still at work fails only when the drawings leave no
room for a quiet window between the wait's start and its answer (:func:`quiet_room`); otherwise the
attempt proves nothing and is tried again, and a test fails saying so when every attempt stalled."""

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
#: Tries of a test whose painter may stall (each stalled try proves nothing, module doc).
ATTEMPTS = 4


def quiet_room(spans: list[tuple[float, float]], start: float, end: float) -> float:
    """The longest time in seconds the X server may have gone without drawing between ``start`` and ``end``
    (monotonic s), given each drawing's ``(sent, done)`` span: the server drew it at some moment inside.

    Candidates: from ``start`` to the first drawing after it, between two drawings (the earliest the first
    may have been drawn to the latest the next was), from the last drawing to ``end``. A wait that settled
    at or before ``end`` can be right only when this is at least its quiet window.
    """
    inside = sorted((sent, done) for sent, done in spans if done >= start and sent <= end)
    if not inside:
        return end - start
    room = inside[0][1] - start
    for (sent, _), (_, done) in zip(inside, inside[1:]):
        room = max(room, done - sent)
    return max(room, end - inside[-1][0])


class Painter:
    """A window of its own, drawn by a thread every ``period`` s for ``duration`` s: a bar one step further
    each time, so no two frames are alike. ``flash`` > 0: instead a flash of the whole window, undone
    ``flash`` s later (a change a sampled frame almost never shows). ``spans`` holds each drawing's
    ``(sent, done)`` monotonic times (its requests sent; the server's answer to the round trip after
    them); ``last`` is the ``done`` time of the last drawing."""

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
        self.spans: list[tuple[float, float]] = []
        self.done = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _paint(self, bar: int | None) -> None:
        """The window black, with a white bar at x = ``bar`` (or all white for None)."""
        sent = time.monotonic()
        if bar is None:
            self.win.fill_rectangle(self.gcs[1], 0, 0, 200, 120)
        else:
            self.win.fill_rectangle(self.gcs[0], 0, 0, 200, 120)
            self.win.fill_rectangle(self.gcs[1], bar, 0, 4, 120)
        self.dpy.sync()
        self.last = time.monotonic()
        self.spans.append((sent, self.last))

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


def settled_too_early(painter: Painter, took: float, end: float, quiet: float) -> str | None:
    """For a wait that settled (answer at ``end``, after ``took`` s) while ``painter`` was still drawing:
    a failure message when its drawings left no room for a ``quiet`` s window in the wait, None when the
    painter stalled long enough that settling was right (the attempt then proves nothing)."""
    room = quiet_room(painter.spans, end - took, end)
    if room >= quiet:
        return None
    return (f"the wait settled after {took:.3f} s while the window was still being drawn: at most "
            f"{room * 1000:.0f} ms without drawing, quiet window {quiet * 1000:g} ms")


@pytest.fixture(scope="module")
def agent(xvfb):
    proc = AgentProcess(xvfb.display, extra_args=["--wait-cap", str(WAIT_CAP)]).start()
    wait(proc)  # the first wait opens the agent's damage connection
    yield proc
    proc.stop()


def test_quiet_room_is_the_longest_the_server_may_have_gone_without_drawing():
    drawn_every_30_ms = [(0.00, 0.01), (0.03, 0.04), (0.06, 0.07)]
    assert quiet_room(drawn_every_30_ms, 0.0, 0.08) == pytest.approx(0.04)  # 0.00 drawn as late as 0.04
    stalled = [(0.00, 0.01), (0.20, 0.21)]
    assert quiet_room(stalled, 0.0, 0.215) == pytest.approx(0.21)
    assert quiet_room(stalled, 0.05, 0.25) == pytest.approx(0.16)  # from the wait's start to 0.21
    assert quiet_room(stalled, 0.0, 0.5) == pytest.approx(0.30)  # the last drawing may be at 0.20
    assert quiet_room([], 1.0, 1.25) == pytest.approx(0.25)


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
    # never before the drawing stopped plus the quiet window; not much later either (the closest of the
    # tries, so one stall of a busy host does not decide it)
    afters, stalls = [], []
    for _ in range(ATTEMPTS):
        painter = Painter(xvfb.display, period=0.03, duration=0.8).start()
        try:
            settled, took, end = wait(agent)
            still_drawing = not painter.done.is_set()
        finally:
            painter.close()
        assert settled is True
        if still_drawing:
            failure = settled_too_early(painter, took, end, WAIT_QUIET_S)
            assert failure is None, failure
            stalls.append(f"{quiet_room(painter.spans, end - took, end) * 1000:.0f} ms")
            continue
        after = end - painter.last
        assert after >= WAIT_QUIET_S - 0.01, \
            f"settled {after:.3f} s after the last drawing (quiet window {WAIT_QUIET_S:g} s)"
        afters.append(after)
        if after < WAIT_QUIET_S + MARGIN:
            break
    assert afters, f"the painter stalled past the quiet window in each of {ATTEMPTS} tries: {stalls}"
    assert min(afters) < WAIT_QUIET_S + MARGIN, f"settled {sorted(afters)} s after the last drawing"


def test_brief_flashes_keep_the_screen_from_settling(agent, xvfb):
    # Every 40 ms a 2 ms flash, undone at once: sampled frames nearly always look the same, but each
    # flash is drawing the server reports, so the wait runs to the cap and says it did not settle.
    assert_never_settles(agent, xvfb.display, WAIT_QUIET_S, period=0.04, flash=0.002)


def assert_never_settles(agent: AgentProcess, display: str, quiet: float, **painting: float) -> None:
    """A painter drawing on ``display`` (``Painter``'s ``painting`` options) through the whole cap keeps
    the wait from settling: it runs to the cap. A try in which the painter stalled for ``quiet`` s is
    tried again (module doc)."""
    stalls = []
    for _ in range(ATTEMPTS):
        painter = Painter(display, duration=WAIT_CAP + 3, **painting).start()
        try:
            settled, took, end = wait(agent)
        finally:
            painter.close()
        if not settled:
            assert WAIT_CAP <= took < WAIT_CAP + 1.0, f"wait took {took:.2f} s, cap {WAIT_CAP:g} s"
            return
        failure = settled_too_early(painter, took, end, quiet)
        assert failure is None, failure
        stalls.append(f"{quiet_room(painter.spans, end - took, end) * 1000:.0f} ms")
    pytest.fail(f"the painter stalled past the quiet window in each of {ATTEMPTS} tries: {stalls}")


def test_without_damage_the_wait_compares_frames(make_agent):
    server = Xvfb(640, 480, 24, args=("-extension", "DAMAGE")).start()
    try:
        agent = make_agent(server.display, extra_args=["--wait-cap", str(WAIT_CAP)])
        settled, took, _ = wait(agent, [{"type": "move", "x": 5, "y": 5}])
        assert settled is True
        assert FRAME_QUIET_S <= took < FRAME_QUIET_S + 0.5, f"an idle wait took {took:.3f} s"
        assert_never_settles(agent, server.display, FRAME_QUIET_S, period=0.03)
    finally:
        server.stop()
