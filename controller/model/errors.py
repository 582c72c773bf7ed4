"""The project's exception base and the vocabulary's errors.

:class:`DesktopSandboxError` is the base for the project's own errors: ``except DesktopSandboxError``
catches what this code raises on purpose and nothing of Python's or a library's. The vocabulary's
errors (:class:`UnknownKind`, :class:`IncompleteVocabulary`) derive from it.
"""

from __future__ import annotations

from typing import Iterable


class DesktopSandboxError(Exception):
    """Base class of the errors this project raises on purpose."""


class UnknownKind(DesktopSandboxError, ValueError):
    """A kind name that is not in its table (an approval request kind, a check kind): refused, never
    mapped to a default. ``vocabulary``: what kind of kind (``approval request kind``, ``check kind``);
    ``kind``: the name as given (shown with ``repr`` and cut to 80 characters, so a hostile name
    cannot rewrite the message); ``known``: the names the table holds, sorted. Also a ValueError:
    an unknown kind is a bad value for whoever passed it."""

    def __init__(self, kind: object, known: Iterable[str], vocabulary: str = "kind") -> None:
        self.kind, self.known, self.vocabulary = kind, tuple(sorted(known)), vocabulary
        shown = repr(kind)
        if len(shown) > 80:
            shown = shown[:77] + "..."
        super().__init__(f"unknown {vocabulary} {shown} (known: {', '.join(self.known) or 'none'})")


class IncompleteVocabulary(DesktopSandboxError):
    """A table whose entries do not fit together (checked at import): a kind without its runner, a
    runner without its kind, an entry filed under another name, answers a view cannot give. The
    message names the table and each offending entry."""
