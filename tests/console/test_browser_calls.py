"""Calls of the browser tools (contract 9) on a live run's page, in a real browser (Debian's chromium
through Playwright): the run's record (a real :class:`controller.run.record.RunRecord`, the
``browser_call`` entries as the loop writes them) feeds the run's :class:`controller.run.live.LiveRun`,
which is attached to a real desktop (Xvfb and the agent: the live screen). Each call is one line of the
step list (member, its target, ok or why it failed, typed text as its length); the element a call acted
on is drawn on the live screen, its box (viewport CSS px) placed by the call's viewport (screen px) and
cut to it; a page opened later draws the last one too; strings from the record stay text."""

from __future__ import annotations

from pathlib import Path

from controller.run.entries import BrowserCall, BrowserResult, ModelResponse, browser_arguments
from controller.run.live import browser_box
from controller.run.record import RunRecord
from tests.console.conftest import LIVE_ID

VIEWPORT = {"x": 0.0, "y": 87.0, "width": 1280.0, "height": 493.0}
"""Where the tab's viewport is on the 1280x800 screen (screen px), as the agent reports it."""


def test_browser_box_places_the_element_on_the_screen_and_cuts_it_to_the_viewport():
    assert browser_box({"x": 100, "y": 50, "width": 80, "height": 20}, VIEWPORT) == \
        {"x": 100.0, "y": 137.0, "width": 80.0, "height": 20.0}
    # partly below the viewport: only what is inside it
    assert browser_box({"x": 10, "y": 480, "width": 50, "height": 40}, VIEWPORT) == \
        {"x": 10.0, "y": 567.0, "width": 50.0, "height": 13.0}
    assert browser_box({"x": 10, "y": 600, "width": 50, "height": 40}, VIEWPORT) is None  # wholly outside
    assert browser_box(None, VIEWPORT) is None and browser_box({"x": 1, "y": 1, "width": 5, "height": 5}, None) is None
    assert browser_box({"x": float("nan"), "y": 1, "width": 5, "height": 5}, VIEWPORT) is None
    assert browser_box({"x": 1, "y": 1, "width": 0, "height": 5}, VIEWPORT) is None
    assert browser_box({"x": True, "y": 1, "width": 5, "height": 5}, VIEWPORT) is None


def test_browser_calls_in_the_step_list_and_on_the_live_screen(browser, console, live_desktop, tmp_path: Path):
    from playwright.sync_api import expect

    live, _runner = live_desktop
    record = RunRecord(tmp_path, "browser-calls", bus=live.bus)
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    problems: list[str] = []
    page.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))
    page.on("response", lambda resp: problems.append(f"HTTP {resp.status} {resp.url}") if resp.status >= 400 else None)
    page.goto(console.url)
    page.goto(f"{console.base}/runs/{LIVE_ID}")
    expect(page.locator("#conn")).to_have_text("live")
    log, overlay = page.locator("#log"), page.locator("#overlay")

    record.write(ModelResponse(response_id="resp_1", http_status=200))
    record.write(BrowserCall(step=1, call_id="call_1", member="click", arguments={"tab_id": None, "target": "d1e3"},
                             ok=True, result=BrowserResult(kind="none"),
                             target={"x": 100, "y": 50, "width": 80, "height": 20}, viewport=VIEWPORT, ms=35.2))
    expect(log).to_contain_text("browser click target=d1e3: ok (35 ms)")
    rect = overlay.locator("rect.browser-box")
    expect(rect).to_have_count(1)
    assert [rect.get_attribute(k) for k in ("x", "y", "width", "height")] == ["100", "137", "80", "20"]
    expect(overlay.locator("text")).to_have_text("model: browser click")

    # a page opened now draws the last call too (the stream's first state carries it)
    page.reload()
    expect(page.locator("#conn")).to_have_text("live")
    expect(overlay.locator("rect.browser-box")).to_have_count(1)
    assert overlay.locator("rect.browser-box").get_attribute("y") == "137"
    expect(log).to_contain_text("browser click target=d1e3: ok (35 ms)")

    # typed text: its length only; a box partly outside the viewport is cut to it
    typed = browser_arguments("type", {"tab_id": None, "target": "d1e4", "text": "Ada Lovelace"})
    record.write(BrowserCall(step=1, call_id="call_2", member="type", arguments=typed, ok=True,
                             result=BrowserResult(kind="none"),
                             target={"x": 10, "y": 480, "width": 50, "height": 40}, viewport=VIEWPORT, ms=12.0))
    expect(log).to_contain_text("browser type target=d1e4 <12 chars>: ok (12 ms)")
    expect(overlay.locator("text")).to_have_text("model: browser type")
    assert overlay.locator("rect.browser-box").get_attribute("height") == "13"
    assert "Ada Lovelace" not in page.content()

    # a call without an element: the label only, the last box gone
    record.write(BrowserCall(step=2, call_id="call_3", member="read_page", arguments={"tab_id": None, "filter": "all"},
                             ok=True, result=BrowserResult(kind="read", text_length=1200, elements=14),
                             viewport=VIEWPORT, ms=80.0))
    expect(log).to_contain_text("browser read_page filter=all: read 1200 chars, 14 elements (80 ms)")
    expect(overlay.locator("text")).to_have_text("model: browser read_page")
    expect(overlay.locator("rect.browser-box")).to_have_count(0)

    # what a page or the model chose stays text: markup is not made, control characters are escaped
    record.write(BrowserCall(step=2, call_id="call_4", member="<b>zoom</b>\x1b[31m", ok=False,
                             error="agent refused: <img src=x onerror=alert(1)>\u202e"))
    bad = log.locator("li.bad").last
    expect(bad).to_contain_text("browser <b>zoom</b>\\x1b[31m: FAILED: agent refused: <img src=x onerror=alert(1)>"
                                "\\u202e")
    expect(overlay.locator("text")).to_have_text("model: browser <b>zoom</b>\\x1b[31m FAILED")
    assert page.locator("#log b, #log img, #overlay b, #overlay img").count() == 0
    record.close()
    assert problems == [], problems
