"""wait (frame-stable, capped) and release (nothing left pressed).

The ``wait`` tests watch an animating probe window. Under load the probe itself can stall (not be
scheduled for longer than the settle quiet period), and then the screen really does settle, so a
``wait`` that returns early is right. The probe logs every frame once the X server has drawn it, so the
tests read from its log whether the animation kept going while the ``wait`` ran: the ``wait`` is
bracketed by two pointer moves in the same request (pointer motion is no screen change), whose lines in
the log mark its start and end on the probe's clock. A ``wait`` that returned while frames kept coming
fails; one that returned because the animation stalled is run again (at most :data:`ATTEMPTS` times,
then the test fails saying the animation stalled every time).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import pytest

from .conftest import WAIT_CAP_S, WAIT_QUIET_S  # what every agent this suite runs against is started with
from .harness import Probe, TargetError

ATTEMPTS = 6
"""Tries of a ``wait`` test whose animation stalled before it fails (a stalled try ends early, at the
stall; on a loaded 2-core machine three in a row were seen to stall)."""

STALL_GAP_S = 0.75 * WAIT_QUIET_S
"""A gap between the probe's frames at least this long counts as a stall: the server may have seen no
drawing for the whole quiet period (the probe writes a frame's line a round trip after drawing it, so
the gap it sees can be a little shorter than the gap the server saw)."""


@dataclass
class BracketedWait:
    """One ``wait`` seen from the test and from the probe's log.

    ``elapsed``: seconds the request took (test's clock); ``gap``: the longest time between two frames
    the probe drew around and during the wait, seconds (probe's clock; from the last frame before the
    wait to its end); ``done_before_return``: the animation ended before the wait returned;
    ``frames``: how many frames were drawn during the wait."""

    elapsed: float
    gap: float
    done_before_return: bool
    frames: int

    def describe(self) -> str:
        return (f"wait took {self.elapsed:.2f} s, {self.frames} frame(s) drawn meanwhile, longest gap between "
                f"frames {self.gap * 1000:.0f} ms (settle quiet period {WAIT_QUIET_S * 1000:.0f} ms)")


def _motion(events: list[dict[str, Any]], point: tuple[int, int]) -> dict[str, Any] | None:
    return next((e for e in events if e["type"] == "MotionNotify" and (e["x"], e["y"]) == point), None)


def bracketed_wait(target: Any, probe: Probe, attempt: int) -> BracketedWait:
    """Run ``[move a, wait, move b]`` and read the wait's span from the probe's log."""
    w, h = target.screen_size
    a, b = (w - 20 - 2 * attempt, h - 3), (w - 21 - 2 * attempt, h - 3)
    target.run([{"type": "move", "x": w - 40, "y": h - 3}])  # so the move to ``a`` is a motion
    mark = probe.mark()
    start = time.monotonic()
    target.run([{"type": "move", "x": a[0], "y": a[1]}, {"type": "wait"}, {"type": "move", "x": b[0], "y": b[1]}])
    elapsed = time.monotonic() - start
    events = probe.wait_for(lambda ev: _motion(ev, b) is not None, mark)
    begin, end = _motion(events, a), _motion(events, b)
    assert begin is not None and end is not None, f"the probe saw no motion to {a}; {probe.diagnosis(mark)}"
    t0, t1 = begin["t"], end["t"]
    every = [e["t"] for e in probe.events() if e["type"] == "frame"]
    during = [t for t in every if t0 < t <= t1]
    before = [t for t in every if t <= t0]
    points = [before[-1] if before else t0, *during, t1]
    gap = max(later - earlier for earlier, later in zip(points, points[1:]))
    done = any(e["type"] == "animation_done" for e in events[:events.index(end)])
    return BracketedWait(elapsed, gap, done, len(during))


def test_wait_returns_after_the_screen_settles(target, desktop):
    stalls: list[str] = []
    for attempt in range(ATTEMPTS):
        probe = desktop.start_probe(animate=1.0)
        try:
            seen = bracketed_wait(target, probe, attempt)
        finally:
            probe.stop()
        assert seen.elapsed < 5.0, seen.describe()
        if seen.done_before_return:
            return
        # It returned while the animation still had time to run: right only when the animation stalled.
        assert seen.gap >= STALL_GAP_S, f"wait returned while the screen was still changing: {seen.describe()}"
        stalls.append(seen.describe())
    pytest.fail(f"the probe's animation stalled in each of {ATTEMPTS} attempts, so the screen settled before it "
                f"ended: {'; '.join(stalls)}")


def test_wait_on_a_settled_screen_is_short(target, desktop):
    target.run([{"type": "wait"}])
    start = time.monotonic()
    target.run([{"type": "wait"}])
    assert time.monotonic() - start < 1.5


def test_wait_is_capped_when_the_screen_never_settles(target, desktop):
    probe = desktop.start_probe(animate=60.0)
    try:
        stalls: list[str] = []
        for attempt in range(ATTEMPTS):
            seen = bracketed_wait(target, probe, attempt)
            # Never past the cap (a wait that ignores it runs to the request's deadline)...
            assert seen.elapsed < WAIT_CAP_S + 1.5, f"cap {WAIT_CAP_S:g} s: {seen.describe()}"
            if seen.elapsed >= WAIT_CAP_S:  # ...and on a screen that keeps changing, up to it
                assert not seen.done_before_return
                return
            # It settled before the cap: right only when the animation stalled for the quiet period.
            assert seen.gap >= STALL_GAP_S, (
                f"wait returned before its {WAIT_CAP_S:g} s cap while the screen kept changing: {seen.describe()}")
            stalls.append(seen.describe())
        pytest.fail(f"the probe's animation stalled in each of {ATTEMPTS} attempts, so the screen settled and "
                    f"the cap was never reached: {'; '.join(stalls)}")
    finally:
        probe.stop()


def test_release_lets_go_of_keys_and_buttons_pressed_elsewhere(target, desktop):
    if desktop.pressed() is None:
        pytest.skip("the desktop's key map is not observable from here")
    try:
        shift = desktop.press_elsewhere()
        keys, buttons = desktop.pressed()
        assert shift in keys and buttons
    finally:
        target.release()
    assert desktop.pressed() == ([], 0)


def test_nothing_pressed_after_a_refused_request(target, desktop):
    with pytest.raises(TargetError) as err:
        target.run([{"type": "keypress", "keys": ["shift"]},
                    {"type": "click", "x": 10, "y": 10, "button": "left", "keys": ["shift"]},
                    {"type": "click", "x": -5, "y": 10, "button": "left"}])
    assert err.value.code == "out_of_bounds" and err.value.index == 2
    state = desktop.pressed()
    if state is not None:
        assert state == ([], 0)
