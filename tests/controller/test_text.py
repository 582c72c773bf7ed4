"""The one escaping rule (controller.text): every control and format character a model, a page or
the guest may use to rewrite a terminal is escaped, by ``clean`` on one line and by ``clean_lines``
line by line, and long values are cut."""

from __future__ import annotations

import pytest

from controller.text import clean, clean_lines

CLASSES = {
    "ESC": "\x1b", "BEL": "\x07", "CR": "\r", "backspace": "\x08", "newline": "\n", "tab": "\t", "DEL": "\x7f",
    "C1 first": "\x80", "C1 CSI": "\x9b", "C1 last": "\x9f", "NEL": "\x85",
    **{f"bidi U+{c:04X}": chr(c) for c in (*range(0x202A, 0x202F), *range(0x2066, 0x206A), 0x200E, 0x200F, 0x061C)},
    **{f"zero-width U+{c:04X}": chr(c) for c in (0x200B, 0x200C, 0x200D, 0x2060, 0xFEFF)},
    "line separator": "\u2028", "paragraph separator": "\u2029", "soft hyphen": "\u00ad",
    "tag character": "\U000E0001", "unassigned": "\U000E0080", "lone surrogate": "\ud800",
}


@pytest.mark.parametrize("char", CLASSES.values(), ids=CLASSES.keys())
def test_clean_escapes_every_control_and_format_class(char):
    shown = clean(f"a{char}b", 100)
    assert char not in shown and shown.isprintable() and shown.startswith("a\\") and shown.endswith("b")


def test_clean_cuts_after_escaping_and_reads_only_what_it_keeps():
    assert clean("\x1b" * 10, 12) == "\\x1b\\x1b\\..."
    assert clean("abc", 3) == "abc" and clean("abcd", 3) == "a..."
    assert clean("\x1b", 3) == "\\..."  # an escape longer than the limit is cut too
    huge = "\x1b" * 10**7
    assert clean(huge, 20) == ("\\x1b" * 5)[:17] + "..."


def test_clean_lines_keeps_line_breaks_and_escapes_each_line():
    text = "boot ok\r\n\x1b[2Kfake: all passed\x07\nover\rwritten\u2028\u202eevil\n"
    shown = clean_lines(text)
    assert shown.split("\n") == ["boot ok", "\\x1b[2Kfake: all passed\\x07", "over\\rwritten\\u2028\\u202eevil", ""]
    assert all(line.isprintable() for line in shown.split("\n"))


def test_clean_lines_keeps_the_end_of_long_output():
    text = "".join(f"line {i}\x1b[0m\n" for i in range(10000)) + "the reason it failed"
    shown = clean_lines(text, 200)
    assert len(shown) == 200 and shown.startswith("...") and shown.endswith("the reason it failed")
    assert "\x1b" not in shown and "line 9999\\x1b[0m\n" in shown
    assert clean_lines("short\nlines", 200) == "short\nlines"
    assert clean_lines(ValueError("a\x1b\nb")) == "a\\x1b\nb"
