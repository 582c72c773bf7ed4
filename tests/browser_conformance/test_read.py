"""Reads: ``read_page`` (``all`` and ``interactive``), ``get_page_text`` and ``find`` report the site's
form as the SDK's ``BrowserReadV1``: roles, labels, values, options and checked states; controls in an
open shadow root and a same-origin iframe are read; private values never leave the browser."""

from __future__ import annotations

import json

from .harness import element, labels


def test_read_page_reports_the_forms_controls(browser, site):
    report = browser.goto(site.base + "/form")
    assert report["version"] == 1 and "Feature form" in report["text"]
    roles = {e["label"]: e["role"] for e in report["elements"]}
    assert roles["Full name"] == "textbox" and roles["Notes"] == "textbox" and roles["Editor"] == "textbox"
    assert roles["Colour"] == "combobox" and roles["Extras"] == "listbox" and roles["Volume"] == "slider"
    assert roles["I agree"] == "checkbox" and roles["Small"] == "radio" and roles["Large"] == "radio"
    assert roles["Send form"] == "button"
    assert element(report, "Full name")["value"] == "Ada"
    colour = element(report, "Colour")
    assert colour["value"] == "g"
    assert [(o["label"], o["value"]) for o in colour["options"]] == [("Red", "r"), ("Green", "g"), ("Blue", "b")]
    assert [o.get("selected") for o in element(report, "Extras")["options"]] == [False, True, False]
    assert element(report, "I agree")["checked"] is False and element(report, "Large")["checked"] is True
    assert element(report, "Small")["checked"] is False


def test_read_page_reads_shadow_roots_and_same_origin_frames(browser, site):
    report = browser.goto(site.base + "/form")
    assert {"Shadow button", "Shadow field"} <= set(labels(report))
    assert "Frame button" in labels(report) and "Inside the frame" in report["text"]


def test_read_page_keeps_hidden_and_private_things_out(browser, site):
    report = browser.goto(site.base + "/form")
    text = json.dumps(report)
    assert "secret-value" not in text and "4111111111111111" not in text  # password, card number
    assert "value" not in element(report, "Password") and "value" not in element(report, "Card number")
    assert "hidden-value" not in text and "Ghost button" not in labels(report)  # hidden input, display:none
    assert element(report, "Disabled button")["role"] == "button"  # disabled controls are still reported


def test_interactive_reads_the_same_controls_without_the_prose(browser, site):
    everything = browser.goto(site.base + "/form")
    interactive = browser.ok("read_page", filter="interactive").result
    assert labels(interactive) == labels(everything)
    assert "Feature form" not in interactive["text"]


def test_get_page_text_is_the_visible_text_without_elements(browser, site):
    browser.goto(site.base + "/form")
    text = browser.text()
    assert "Feature form" in text and "Inside the frame" in text
    assert "hidden-value" not in text


def test_find_matches_labels_and_text_case_and_space_insensitively(browser, site):
    browser.goto(site.base + "/form")
    found = browser.ok("find", query="  send   FORM ").result
    assert labels(found) == ["Send form"]
    assert "Inside the frame" in browser.ok("find", query="inside the").result["text"]
    assert browser.ok("find", query="no such words anywhere").result["elements"] == []
