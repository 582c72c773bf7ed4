"""The audit of a policy swapped in at runtime (``audit(policy, swap_from=START)``), and of a sandbox
claimed from a warm pool (``audit(policy, via_pool=True)``).

A swapped audit starts the sandbox with another policy, ``START``, that lets the guest reach
:data:`~controller.audit.targets.SWAP_ORIGIN` (the allowed target's second port), and then, before the
audit's own probes, :func:`swap_in`:

1. runs a probe of that origin in the guest (``swap-target-reachable-before``: the start policy is
   really enforced, and the target reachable);
2. opens a connection from the guest through the proxy to it and holds it open (netprobe's ``hold``
   kind, run in the background), until the allowed target has recorded its request;
3. swaps in the audited policy with ``Sandbox.set_policy`` (``PUT /v1/policy`` on the gateway's
   control API), noting how many decision-log lines there were before;
4. waits for the held connection to end: at most :data:`CUT_WITHIN_S` seconds when the audited policy
   refuses that origin (the gateway must close it), :data:`KEPT_CHECK_S` when it still admits it; then
   ends the hold itself (a ``release`` file in the guest) and collects what the guest saw.

The audit's probe list then runs as usual, judged against the audited policy; hits the targets recorded
during this phase are left out of the probes' judging (the summary probes still count them all).
:func:`swap_results` turns the phase into three report rows (category ``swap``):
``swap-target-reachable-before``, ``swap-held-connection-closed`` (cut within :data:`CUT_WITHIN_S` s of
the swap, while it was open at the swap, and counted in the gateway's ``closed``; or, when the audited
policy admits the origin, still open) and ``swap-closed-connection-logged`` (the decision log's
``policy_swapped`` line for exactly that connection's client after the swap; none when it is kept).

The guest is hostile: its words are only observations (capped and escaped by the runner), and the
timing verdict is the controller's own clock: when the guest's hold run ended, against when the swap
was sent.
"""

from __future__ import annotations

import collections
import contextlib
import json
import secrets
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from controller.audit.errors import ProbeRunFailed, SwapFailed
from controller.audit.judges import Hits, Probe, hops
from controller.audit.report import ProbeResult
from controller.audit.targets import ALLOWED_NAME, SWAP_ORIGIN, SWAP_PORT, AuditTargets, effective_policy
from controller.audit.topology import AuditTopology
from controller.gateway.policy import NetworkPolicy, Origin
from controller.text import clean

BEFORE_PATH = "/swap-before"
"""Path of the probe that shows the target reachable before the swap."""
HOLD_PATH = "/swap-held"
"""Path prefix of the held connection's request (a random token follows)."""
CUT_WITHIN_S = 5.0
"""Seconds after the swap by which a held connection the audited policy refuses must be cut."""
KEPT_CHECK_S = 1.0
"""Seconds a held connection the audited policy still admits is watched after the swap (it must stay)."""
ESTABLISH_S = 20.0
"""Seconds the held connection may take to reach the target before the swap goes ahead without it."""
HOLD_S = 45.0
"""Seconds the guest holds the connection at most (it ends sooner: cut, or released after the swap)."""
HOLD_RUN_S = HOLD_S + 30.0
"""Seconds the hold's netprobe run may take in the guest in all (killed after)."""
MAX_CLIENT = 64
"""Characters of the guest's ``client`` (``ip:port``) kept."""

ROWS = ("swap-target-reachable-before", "swap-held-connection-closed", "swap-closed-connection-logged")
"""The report rows of a swapped audit, in order (category ``swap``)."""

RunProbes = Callable[..., list[dict[str, Any]]]
"""``run(topology, probes, timeout=seconds)``: the runner's probe run (controller.audit.runner.run_probes)."""


@dataclass
class SwapRecord:
    """What a sandbox's policy went through before the audit's probes ran.

    ``how``: ``set_policy`` (swapped by the audit) or ``pool-claim`` (swapped in by the warm pool's
    claim, nothing held across it); ``start_policy``: the policy the sandbox enforced before (JSON);
    ``answer``: the gateway's answer to the swap (``policy``, ``closed``, ``pending_refused``);
    ``decisions_before``: decision-log lines written before the swap; ``claim``: the claimed sandbox's
    ``provenance`` (None: not from a pool). For ``set_policy`` also: ``before`` and ``hold`` (the
    guest's observations, ``{"name", "observed", "detail"}``), ``open_at_swap`` (the hold had not ended
    when the swap was sent), ``ended_after_s`` (seconds from sending the swap to the hold's end, by the
    controller's clock; None when it did not end by itself in the window), ``cut_expected`` (the
    audited policy refuses :data:`SWAP_ORIGIN`), ``hits_before`` (every target hit up to the end of the
    phase; left out of the audit's judging).
    """

    how: str
    start_policy: dict[str, Any]
    answer: dict[str, Any]
    decisions_before: int = 0
    claim: Optional[dict[str, Any]] = None
    before: Optional[dict[str, Any]] = None
    hold: Optional[dict[str, Any]] = None
    open_at_swap: bool = False
    ended_after_s: Optional[float] = None
    cut_expected: bool = True
    hits_before: Hits = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        """The report's ``swap`` object (docs/audit.md, "JSON report")."""
        return {"how": self.how, "from": self.start_policy, "policy": self.answer.get("policy"),
                "closed": self.answer.get("closed"), "pending_refused": self.answer.get("pending_refused"),
                "decisions_before": self.decisions_before, "claim": self.claim}


def refuses_swap_origin(policy: NetworkPolicy) -> bool:
    """True when ``policy`` (effective) no longer admits a connection to :data:`SWAP_ORIGIN` that was
    allowed before, as the gateway judges one at a swap: its origin not in the allow tier."""
    return not policy.admits_origin(Origin.parse(SWAP_ORIGIN))


def before_probe(proxy_host: str, proxy_port: int) -> Probe:
    """The probe run before the swap: a GET of :data:`SWAP_ORIGIN` through the proxy."""
    url = f"{SWAP_ORIGIN}{BEFORE_PATH}"
    return Probe(ROWS[0], "swap", f"{url} before the swap", "allowed",
                 {"name": ROWS[0], "kind": "http", "proxy_host": proxy_host, "proxy_port": proxy_port, "url": url},
                 lambda o, d, h: (False, False))


def hold_probe(proxy_host: str, proxy_port: int, token: str, release: str) -> Probe:
    """The connection held open across the swap: netprobe's ``hold`` of ``SWAP_ORIGIN/swap-held/<token>``,
    ended by the file ``release`` in the guest."""
    url = f"{SWAP_ORIGIN}{HOLD_PATH}/{token}"
    return Probe(ROWS[1], "swap", f"{url} held open across the swap", "blocked",
                 {"name": ROWS[1], "kind": "hold", "proxy_host": proxy_host, "proxy_port": proxy_port, "url": url,
                  "hold_s": HOLD_S, "release": release, "timeout": 6.0},
                 lambda o, d, h: (False, False))


def swap_in(topology: AuditTopology, set_policy: Callable[[Any], dict[str, Any]], targets: AuditTargets,
            start_policy: NetworkPolicy, policy: NetworkPolicy, run_probes: RunProbes, *,
            claim: Optional[dict[str, Any]] = None) -> SwapRecord:
    """Run the swap phase (module docstring, steps 1-4) on the sandbox of ``topology``, which enforces
    ``effective_policy(start_policy, targets)`` and whose gateway is attached to ``targets``;
    ``set_policy``: the sandbox's ``set_policy``; ``run_probes``: the runner's. Returns the record
    :func:`swap_results` judges. Raises SwapFailed (AuditError) when the gateway does not take the
    audited policy, ProbeRunFailed or GatewayNotListening (AuditError) when a probe run cannot be had,
    controller.sandbox.SandboxError when the sandbox is gone."""
    from controller.sandbox import SandboxError

    proxy = (topology.proxy_host, topology.proxy_port)
    token = secrets.token_hex(8)
    release = f"/tmp/netprobe-release-{token}"
    audited = effective_policy(policy, targets)
    [before] = _observe(run_probes, topology, before_probe(*proxy), 30.0)

    def held_open() -> tuple[list[dict[str, Any]], float]:
        return _observe(run_probes, topology, hold_probe(*proxy, token, release), HOLD_RUN_S), time.monotonic()

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="audit-hold") as pool:
        hold: Future = pool.submit(held_open)
        try:
            _wait_established(targets, token, hold)
            decisions_before = len(topology.decision_log())
            sent = time.monotonic()
            open_at_swap = not hold.done()
            try:
                answer = set_policy(audited)
            except SandboxError as exc:
                raise SwapFailed(f"the gateway did not take the audited policy: {clean(exc, 500)}") from None
            cut_expected = refuses_swap_origin(audited)
            wait_futures([hold], timeout=CUT_WITHIN_S if cut_expected else KEPT_CHECK_S)
            ended_by_itself = hold.done()
        finally:
            if not hold.done():
                _release(topology, release)
        try:
            [held], ended = hold.result(timeout=HOLD_RUN_S + 10.0)
        except FutureTimeout:
            raise ProbeRunFailed(f"the held connection's probe run did not end within {HOLD_RUN_S + 10.0:.0f}s"
                                 ) from None
    ended_after = round(ended - sent, 3) if ended_by_itself else None
    targets.flush()
    return SwapRecord(how="set_policy", start_policy=start_policy.model_dump(mode="json"), answer=answer,
                      decisions_before=decisions_before, claim=claim, before=before, hold=held,
                      open_at_swap=open_at_swap, ended_after_s=ended_after, cut_expected=cut_expected,
                      hits_before=targets.hits())


def _observe(run_probes: RunProbes, topology: AuditTopology, probe: Probe, timeout: float) -> list[dict[str, Any]]:
    """``run_probes`` of ``probe`` alone; a run that failed (ProbeRunFailed) is its observation ``error``."""
    try:
        return run_probes(topology, [probe], timeout=timeout)
    except ProbeRunFailed as exc:
        return [{"name": probe.name, "observed": "error", "detail": clean(exc, 500)}]


def _wait_established(targets: AuditTargets, token: str, hold: Future, timeout: float = ESTABLISH_S) -> bool:
    """Wait until the allowed target recorded the held connection's request (``token`` in its path) or
    the hold ended (refused, failed); at most ``timeout`` seconds. True when the request was recorded."""
    deadline = time.monotonic() + timeout
    delay = 0.05
    while not hold.done():
        if any(_is_hold_hit(h, token) for h in targets.hits()):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(delay)  # poll interval of a condition wait (the request recorded), bounded by the deadline
        delay = min(delay * 1.5, 0.5)
    return False


def _is_hold_hit(hit: dict[str, Any], token: str) -> bool:
    return hit.get("target") == "allowed" and hit.get("port") == SWAP_PORT and f"{HOLD_PATH}/{token}" in str(
        hit.get("head", ""))


def _release(topology: AuditTopology, path: str) -> None:
    """End the guest's hold: create its ``release`` file (as the desktop user, like the hold itself)."""
    from controller.sandbox import SandboxError

    with contextlib.suppress(SandboxError):
        topology.exec_in_guest(["python3", "-c", "import sys; open(sys.argv[1], 'a').close()", path], timeout=15)


def pool_claim_record(sandbox: Any, decisions_before: int = 0) -> SwapRecord:
    """The record of a sandbox whose policy the warm pool's claim swapped in (no swap by the audit):
    from the pool's deny-all to what the claim's spec named (``sandbox.policy_swap``)."""
    from controller.sandbox import DEFAULT_POLICY

    start = NetworkPolicy.model_validate(DEFAULT_POLICY).model_dump(mode="json")
    return SwapRecord(how="pool-claim", start_policy=start,
                      answer=dict(sandbox.policy_swap or {}), decisions_before=decisions_before,
                      claim=dict(sandbox.provenance or {}))


def hits_after(hits: Hits, before: Hits) -> Hits:
    """``hits`` without those of ``before`` (as many of each equal record as ``before`` holds): what the
    targets recorded after the swap phase."""
    left = collections.Counter(json.dumps(h, sort_keys=True, default=str) for h in before)
    out = []
    for hit in hits:
        key = json.dumps(hit, sort_keys=True, default=str)
        if left[key] > 0:
            left[key] -= 1
        else:
            out.append(hit)
    return out


def swap_results(record: SwapRecord, decisions: list[dict[str, Any]]) -> list[ProbeResult]:
    """The three ``swap`` rows of a ``set_policy`` record (none for a pool claim, where nothing was held
    across the swap); ``decisions``: the gateway's whole decision log after the audit."""
    if record.how != "set_policy" or record.before is None or record.hold is None:
        return []
    return [_reachable_row(record), _held_row(record), _logged_row(record, decisions)]


def _reachable_row(record: SwapRecord) -> ProbeResult:
    """The start policy let the guest reach the swap target: 200 with the target's own body, and the
    target recorded the request."""
    before = record.before or {}
    last = hops(before.get("detail"))[-1:]
    answered = before.get("observed") == "status:200" and bool(last) and "audit-allowed" in last[0].get("body", "")
    recorded = any(h.get("target") == "allowed" and h.get("port") == SWAP_PORT
                   and f" {BEFORE_PATH} " in str(h.get("head", "")) for h in record.hits_before)
    return ProbeResult(name=ROWS[0], category="swap", target=f"{SWAP_ORIGIN}{BEFORE_PATH} before the swap",
                       expected="allowed", observed=str(before.get("observed", "error")),
                       passed=answered and recorded,
                       detail={"guest": before.get("detail"), "target_recorded": recorded})


def hold_client(record: SwapRecord) -> Optional[str]:
    """The held connection's client ``ip:port`` as the guest reported it (printable, capped), or None."""
    detail = (record.hold or {}).get("detail")
    client = detail.get("client") if isinstance(detail, dict) else None
    return clean(client, MAX_CLIENT) if isinstance(client, str) and client else None


def _held_row(record: SwapRecord) -> ProbeResult:
    """Cut expected: the guest saw the connection cut, it was open when the swap was sent, it ended
    within :data:`CUT_WITHIN_S` s of it and the gateway counted a closed connection; an escape when the
    guest still held it. Kept expected: still held after :data:`KEPT_CHECK_S` s."""
    observed = str((record.hold or {}).get("observed", "error"))
    closed = record.answer.get("closed")
    if record.cut_expected:
        within = record.ended_after_s is not None and 0 <= record.ended_after_s <= CUT_WITHIN_S
        passed = observed == "cut" and record.open_at_swap and within and isinstance(closed, int) and closed >= 1
        escaped = observed == "held"
    else:
        passed, escaped = observed == "held" and record.open_at_swap and record.ended_after_s is None, False
    return ProbeResult(
        name=ROWS[1], category="swap", target=f"{ALLOWED_NAME}:{SWAP_PORT} connection open across the swap",
        expected="blocked" if record.cut_expected else "allowed", observed=observed, passed=passed, escaped=escaped,
        detail={"guest": (record.hold or {}).get("detail"), "open_at_swap": record.open_at_swap,
                "ended_after_swap_s": record.ended_after_s, "within_s": CUT_WITHIN_S if record.cut_expected
                else KEPT_CHECK_S, "gateway_closed": closed})


def _logged_row(record: SwapRecord, decisions: list[dict[str, Any]]) -> ProbeResult:
    """The decision log's lines after the swap that close the held connection: deny ``policy_swapped``
    (via ``policy``) for :data:`SWAP_ORIGIN` and the held connection's client. One or more when a cut
    is expected, none otherwise."""
    client = hold_client(record)
    lines = [d for d in decisions[record.decisions_before:]
             if d.get("reason") == "policy_swapped" and d.get("decision") == "deny" and d.get("via") == "policy"
             and d.get("origin") == SWAP_ORIGIN and client is not None and d.get("client") == client]
    passed = bool(lines) if record.cut_expected else client is not None and not lines
    return ProbeResult(name=ROWS[2], category="swap", target=f"decision log: policy_swapped for {client or '?'}",
                       expected="blocked" if record.cut_expected else "allowed",
                       observed=f"{len(lines)} policy_swapped lines", passed=passed, detail=lines or None)


class AuditPool:
    """A warm pool of one for the audit, ``WarmPool(backend, options, [Template()], 1)``: use as a context
    manager (it starts filling on entry, so the audit's targets start meanwhile), :meth:`claim` once.
    Closing it (at once after the claim, in the background; waited for on exit, at most 90 s) abandons
    the refill the claim set off and removes what the pool still holds; the claimed sandbox is the
    caller's."""

    def __init__(self, backend: Any, options: Any, *, ready_timeout: float) -> None:
        from controller.sandbox.pool import Template, WarmPool

        self.ready_timeout = ready_timeout
        self.pool = WarmPool(backend, options, [Template()], 1, ready_timeout=ready_timeout)
        self._closer = threading.Thread(target=self.pool.close, name="audit-pool-close", daemon=True)

    def __enter__(self) -> "AuditPool":
        self.pool.start()
        return self

    def claim(self, spec: Any) -> Any:
        """The pool's sandbox claimed with ``spec`` (its policy swapped in by the claim; ``provenance``
        source ``pool``). Raises SwapFailed when the pool had no sandbox ready within ``ready_timeout``
        + 30 seconds or the claim fell back to a cold start (closed again: the audit is of a pool sandbox
        or of none); what a cold start raises."""
        waited = self.ready_timeout + 30.0
        try:
            if not self.pool.wait_ready(1, timeout=waited):
                raise SwapFailed(f"the warm pool had no sandbox ready after {waited:.0f}s (started "
                                 f"{self.pool.stats.started}, failed {self.pool.stats.start_failures})")
            sandbox = self.pool.claim(spec)
        finally:
            self._close_soon()
        provenance = sandbox.provenance or {}
        if provenance.get("source") != "pool":
            sandbox.close()
            raise SwapFailed(f"the warm pool's claim gave a {clean(provenance.get('source'), 20)} start, not a "
                             f"pool sandbox ({clean(provenance.get('reason'), 80)})")
        return sandbox

    def _close_soon(self) -> None:
        if not self._closer.is_alive() and self._closer.ident is None:
            self._closer.start()

    def __exit__(self, *_: object) -> None:
        self._close_soon()
        self._closer.join(90.0)


__all__ = ["BEFORE_PATH", "CUT_WITHIN_S", "HOLD_PATH", "KEPT_CHECK_S", "ROWS", "AuditPool", "SwapFailed",
           "SwapRecord", "hits_after", "pool_claim_record", "refuses_swap_origin", "swap_in", "swap_results"]
