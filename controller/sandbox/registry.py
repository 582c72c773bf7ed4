"""Backends by name: ``BACKENDS["docker"]`` is ``DockerSandbox``, ``BACKENDS["vm"]`` is ``VMSandbox``,
``BACKENDS["kubernetes"]`` is ``KubernetesSandbox`` (its client is the optional extra ``[kubernetes]``).

A backend's module is imported the first time its class is looked up, so importing the registry (or
listing its names for ``--backend``) imports neither the Docker SDK nor the QEMU code. Adding a backend
is one module with a ``Sandbox`` subclass plus one line in :data:`_ENTRIES`; what every backend writes
the same way (the labels naming a sandbox, its role and its starter, the decision-log read) it takes
from :mod:`controller.sandbox.backend_setup`. The registry knows nothing above the sandboxes: the
network audit of each backend is looked up by name in :mod:`controller.audit.backends`, which refuses
to import until every backend named here has its audit there or is declared without one.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Iterator, Mapping

if TYPE_CHECKING:  # pragma: no cover
    from controller.sandbox import Sandbox

_ENTRIES: dict[str, tuple[str, str]] = {
    "docker": ("controller.sandbox.docker", "DockerSandbox"),
    "vm": ("controller.sandbox.vm", "VMSandbox"),
    "kubernetes": ("controller.sandbox.kubernetes", "KubernetesSandbox"),
}
"""name -> (module, class). The first entry is the default backend of ``up``, ``run-task`` and ``audit``."""

DEFAULT_BACKEND = next(iter(_ENTRIES))


class _Backends(Mapping[str, "type[Sandbox]"]):
    """Read-only mapping name -> backend class, importing each backend's module on first lookup."""

    def __getitem__(self, name: str) -> "type[Sandbox]":
        module, attr = _ENTRIES[name]
        return getattr(importlib.import_module(module), attr)

    def __iter__(self) -> Iterator[str]:
        return iter(_ENTRIES)

    def __len__(self) -> int:
        return len(_ENTRIES)


BACKENDS: Mapping[str, "type[Sandbox]"] = _Backends()
"""name -> ``Sandbox`` subclass (``docker``, ``vm``, ``kubernetes``); lazy, see the module docstring."""


def backend_names() -> list[str]:
    """The registered backend names, default first (for ``--backend`` choices and messages)."""
    return list(_ENTRIES)


def capability_table() -> list[dict[str, object]]:
    """One row per registered backend, default first: ``{"backend": name, feature: value, ...}``
    (:mod:`controller.sandbox.capabilities`; imports each backend's module)."""
    return [{"backend": name, **BACKENDS[name].capabilities.as_dict()} for name in _ENTRIES]


def get_backend(name: str) -> "type[Sandbox]":
    """The backend class registered as ``name``. Raises KeyError naming the known ones otherwise."""
    if name not in _ENTRIES:
        raise KeyError(f"unknown backend {name!r} (one of {', '.join(_ENTRIES)})")
    return BACKENDS[name]

