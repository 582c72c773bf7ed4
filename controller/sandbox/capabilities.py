"""What each backend can do, said once: :class:`Capabilities` on every ``Sandbox`` subclass.

``up``, ``serve`` and the docs show it (``desktop-sandbox up --capabilities`` prints the table,
:func:`controller.sandbox.registry.capability_table`); asking a backend for something it cannot do raises
:class:`CapabilityMissing` at once, before anything starts (:meth:`Capabilities.require`).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Literal

from controller.sandbox.errors import SandboxError

SnapshotKind = Literal["none", "files", "machine"]
"""``machine``: RAM and disk saved and restored (processes survive); ``files``: the guest's files
only (apps start again after a restore); ``none``."""

FEATURES: dict[str, str] = {
    "policy_swap": "the network policy replaced on a running sandbox (set_policy)",
    "pool": "pre-started sandboxes kept in a warm pool and claimed by a run",
    "snapshot": "a snapshot of a running sandbox (kind: machine = RAM and disk, files = the guest's files)",
    "fork": "several new sandboxes restored from one snapshot",
}
"""Feature name -> what it means (the table's rows, the error's wording)."""


class CapabilityMissing(SandboxError):
    """A backend was asked for something it cannot do (``feature``, ``backend``)."""

    def __init__(self, backend: str, feature: str, detail: str = "") -> None:
        self.backend, self.feature = backend, feature
        what = FEATURES.get(feature, feature)
        super().__init__(f"the {backend} backend cannot do this: {what}" + (f" ({detail})" if detail else ""))


@dataclass(frozen=True)
class Capabilities:
    """What a backend can do. ``snapshot``: :data:`SnapshotKind`."""

    policy_swap: bool = False
    pool: bool = False
    snapshot: SnapshotKind = "none"
    fork: bool = False

    def require(self, backend: str, feature: str, detail: str = "") -> None:
        """Raise :class:`CapabilityMissing` unless ``feature`` (a key of :data:`FEATURES`) is available.
        Raises KeyError for an unknown feature name."""
        if feature not in FEATURES:
            raise KeyError(f"unknown feature {feature!r} (one of {', '.join(FEATURES)})")
        value = getattr(self, feature)
        if value in (False, "none"):
            raise CapabilityMissing(backend, feature, detail)

    def as_dict(self) -> dict[str, object]:
        """``{feature: value}`` in :data:`FEATURES` order."""
        return {f: getattr(self, f) for f in FEATURES}


def _check() -> None:
    names = {f.name for f in fields(Capabilities)}
    if names != set(FEATURES):
        raise ImportError(f"Capabilities fields {sorted(names)} and FEATURES {sorted(FEATURES)} differ")


_check()


__all__ = ["Capabilities", "CapabilityMissing", "FEATURES", "SnapshotKind"]
