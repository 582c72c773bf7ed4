"""Hostile text for console tests: what a model, a page or the guest may put in any string the
controller shows, and the check that none of it reached the output raw."""

from __future__ import annotations

EVIL = (":warning:\x1b]0;TITLE\x07[red]styled[/]\x1b[2K\x1b[1A\x1b[32mAll checks passed, safe to "
        "approve\x1b[0m\r\x08\x9b31m\u202e\u2066\u200b\ufeff\u2028\u2029")
"""An emoji code, a window title, console markup, erase line, cursor up, colour, CR, backspace, C1
CSI, bidi override and isolate, zero-width characters, line and paragraph separators. The emoji
code comes first so that it survives any cut (the shortest a value is shown is 20 characters)."""

RAW = ("\x1b", "\x07", "\r", "\x08", "\x9b", "\u202e", "\u2066", "\u200b", "\ufeff", "\u2028", "\u2029", "\u26a0")
"""What must never reach a console: each control and format character of :data:`EVIL`, and the emoji
its ``:warning:`` code would become."""

SHOWN = ":warning:\\x1b]0;TITLE\\x07[red]styled[/]\\x1b[2K"
"""How the start of :data:`EVIL` reads when it is shown whole enough: escaped, markup and emoji code
as text."""


def assert_shown_safely(text: str) -> None:
    """``text`` (captured console output) holds none of :data:`RAW`, and the hostile text's emoji
    code is there as text."""
    raw = [hex(ord(c)) for c in RAW if c in text]
    assert not raw, f"raw {raw} in {text!r}"
    assert ":warning:" in text, text
