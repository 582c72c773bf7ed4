"""Sandboxes: a guest desktop behind the egress gateway, whatever runs it (Docker here, a VM elsewhere).

A backend starts the guest and the gateway, waits until the agent and the display answer, and gives the
controller four things (``Sandbox``): the agent client, a way to run a command in the guest as its user
(the network audit's probes), the gateway's decision log, and teardown that leaves nothing behind.

Use as a context manager; inside ``with`` SIGTERM and SIGHUP unwind like Ctrl-C, so teardown runs::

    with DockerSandbox.start(SandboxSpec(policy={"mode": "deny-all", "allow": []})) as sb:
        sb.agent.screenshot()

Isolation model: ARCHITECTURE.md, "Isolation model (Docker)".
"""

from __future__ import annotations

import abc
import contextlib
import json
import signal
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterator, Mapping, Sequence

if TYPE_CHECKING:  # pragma: no cover
    from controller.agent_client import AgentClient

LABEL_SANDBOX = "desktop-sandbox.sandbox"
"""Label carried by every container and network of a sandbox; value: the sandbox id."""
LABEL_ROLE = "desktop-sandbox.role"
"""Label value: ``desktop``, ``gateway`` (containers), ``internal``, ``egress`` (networks)."""
LABEL_OWNER = "desktop-sandbox.owner"
"""Label value ``<hostname>:<pid>`` of the process that started the sandbox (to reap killed runs)."""
LABEL_DETACHED = "desktop-sandbox.detached"
"""Label value ``1`` on sandboxes meant to outlive their starter (``desktop-sandbox up --detach``)."""

DEFAULT_POLICY: dict[str, Any] = {"mode": "deny-all", "allow": []}
"""The policy when a task has no ``[network]`` table: deny everything."""


class SandboxError(RuntimeError):
    """A sandbox could not be started, or stopped answering. The message says which part and why."""


class SandboxInterrupted(BaseException):
    """Raised in the main thread on SIGTERM/SIGHUP while a sandbox is open, so ``with`` blocks unwind.

    A BaseException (like KeyboardInterrupt) so that ``except Exception`` in callers does not swallow it.
    """

    def __init__(self, signum: int) -> None:
        super().__init__(f"interrupted by signal {signal.Signals(signum).name}")
        self.signum = signum


@dataclass(frozen=True)
class ExecResult:
    """Outcome of a command run in the guest: exit status and captured output (bytes)."""

    exit_code: int
    stdout: bytes
    stderr: bytes


@dataclass
class SandboxSpec:
    """What to start.

    ``screen_width``/``screen_height``: guest screen in screen px (task ``[screen]``).
    ``policy``: the task's ``[network]`` table as a mapping (``{"mode": "deny-all"|"allowlist",
    "allow": [origins], ...}``) or a pydantic model with ``model_dump``; passed to the gateway as JSON,
    validated there. ``ready_timeout``: seconds to wait for the agent and display.
    """

    screen_width: int = 1280
    screen_height: int = 800
    policy: Any = field(default_factory=lambda: dict(DEFAULT_POLICY))
    ready_timeout: float = 120.0

    def policy_json(self) -> str:
        """The policy as JSON text (pydantic models are dumped in JSON mode)."""
        policy = self.policy
        if hasattr(policy, "model_dump"):
            policy = policy.model_dump(mode="json")
        if not isinstance(policy, Mapping):
            raise TypeError(f"policy must be a mapping or a pydantic model, not {type(policy).__name__}")
        return json.dumps(policy, sort_keys=True)


class Sandbox(abc.ABC):
    """A running guest plus its gateway. Backend-neutral; see ``controller.sandbox.docker``."""

    id: str
    """Unique id of this sandbox (also the value of its ``desktop-sandbox.sandbox`` label)."""

    @property
    @abc.abstractmethod
    def agent_url(self) -> str:
        """Base URL of the guest agent as the controller reaches it (``http://127.0.0.1:PORT``)."""

    @property
    @abc.abstractmethod
    def agent_token(self) -> str:
        """The per-sandbox bearer token of the agent. Never log or record it."""

    @property
    def agent(self) -> "AgentClient":
        """An ``AgentClient`` for this sandbox's agent (created on first use)."""
        client = getattr(self, "_agent_client", None)
        if client is None:
            from controller.agent_client import AgentClient

            client = AgentClient(self.agent_url, self.agent_token)
            self._agent_client = client
        return client

    @property
    @abc.abstractmethod
    def image_id(self) -> str:
        """Identity of what runs the guest (image digest ``sha256:...`` or VM image hash), for the record."""

    @abc.abstractmethod
    def exec_in_guest(self, argv: Sequence[str], *, timeout: float | None = None) -> ExecResult:
        """Run ``argv`` (no shell) in the guest as the desktop user; wait for it and capture its output.

        ``timeout`` (seconds): the command is killed after it (exit status 124, like coreutils timeout).
        Raises SandboxError when the guest is gone.
        """

    @abc.abstractmethod
    def decision_log(self) -> list[dict[str, Any]]:
        """The gateway's decisions so far, one dict per JSONL line (oldest first); [] when none yet."""

    @abc.abstractmethod
    def close(self) -> None:
        """Remove everything this sandbox created. Idempotent; never raises for already-gone parts."""

    def __enter__(self) -> "Sandbox":
        self._signal_guard = raise_on_signals()
        self._signal_guard.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.close()
        finally:
            guard = getattr(self, "_signal_guard", None)
            if guard is not None:
                guard.__exit__(None, None, None)


@contextlib.contextmanager
def raise_on_signals(signums: Sequence[int] = (signal.SIGTERM, signal.SIGHUP)) -> Iterator[None]:
    """Within the block, turn ``signums`` into ``SandboxInterrupted`` raised in the main thread.

    Lets ``finally``/``with`` teardown run when a run is stopped with ``kill`` (Ctrl-C already raises
    KeyboardInterrupt). Outside the main thread it does nothing (Python delivers signals there only).
    Previous handlers are restored on exit.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def _raise(signum: int, _frame: object) -> None:
        raise SandboxInterrupted(signum)

    previous = {s: signal.signal(s, _raise) for s in signums}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
