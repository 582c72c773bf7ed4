"""Sandboxes: a guest desktop behind the egress gateway, whatever runs it (Docker containers, a QEMU VM).

A backend starts the guest and the gateway, waits until the agent and the display answer, and gives the
controller what ``Sandbox`` declares: the agent (URL, token, client), a way to run a command in the guest
as its user (the network audit's probes), the gateway's decision log, output, start timings, the guest's
home, the network topology (``NetworkTopology``), and teardown that leaves nothing behind; as class
methods, how to make its options, find or build its image, and list, remove and reap its sandboxes.
Backends by name: ``controller.sandbox.registry.BACKENDS``. Owners and reaping: ``controller.sandbox.owner``.

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
import json
import logging
import os
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Mapping, Sequence

from controller.sandbox.capabilities import Capabilities, CapabilityMissing
from controller.sandbox.errors import BackendUnavailable, SandboxError
from controller.sandbox.guest import GUEST_HOME
from controller.sandbox.readiness import (
    DECISIONS_READ_MAX_BYTES, parse_decision_lines, parse_decision_log, wait_agent_ready, wait_control_ready,
    with_timeout,
)
from controller.sandbox.signals import (
    INTERRUPT_SIGNALS,
    start_aborted,
    SandboxInterrupted,
    interruption,
    raise_on_signals,
    signals_deferred,
)
from controller.sandbox.topology import NetworkTopology
from controller.text import clean

__all__ = [  # re-exported from the helper modules, with this module's own names
    "BackendUnavailable", "SandboxError", "SandboxInterrupted", "INTERRUPT_SIGNALS", "interruption",
    "raise_on_signals", "signals_deferred", "parse_decision_log", "parse_decision_lines", "DECISIONS_READ_MAX_BYTES", "wait_agent_ready", "wait_control_ready", "with_timeout",
    "NetworkTopology", "Capabilities", "CapabilityMissing", "LABEL_SANDBOX", "LABEL_ROLE", "LABEL_OWNER", "LABEL_OWNER_ID", "LABEL_DETACHED",
    "DEFAULT_POLICY", "ExecResult", "SandboxSpec", "Sandbox", "reap", "pid_alive", "log",
]

if TYPE_CHECKING:  # pragma: no cover
    from controller.agent_client import AgentClient

LABEL_SANDBOX = "desktop-sandbox.sandbox"
"""Label carried by every container and network of a sandbox; value: the sandbox id."""
LABEL_ROLE = "desktop-sandbox.role"
"""Label value: ``desktop``, ``gateway`` (containers), ``internal``, ``egress`` (networks)."""
SANDBOX_ID = re.compile(r"d[svk]-(?:audit-)?[0-9a-f]{8}")
"""Every sandbox id a backend makes: ``ds-<8 hex>`` (Docker), ``dv-<8 hex>`` (VM), ``dk-<8 hex>``
(Kubernetes), ``ds-audit-<8 hex>``
(the audit's targets). ``down`` refuses anything else before it looks for it (an id is used in glob
patterns and file names)."""

LABEL_OWNER = "desktop-sandbox.owner"
"""Label value ``<hostname>:<pid>`` of the process that started the sandbox: for people and for
``down --all --label``; never used to decide that a sandbox is abandoned (``LABEL_OWNER_ID`` is)."""
LABEL_OWNER_ID = "desktop-sandbox.owner-id"
"""Label value ``<machine id>:<boot id>:<pid namespace>:<pid>:<start time>`` of the process that started
the sandbox (``controller.sandbox.owner.owner_id``): what orphan reaping judges."""
LABEL_DETACHED = "desktop-sandbox.detached"
"""Label value ``1`` on sandboxes meant to outlive their starter (``desktop-sandbox up --detach``)."""

DEFAULT_POLICY: dict[str, Any] = {"mode": "deny-all", "allow": []}
"""The policy when a task has no ``[network]`` table: deny everything."""


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
    validated there. ``ready_timeout``: seconds to wait for the agent and display. ``browser_channel``:
    the task drives the agent's chromium (``[[launch]] app = "chromium"``, contract 8); the Docker
    backend then gives the desktop the seccomp profile chromium's sandbox needs
    (:mod:`controller.sandbox.seccomp`).
    """

    screen_width: int = 1280
    screen_height: int = 800
    policy: Any = field(default_factory=lambda: dict(DEFAULT_POLICY))
    ready_timeout: float = 120.0
    browser_channel: bool = False

    def policy_json(self) -> str:
        """The policy as JSON text (pydantic models are dumped in JSON mode)."""
        policy = self.policy
        if hasattr(policy, "model_dump"):
            policy = policy.model_dump(mode="json")
        if not isinstance(policy, Mapping):
            raise TypeError(f"policy must be a mapping or a pydantic model, not {type(policy).__name__}")
        return json.dumps(policy, sort_keys=True)


class Sandbox(abc.ABC):
    """A running guest plus its gateway: what every backend provides (``controller.sandbox.docker``,
    ``controller.sandbox.vm``; by name: ``controller.sandbox.registry.BACKENDS``).

    A caller goes through these members only: the class methods ``make_options``, ``ensure_image``,
    ``start``, ``list_all``, ``remove``, ``remove_all``, ``reap_orphans``; on an instance ``id``,
    ``agent_url``, ``agent_token``, ``agent``, ``gateway_control_url``, ``gateway_control_token``,
    ``image_id``, ``arch``, ``time_scale``, ``timings``,
    ``ready_seconds``, ``guest_home``, ``exec_in_guest``, ``decision_log``, ``logs``, ``topology``,
    ``close`` (and ``with``).
    """

    backend_name: ClassVar[str] = ""
    """The registry name of the backend (``docker``, ``vm``)."""

    id_prefix: ClassVar[str] = ""
    """How this backend's sandbox ids begin (``ds-``, ``dv-``, ``dk-``; :data:`SANDBOX_ID`): ``down`` tells
    by it which backend a token file's sandbox belongs to."""

    default_ready_timeout: ClassVar[float] = 120.0

    capabilities: ClassVar[Capabilities] = Capabilities()
    """What this backend can do (:mod:`controller.sandbox.capabilities`); every backend declares its
    own (tests/controller/test_capabilities.py checks each registered one)."""
    """Seconds a command line start waits for readiness on this backend (``SandboxSpec.ready_timeout``)."""

    id: str
    """Unique id of this sandbox (also the value of its ``desktop-sandbox.sandbox`` label)."""

    guest_home: str = GUEST_HOME
    """The guest user's home directory, inside the guest (absolute path)."""

    timings: dict[str, float]
    """Seconds from the start call to each milestone of the start (``agent_live``, ``display_ready``,
    and the backend's own, e.g. ``containers_started`` or ``vm_started``)."""

    arch: str = ""
    """The guest's CPU architecture in Debian terms (``amd64``, ``arm64``) once started; empty where the
    backend cannot tell."""

    time_scale: float = 1.0
    """How many times slower than a native guest this one reacts (1.0: containers, a VM with KVM or
    HVF; :data:`controller.sandbox.vm.TCG_TIME_SCALE` under plain emulation). Deadlines that wait for
    the guest to react -- a task's ``[[ready]]`` files, the offline script's screen expectations -- are
    multiplied by it; deadlines that bound a hostile guest (the agent client's) are not."""

    provenance: dict[str, Any] | None = None
    """Where the sandbox came from, set by whoever handed it out: ``{"source": "pool" | "cold" |
    "snapshot", "claim_s": seconds, ...}`` (:meth:`controller.sandbox.pool.WarmPool.claim`); the run
    writes it as ``run_started.claim``. None: started directly."""

    release_to: Callable[[], bool] | None = None
    """Set on a sandbox claimed from a warm pool in another process: hands it back to that pool's keeper
    for removal (True when taken); :meth:`close` tries it first and removes the sandbox itself otherwise."""

    policy_swap: dict[str, Any] | None = None
    """The gateway's answer to the last :meth:`set_policy` (``policy``, ``closed``, ``pending_refused``),
    kept for the run's ``policy`` record line; None when the policy is the one it started with."""

    # set by the backend's start sequence; read through agent_url, agent_token, image_id,
    # gateway_control_url, gateway_control_token
    _agent_url: str = ""
    _token: str = ""
    _image_id: str = ""
    _control_url: str = ""
    _control_token: str = ""

    # -- class side: options, image, start, cleanup ---------------------------------------------------

    @classmethod
    @abc.abstractmethod
    def make_options(cls, *, image: str | None = None, detached: bool = False) -> Any:
        """The backend's options object for a command line start: ``image`` as the user gave it (Docker:
        a tag; VM: an image directory) or None for the backend's default; ``detached``: the sandbox
        outlives its starter (``up --detach``) and is never reaped automatically."""

    @classmethod
    @abc.abstractmethod
    def ensure_image(cls, options: Any, say: Callable[[str], None]) -> Any:
        """Make sure the image ``options`` names exists, building it when missing (minutes; ``say(text)``
        reports progress). Returns the options to start with. Raises SandboxError when it cannot."""

    @classmethod
    @abc.abstractmethod
    def start(cls, spec: "SandboxSpec | None" = None, options: Any = None) -> "Sandbox":
        """Start a sandbox and wait until it is ready (``spec.ready_timeout`` seconds). Reaps provable
        orphans first (``reap_orphans``). Raises SandboxError; on any failure, also a signal, what was
        created is removed first (see ``_start_or_close``)."""

    @classmethod
    @abc.abstractmethod
    def list_all(cls) -> dict[str, dict[str, str]]:
        """Sandboxes of this backend on this host: ``{id: labels}`` (``LABEL_*`` keys). Raises
        BackendUnavailable when the backend cannot be asked."""

    @classmethod
    @abc.abstractmethod
    def remove(cls, sandbox_id: str) -> list[str]:
        """Remove everything of sandbox ``sandbox_id`` (live or not); returns the names removed ([] when
        nothing of it exists). Raises BackendUnavailable when the backend cannot be asked."""

    @classmethod
    def remove_all(cls, labels: Mapping[str, str] | None = None) -> list[str]:
        """Remove every sandbox of this backend, or with ``labels`` only those whose labels include each
        ``key: value``. What ``desktop-sandbox down --all [--label K=V]`` does. Returns the names removed.
        Raises BackendUnavailable when the backend cannot be asked."""
        wanted = dict(labels or {})
        removed: list[str] = []
        for sandbox_id, have in cls.list_all().items():
            if all(have.get(k) == v for k, v in wanted.items()):
                removed += cls.remove(sandbox_id)
        return removed

    @classmethod
    def reap_orphans(cls) -> list[str]:
        """Remove this backend's sandboxes whose owner is provably dead and ours
        (``controller.sandbox.owner.owner_state``); detached ones stay. A sandbox whose owner cannot be
        proven dead (another machine or container, a reused pid, an older label) is reported in one
        warning line on the ``controller.sandbox`` logger and left alone. Returns the ids removed."""
        return reap(cls.list_all(), cls.remove)

    # -- instance side --------------------------------------------------------------------------------

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
    def gateway_control_url(self) -> str | None:
        """Base URL of the gateway's control API as the controller reaches it (``http://127.0.0.1:PORT``, or
        Docker's gateway egress address where the host routes there; ARCHITECTURE.md, "Gateway control
        API"); None when the gateway has none."""
        return self._control_url or None

    @property
    def gateway_control_token(self) -> str | None:
        """The per-sandbox bearer token of the gateway's control API (not the agent's); None when the
        gateway has no control API. Never log or record it."""
        return self._control_token or None

    @property
    def image_id(self) -> str:
        """Identity of what runs the guest (image digest ``sha256:...`` or VM image hash), for the record."""
        return self._image_id

    @property
    def ready_seconds(self) -> float | None:
        """Seconds from the start call until the display answered; None before that."""
        return getattr(self, "timings", {}).get("display_ready")

    @abc.abstractmethod
    def logs(self, role: str = "desktop", tail: int = 200) -> str:
        """The last ``tail`` lines of output of ``role``: ``desktop`` (the guest) or ``gateway``; "" when
        there is none (yet, or any more). Raw text the guest chose: shown, or put in an error message,
        only through :func:`controller.text.clean_lines`."""

    @abc.abstractmethod
    def topology(self) -> NetworkTopology:
        """Addresses and ports of this sandbox's network (for the network audit). Raises SandboxError
        when the sandbox is not running."""

    @abc.abstractmethod
    def exec_in_guest(self, argv: Sequence[str], *, timeout: float | None = None) -> ExecResult:
        """Run ``argv`` (no shell) in the guest as the desktop user; wait for it and capture its output.

        ``timeout`` (seconds): the command is killed after it (exit status 124, like coreutils timeout).
        Raises SandboxError when the guest is gone.
        """

    @abc.abstractmethod
    def decision_log(self) -> list[dict[str, Any]]:
        """The gateway's decisions so far, one dict per JSONL line (oldest first); [] when none yet."""

    def decisions_since(self, start: int, max_lines: int = 1000,
                        max_bytes: int = DECISIONS_READ_MAX_BYTES) -> list[Any]:
        """Lines ``start``.. (0-based) of the gateway's decision log, at most ``max_lines`` lines and
        ``max_bytes`` bytes, one item per complete line (:func:`parse_decision_lines`: the JSON value,
        or the text of a line that is not JSON); [] when there are none yet. What the run record copies
        while a run goes on, so a backend makes it cheap; this default slices :meth:`decision_log`."""
        return list(self.decision_log()[start:start + max_lines])

    def set_policy(self, policy: Any, *, timeout: float = 10.0) -> dict[str, Any]:
        """Replace the network policy of the running sandbox with ``policy`` (a mapping like
        ``SandboxSpec.policy``, or a pydantic model), through the gateway's control channel (never the
        guest). The gateway validates it, enforces it on every decision from then on, and closes the
        connections it opened that the new policy refuses. Returns the gateway's answer:
        ``{"policy": canonical policy, "closed": connections closed, "pending_refused": origin requests
        answered ``denied`` because the new policy no longer asks for them}``. Raises
        :class:`CapabilityMissing` when the backend cannot, :class:`PolicyRefused` (a SandboxError)
        when the gateway refuses the policy (its message says why), SandboxError when the gateway does
        not answer within ``timeout`` seconds."""
        self.capabilities.require(self.backend_name, "policy_swap")
        from controller.sandbox.policy_swap import put_policy

        text = SandboxSpec(policy=policy).policy_json()
        if not self.gateway_control_url or not self.gateway_control_token:
            raise SandboxError(f"sandbox {self.id} has no gateway control API to take a policy")
        answer = put_policy(self.gateway_control_url, self.gateway_control_token, text, timeout=timeout)
        self.policy_swap = answer
        return answer

    def handover(self) -> dict[str, Any]:
        """What another process needs to take this sandbox over (:meth:`adopt`): ids, URLs, tokens,
        timings, as JSON-able data. Secret (it holds the tokens): send it only over a channel the
        receiving process alone can read. Raises CapabilityMissing where the backend cannot hand over
        (its sandbox is tied to processes this one started)."""
        raise CapabilityMissing(self.backend_name, "pool", "handing a sandbox to another process")

    @classmethod
    def adopt(cls, facts: Mapping[str, Any]) -> "Sandbox":
        """This backend's sandbox described by ``facts`` (from :meth:`handover` in another process),
        owned from now on by the caller (it closes it). Raises SandboxError when the sandbox is gone or
        ``facts`` do not describe one of this backend; CapabilityMissing as :meth:`handover`."""
        raise CapabilityMissing(cls.backend_name, "pool", "taking over a sandbox from another process")

    def rotate_agent_token(self, token: str | None = None) -> None:
        """Give the agent a new bearer token (``POST /v1/token`` with the current one) and use it from
        now on: whoever held the old token (a warm pool's keeper, the run before a snapshot) can no
        longer drive the desktop. ``token``: the new one (default: a fresh random one; a restored VM
        chooses its own first, it is also in its fw_cfg). Raises SandboxError when the agent refuses
        or does not answer."""
        import secrets

        from controller.agent_client import AgentClient, AgentError

        new = token or secrets.token_urlsafe(32)
        old = self.agent
        try:
            old.replace_token(new)
        except AgentError as exc:
            raise SandboxError(f"the agent of sandbox {self.id} did not take a new token: {clean(exc, 300)}") from exc
        self._token = new
        self._agent_client = AgentClient(old.base_url, new)
        self._agent_client.redactor = old.redactor  # what the screen keeps out of pictures goes on
        try:
            old.close()
        except Exception:  # noqa: BLE001 - the old connections are dropped either way
            pass

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
        """During ``_start_or_close``: raise the interruption for the first signal noted so far, if any;
        on a thread inside :func:`controller.sandbox.signals.abort_starts_when` whose condition holds,
        ``SandboxInterrupted(SIGTERM)``."""
        noted = self._signals_noted
        if noted:
            raise interruption(noted[0])
        if start_aborted():
            import signal

            raise SandboxInterrupted(signal.SIGTERM)

    def _close_agent_client(self) -> None:
        """Close the ``AgentClient`` made by ``agent``, if any (teardown: its errors are ignored)."""
        client = getattr(self, "_agent_client", None)
        if client is not None and hasattr(client, "close"):
            try:
                client.close()
            except Exception:  # noqa: BLE001 - teardown must go on
                pass


log = logging.getLogger("controller.sandbox")


def reap(found: Mapping[str, Mapping[str, str]], remove: Callable[[str], list[str]]) -> list[str]:
    """Remove the sandboxes of ``found`` (``{id: labels}``) whose owner is provably dead and ours.

    The owner is the one its labels name, or the claimer a warm pool handed it to
    (:func:`controller.sandbox.owner.record_claim`). Skips detached ones (``LABEL_DETACHED=1``) and
    ones whose owner is alive; logs one warning per
    sandbox whose owner cannot be proven dead (``controller.sandbox.owner.owner_state``), naming it and
    why (each value escaped and cut by :func:`controller.text.clean`: labels are whatever the engine or
    the sandbox's directory holds), and leaves it. ``remove(id)`` removes one; one that fails is named in
    a warning and left for the next start (the caller's start goes on). Returns the ids removed.
    """
    from controller.sandbox.owner import claimed_owner, forget_claim, owner_state

    reaped = []
    for sandbox_id, labels in found.items():
        if labels.get(LABEL_DETACHED) == "1":
            continue
        claimed = claimed_owner(sandbox_id) if SANDBOX_ID.fullmatch(sandbox_id) else None
        if claimed is not None:  # handed over by a warm pool: its claimer owns it now
            labels = {**labels, LABEL_OWNER_ID: claimed[0], LABEL_OWNER: claimed[1]}
        state, reason = owner_state(labels.get(LABEL_OWNER_ID))
        if state == "dead":
            try:
                remove(sandbox_id)
            except Exception as exc:  # noqa: BLE001 - another's leftovers never stop this start
                shown = clean(sandbox_id, 80)
                log.warning("abandoned sandbox %s could not be removed (%s); the next start tries again, "
                            "`desktop-sandbox down %s` removes it", shown, clean(exc, 300), shown)
                continue
            forget_claim(sandbox_id)
            reaped.append(sandbox_id)
        elif state == "unproven":
            shown = clean(sandbox_id, 80)
            log.warning("sandbox %s left in place (owner %s: %s); `desktop-sandbox down %s` removes it",
                        shown, clean(labels.get(LABEL_OWNER, "unknown"), 120), clean(reason, 300), shown)
    return reaped


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this host (one owned by another user counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
