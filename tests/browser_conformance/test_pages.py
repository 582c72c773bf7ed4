"""Pages that fight back: JavaScript dialogs are answered at once (dismissed) and observed
(``dialog_dismissed``), downloads are observed (``download``) and leave the page where it was, a page
that never stops loading still returns ``navigate`` within a bound and can be read and left, and URLs
that are not http(s) or about:blank are not loaded even when ``url_policy`` lets them through."""

from __future__ import annotations

import time

from .harness import element

SLOW_NAVIGATE_S = 30.0
"""Longest a ``navigate`` to a page that never stops loading may take (s): the driver's own load
deadline, which must exist (this project's is ``wire.browser_tools.LOAD_TIMEOUT_S``, 20 s)."""


def test_dialogs_are_dismissed_and_observed(browser, site):
    report = browser.goto(site.base + "/dialogs")
    mark = browser.ok("list_tabs").sequence
    for button, answer in [("Alert me", "alert returned undefined"), ("Confirm me", "confirm returned false"),
                           ("Prompt me", "prompt returned null")]:
        browser.ok("click", target=element(report, button)["ref"])
        browser.wait_text(answer)
    changes = browser.ok("list_tabs").changes_after(mark)
    dismissed = [c["kind"] for c in changes if c["type"] == "dialog_dismissed"]
    assert dismissed == ["alert", "confirm", "prompt"], changes


def test_downloads_are_observed_and_leave_the_page(browser, site):
    report = browser.goto(site.base + "/form")
    mark = browser.ok("list_tabs").sequence
    browser.ok("click", target=element(report, "Get file")["ref"])
    seen = browser.until(lambda o: any(c["type"] == "download" for c in o.changes_after(mark)),
                         what="a download change")
    download = next(c for c in seen.changes_after(mark) if c["type"] == "download")
    assert download["status"] in ("blocked", "started", "completed", "failed")
    assert len(seen.tabs) == 1 and seen.active["title"] == "Form page"
    assert "Feature form" in browser.text()


def test_a_page_that_never_stops_loading(browser, site):
    t0 = time.monotonic()
    browser.ok("navigate", url=site.base + "/slow")
    assert time.monotonic() - t0 < SLOW_NAVIGATE_S
    browser.wait_text("Still loading page")
    t0 = time.monotonic()
    left = browser.ok("navigate", url=site.base + "/other")
    assert time.monotonic() - t0 < 10 and left.active["title"] == "Other"
    assert "The other page" in browser.text()


def test_unsupported_urls_are_not_loaded(browser, site):
    start = browser.goto(site.base + "/other")
    assert "The other page" in start["text"]
    mark = browser.ok("list_tabs").sequence
    for url in ["file:///etc/passwd", "chrome://settings", "javascript:document.title='x'", "data:text/html,hi"]:
        outcome = browser.refused("navigate", url=url)
        assert outcome.active["title"] == "Other" and len(outcome.tabs) == 1, (url, outcome.tabs)
    refused = [c for c in browser.ok("list_tabs").changes_after(mark) if c["type"] == "navigation_refused"]
    assert len(refused) == 4 and all(c["reason"] in ("unsupported", "policy") for c in refused), refused
    browser.refused("new_tab", url="file:///etc/passwd")
    assert len(browser.ok("list_tabs").tabs) == 1
    assert "The other page" in browser.text()
