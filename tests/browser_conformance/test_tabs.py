"""Tabs: ``new_tab``, ``list_tabs``, ``switch_tab``, ``close_tab`` and the observation's ``tab_opened``,
``tab_switched``, ``tab_closed`` and ``navigation`` changes; tabs the page itself opens (a link with
``target=_blank``, ``window.open``) show in the state, in front; reads of a tab not in front."""

from __future__ import annotations

from .harness import element, origin


def test_navigate_shows_the_page_and_records_the_navigation(browser, site):
    mark = browser.ok("list_tabs").sequence
    outcome = browser.ok("navigate", url=site.base + "/other")
    assert outcome.result is None
    assert outcome.active["url"] == origin(site.base) and outcome.active["title"] == "Other"
    changes = outcome.changes_after(mark)
    assert {"type": "navigation", "tab_id": outcome.active["id"]} in [
        {"type": c["type"], "tab_id": c["tab_id"]} for c in changes], changes


def test_new_switch_and_close_tab(browser, site):
    first = browser.ok("list_tabs").active["id"]
    mark = browser.ok("navigate", url=site.base + "/form").sequence
    opened = browser.ok("new_tab", url=site.base + "/other")
    assert len(opened.tabs) == 2
    new = opened.active
    assert new["id"] != first and new["title"] == "Other" and new["url"] == origin(site.base)
    assert ("tab_opened", new["id"]) in [(c["type"], c["tab_id"]) for c in opened.changes_after(mark)]
    assert "The other page" in browser.text()
    assert "Feature form" in browser.text(tab_id=first)  # a tab not in front is read by its id
    listed = browser.ok("list_tabs")
    assert listed.result is None and [t["id"] for t in listed.tabs] == [t["id"] for t in opened.tabs]
    mark = listed.sequence
    switched = browser.ok("switch_tab", tab_id=first)
    assert switched.active["id"] == first and switched.active["title"] == "Form page"
    assert ("tab_switched", first) in [(c["type"], c["tab_id"]) for c in switched.changes_after(mark)]
    closed = browser.ok("close_tab", tab_id=new["id"])
    assert [t["id"] for t in closed.tabs] == [first]
    assert ("tab_closed", new["id"]) in [(c["type"], c["tab_id"]) for c in closed.changes_after(mark)]
    browser.refused("switch_tab", tab_id=new["id"])
    browser.refused("close_tab", tab_id=new["id"])


def test_new_tab_without_a_url_is_blank(browser, site):
    opened = browser.ok("new_tab", url=None)
    assert len(opened.tabs) == 2 and opened.active["url"] == "about:blank"


def test_tabs_the_page_opens_come_to_the_front(browser, site):
    report = browser.goto(site.base + "/form")
    listed = browser.ok("list_tabs")
    first, mark = listed.active["id"], listed.sequence
    browser.ok("click", target=element(report, "Open blank")["ref"])
    popup = browser.until(lambda o: len(o.tabs) == 2 and o.active["title"] == "Popup", what="the target=_blank tab")
    assert popup.active["id"] != first
    assert ("tab_opened", popup.active["id"]) in [(c["type"], c["tab_id"]) for c in popup.changes_after(mark)]
    assert "A popup page" in browser.text()
    browser.ok("switch_tab", tab_id=first)
    browser.ok("click", target=element(report, "Open window")["ref"])
    opened = browser.until(lambda o: len(o.tabs) == 3, what="the window.open tab")
    assert opened.active["id"] not in (first, popup.active["id"])
    browser.until(lambda o: o.active["title"] == "Popup", what="the window.open tab's title")
