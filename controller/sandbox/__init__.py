"""Sandboxes: a guest desktop behind the egress gateway, whatever runs it (Docker here, a VM elsewhere).

A backend starts the guest and the gateway, waits until the agent and the display answer, and gives the
controller four things (``Sandbox``): the agent client, a way to run a command in the guest as its user
(the network audit's probes), the gateway's decision log, and teardown that leaves nothing behind.

Use as a context manager; inside ``with`` SIGTERM and SIGHUP unwind like Ctrl-C, so teardown runs::

    with DockerSandbox.start(SandboxSpec(policy={"mode": "deny-all", "allow": []})) as sb:
        sb.agent.screenshot()

Signals never cut a start or a teardown step in half. During ``start`` SIGINT, SIGTERM and SIGHUP are
noted and acted on between steps (``Sandbox._checkpoint``): the start is abandoned, what it created is
removed, then KeyboardInterrupt (SIGINT) or ``SandboxInterrupted`` propagates. During ``close`` they are
held until it is done and then handed to whatever handled them before (``signals_deferred``).

Isolation model: ARCHITECTURE.md, "Isolation model (Docker)".
"""

from __future__ import annotations

import abc
import contextlib
import json
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping, Sequence

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

    time_scale: float = 1.0
    """How many times slower than a native guest this one reacts (1.0: containers, a VM with KVM or
    HVF; :data:`controller.sandbox.vm.TCG_TIME_SCALE` under plain emulation). Deadlines that wait for
    the guest to react -- a task's ``[[ready]]`` files, the offline script's screen expectations -- are
    multiplied by it; deadlines that bound a hostile guest (the agent client's) are not."""

    # set by the backend's start sequence; read through agent_url, agent_token, image_id
    _agent_url: str = ""
    _token: str = ""
    _image_id: str = ""

    @property
    def agent_url(self) -> str:
        """Base URL of the guest agent as the controller reaches it (``http://127.0.0.1:PORT``)."""
        return self._agent_url

    @property
    def agent_token(self) -> str:
        """The per-sandbox bearer token of the agent. Never log or record it."""
        return self._token

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
    def image_id(self) -> str:
        """Identity of what runs the guest (image digest ``sha256:...`` or VM image hash), for the record."""
        return self._image_id

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
        """Remove everything this sandbox created. Idempotent; never raises for already-gone parts.

        Not cut short by a signal: backends run it under ``signals_deferred()``, so SIGINT/SIGTERM/SIGHUP
        reach the caller's handlers only once everything is removed."""

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

    # -- for backends ---------------------------------------------------------------------------------

    _signals_noted: list[int] | None = None

    def _start_or_close(self, start: Callable[[], None]) -> None:
        """Run ``start()`` (the backend's start sequence) with SIGINT, SIGTERM and SIGHUP noted, not raised.

        ``start()`` calls ``self._checkpoint()`` between its steps (and while it polls), which abandons the
        start when a signal was noted: no Docker call or process start is cut off halfway, so ``close()``
        finds everything the start created. On any failure (also a signal) ``close()`` removes what was
        created so far, then the exception propagates: KeyboardInterrupt for SIGINT, ``SandboxInterrupted``
        for SIGTERM/SIGHUP (also when the start failed otherwise and a signal came meanwhile). A signal
        after the last checkpoint abandons a finished start the same way, so a start either returns with no
        signal pending or leaves nothing behind.
        """
        with signals_deferred(redeliver=False) as noted:
            self._signals_noted = noted
            try:
                start()
            except BaseException as exc:
                self.close()
                if noted and not isinstance(exc, (KeyboardInterrupt, SandboxInterrupted)):
                    raise interruption(noted[0]) from exc
                raise
            finally:
                self._signals_noted = None
        if noted:  # after the last checkpoint, up to the handlers' restoration
            self.close()
            raise interruption(noted[0])

    def _checkpoint(self) -> None:
        """During ``_start_or_close``: raise the interruption for the first signal noted so far, if any."""
        noted = self._signals_noted
        if noted:
            raise interruption(noted[0])

    def _close_agent_client(self) -> None:
        """Close the ``AgentClient`` made by ``agent``, if any (teardown: its errors are ignored)."""
        client = getattr(self, "_agent_client", None)
        if client is not None and hasattr(client, "close"):
            try:
                client.close()
            except Exception:  # noqa: BLE001 - teardown must go on
                pass


INTERRUPT_SIGNALS: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
"""The signals that stop a run or a sandbox (Ctrl-C, ``kill``, a closed terminal)."""


def interruption(signum: int) -> BaseException:
    """What a noted signal turns into: KeyboardInterrupt for SIGINT, else ``SandboxInterrupted``."""
    return KeyboardInterrupt() if signum == signal.SIGINT else SandboxInterrupted(signum)


@contextlib.contextmanager
def signals_deferred(signums: Sequence[int] = INTERRUPT_SIGNALS, *, redeliver: bool = True) -> Iterator[list[int]]:
    """Within the block, ``signums`` are only noted (appended to the list this yields), never acted on.

    For steps that must not be cut in half (a teardown, a Docker call whose result must be known). On
    exit the previous handlers come back and, with ``redeliver``, each signal noted is raised once more
    (in the order first seen), so they handle it now; without it the caller acts on the list. Outside the
    main thread it does nothing and yields an empty list (Python delivers signals to the main thread).
    """
    if threading.current_thread() is not threading.main_thread():
        yield []
        return
    noted: list[int] = []

    def _note(signum: int, _frame: object) -> None:
        noted.append(signum)

    previous = {s: signal.signal(s, _note) for s in signums}
    try:
        yield noted
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        if redeliver:
            for s in dict.fromkeys(noted):
                signal.raise_signal(s)


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


def wait_agent_ready(
    sandbox_id: str,
    agent_url: str,
    token: str,
    *,
    timeout: float,
    check_alive: Callable[[], None],
    describe: Callable[[], str],
    timings: dict[str, float],
    t0: float,
    first_delay: float = 0.05,
) -> None:
    """Poll the agent's ``GET /livez`` and then ``GET /v1/display`` until each answers 200.

    ``agent_url``/``token``: as ``Sandbox.agent_url``/``agent_token``. ``timeout``: seconds for both.
    ``check_alive()`` runs after every poll that did not answer 200 and raises SandboxError when what runs
    the guest or the gateway has exited. ``describe()``: the backend's last output, appended to the
    timeout error. ``timings["agent_live"]``/``timings["display_ready"]``: seconds since ``t0``
    (``time.monotonic()``) when each answered. Polls back off from ``first_delay`` (the first stage) or
    0.05 s (the second) to 0.5 s. Raises SandboxError on timeout.
    """
    import httpx

    deadline = time.monotonic() + timeout
    headers = {"Authorization": f"Bearer {token}"}
    stage, path = "agent_live", "/livez"
    delay = first_delay
    last_error = ""
    with httpx.Client(base_url=agent_url, timeout=5.0, trust_env=False) as http:
        while True:
            try:
                resp = http.get(path, headers=headers)
                if resp.status_code == 200:
                    timings[stage] = time.monotonic() - t0
                    if stage == "display_ready":
                        return
                    stage, path, delay = "display_ready", "/v1/display", 0.05
                    continue
                last_error = f"{path}: HTTP {resp.status_code} {resp.text[:200]}"
            except httpx.HTTPError as exc:
                last_error = f"{path}: {type(exc).__name__}: {exc}"
            check_alive()
            if time.monotonic() > deadline:
                raise SandboxError(
                    f"sandbox {sandbox_id} not ready after {timeout:.0f}s ({last_error}); {describe()}"
                )
            time.sleep(delay)
            delay = min(delay * 1.5, 0.5)


def parse_decision_log(text: str) -> list[dict[str, Any]]:
    """The gateway's JSONL decision log as one dict per line (oldest first); a line being written right
    now (not yet valid JSON) and blank lines are skipped."""
    entries = []
    for line in text.splitlines():
        line = line.strip()
        if line:
            try:
                entries.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return entries


def with_timeout(argv: Sequence[str], timeout: float | None) -> list[str]:
    """``argv`` run under coreutils ``timeout`` in the guest when ``timeout`` (seconds) is given: killed
    after it (SIGTERM, SIGKILL 2 s later), exit status 124. See ``Sandbox.exec_in_guest``."""
    if timeout is None:
        return list(argv)
    return ["timeout", "--kill-after=2", f"{timeout:g}", *argv]


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this host (one owned by another user counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
