"""desktop-sandbox's public Python API: a real Linux desktop for computer-use agents, driven exactly,
kept behind a default-deny gateway, every call recorded and asked about like a model's.

::

    from desktop_sandbox import Sandbox

    with Sandbox.start(apps=["terminal"]) as sb:       # an empty desktop under deny-all, a terminal launched
        shot = sb.screenshot(max_width=1024)           # PNG bytes; shot.width x shot.height in model px
        sb.click(shot.width // 2, shot.height // 2)    # model px of that screenshot
        sb.type("echo hello")

**Units.** A screenshot's size is in *model px*; every point an action takes is in the model px of the
last screenshot taken (screen px before the first one, and whenever the last one was full-size and
uncropped). The mapping is the driver's one rule (:class:`controller.run.mapping.ModelSpace`):
``screen = frame origin + round(model * frame size / image size)``, halves up. A point outside the last
image raises :class:`OutOfModelBounds` and nothing is sent.

**Records and approvals.** The calls are the steps of a run (``mode: attended``, ``runner: python``):
``runs/<id>/record.jsonl`` holds each call, action and screenshot; ``confirm_actions`` asks the
``approver`` before those action types run; the network policy's origin requests are asked the same way.

**Async.** :class:`AsyncSandbox` has the same methods as coroutines (each call runs on a worker thread).

Errors: every error this package raises is a :class:`DesktopSandboxError`.
"""

from __future__ import annotations

import importlib
from importlib import metadata as _metadata
from typing import TYPE_CHECKING, Any

try:
    __version__ = _metadata.version("desktop-sandbox")
except _metadata.PackageNotFoundError:  # pragma: no cover - run from a checkout without an install
    __version__ = "0+unknown"

API_VERSION = 1
"""The version of this API's shape: raised when a method or a unit changes meaning."""

_EXPORTS = {
    "ActionDenied": "controller.run.attended", "AttendedRunError": "controller.run.attended",
    "CallTimeout": "controller.run.attended", "DesktopSandboxError": "controller.model.errors",
    "DriverError": "controller.run.driver", "OutOfModelBounds": "controller.run.mapping",
    "AsyncSandbox": "desktop_sandbox._async", "ApprovalRequest": "desktop_sandbox._sandbox",
    "RunResult": "desktop_sandbox._sandbox", "Sandbox": "desktop_sandbox._sandbox",
    "SandboxClosed": "desktop_sandbox._sandbox", "Screenshot": "desktop_sandbox._sandbox",
    "AgentError": "controller.agent_client", "BackendUnavailable": "controller.sandbox.errors",
    "SandboxError": "controller.sandbox.errors", "TaskError": "controller.run.tasks",
}
"""Each name this package exports and the module it lives in: loaded on first use, so importing the package
needs only the base install; using it needs the controller (``pip install 'desktop-sandbox[controller]'``)."""

if TYPE_CHECKING:  # pragma: no cover
    from controller.agent_client import AgentError
    from controller.run.tasks import TaskError
    from controller.sandbox.errors import BackendUnavailable, SandboxError
    from controller.model.errors import DesktopSandboxError
    from controller.run.attended import ActionDenied, AttendedRunError, CallTimeout
    from controller.run.driver import DriverError
    from controller.run.mapping import OutOfModelBounds
    from desktop_sandbox._async import AsyncSandbox
    from desktop_sandbox._sandbox import ApprovalRequest, RunResult, Sandbox, SandboxClosed, Screenshot


def __getattr__(name: str) -> Any:
    where = _EXPORTS.get(name)
    if where is None:
        raise AttributeError(f"module 'desktop_sandbox' has no attribute {name!r}")
    try:
        module = importlib.import_module(where)
    except ImportError as exc:
        raise ImportError(f"desktop_sandbox.{name} needs the controller: pip install 'desktop-sandbox[controller]' "
                          f"({exc})") from exc
    value = getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])


__all__ = ["API_VERSION", "__version__", *sorted(_EXPORTS)]
