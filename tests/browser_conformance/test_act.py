"""Acting on elements by ref: ``type``, ``select_option``, ``set_checked``, ``click`` and ``key`` change
the page as a person's input would (the page notes what it received in its text); what cannot be acted
on is refused (``ok`` false, the page untouched), and refs go stale with their document."""

from __future__ import annotations

from .harness import BrowserSession, element


def test_type_replaces_a_fields_content(browser, site):
    report = browser.goto(site.base + "/form")
    browser.ok("type", text="Grace Hopper", target=element(report, "Full name")["ref"])
    browser.ok("type", text="é日\nline two", target=element(report, "Notes")["ref"])
    after = browser.ok("read_page", filter="interactive").result
    assert element(after, "Full name")["value"] == "Grace Hopper"
    assert element(after, "Notes")["value"] == "é日\nline two"


def test_type_without_a_target_types_at_the_focus(browser, site):
    report = browser.goto(site.base + "/form")
    browser.ok("click", target=element(report, "Editor")["ref"])
    browser.ok("key", keys=["Control", "a"])
    browser.ok("type", text="typed at the focus")
    assert element(browser.ok("read_page", filter="all").result, "Editor")["value"] == "typed at the focus"


def test_select_option_by_value_or_label(browser, site):
    report = browser.goto(site.base + "/form")
    browser.ok("select_option", target=element(report, "Colour")["ref"], values=["Blue"])
    browser.ok("select_option", target=element(report, "Extras")["ref"], values=["x", "Extra Z"])
    browser.wait_text("colour b")
    browser.wait_text("extras x,z")
    after = browser.ok("read_page", filter="interactive").result
    assert element(after, "Colour")["value"] == "b"
    assert [o.get("selected") for o in element(after, "Extras")["options"]] == [True, False, True]


def test_set_checked_checks_boxes_and_radios(browser, site):
    report = browser.goto(site.base + "/form")
    agree = element(report, "I agree")["ref"]
    browser.ok("set_checked", target=agree, checked=True)
    browser.ok("set_checked", target=agree, checked=True)  # already checked: nothing changes
    browser.ok("set_checked", target=element(report, "Small")["ref"], checked=True)
    browser.wait_text("size s")
    after = browser.ok("read_page", filter="interactive").result
    assert element(after, "I agree")["checked"] is True
    assert element(after, "Small")["checked"] is True and element(after, "Large")["checked"] is False
    assert browser.text().count("agree true") == 1
    browser.ok("set_checked", target=agree, checked=False)
    assert element(browser.ok("read_page", filter="interactive").result, "I agree")["checked"] is False


def check_click_submits(browser: BrowserSession, base: str, timeout_ms: int = 10_000) -> None:
    """``click`` on the form's submit button submits it: the page notes ``submitted Ada``."""
    report = browser.goto(base + "/form")
    browser.ok("click", target=element(report, "Send form")["ref"])
    browser.wait_text("submitted Ada", timeout_ms)


def test_click_submits_the_form(browser, site):
    check_click_submits(browser, site.base)


def test_click_reaches_shadow_roots_and_frames(browser, site):
    report = browser.goto(site.base + "/form")
    browser.ok("click", target=element(report, "Shadow button")["ref"])
    browser.wait_text("shadow clicked")
    browser.ok("click", target=element(report, "Frame button")["ref"])
    browser.wait_text("frame clicked")


def test_key_presses_chords_into_the_focused_field(browser, site):
    report = browser.goto(site.base + "/form")
    browser.ok("type", text="Ada Byron", target=element(report, "Full name")["ref"])
    browser.ok("key", keys=["Enter"])  # in a form's text field: submits it
    browser.wait_text("keydown Enter")
    browser.wait_text("submitted Ada Byron")
    browser.ok("type", text="", target=element(report, "E-mail")["ref"])  # focus it, empty
    browser.ok("key", keys=["Shift", "b"])
    browser.wait_text("keydown B")
    assert element(browser.ok("read_page", filter="interactive").result, "E-mail")["value"] == "B"


def test_what_cannot_be_acted_on_is_refused(browser, site):
    report = browser.goto(site.base + "/form")
    before = browser.text()
    for member, arguments in [
        ("click", {"target": element(report, "Disabled button")["ref"]}),
        ("click", {"target": element(report, "Under")["ref"]}),  # covered by another element
        ("type", {"text": "x", "target": element(report, "Send form")["ref"]}),  # not a text field
        ("select_option", {"target": element(report, "Colour")["ref"], "values": ["purple"]}),
        ("select_option", {"target": element(report, "Colour")["ref"], "values": ["r", "g"]}),  # one value only
        ("set_checked", {"target": element(report, "Send form")["ref"], "checked": True}),
        ("click", {"target": "a-ref-never-issued"}),
        ("read_page", {"tab_id": "no-such-tab", "filter": "all"}),
    ]:
        if browser.serves(member):
            outcome = browser.refused(member, **arguments)
            assert outcome.active["title"] == "Form page", (member, outcome.tabs)
    after = browser.text()
    assert "off clicked" not in after and "under clicked" not in after and after == before


def test_refs_go_stale_with_their_document(browser, site):
    report = browser.goto(site.base + "/form")
    ref = element(report, "Send form")["ref"]
    browser.ok("navigate", url=site.base + "/form")  # a new document of the same page
    browser.refused("click", target=ref)
    assert "submitted" not in browser.text()
