"""A stand-in sandbox backend for the Agents API's tests, registered in the backend registry by the
``stub_backend`` fixture: it starts nothing, it only records which sandboxes are "running" and with
which labels (the same labels a real backend writes: ``backend_setup.sandbox_labels``).

It exists because two things the tests need cannot be had from a real backend at will: a sandbox start
that lasts until the test lets it end (a race between create and delete while starts are under way:
a real start's length is whatever the machine makes it), and sandboxes with chosen labels and owners
(what a server on another database, or a dead one, left). Everything above the backend -- the server,
its routes, the session hub, the store, the openai client -- is the real one.
"""

from __future__ import annotations

import secrets
import threading
from dataclasses import dataclass, field
from typing import Any

from controller.sandbox import SandboxError
from controller.sandbox.backend_setup import owner_labels, sandbox_labels

GATE_TIMEOUT_S = 60.0
"""Longest a start waits for the test to open the gate (then it fails, as a start past its deadline)."""


@dataclass
class StubOptions:
    """What a session sets on a backend's options: labels, and whether it is detached."""

    extra_labels: dict[str, str] = field(default_factory=dict)
    detached: bool = False


class _Agent:
    def livez(self) -> bool:
        return True


class StubSandbox:
    """The stand-in (see the module docstring). Class state, reset by :meth:`reset`: ``running``
    (``{id: labels}``), ``most`` (the largest number running at once since the reset), ``gate`` (a
    start returns once it is set)."""

    backend_name = "stub"
    default_ready_timeout = GATE_TIMEOUT_S
    lock = threading.Lock()
    running: dict[str, dict[str, str]] = {}
    most = 0
    starts = 0
    gate = threading.Event()

    def __init__(self, sandbox_id: str) -> None:
        self.id = sandbox_id
        self.agent = _Agent()

    @classmethod
    def reset(cls, *, gate_open: bool = True) -> None:
        with cls.lock:
            cls.running.clear()
            cls.most = cls.starts = 0
        if gate_open:
            cls.gate.set()
        else:
            cls.gate.clear()

    @classmethod
    def make_options(cls, *, image: str | None = None, detached: bool = False) -> StubOptions:
        return StubOptions(detached=detached)

    @classmethod
    def start(cls, spec: Any = None, options: StubOptions | None = None) -> "StubSandbox":
        """A sandbox "running" from the call on (as a real start makes its parts at once); returns once
        :attr:`gate` is set. Raises SandboxError when it is not set within :data:`GATE_TIMEOUT_S`."""
        sandbox_id = f"dx-{secrets.token_hex(4)}"
        labels = sandbox_labels(sandbox_id, None, options or StubOptions(), owner_labels())
        cls.add(sandbox_id, labels)
        if not cls.gate.wait(GATE_TIMEOUT_S):
            cls.remove(sandbox_id)
            raise SandboxError(f"stub sandbox {sandbox_id} was never let start")
        return cls(sandbox_id)

    @classmethod
    def add(cls, sandbox_id: str, labels: dict[str, str]) -> None:
        """Record ``sandbox_id`` as running with ``labels`` (also what a test plants)."""
        with cls.lock:
            cls.running[sandbox_id] = dict(labels)
            cls.starts += 1
            cls.most = max(cls.most, len(cls.running))

    @classmethod
    def list_all(cls) -> dict[str, dict[str, str]]:
        with cls.lock:
            return {k: dict(v) for k, v in cls.running.items()}

    @classmethod
    def remove(cls, sandbox_id: str) -> list[str]:
        with cls.lock:
            return [sandbox_id] if cls.running.pop(sandbox_id, None) is not None else []

    def attach_gateway(self, network: str) -> tuple[str, None]:
        return "0.0.0.0", None

    def close(self) -> None:
        type(self).remove(self.id)
