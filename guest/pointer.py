"""Pointer input through XTEST: move, click, double click, drag and scroll, in screen pixels.

Buttons (Responses ``button`` names -> X buttons): left 1, wheel 2 (middle), right 3, back 8,
forward 9. Scroll uses the wheel buttons: 4 up / 5 down for ``scroll_y``, 6 left / 7 right for
``scroll_x``, after moving the pointer to (x, y) so the scroll goes to what is under it.

Scroll rule: ``clicks = round(|delta| / SCROLL_PX_PER_CLICK)``, at least 1 for any non-zero delta,
0 for a zero delta, at most ``MAX_SCROLL_CLICKS``; the sign gives the direction (positive
``scroll_y`` scrolls down, positive ``scroll_x`` right). ``SCROLL_PX_PER_CLICK`` is calibrated
against the guest browser: firefox-esr 153 (Debian bookworm) with default preferences on Xvfb
1280x800 at 100 % zoom scrolls a page by 114 CSS px per wheel click (measured with a page reporting
``scrollY``; ``tests/guest/test_scroll_firefox.py`` re-measures it), so a model asking for N pixels
gets the nearest whole number of clicks.

Drag: press at ``path[0]``, then motion events every ``DRAG_STEP_PX`` pixels or less along each
segment (so toolkits see real motion and start a drag), landing on every point of the path, and
release at the last point. The motions are flushed to the server every ``FLUSH_EVERY`` events:
python-xlib's send buffer grows quadratically when requests pile up, and a long path makes hundreds
of thousands of them.
"""

from __future__ import annotations

import math

from Xlib import X
from Xlib.display import Display
from Xlib.ext import xtest

from .held import Held

BUTTONS: dict[str, int] = {"left": 1, "wheel": 2, "middle": 2, "right": 3, "back": 8, "forward": 9}
SCROLL_PX_PER_CLICK = 114
MAX_SCROLL_CLICKS = 50
DRAG_STEP_PX = 8
FLUSH_EVERY = 256


def scroll_clicks(delta: int) -> int:
    """Signed number of wheel clicks for a scroll delta in pixels (rule in the module doc)."""
    if delta == 0:
        return 0
    clicks = min(MAX_SCROLL_CLICKS, max(1, round(abs(delta) / SCROLL_PX_PER_CLICK)))
    return clicks if delta > 0 else -clicks


def move(dpy: Display, x: int, y: int) -> None:
    """Queue an absolute pointer motion to (x, y) on screen 0."""
    xtest.fake_input(dpy, X.MotionNotify, x=x, y=y)


def click(dpy: Display, held: Held, x: int, y: int, button: int, count: int = 1, *, sync: bool = True) -> None:
    """Move to (x, y), then ``count`` press/release pairs of ``button``; ends with a round trip unless
    ``sync`` is False (the caller makes one next, e.g. :meth:`guest.held.Held.release_all`)."""
    move(dpy, x, y)
    for _ in range(count):
        held.button_down(dpy, button)
        held.button_up(dpy, button)
    if sync:
        dpy.sync()


def interpolate(path: list[tuple[int, int]], step: int = DRAG_STEP_PX) -> list[tuple[int, int]]:
    """Points from ``path[0]`` to ``path[-1]`` visiting every path point, at most ``step`` apart."""
    out = [path[0]]
    for (x0, y0), (x1, y1) in zip(path, path[1:]):
        n = max(1, math.ceil(max(abs(x1 - x0), abs(y1 - y0)) / step))
        for i in range(1, n + 1):
            out.append((round(x0 + (x1 - x0) * i / n), round(y0 + (y1 - y0) * i / n)))
    return out


def drag(dpy: Display, held: Held, path: list[tuple[int, int]]) -> None:
    """Press button 1 at ``path[0]``, move through the interpolated path, release at the end."""
    points = interpolate(path)
    move(dpy, *points[0])
    held.button_down(dpy, 1)
    for i, (x, y) in enumerate(points[1:], 1):
        move(dpy, x, y)
        if i % FLUSH_EVERY == 0:
            dpy.flush()
    held.button_up(dpy, 1)
    dpy.sync()


def scroll(dpy: Display, held: Held, x: int, y: int, scroll_x: int, scroll_y: int) -> None:
    """Move to (x, y), then send wheel clicks for ``scroll_y`` and ``scroll_x`` (rule above)."""
    move(dpy, x, y)
    for clicks, neg, pos in ((scroll_clicks(scroll_y), 4, 5), (scroll_clicks(scroll_x), 6, 7)):
        button = pos if clicks > 0 else neg
        for _ in range(abs(clicks)):
            held.button_down(dpy, button)
            held.button_up(dpy, button)
    dpy.sync()
