"""Sign-in requests (``browser_authentication``) in a real browser (Debian's chromium through Playwright):
the card (heading, the credential origin, the reason, the methods or the fields, every value masked),
Submit and Cancel deciding the request in the registry, refusals shown with empty inputs to retry, and
the values nowhere once sent: not in the page (DOM, inputs, storage, URL, the script's heap), not in
what the console serves (the answer, the approvals, the state, the event stream), not in a log.

Values are typed with real key events (``press_sequentially``), so no string of the test's ever enters
the page's script: a value found in its heap is one the console's script kept."""

from __future__ import annotations

import json
import logging
import time
from typing import Any

import pytest

from tests.console.conftest import LIVE_ID, until

ORIGIN = "http://signin-demo:8080"
EMAIL = "alice.S7kq@signin-demo.test"
PASSWORD = "pw-Vq93-xLm2-hidden"
FIELDS = [{"id": "email", "label": "E-mail", "type": "email", "required": True, "kind": "email"},
          {"id": "password", "label": "Password", "type": "password", "required": True, "kind": "password"}]

LEFTOVERS = """() => ({
  content: document.documentElement.outerHTML,
  inputs: [...document.querySelectorAll("input")].map((i) => i.value),
  local: JSON.stringify(Object.entries(localStorage)),
  session: JSON.stringify(Object.entries(sessionStorage)),
  url: location.href,
})"""
"""What a page holds that a value could stay in: its markup, every input's value, both storages, its URL."""


def open_run(browser: Any, console: Any) -> tuple[Any, Any, list[str]]:
    """A new browser context logged in to ``console`` on the live run's page (stream connected):
    ``(context, page, problems)``, ``problems`` collecting the page's script errors."""
    from playwright.sync_api import expect

    context = browser.new_context()
    page = context.new_page()
    problems: list[str] = []
    page.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))
    page.goto(console.url)
    page.goto(f"{console.base}/runs/{LIVE_ID}")
    expect(page.locator("#conn")).to_have_text("live")
    return context, page, problems


def card_of(page: Any, request: Any) -> Any:
    return page.locator(f'.card[data-request-id="{request.id}"]')


def value_lengths(card: Any) -> list[int]:
    """The lengths of the card's value inputs (their values never come back to the test)."""
    return card.locator("input[type=password]").evaluate_all("(inputs) => inputs.map((i) => i.value.length)")


def assert_nowhere_in_page(page: Any, values: list[str]) -> None:
    """None of ``values`` in the page's markup, inputs, storage or URL."""
    held = page.evaluate(LEFTOVERS)
    for value in values:
        for where, text in held.items():
            assert value not in json.dumps(text), f"a submitted value stayed in the page's {where}"


def heap_holds(context: Any, page: Any, values: list[str]) -> list[str]:
    """Those of ``values`` found in the strings of the page's script heap (a heap snapshot over CDP,
    which collects garbage first: only strings something still refers to remain)."""
    cdp = context.new_cdp_session(page)
    chunks: list[str] = []
    cdp.on("HeapProfiler.addHeapSnapshotChunk", lambda event: chunks.append(event["chunk"]))
    cdp.send("HeapProfiler.enable")
    cdp.send("HeapProfiler.collectGarbage")
    cdp.send("HeapProfiler.takeHeapSnapshot", {"reportProgress": False})
    cdp.detach()
    snapshot = "".join(chunks)
    assert len(snapshot) > 1000, "no heap snapshot came back"
    return [value for value in values if value in snapshot]


def hold_answers(page: Any, request: Any) -> list[Any]:
    """Hold the page's POSTs answering ``request`` (each route appended to the list returned, continued
    by the test)."""
    held: list[Any] = []
    page.route(lambda url: url.endswith(f"/approvals/{request.id}"), lambda route: held.append(route))
    return held


def wait_held(page: Any, held: list[Any], timeout: float = 10.0) -> Any:
    """The first held answer, once the page has sent it (Playwright dispatches the route while the
    test waits on the page: each round trip to the page lets it through)."""
    deadline = time.monotonic() + timeout
    while not held:
        if time.monotonic() > deadline:
            pytest.fail("the page never sent its answer")
        page.evaluate("0")
    return held[0]


def test_a_method_is_chosen_and_submitted(browser, console, live):
    from playwright.sync_api import expect

    request = live.registry.open_signin(
        "Choose how to sign in", credential_origin=ORIGIN, fields=[],
        options=[{"id": "opt_password", "label": "Password", "field_ids": []},
                 {"id": "opt_code", "label": "E-mail me a code", "field_ids": []}])
    context, page, problems = open_run(browser, console)
    card = card_of(page, request)
    expect(card).to_be_visible()
    expect(card.locator("h3")).to_have_text("Sign in")
    expect(card.locator(".origin-label")).to_have_text("Credential origin")
    expect(card.locator("code.credential-origin")).to_have_text(ORIGIN)
    expect(card.locator(".reason")).to_have_text("Choose how to sign in")
    expect(card.get_by_role("button", name="Approve")).to_have_count(0)  # not an approve/deny card
    expect(card.locator("input[type=radio]")).to_have_count(2)
    expect(card.locator("input[type=password]")).to_have_count(0)

    card.get_by_role("button", name="Submit").click()  # a method must be chosen first
    expect(card.locator(".error")).to_have_text("Choose a sign-in method.")
    assert request.pending

    card.get_by_label("E-mail me a code").check()
    expect(card.locator("input[type=password]")).to_have_count(0)  # this method takes no value
    card.get_by_role("button", name="Submit").click()
    until(lambda: request.state == "submitted", what="the registry to take the submit")
    assert request.selected_option == "opt_code" and request.by == "console"
    assert live.registry.take_values(request) == []
    expect(card).to_have_count(0)
    expect(page.locator("#no-approvals")).to_be_visible()
    assert problems == [], problems
    context.close()


def test_a_method_shows_only_its_fields(browser, console, live):
    from playwright.sync_api import expect

    request = live.registry.open_signin(
        "Sign in", credential_origin=ORIGIN,
        fields=[{"id": "password", "label": "Password", "type": "password", "required": True, "kind": "password"},
                {"id": "code", "label": "One-time code", "type": "text", "required": True, "kind": "code"}],
        options=[{"id": "with_password", "label": "Password", "field_ids": ["password"]},
                 {"id": "with_code", "label": "Code", "field_ids": ["code"]}])
    context, page, problems = open_run(browser, console)
    card = card_of(page, request)
    expect(card.locator("input[type=radio]")).to_have_count(2)
    expect(card.locator("input[type=password]")).to_have_count(0)  # none before a method is chosen
    card.get_by_label("Password", exact=True).first.check()
    inputs = card.locator("input[type=password]")
    expect(inputs).to_have_count(1)
    expect(inputs).to_have_attribute("data-field-id", "password")
    inputs.press_sequentially("typed-then-switched")
    card.locator('input[type=radio][value="with_code"]').check()
    expect(inputs).to_have_count(1)
    expect(inputs).to_have_attribute("data-field-id", "code")  # the other method's input is gone, and with it its value
    assert value_lengths(card) == [0]
    card.get_by_label("One-time code").press_sequentially("481516")
    card.get_by_role("button", name="Submit").click()
    until(lambda: request.state == "submitted", what="the registry to take the submit")
    assert request.selected_option == "with_code" and request.submitted_fields == ["code"]
    assert live.registry.take_values(request) == [("code", "481516")]
    assert_nowhere_in_page(page, ["481516", "typed-then-switched"])
    assert problems == [], problems
    context.close()


def test_submitted_values_leave_the_page_before_the_answer_comes(browser, console, live):
    from playwright.sync_api import expect

    request = live.registry.open_signin("Sign in to read the report", credential_origin=ORIGIN, fields=FIELDS,
                                        options=[])
    context, page, problems = open_run(browser, console)
    card = card_of(page, request)
    inputs = card.locator("input")
    expect(inputs).to_have_count(2)
    for i in range(2):  # every value is masked, the e-mail address too; none is remembered by the browser
        expect(inputs.nth(i)).to_have_attribute("type", "password")
        expect(inputs.nth(i)).to_have_attribute("autocomplete", "off")
        expect(inputs.nth(i)).to_have_attribute("required", "")
    assert card.locator("form").count() == 0 and page.locator("form").count() == 0
    card.get_by_label("E-mail").press_sequentially(EMAIL)
    card.get_by_label("Password").press_sequentially(PASSWORD)
    assert value_lengths(card) == [len(EMAIL), len(PASSWORD)]

    held = hold_answers(page, request)
    card.get_by_role("button", name="Submit").click()
    route = wait_held(page, held)
    # the answer is on its way, not answered yet: the page holds no input and no value any more
    assert json.loads(route.request.post_data) == {
        "action": "submit", "fields": [{"field_id": "email", "value": EMAIL}, {"field_id": "password", "value": PASSWORD}]}
    expect(card.locator("input")).to_have_count(0)
    assert_nowhere_in_page(page, [EMAIL, PASSWORD])
    assert heap_holds(context, page, [EMAIL, PASSWORD]) == [], "the page's script kept a value"
    assert request.pending
    route.continue_()

    until(lambda: request.state == "submitted", what="the registry to take the submit")
    assert request.by == "console" and request.selected_option is None
    assert live.registry.take_values(request) == [("email", EMAIL), ("password", PASSWORD)]
    expect(card).to_have_count(0)
    assert_nowhere_in_page(page, [EMAIL, PASSWORD])
    assert heap_holds(context, page, [EMAIL, PASSWORD]) == [], "the page's script kept a value"
    assert problems == [], problems
    context.close()


def test_cancel_cancels_and_sends_nothing(browser, console, live):
    from playwright.sync_api import expect

    request = live.registry.open_signin("Sign in", credential_origin=ORIGIN, fields=FIELDS, options=[])
    context, page, problems = open_run(browser, console)
    card = card_of(page, request)
    card.get_by_label("Password").press_sequentially(PASSWORD)
    held = hold_answers(page, request)
    card.get_by_role("button", name="Cancel").click()
    route = wait_held(page, held)
    assert json.loads(route.request.post_data) == {"action": "cancel"}
    expect(card.locator("input")).to_have_count(0)
    route.continue_()
    until(lambda: request.state == "cancelled", what="the registry to take the cancel")
    assert request.by == "console" and live.registry.take_values(request) == []
    expect(card).to_have_count(0)
    assert_nowhere_in_page(page, [PASSWORD])
    assert problems == [], problems
    context.close()


def test_refused_answers_say_why_without_the_value_and_can_be_retried(browser, console, live):
    from playwright.sync_api import expect

    request = live.registry.open_signin("Sign in", credential_origin=ORIGIN, fields=FIELDS, options=[])
    context, page, problems = open_run(browser, console)
    path = f"{console.auth.base}/runs/{LIVE_ID}/approvals/{request.id}"

    # a page that posts what the card never would: an unknown field id
    status, text = page.evaluate("""async ([url, body]) => {
      const csrf = document.querySelector('meta[name="csrf-token"]').content;
      const r = await fetch(url, {method: "POST", headers: {"Content-Type": "application/json", "X-CSRF-Token": csrf}, body});
      return [r.status, await r.text()];
    }""", [path, json.dumps({"action": "submit", "fields": [{"field_id": "pin", "value": PASSWORD}]})])
    assert status == 400 and json.loads(text)["error"]["code"] == "invalid_answer", text
    assert PASSWORD not in text and "pin" in json.loads(text)["error"]["message"]
    assert request.pending

    # the card's own answer refused by the registry (a value over 16384 characters): the message is
    # shown, the inputs come back empty, and a second try goes through
    card = card_of(page, request)
    too_long = "Qz7" * 5462
    card.get_by_label("E-mail").press_sequentially(EMAIL)
    card.get_by_label("Password").fill(too_long)
    with page.expect_response(lambda r: r.url.endswith(path)) as answered:
        card.get_by_role("button", name="Submit").click()
    assert answered.value.status == 400 and too_long not in answered.value.text()
    expect(card.locator(".error")).to_contain_text("invalid_answer: fields.1.value")
    expect(card.locator("input")).to_have_count(2)
    assert value_lengths(card) == [0, 0]
    assert request.pending
    assert_nowhere_in_page(page, [EMAIL, too_long])
    card.get_by_label("E-mail").press_sequentially(EMAIL)
    card.get_by_label("Password").press_sequentially(PASSWORD)
    card.get_by_role("button", name="Submit").click()
    until(lambda: request.state == "submitted", what="the registry to take the second try")
    assert live.registry.take_values(request) == [("email", EMAIL), ("password", PASSWORD)]
    expect(card).to_have_count(0)
    assert problems == [], problems
    context.close()


def test_origin_reason_labels_and_refusals_show_as_text(browser, console, live):
    from playwright.sync_api import expect

    request = live.registry.open_signin(
        "<script>window.bad = 1</script>sign\nin", credential_origin="http://evil.test\x1b[31m<b>bold</b>\u202e",
        fields=[{"id": "password", "label": "<b>Pass</b>\x07word", "type": "password", "required": True,
                 "kind": "password"}],
        options=[{"id": "pw", "label": "<i>Password</i> method", "field_ids": ["password"]}])
    assert "\\x1b" in request.credential_origin and "\\u202e" in request.credential_origin  # escaped as text
    context, page, problems = open_run(browser, console)
    card = card_of(page, request)
    expect(card.locator("code.credential-origin")).to_have_text(request.credential_origin)
    expect(card.locator(".reason")).to_have_text(request.question)
    expect(card.locator("label.method")).to_have_text(" <i>Password</i> method")
    card.locator("input[type=radio]").check()
    expect(card.locator(".signin-field .label")).to_have_text(request.fields[0]["label"])
    assert card.locator("b, i, script").count() == 0, "text from the page must never become markup"

    # a refusal's message is shown as text too
    page.route(lambda url: url.endswith(f"/approvals/{request.id}"), lambda route: route.fulfill(
        status=400, content_type="application/json",
        body=json.dumps({"error": {"code": "invalid_answer", "message": "<b>no</b> <img src=x>"}})))
    card.locator("input[type=password]").press_sequentially(PASSWORD)
    card.get_by_role("button", name="Submit").click()
    expect(card.locator(".error")).to_have_text("invalid_answer: <b>no</b> <img src=x>")
    assert card.locator("b, i, img, script").count() == 0
    expect(card.locator("input[type=password]")).to_have_count(1)  # new, empty inputs once the card is ready again
    assert value_lengths(card) == [0] and request.pending
    assert page.evaluate("window.bad === undefined")
    assert problems == [], problems
    context.close()


def test_what_the_console_serves_and_logs_holds_no_value(browser, console, live, caplog, capfd):
    caplog.set_level(logging.DEBUG)
    request = live.registry.open_signin("Sign in", credential_origin=ORIGIN, fields=FIELDS, options=[])
    context, page, problems = open_run(browser, console)
    card = card_of(page, request)
    card.get_by_label("E-mail").press_sequentially(EMAIL)
    card.get_by_label("Password").press_sequentially(PASSWORD)
    with page.expect_response(lambda r: r.url.endswith(f"/approvals/{request.id}")) as answered:
        card.get_by_role("button", name="Submit").click()
    served = {"answer": answered.value.text()}
    assert answered.value.status == 202 and json.loads(served["answer"])["submitted_fields"] == ["email", "password"]
    until(lambda: request.state == "submitted", what="the registry to take the submit")

    # what the page polls and streams, fetched again after the submit
    served.update(page.evaluate("""async (base) => {
      const out = {};
      for (const path of ["/approvals", "/state"]) out[path] = await (await fetch(base + path, {cache: "no-store"})).text();
      const resp = await fetch(base + "/events", {cache: "no-store"});
      const reader = resp.body.getReader();
      const decoder = new TextDecoder();
      let text = "";
      const deadline = Date.now() + 10000;
      while (!text.includes('"state":"submitted"') && Date.now() < deadline) {
        const {value, done} = await reader.read();
        if (done) break;
        text += decoder.decode(value, {stream: true});
      }
      await reader.cancel();
      out["/events"] = text;
      return out;
    }""", f"{console.auth.base}/runs/{LIVE_ID}"))
    assert '"state":"submitted"' in served["/events"], served["/events"][-500:]
    served["live events"] = json.dumps(live.events_after(0, 0))
    served["request"] = json.dumps(request.as_json())
    for where, text in served.items():
        for value in (EMAIL, PASSWORD):
            assert value not in text, f"a submitted value is in {where}"
    logged = caplog.text + "".join(capfd.readouterr())
    assert EMAIL not in logged and PASSWORD not in logged
    assert live.registry.take_values(request) == [("email", EMAIL), ("password", PASSWORD)]
    assert problems == [], problems
    context.close()
