"""The explicit-only pointer and key members: ``click_at``, ``hover_at``, ``drag_path`` and ``hold_keys``
land on the page at the full-viewport coordinates given (the pointer page logs every event's
``clientX``/``clientY``, button, click count and modifiers as text), and keys are held for the
duration asked."""

from __future__ import annotations

import re

import pytest


@pytest.fixture
def pointer(browser, site):
    """The pointer page in front; (w, h) of its viewport (the screenshot's pixels)."""
    browser.goto(site.base + "/pointer")
    return browser.ok("screenshot").images[0].size


def test_click_at_lands_on_the_point_given(browser, pointer):
    w, h = pointer
    for x, y in [(0, 0), (123, 45), (w - 1, h - 1)]:  # the corners: the first and the last pixel
        browser.ok("click_at", x=x, y=y, button="left", click_count=1, keys=[])
        browser.wait_text(f"[click {x} {y} b0 d1]")
    browser.ok("click_at", x=300, y=200, button="right", click_count=1, keys=["Shift"])
    browser.wait_text("[mouseup 300 200 b2 d1 shift]")
    assert "[mousedown 300 200 b2 d1 shift]" in browser.text() and "[contextmenu 300 200 b2" in browser.text()
    browser.ok("click_at", x=310, y=210, button="left", click_count=3, keys=["Control"])
    browser.wait_text("[click 310 210 b0 d3 ctrl]")
    browser.ok("click_at", x=320, y=220, button="middle", click_count=1, keys=[])
    browser.wait_text("[mouseup 320 220 b1 d1]")
    browser.refused("click_at", x=w, y=5, button="left", click_count=1, keys=[])  # just outside the viewport
    assert f"[click {w} 5" not in browser.text()


def test_hover_at_moves_the_pointer_there(browser, pointer):
    browser.ok("hover_at", x=222, y=111)
    browser.wait_text("[move 222 111]")
    assert "[click 222 111" not in browser.text()


def test_drag_path_presses_moves_and_releases_along_the_path(browser, pointer):
    browser.ok("drag_path", path=[{"x": 10, "y": 20}, {"x": 60, "y": 40}, {"x": 100, "y": 90}], keys=[])
    browser.wait_text("[mouseup 100 90 b0")
    text = browser.text()
    assert "[mousedown 10 20 b0" in text and "[drag 100 90]" in text
    assert text.index("[mousedown 10 20") < text.index("[drag 100 90]") < text.index("[mouseup 100 90")


def test_hold_keys_holds_them_for_the_duration(browser, pointer):
    browser.ok("click_at", x=50, y=50, button="left", click_count=1, keys=[])  # the page has the focus
    browser.wait_text("[click 50 50 b0 d1]")
    browser.ok("hold_keys", keys=["Shift", "a"], duration_ms=400)
    browser.wait_text("[keyup KeyA held")
    text = browser.text()
    held = [int(ms) for ms in re.findall(r"\[keyup KeyA held (\d+)\]", text)]
    assert held and held[0] >= 350, text[-400:]
    assert text.index("[keydown Shift") < text.index("[keydown KeyA]")
