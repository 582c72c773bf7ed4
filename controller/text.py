"""Text from the model, a page or the guest, made safe to show on a terminal or a page.

The one home of the rule: every character that is not printable (``str.isprintable``: control and
format characters such as ESC, BEL, CR, backspace, newlines, C1 controls U+0080-U+009F, bidi
overrides and isolates U+202A-U+202E and U+2066-U+2069, zero-width characters, line and paragraph
separators, unassigned code points) is escaped as ``\\xNN`` / ``\\uNNNN`` / ``\\UNNNNNNNN``, and the
result is cut to a length. :func:`clean` gives one line; :func:`clean_lines` keeps the line breaks of
multi-line output (a console tail, a process's stderr) and escapes each line by the same rule. The
console, the run record's printer, log records and error messages built from guest answers use them.

Neither escapes console markup: a rich console prints the result with ``markup=False`` (or through
``rich.markup.escape``) and ``emoji=False``.
"""

from __future__ import annotations

from typing import Any

SHORT = 60
"""Default length (characters) of a shown value."""

TAIL = 4000
"""Default length (characters) of shown multi-line output (:func:`clean_lines`)."""


def _escape(text: str) -> str:
    """``text`` with every non-printable character escaped (``\\x1b``, ``\\u202e``, ...)."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def clean(value: Any, limit: int = SHORT) -> str:
    """``value`` (``str()`` of it when not a string) as one printable line of at most ``limit``
    characters: non-printable characters escaped, then cut with ``...`` when longer."""
    text = value if isinstance(value, str) else str(value)
    keep = max(limit - 3, 1)
    if len(text) > limit:  # each character gives at least one: only the kept head needs escaping
        return _escape(text[:keep])[:keep] + "..."
    out = _escape(text)
    return out if len(out) <= limit else out[:keep] + "..."


def clean_lines(value: Any, limit: int = TAIL) -> str:
    """``value`` (``str()`` of it when not a string) as printable lines, for multi-line output from
    the guest or a process (a console tail, stderr, a container's log).

    Lines are split at ``\\n`` only (a ``\\r`` just before it is dropped); each is escaped as
    :func:`clean` escapes (so a lone ``\\r``, ESC, bidi controls, ``\\u2028`` and the other line breaks
    Unicode knows show as escapes and cannot start a line of their own), and they are joined with
    ``\\n``. When the result is longer than ``limit`` characters its end is kept (the end of a log
    says why something failed), after ``...``."""
    text = value if isinstance(value, str) else str(value)
    cut = len(text) > limit
    if cut:  # each character gives at least one: only the kept tail needs escaping
        text = text[-limit:]
    out = "\n".join(_escape(line[:-1] if line.endswith("\r") else line) for line in text.split("\n"))
    if not cut and len(out) <= limit:
        return out
    return "..." + out[-max(limit - 3, 1):]
