"""Errors of the sandbox backends."""

from __future__ import annotations

from controller.model.errors import DesktopSandboxError


class SandboxError(DesktopSandboxError, RuntimeError):
    """A sandbox could not be started, or stopped answering. The message says which part and why."""


class BackendUnavailable(SandboxError):
    """What a backend needs is not there (the Docker engine cannot be reached, QEMU is not installed)."""
