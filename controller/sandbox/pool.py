"""A warm pool: sandboxes started ahead of time, each claimed by one run, never by a second.

A pool keeps up to ``size`` ready sandboxes per :class:`Template` (what a sandbox cannot change once
started: the backend's options, the screen size, the browser channel), started one at a time on a
background thread, as far as a memory budget allows. A pool sandbox waits behind the default-deny
policy with a token only the pool knows, labelled :data:`LABEL_POOL` and owned by the process that keeps
the pool (so a killed keeper's sandboxes are reaped like any other, :func:`controller.sandbox.reap`).

:meth:`WarmPool.claim` hands one out for a spec: it takes a ready sandbox of the spec's template off
the pool (under a lock: one claimer per sandbox), checks that its agent still answers, gives the agent a
fresh token (:meth:`controller.sandbox.Sandbox.rotate_agent_token`), swaps in the spec's network policy
(:meth:`controller.sandbox.Sandbox.set_policy`) and refills the pool. The run then launches the task's
apps and checks its ready conditions, as on a cold start. An empty pool, a template the pool does not
keep, or a pool sandbox that fails its claim falls back to a cold start, never an error; the sandbox
says which it was in :attr:`controller.sandbox.Sandbox.provenance` (the run writes it into
``run_started.claim``). A claimed sandbox belongs to the claimer: it removes it when done (a used
sandbox never goes back to the pool).

Waits: a claim waits for nothing the pool starts (a sandbox still starting is not waited for);
:meth:`WarmPool.wait_ready` and :meth:`WarmPool.close` are bounded. Closing abandons a start in flight at
its next step (``Sandbox._checkpoint``) and removes every sandbox not claimed.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Optional

from controller.sandbox import DEFAULT_POLICY, Sandbox, SandboxError, SandboxSpec
from controller.sandbox.policy_swap import PolicyRefused
from controller.sandbox.signals import abort_starts_when
from controller.text import clean

LABEL_POOL = "desktop-sandbox.pool"
"""Label value on a pool sandbox: its template's key (:meth:`Template.key`)."""

DEFAULT_IDLE_MIB = 420
"""A pool sandbox's idle memory (desktop and gateway containers, MiB) as measured on Docker with the
default image (``make bench`` prints it again: ``pool idle footprint``); what :func:`default_size`
budgets with when the backend gives no measure of its own."""

HOST_SHARE = 0.25
"""Share of the host's available memory a pool may hold by default."""

MAX_DEFAULT_SIZE = 4
"""Largest default pool size (more sandboxes than cores only wait for CPU)."""

RETRY_S = (1.0, 5.0, 30.0)
"""Seconds the filler waits after 1, 2, 3+ failed starts in a row before the next try."""

COLD_REASONS: dict[str, str] = {
    "empty": "the warm pool had none ready",
    "no_template": "the warm pool keeps none of this task's template (screen, apps)",
    "claim_failed": "the warm pool's sandbox failed its claim",
    "bad_policy": "the warm pool refused the task's network policy",
    "bad_request": "the warm pool refused the claim",
    "keeper_unreachable": "the warm pool could not be reached",
    "keeper_foreign": "the warm pool's socket belongs to another user",
}
"""Why a claim started a sandbox cold (``provenance["reason"]``, ``run_started.claim.reason``) and what
the run prints for it: the one list of them."""

log = logging.getLogger("controller.sandbox.pool")


Apps = tuple[tuple[str, tuple[str, ...]], ...]
"""Apps a template launches: ``((app, (arg, ...)), ...)`` in order (the agent's ``/v1/launch``)."""
ReadyFiles = tuple[tuple[str, float], ...]
"""Files a template waits for after launching: ``((path, timeout_s), ...)`` (``~/`` is the guest's home)."""


@dataclass(frozen=True)
class Template:
    """What a pool sandbox is started with and cannot change afterwards: screen size (screen px), whether
    the task drives the agent's chromium (``browser_channel``), and the apps it launches before it is
    claimed (``launch``) with the files that say they are up (``ready``). The network policy is not part
    of it: a claim swaps it. Apps are launched under the pool's deny-all policy, so a template carries
    only apps that need no network (what :meth:`controller.run.tasks.Task.pool_apps` gives)."""

    screen_width: int = 1280
    screen_height: int = 800
    browser_channel: bool = False
    launch: Apps = ()
    ready: ReadyFiles = ()

    @classmethod
    def of(cls, spec: SandboxSpec, launch: Apps = (), ready: ReadyFiles = ()) -> "Template":
        """The template a spec needs, with the apps a claim wants launched already."""
        return cls(spec.screen_width, spec.screen_height, bool(spec.browser_channel),
                   tuple((str(a), tuple(str(x) for x in args)) for a, args in launch),
                   tuple((str(f), float(t)) for f, t in ready))

    def key(self) -> str:
        """A short stable key (12 hex) for labels and logs."""
        text = json.dumps(dataclasses.asdict(self), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:12]

    def spec(self, ready_timeout: float) -> SandboxSpec:
        """The spec a pool sandbox of this template starts with: deny-all."""
        return SandboxSpec(screen_width=self.screen_width, screen_height=self.screen_height,
                           policy=dict(DEFAULT_POLICY), ready_timeout=ready_timeout,
                           browser_channel=self.browser_channel)

    def __str__(self) -> str:
        apps = f" +{len(self.launch)} app(s)" if self.launch else ""
        return f"{self.screen_width}x{self.screen_height}{' +browser' if self.browser_channel else ''}{apps}"


@dataclass
class PoolStats:
    """What a pool did: ``hits`` (claims served from the pool), ``cold`` (claims that started a sandbox),
    ``cold_reasons`` (why, counted), ``claim_s`` (seconds each hit's claim took), ``started`` /
    ``start_failures`` (sandboxes the filler started or failed to), ``removed`` (unclaimed ones removed
    at close or found dead)."""

    hits: int = 0
    cold: int = 0
    cold_reasons: dict[str, int] = field(default_factory=dict)
    claim_s: list[float] = field(default_factory=list)
    started: int = 0
    start_failures: int = 0
    removed: int = 0

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def policy_problem(spec: SandboxSpec) -> Optional[str]:
    """Why ``spec.policy`` is no network policy a gateway takes (the first problem, escaped), or None.
    Checked before a claim takes a pool sandbox, so that a malformed policy spends none."""
    from controller.gateway.policy import NetworkPolicy

    try:
        data = json.loads(spec.policy_json())
        NetworkPolicy.model_validate(data["network"] if isinstance(data, dict) and "network" in data else data)
    except (TypeError, ValueError) as exc:  # pydantic.ValidationError is a ValueError
        return clean(exc, 300)
    return None


def default_size(idle_mib: int = DEFAULT_IDLE_MIB) -> int:
    """How many pool sandboxes fit this host by default: :data:`HOST_SHARE` of the available memory
    (``MemAvailable``) over ``idle_mib`` each, at least 1, at most :data:`MAX_DEFAULT_SIZE`."""
    try:
        with open("/proc/meminfo", encoding="ascii") as info:
            available_kib = next(int(line.split()[1]) for line in info if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError, IndexError):
        return 1
    return max(1, min(MAX_DEFAULT_SIZE, int(available_kib / 1024 * HOST_SHARE // idle_mib)))


class WarmPool:
    """Pre-started sandboxes of backend ``backend`` (a ``Sandbox`` subclass) started with ``options``
    (the backend's options; the pool adds :data:`LABEL_POOL`), ``size`` per template of ``templates``.

    ``memory_budget_mib``: the most memory (MiB) the pool's unclaimed sandboxes may hold, counted at
    ``idle_mib`` each (None: no budget beyond ``size``). ``ready_timeout``: seconds a pool start may
    take. ``start``: how to start one (default ``backend.start(spec, options)``; a test may wrap it).

    Use as a context manager (or :meth:`start` / :meth:`close`). Raises CapabilityMissing at once when
    the backend keeps no pools. Thread-safe: any thread may claim.
    """

    def __init__(self, backend: type[Sandbox], options: Any, templates: Iterable[Template], size: int, *,
                 memory_budget_mib: Optional[int] = None, idle_mib: int = DEFAULT_IDLE_MIB,
                 ready_timeout: Optional[float] = None,
                 start: Optional[Callable[[SandboxSpec, Any], Sandbox]] = None) -> None:
        backend.capabilities.require(backend.backend_name, "pool")
        if size < 0:
            raise ValueError(f"pool size must be 0 or more, got {size}")
        self.backend = backend
        self.templates = list(dict.fromkeys(templates))
        self.size = size
        self.memory_budget_mib = memory_budget_mib
        self.idle_mib = idle_mib
        self.ready_timeout = ready_timeout or backend.default_ready_timeout
        self._start_one = start or (lambda spec, opts: backend.start(spec, opts))
        self._options = options
        self.stats = PoolStats()
        self._ready: dict[Template, collections.deque[Sandbox]] = {t: collections.deque() for t in self.templates}
        self._starting: Optional[Template] = None
        self._failures = 0
        self._closed = False
        self._cond = threading.Condition()
        self._thread: Optional[threading.Thread] = None

    # -- lifetime -----------------------------------------------------------------------------------

    def start(self) -> "WarmPool":
        """Start filling the pool in the background; returns at once."""
        with self._cond:
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(target=self._fill, name="warm-pool", daemon=True)
                self._thread.start()
        return self

    def __enter__(self) -> "WarmPool":
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self, timeout: float = 60.0) -> None:
        """Stop filling, abandon a start in flight at its next step, remove every sandbox not claimed.
        Waits at most ``timeout`` seconds for the filler (a start's current Docker or QEMU step); a
        sandbox it still finishes afterwards is removed by the filler itself. Idempotent."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            leftovers = [sb for queue in self._ready.values() for sb in queue]
            for queue in self._ready.values():
                queue.clear()
        for sandbox in leftovers:
            self._remove(sandbox)
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    # -- what a caller sees -------------------------------------------------------------------------

    def ready_count(self, template: Optional[Template] = None) -> int:
        """Ready sandboxes (of ``template``, or of all templates)."""
        with self._cond:
            if template is not None:
                return len(self._ready.get(template, ()))
            return sum(len(q) for q in self._ready.values())

    def wait_ready(self, count: Optional[int] = None, timeout: float = 600.0,
                   cancelled: Callable[[], bool] = lambda: False) -> bool:
        """Wait until ``count`` sandboxes (default: the full pool) are ready, at most ``timeout``
        seconds, checking ``cancelled()`` every half second. True when they are."""
        want = self.size * len(self.templates) if count is None else count
        deadline = time.monotonic() + timeout
        with self._cond:
            while sum(len(q) for q in self._ready.values()) < want:
                left = deadline - time.monotonic()
                if left <= 0 or self._closed or cancelled():
                    return False
                self._cond.wait(min(left, 0.5))
            return True

    def take(self, spec: SandboxSpec, launch: Apps = (), ready: ReadyFiles = ()) -> tuple[Optional[Sandbox], str]:
        """A ready pool sandbox of ``spec``'s template made the claimer's (fresh agent token,
        ``spec.policy`` swapped in; ``provenance`` set), or ``(None, reason)`` when there is none to
        give: ``no_template``, ``empty``, ``claim_failed`` (each one tried failed its hand-over and was
        removed). ``launch`` / ``ready``: the apps the claimer wants running (part of the template: a pool
        sandbox with them launched, or none). Counts a hit; the caller counts a cold start
        (:meth:`count_cold`). Never blocks on a start. ``(None, "bad_policy")``, taking nothing, for a
        ``spec.policy`` that is no network policy (:func:`policy_problem`) or that a gateway refused
        (that one sandbox removed: the next would refuse it too)."""
        template = Template.of(spec, launch, ready)
        t0 = time.monotonic()
        if policy_problem(spec) is not None:
            return None, "bad_policy"
        reason = "no_template" if template not in self._ready else "empty"
        while True:
            with self._cond:
                queue = self._ready.get(template)
                sandbox = queue.popleft() if queue else None
                if sandbox is not None:
                    self._cond.notify_all()  # the filler refills
            if sandbox is None:
                return None, reason
            try:
                self._hand_over(sandbox, spec)
            except PolicyRefused as exc:
                log.warning("pool sandbox %s: %s; removed", sandbox.id, clean(exc, 300))
                self._remove(sandbox)
                return None, "bad_policy"
            except Exception as exc:  # noqa: BLE001 - a broken pool sandbox: remove it, try the next
                log.warning("pool sandbox %s failed its claim (%s); removed", sandbox.id, clean(exc, 300))
                self._remove(sandbox)
                reason = "claim_failed"
                continue
            claim_s = time.monotonic() - t0
            with self._cond:
                self.stats.hits += 1
                self.stats.claim_s.append(claim_s)
            sandbox.provenance = {"source": "pool", "claim_s": round(claim_s, 4), "template": template.key(),
                                  "launched": bool(template.launch)}
            return sandbox, "hit"

    def count_cold(self, reason: str) -> None:
        """Count a claim that had to start a sandbox (``reason`` as :meth:`take` gave it)."""
        with self._cond:
            self.stats.cold += 1
            self.stats.cold_reasons[reason] = self.stats.cold_reasons.get(reason, 0) + 1

    def claim(self, spec: SandboxSpec, *, launch: Apps = (), ready: ReadyFiles = (),
              cold_options: Any = None) -> Sandbox:
        """A sandbox for ``spec``: :meth:`take`, or a cold start (``backend.start(spec, cold_options or
        the pool's options)``) when the pool has none to give. Never the same sandbox twice. The
        sandbox's ``provenance`` says ``{"source": "pool" | "cold", "claim_s", "template", "reason"
        (cold), "launched": the template's apps run already}``; on a cold start the claimer launches
        them. Raises what a cold start raises (SandboxError, a signal's exception)."""
        t0 = time.monotonic()
        sandbox, reason = self.take(spec, launch, ready)
        if sandbox is not None:
            return sandbox
        self.count_cold(reason)
        sandbox = self.backend.start(spec, cold_options if cold_options is not None else self._options)
        sandbox.provenance = {"source": "cold", "claim_s": round(time.monotonic() - t0, 4),
                              "template": Template.of(spec, launch, ready).key(), "reason": reason,
                              "launched": False}
        return sandbox

    # -- internals ----------------------------------------------------------------------------------

    def _hand_over(self, sandbox: Sandbox, spec: SandboxSpec) -> None:
        """Make a pool sandbox the claimer's: its agent answers, a fresh token, the spec's policy."""
        sandbox.rotate_agent_token()
        sandbox.set_policy(spec.policy)

    def _options_for(self, template: Template) -> Any:
        options = self._options
        labels = {**getattr(options, "extra_labels", {}), LABEL_POOL: template.key()}
        return dataclasses.replace(options, extra_labels=labels) if dataclasses.is_dataclass(options) else options

    def _next_template(self) -> Optional[Template]:
        """The template to start one more sandbox of (the emptiest below ``size``), or None when the
        pool is full or the memory budget is spent. Under ``_cond``."""
        held = sum(len(q) for q in self._ready.values())
        if self.memory_budget_mib is not None and (held + 1) * self.idle_mib > self.memory_budget_mib:
            return None
        wanting = [t for t in self.templates if len(self._ready[t]) < self.size]
        return min(wanting, key=lambda t: len(self._ready[t])) if wanting else None

    def _fill(self) -> None:
        with abort_starts_when(lambda: self._closed):
            while True:
                with self._cond:
                    template = None
                    while not self._closed:
                        template = self._next_template()
                        if template is not None:
                            break
                        self._cond.wait(1.0)
                    if self._closed:
                        return
                    self._starting = template
                try:
                    sandbox = self._start_one(template.spec(self.ready_timeout), self._options_for(template))
                    try:
                        self._launch(sandbox, template)
                    except BaseException:
                        self._remove(sandbox)
                        raise
                except BaseException as exc:  # noqa: BLE001 - the filler never dies of a start
                    with self._cond:
                        self._starting = None
                        if self._closed:
                            return
                        self.stats.start_failures += 1
                        self._failures += 1
                        pause = RETRY_S[min(self._failures, len(RETRY_S)) - 1]
                    log.warning("warm pool: a %s start failed (%s); next try in %g s", template, clean(exc, 300),
                                pause)
                    with self._cond:
                        self._cond.wait_for(lambda: self._closed, pause)
                    continue
                with self._cond:
                    self._starting = None
                    self._failures = 0
                    if not self._closed:
                        self.stats.started += 1
                        self._ready[template].append(sandbox)
                        self._cond.notify_all()
                        continue
                self._remove(sandbox)
                return

    def _launch(self, sandbox: Sandbox, template: Template) -> None:
        """Launch the template's apps in a new pool sandbox and wait for its ready files (each its own
        timeout times the sandbox's ``time_scale``; abandoned when the pool closes). Raises SandboxError
        when a file does not appear, AgentError when the agent refuses a launch."""
        for app, args in template.launch:
            sandbox.agent.launch(app, list(args))
        home = sandbox.guest_home.rstrip("/")
        for file, timeout_s in template.ready:
            path = home + file[1:] if file.startswith("~/") else file
            deadline = time.monotonic() + timeout_s * (sandbox.time_scale or 1.0)
            while not self._closed:
                try:
                    sandbox.agent.read_file(path)
                    break
                except Exception as exc:  # noqa: BLE001 - 404 until the app is up
                    if getattr(exc, "status", None) not in (404, None) or time.monotonic() > deadline:
                        raise SandboxError(f"pool sandbox {sandbox.id}: {clean(path, 200)} did not appear "
                                           f"({clean(exc, 200)})") from None
                with self._cond:
                    self._cond.wait_for(lambda: self._closed, 0.1)  # poll interval of the ready file
            if self._closed:
                raise SandboxError("the pool closed")

    def _remove(self, sandbox: Sandbox) -> None:
        try:
            sandbox.close()
        except Exception as exc:  # noqa: BLE001 - teardown goes on
            log.warning("warm pool: removing %s: %s", sandbox.id, clean(exc, 300))
        with self._cond:
            self.stats.removed += 1


def claim_opener(pool: WarmPool) -> Callable[[Any], Sandbox]:
    """``open_sandbox(task)`` for :func:`controller.run.runner.run_task`: ``pool.claim`` of the task's spec
    with the apps it lets a pool launch (``task.pool_apps()``)."""

    def open_sandbox(task: Any) -> Sandbox:
        launch, ready = task.pool_apps()
        return pool.claim(task.sandbox_spec(), launch=launch, ready=ready)

    return open_sandbox


__all__ = ["COLD_REASONS", "Apps", "DEFAULT_IDLE_MIB", "LABEL_POOL", "ReadyFiles", "PoolStats", "Template", "WarmPool", "claim_opener",
           "default_size", "policy_problem"]
