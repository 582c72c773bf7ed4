"""The network audit of each backend, by its name in the backend registry (:mod:`controller.sandbox.registry`).

The audit sits above the sandboxes: it starts one and probes it, so it looks the backends up, never the
other way round. Every backend the registry names is in :data:`AUDITS` (its audit) or in
:data:`WITHOUT_AUDIT` (``desktop-sandbox audit --backend NAME`` refuses it), and nothing else is:
importing this module raises ImportError otherwise, so a backend added to the registry without its
audit decided fails ``desktop-sandbox audit`` (and tests/audit/test_backends.py) at once.

The package :mod:`controller.audit` does not import this module (this module imports the package), so
the two stay one way.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any, Protocol

import controller.audit as audit_package
from controller.audit.report import AuditReport
from controller.gateway.policy import NetworkPolicy
from controller.sandbox.registry import backend_names


class BackendAudit(Protocol):
    """``audit(policy, *, image=...)``: probe ``policy`` from inside a guest of one backend, started from
    ``image`` (what that backend's ``ensure_image`` options name: a Docker image tag, a VM image folder;
    None for the backend's default) and removed after; the report. Raises AuditError, SandboxError (or
    the backend's client error, docker.errors.DockerException) when the audit cannot run."""

    def __call__(self, policy: NetworkPolicy, *, image: Any = None) -> AuditReport: ...


AUDITS: Mapping[str, str] = {
    "docker": "audit",
    "vm": "audit_vm",
}
"""Backend name -> the name of its network audit in :mod:`controller.audit`, read on each lookup (so a
stand-in set on the package, as tests/audit/standin.py sets ``controller.audit.audit``, is the one run)."""

WITHOUT_AUDIT: frozenset[str] = frozenset({"kubernetes"})
"""The registry's backends that have no network audit (docs/kubernetes.md: not on that backend)."""

SWAPPED_AUDITS: frozenset[str] = frozenset({"docker"})
"""The backends of :data:`AUDITS` whose audit also takes ``swap_from`` (a policy swapped in at runtime)
and ``via_pool`` (a sandbox claimed from a warm pool): those with the audit's targets (the swap holds a
connection to one)."""


def audit_function(name: str) -> BackendAudit:
    """The network audit for backend ``name``. Raises KeyError when it has none (a backend of
    :data:`WITHOUT_AUDIT`, or a name the registry does not know)."""
    if name not in AUDITS:
        raise KeyError(f"no network audit for backend {name!r}")
    audit: BackendAudit = getattr(audit_package, AUDITS[name])
    return audit


def check_complete(registered: Collection[str]) -> None:
    """Raise ImportError unless the backends ``registered`` (the registry's names) are exactly those of
    :data:`AUDITS` and :data:`WITHOUT_AUDIT`, no name is in both, every audit :data:`AUDITS` names is a
    function of :mod:`controller.audit` and every backend of :data:`SWAPPED_AUDITS` is in :data:`AUDITS`;
    the message names each misfit."""
    problems = [f"backend {name!r} is neither in AUDITS nor in WITHOUT_AUDIT"
                for name in registered if name not in AUDITS and name not in WITHOUT_AUDIT]
    problems += [f"{name!r} is not a backend of the registry" for name in [*AUDITS, *sorted(WITHOUT_AUDIT)]
                 if name not in registered]
    problems += [f"backend {name!r} is in both AUDITS and WITHOUT_AUDIT" for name in AUDITS if name in WITHOUT_AUDIT]
    problems += [f"backend {name!r} is in SWAPPED_AUDITS but not in AUDITS" for name in sorted(SWAPPED_AUDITS)
                 if name not in AUDITS]
    problems += [f"controller.audit has no function {attr!r} (the audit of backend {name!r})"
                 for name, attr in AUDITS.items() if not callable(getattr(audit_package, attr, None))]
    if problems:
        raise ImportError("controller.audit.backends does not match controller.sandbox.registry: "
                          + "; ".join(problems))


check_complete(backend_names())
