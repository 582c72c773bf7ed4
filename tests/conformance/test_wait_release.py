"""wait (frame-stable, capped) and release (nothing left pressed)."""

from __future__ import annotations

import time

import pytest

from .conftest import WAIT_CAP_S  # the cap every agent this suite runs against is started with
from .harness import TargetError


def test_wait_returns_after_the_screen_settles(target, desktop):
    probe = desktop.start_probe(animate=1.0)
    try:
        start = time.monotonic()
        target.run([{"type": "wait"}])
        elapsed = time.monotonic() - start
        assert any(e["type"] == "animation_done" for e in probe.events()), \
            f"wait returned after {elapsed:.2f} s while the screen was still changing"
        assert elapsed < 5.0
    finally:
        probe.stop()


def test_wait_on_a_settled_screen_is_short(target, desktop):
    target.run([{"type": "wait"}])
    start = time.monotonic()
    target.run([{"type": "wait"}])
    assert time.monotonic() - start < 1.5


def test_wait_is_capped_when_the_screen_never_settles(target, desktop):
    probe = desktop.start_probe(animate=60.0)
    try:
        start = time.monotonic()
        target.run([{"type": "wait"}])
        elapsed = time.monotonic() - start
        # The wait runs to the cap (it never settles on a changing screen) and stops there.
        assert WAIT_CAP_S <= elapsed < WAIT_CAP_S + 1.5, f"wait took {elapsed:.2f} s, cap {WAIT_CAP_S:g} s"
        assert not any(e["type"] == "animation_done" for e in probe.events())
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
