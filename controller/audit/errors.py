"""The audit's exceptions: one class per reason it could not run, all under :class:`AuditError`.

Callers (the CLI's ``audit`` command) catch :class:`AuditError`; tests and callers that need the reason
match the subclass, never the message text.
"""

from __future__ import annotations

from controller.model.errors import DesktopSandboxError


class AuditError(DesktopSandboxError, RuntimeError):
    """The audit could not run (image missing, targets did not start, gateway or guest probe failed)."""


class AuditImageMissing(AuditError):
    """The guest image the audit was asked to use is not in the Docker engine."""


class AuditTargetsFailed(AuditError):
    """An audit target container exited or did not announce readiness before its deadline."""


class GatewayNotListening(AuditError):
    """The gateway's proxy did not announce ``gateway listening on`` before the deadline."""


class ProbeRunFailed(AuditError):
    """``guest/netprobe.py`` did not run to completion in the guest (non-zero exit, killed at its
    deadline) or its output was not a probe report (not JSON, over the size cap, no ``results`` list)."""


class ConsoleNotStarted(AuditError):
    """The web console the audit runs on the host (its ``console`` probes' target) did not start
    listening on 127.0.0.1."""


class SwapFailed(AuditError):
    """An audit of a swapped policy could not run: the gateway did not take the audited policy, or the
    warm pool gave no sandbox of its own to audit (controller.audit.swap)."""
