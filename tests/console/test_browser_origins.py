"""Origin requests in the console, in a real browser (Debian's chromium through Playwright), against the
real gateway (mitmproxy and the policy addon, control API on loopback): a connection the gateway holds
becomes a card with the origin, the gateway's reason, a countdown to its deadline and the buttons
Approve, Deny and Cancel (focus on Deny); Approve lets the connection through, Cancel refuses it; the
card goes away once the request is decided."""

from __future__ import annotations

import pytest

from controller.run.origins import GatewayControl, GatewayWatcher
from tests.console.conftest import LIVE_ID, Runner, until
from tests.controller.origin_gateway import start_ask_gateway


@pytest.fixture
def gateway(tmp_path):
    gw = start_ask_gateway(tmp_path, ("ask",), hold_timeout_s=60)
    yield gw
    gw.stop()


def test_an_origin_request_is_a_card_with_three_answers(browser, console, live, gateway):
    from playwright.sync_api import expect

    runner = Runner(live)
    runner.attach(None, (1280, 800))
    control = GatewayControl(gateway.control_url, gateway.token)
    watcher = GatewayWatcher(control, live.registry).start()
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    problems: list[str] = []
    page.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))
    try:
        page.goto(console.url)
        page.goto(f"{console.base}/runs/{LIVE_ID}", wait_until="domcontentloaded")  # no frame: no load event
        expect(page.locator("#conn")).to_have_text("live")

        held = gateway.fetch_later(gateway.url("ask"))
        card = page.locator('.card[data-kind="origin_access"]')
        expect(card).to_be_visible()
        request = next(r for r in live.registry.pending() if r.kind == "origin_access")
        assert card.get_attribute("data-request-id") == request.id
        expect(card.locator("code.origin")).to_have_text(gateway.origin("ask"))
        expect(card.locator(".reason")).to_contain_text("plain-HTTP request to this origin")
        expect(card.locator(".countdown")).to_contain_text("the gateway refuses it in")
        buttons = card.get_by_role("button")
        expect(buttons).to_have_text(["Approve", "Deny", "Cancel"])
        assert page.evaluate("document.activeElement.textContent") == "Deny"
        card.get_by_role("button", name="Approve").click()
        expect(card).to_have_count(0)
        assert held.result(15) == 200 and len(gateway.origins["ask"].hits) == 1
        assert (request.state, request.by) == ("approved", "console")
        assert control.get(request.id)["by"] == "console"

        # an approval is remembered for the sandbox's life: the next connection asks nobody
        assert gateway.fetch(gateway.url("ask")) == 200
        # the record's lines about it, in the network log, as text
        live.on_entry({"type": "approval", "ts": "2030-01-01T10:11:12.000+00:00", "what": "origin_access",
                       "decision": "approved", "by": "console", "origin": "https://<b>x</b>.test",
                       "request_id": request.id})
        live.on_entry({"type": "network", "ts": "2030-01-01T10:11:13.000+00:00", "origin": gateway.origin("ask"),
                       "decision": "allow", "reason": "approved", "request_id": request.id, "held_ms": 812})
        network = page.locator("#network")
        expect(network).to_contain_text("origin request https://<b>x</b>.test: approved by console")
        expect(network).to_contain_text(f"allow {gateway.origin('ask')} (approved) after 812 ms held")
        assert network.locator("b").count() == 0
        assert len([r for r in live.registry.all() if r.kind == "origin_access"]) == 1
        assert problems == [], problems
    finally:
        page.close()
        watcher.stop()
        control.close()
        runner.close()


def test_cancel_in_the_card_refuses_the_held_connection_and_the_next_attempt_asks_again(
        browser, console, live, gateway):
    from playwright.sync_api import expect

    runner = Runner(live)
    runner.attach(None, (1280, 800))
    control = GatewayControl(gateway.control_url, gateway.token)
    watcher = GatewayWatcher(control, live.registry).start()
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    try:
        page.goto(console.url)
        page.goto(f"{console.base}/runs/{LIVE_ID}", wait_until="domcontentloaded")  # no frame: no load event
        held = gateway.fetch_later(gateway.url("ask"))
        card = page.locator('.card[data-kind="origin_access"]')
        expect(card).to_be_visible()
        first = card.get_attribute("data-request-id")
        card.get_by_role("button", name="Cancel").click()
        expect(card).to_have_count(0)
        assert held.result(15) == 403 and gateway.origins["ask"].hits == []
        assert live.registry.get(first).state == "cancelled"
        again = gateway.fetch_later(gateway.url("ask"))
        expect(page.locator(f'.card[data-kind="origin_access"]:not([data-request-id="{first}"])')).to_be_visible()
        second = next(r for r in live.registry.pending() if r.kind == "origin_access")
        page.locator(f'.card[data-request-id="{second.id}"]').get_by_role("button", name="Deny").click()
        assert again.result(15) == 403
        until(lambda: second.state == "denied", what="the deny")
    finally:
        page.close()
        watcher.stop()
        control.close()
        runner.close()
