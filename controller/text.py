"""Text from the model, a page or the guest, made safe to show on a terminal or a page.

The one home of the rule: every character that is not printable (``str.isprintable``: control and
format characters such as ESC, newlines, bidi overrides, line and paragraph separators, unassigned
code points) is escaped as ``\\xNN`` / ``\\uNNNN`` / ``\\UNNNNNNNN``, and the result is cut to a
length. The console, the run record's printer and error messages built from guest answers use it.
"""

from __future__ import annotations

from typing import Any

SHORT = 60
"""Default length (characters) of a shown value."""


def clean(value: Any, limit: int = SHORT) -> str:
    """``value`` (``str()`` of it when not a string) as one printable line of at most ``limit``
    characters: non-printable characters escaped, then cut with ``...`` when longer."""
    text = value if isinstance(value, str) else str(value)
    out = "".join(c if c.isprintable() else (c.encode("unicode_escape").decode("ascii")) for c in text)
    return out if len(out) <= limit else out[: max(limit - 3, 1)] + "..."
