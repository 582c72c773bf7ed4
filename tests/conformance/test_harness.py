"""The harness itself: a probe that sees nothing fails saying why (lost focus, probe gone).

Runs on the local Xvfb only (it opens its own X client to steal the focus), so the Docker and VM
wrappers do not import it.
"""

from __future__ import annotations

import pytest
from Xlib import X
from Xlib import display as xdisplay

from .harness import poll


@pytest.fixture()
def thief(desktop):
    """A second top-level window on the test's display that takes the keyboard focus."""
    if desktop.display is None:
        pytest.skip("needs the display reachable from the test")
    dpy = xdisplay.Display(desktop.display)
    screen = dpy.screen()
    win = screen.root.create_window(0, 0, 10, 10, 0, screen.root_depth, override_redirect=True)
    win.set_wm_class("focus-thief", "FocusThief")
    win.map()
    dpy.sync()
    yield dpy, win
    win.destroy()
    dpy.close()


def test_keys_after_a_focus_theft_fail_naming_the_thief(target, probe, thief):
    dpy, win = thief
    dpy.set_input_focus(win, X.RevertToParent, X.CurrentTime)
    dpy.sync()
    poll(lambda: probe.focus_lost() is not None, 5, what="the probe to log its FocusOut")
    with pytest.raises(AssertionError) as err:
        probe.run_and_collect(target, [{"type": "type", "text": "a"}])
    message = str(err.value)
    assert "does not have the keyboard focus" in message
    assert "FocusThief" in message and str(win.id) in message

    # A click on the probe gives it the focus back, and keys arrive again.
    w, h = target.screen_size
    target.run([{"type": "click", "x": w // 2, "y": h // 2, "button": "left"}])
    poll(lambda: probe.focus_lost() is None, 5, what="the probe to get the focus back")
    events = probe.run_and_collect(target, [{"type": "type", "text": "a"}])
    assert [e["keysym_name"] for e in events if e["type"] == "KeyPress"] == ["a"]


def test_a_probe_that_is_gone_is_named_in_the_failure(desktop, target):
    p = desktop.start_probe()
    p.check_ready_state()
    p.stop()
    with pytest.raises(AssertionError) as err:
        p.run_and_collect(target, [{"type": "move", "x": 5, "y": 5}], timeout=1.0)
    assert f"probe pid {p.pid} NOT running" in str(err.value)
