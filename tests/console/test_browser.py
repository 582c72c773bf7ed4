"""The console in a real browser (Debian's chromium through Playwright): log in with the one-time URL,
the runs list, a run's page with its approval cards (Approve in the page approves in the registry; a
terminal's answer removes the card), the live screen, and taking over: a click on the image lands at
the scaled screen position on the real desktop, keys typed on it reach the probe window."""

from __future__ import annotations

import io
from PIL import Image

from tests.console.conftest import LIVE_ID, until, write_record


def _png(width: int, height: int) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (width, height), (40, 90, 200)).save(out, "PNG")
    return out.getvalue()


def test_the_console_in_a_browser(browser, console, runs_dir, live_desktop, desktop):
    from playwright.sync_api import expect

    live, runner = live_desktop
    write_record(runs_dir, "20290101-000000-old-0001", "2029-01-01T00:00:00.000+00:00", "old", "passed")
    (live.record_dir / "shot-0001.png").write_bytes(_png(64, 40))
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    problems: list[str] = []
    page.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))
    page.on("response", lambda resp: problems.append(f"HTTP {resp.status} {resp.url}") if resp.status >= 400 else None)
    page.on("console", lambda msg: problems.append(f"console {msg.type}: {msg.text}") if msg.type == "error" else None)

    page.goto(console.url)
    assert page.url == console.base + "/"
    runs = page.locator("#runs")
    expect(runs).to_contain_text(LIVE_ID)
    expect(runs).to_contain_text("20290101-000000-old-0001")
    expect(runs.locator("tbody tr").first).to_have_attribute("data-run-id", LIVE_ID)

    page.click(f'a[href="{console.auth.base}/runs/{LIVE_ID}"]')
    state = page.locator("#state")
    expect(state).to_have_text("running")
    expect(page.locator("#conn")).to_have_text("live")

    # a request opened in the registry becomes a card; Approve approves it in the registry
    request = live.registry.open("safety_check", "Allow <b>this</b>?", call_id="call_1",
                                 checks=[{"id": "c1", "code": "malicious_instructions", "message": "odd <i>page</i>"}],
                                 actions=["click (10,20) left"], screenshot="shot-0001.png")
    card = page.locator(f'.card[data-request-id="{request.id}"]')
    expect(card).to_be_visible()
    expect(card.locator(".question")).to_have_text("Allow <b>this</b>?")
    expect(card).to_contain_text("malicious_instructions")
    expect(card).to_contain_text("odd <i>page</i>")
    expect(card).to_contain_text("click (10,20) left")
    expect(card).to_contain_text("denied automatically in")
    assert card.locator("b, i").count() == 0, "text from the model must never become markup"
    page.wait_for_function(f"() => document.querySelector('.card[data-request-id=\"{request.id}\"] img').naturalWidth === 64")
    assert page.evaluate("document.activeElement.textContent") == "Deny"
    card.get_by_role("button", name="Approve").click()
    until(lambda: request.state == "approved", what="the registry to record the approval")
    assert request.by == "console"
    expect(card).to_have_count(0)

    # an answer from the terminal removes the open card
    other = live.registry.open("action", "Type 12 chars?", actions=["type <12 chars>"])
    other_card = page.locator(f'.card[data-request-id="{other.id}"]')
    expect(other_card).to_be_visible()
    live.registry.answer(other.id, "deny", by="terminal")
    expect(other_card).to_have_count(0)
    assert other.by == "terminal"

    # record entries become log lines (as text), responses add up in the usage line
    live.on_entry({"type": "action", "ts": "2030-01-01T10:11:12.000+00:00", "action": "click (5,6) left <u>x</u>"})
    live.on_entry({"type": "model_response", "ts": "2030-01-01T10:11:13.000+00:00",
                   "usage": {"input_tokens": 7, "output_tokens": 3, "total_tokens": 10}})
    live.on_entry({"type": "network", "ts": "2030-01-01T10:11:14.000+00:00", "origin": "https://example.com:443",
                   "decision": "deny", "reason": "not allowlisted"})
    expect(page.locator("#log")).to_contain_text("10:11:12  click (5,6) left <u>x</u>")
    assert page.locator("#log u").count() == 0
    expect(page.locator("#usage")).to_contain_text("10 tokens (in 7, out 3) over 1 responses")
    expect(page.locator("#network")).to_contain_text("deny https://example.com:443 (not allowlisted)")

    # the live screen loads
    page.wait_for_function("() => document.getElementById('screen-img').naturalWidth > 0")

    # take over: the state goes human at the loop's step boundary; a click lands scaled to screen px
    page.get_by_role("button", name="Take over").click()
    expect(state).to_have_text("pausing")
    runner.pause_at_boundary()
    expect(state).to_have_text("human")
    box = page.locator("#screen-img").bounding_box()
    mark = desktop.probe.mark()
    page.mouse.click(box["x"] + box["width"] * 0.25, box["y"] + box["height"] * 0.5)
    width, height = desktop.size
    desktop.probe.wait_for(lambda ev: any(e["type"] == "ButtonPress" and abs(e["x"] - width // 4) <= 2
                                          and abs(e["y"] - height // 2) <= 2 for e in ev), mark)
    mark = desktop.probe.mark()
    page.keyboard.type("ok")
    page.keyboard.press("Enter")
    events = desktop.probe.wait_for(lambda ev: any(e["type"] == "KeyPress" and e["keysym_name"] == "Return"
                                                   for e in ev), mark)
    assert [e["keysym_name"] for e in events if e["type"] == "KeyPress"] == ["o", "k", "Return"]
    expect(page.locator("#overlay text")).to_have_text("you: keys ENTER")
    page.get_by_role("button", name="Resume").click()
    expect(state).to_have_text("running")
    runner.thread.join(10)
    assert not runner.thread.is_alive()

    # the model's action is drawn over the screen in screen px
    live.on_forward([{"type": "click", "x": 640, "y": 400, "button": "left"}])
    expect(page.locator("#overlay text")).to_have_text("model: click (640,400) left")
    assert page.locator("#overlay circle").first.get_attribute("cx") == "640"

    # the run ends: the page turns into the finished run's page
    live.finish("passed")
    expect(page.locator("#takeover")).to_have_count(0)
    assert problems == [], problems
