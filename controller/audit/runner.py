"""Running the audit: the probe list in the guest, the targets' and host canary's records, the verdicts.

``run_audit(topology, policy, targets=..., host_canary=..., console=...)`` is the same for every backend;
``audit`` (Docker: targets, sandbox, gateway attached to the targets) and controller.audit.vm's
``audit_vm`` (VM: no targets; the gateway is a host process) start what it needs — the host canary and
the web console (controller.audit.console) first, so both run for the audit's whole duration — and
remove it afterwards. ``audit`` can also start the sandbox with another policy and swap the audited one
in at runtime (``swap_from``), or claim the sandbox from a warm pool (``via_pool``): controller.audit.swap.

The guest is hostile: netprobe's output is read under a deadline (``timeout``) and a size cap
(:data:`MAX_PROBE_OUTPUT`), every observation is checked against the probe it claims to answer, and one
that is missing or malformed is judged as observed ``error`` (a failed probe), never trusted.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from pathlib import Path
from typing import Any, Optional

from controller.audit import probes as probe_list
from controller.audit.canary import HostCanary
from controller.audit.console import ConsoleLike, audit_console, console_control_probe, host_check
from controller.audit.errors import AuditImageMissing, ConsoleNotStarted, GatewayNotListening, ProbeRunFailed
from controller.audit.judges import Hits, Probe
from controller.audit.report import AuditReport, ProbeResult, utc_now
from controller.audit.swap import AuditPool, SwapRecord, hits_after, pool_claim_record, swap_in, swap_results
from controller.audit.targets import AuditTargets, effective_policy, new_canary_name
from controller.audit.topology import AuditTopology, audit_topology
from controller.gateway.policy import NetworkPolicy
from controller.text import clean, clean_lines

MAX_PROBE_OUTPUT = 8 * 1024 * 1024
"""Bytes of netprobe output (stdout) accepted from the guest; more is refused (ProbeRunFailed)."""
MAX_OBSERVED = 80
"""Characters of an observation's outcome word kept (made printable with controller.text.clean)."""

_NETPROBE = Path(__file__).resolve().parents[2] / "guest" / "netprobe.py"


def run_audit(topology: AuditTopology, policy: NetworkPolicy, *, targets: Optional[AuditTargets] = None,
              host_canary: Optional[HostCanary] = None, console: Optional[ConsoleLike] = None,
              timeout: float = 300.0, swap: Optional[SwapRecord] = None) -> AuditReport:
    """Run every probe in the guest of ``topology``'s sandbox and judge them; return the report.

    The sandbox's gateway enforces ``effective_policy(policy, targets)`` and, with ``targets``, is
    attached to them. ``host_canary``: listeners on the host (one is opened and closed here when None).
    ``console``: the web console running on the host's 127.0.0.1 (a real one is started on a temporary
    runs directory and stopped here when None); the ``console`` probes aim at its port and the host's
    own requests to it, before and after the guest's probes, are the positive control.
    ``timeout``: seconds for the probe run in the guest. ``swap``: how the policy got into the running
    gateway (controller.audit.swap; the report's ``swap`` and its ``swap`` rows, first; the targets'
    hits of the swap phase are left out of the probes' judging). Raises GatewayNotListening,
    ProbeRunFailed (both AuditError), ConsoleNotStarted (AuditError: the console did not start) or
    controller.sandbox.SandboxError.
    """
    started = utc_now()
    with contextlib.ExitStack() as stack:
        canary = host_canary if host_canary is not None else stack.enter_context(HostCanary())
        console = console if console is not None else stack.enter_context(audit_console())
        if not console.port:
            raise ConsoleNotStarted("the web console given to the audit is not listening (no port)")
        plan = probe_list.ProbePlan(topology=topology, targets=targets, policy=policy, canary_port=canary.port,
                                    canary_name=targets.canary if targets is not None else new_canary_name(),
                                    console_port=console.port)
        probes = probe_list.build_probes(plan)
        console_before = host_check(console.port, console.home_path)
        observations = run_probes(topology, probes, timeout=timeout)
        console_after = host_check(console.port, console.home_path)
        canary.flush()
        if targets is not None:
            targets.flush()
        hits = targets.hits() if targets is not None else []
        judged_hits = hits_after(hits, swap.hits_before) if swap is not None else hits
        report = AuditReport(
            started=started, sandbox=topology.sandbox_id, image=topology.image_id,
            policy=policy.model_dump(mode="json"),
            effective_policy=effective_policy(policy, targets).model_dump(mode="json"),
            canary=plan.canary_name, target_hits=hits, host_hits=list(canary.hits),
            swap=swap.summary() if swap is not None else None,
        )
        report.decisions = topology.decision_log()
        if swap is not None:
            report.probes.extend(swap_results(swap, report.decisions))
        report.probes.extend(judge_probes(probes, observations, judged_hits + canary.target_hits()))
        if targets is not None:
            report.probes.extend(target_summary_probes(targets, hits))
        report.probes.append(host_canary_probe(canary, f"{topology.host_label}-canary"))
        report.probes.append(canary_resolution_probe(plan.canary_name, report.decisions))
        report.probes.append(console_control_probe(console.port, console_before, console_after))
        report.finished = utc_now()
        return report


def run_probes(topology: AuditTopology, probes: list[Probe], *, timeout: float) -> list[dict[str, Any]]:
    """Run ``guest/netprobe.py`` with every probe's spec in the guest as its user, once the gateway's
    proxy listens; return one observation ``{"name", "observed", "detail"}`` per probe, in probe order.

    ``timeout``: seconds for the whole run in the guest. An observation missing from the guest's answer,
    or not naming its probe, or malformed, is returned as observed ``error``. Raises GatewayNotListening,
    ProbeRunFailed (netprobe exited non-zero, was killed at the deadline, or its output is over
    :data:`MAX_PROBE_OUTPUT` bytes or not ``{"results": [...]}``) or SandboxError.
    """
    wait_for_proxy(topology)
    source = _NETPROBE.read_text(encoding="utf-8")
    result = topology.exec_in_guest(["python3", "-c", source, json.dumps([p.spec for p in probes])], timeout=timeout)
    if result.exit_code != 0:
        stderr = result.stderr[-2000:].decode("utf-8", "replace")
        raise ProbeRunFailed(f"netprobe exited {result.exit_code}: {clean(stderr, 2000)}")
    if len(result.stdout) > MAX_PROBE_OUTPUT:
        raise ProbeRunFailed(f"netprobe output is {len(result.stdout)} bytes (at most {MAX_PROBE_OUTPUT} accepted)")
    try:
        answered = json.loads(result.stdout)["results"]
    except (ValueError, TypeError, KeyError) as exc:
        raise ProbeRunFailed(f"netprobe output is not a probe report: {clean(exc, 200)}") from None
    if not isinstance(answered, list):
        raise ProbeRunFailed("netprobe output is not a probe report: results is not a list")
    return [_observation(probe, answered[i] if i < len(answered) else None) for i, probe in enumerate(probes)]


def _observation(probe: Probe, answer: Any) -> dict[str, Any]:
    """``answer`` (the guest's, any JSON value) as ``probe``'s observation, or observed ``error``."""
    if not isinstance(answer, dict) or answer.get("name") != probe.name:
        return {"name": probe.name, "observed": "error", "detail": "no observation for this probe from the guest"}
    observed = answer.get("observed")
    if not isinstance(observed, str):
        return {"name": probe.name, "observed": "error", "detail": "the guest's observation has no outcome word"}
    return {"name": probe.name, "observed": clean(observed, MAX_OBSERVED), "detail": answer.get("detail")}


def judge_probes(probes: list[Probe], observations: list[dict[str, Any]], hits: Hits) -> list[ProbeResult]:
    """Each probe's verdict on its observation (from ``run_probes``, same order) and everything ``hits``
    recorded (the targets' and the host canary's records)."""
    results = []
    for probe, obs in zip(probes, observations, strict=True):
        passed, escaped = probe.judge(obs["observed"], obs["detail"], hits)
        results.append(ProbeResult(
            name=probe.name, category=probe.category, target=probe.target, expected=probe.expected,
            observed=obs["observed"], passed=passed, escaped=escaped, detail=obs["detail"],
        ))
    return results


def wait_for_proxy(topology: AuditTopology, timeout: float = 60.0) -> None:
    """Wait until the gateway's output announces ``gateway listening on`` (the agent can be ready before
    the proxy is), polling its last 400 lines. Raises GatewayNotListening after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    delay = 0.05
    while "gateway listening on" not in topology.gateway_log(400):
        if time.monotonic() > deadline:
            raise GatewayNotListening(f"gateway proxy not listening after {timeout:.0f}s:\n"
                                      f"{clean_lines(topology.gateway_log(30), 4000)}")
        time.sleep(delay)  # poll interval of a condition wait (proxy listening), bounded by the deadline
        delay = min(delay * 1.5, 0.5)


def host_canary_probe(host_canary: HostCanary, name: str) -> ProbeResult:
    """Summary verdict: the host canary recorded nothing (any hit escaped)."""
    return ProbeResult(name=name, category="summary", target=f"0.0.0.0:{host_canary.port}", expected="blocked",
                       observed=f"{len(host_canary.hits)} hits", passed=not host_canary.hits,
                       escaped=bool(host_canary.hits), detail=host_canary.hits or None)


def canary_resolution_probe(canary: str, decisions: list[dict[str, Any]]) -> ProbeResult:
    """Summary verdict: the gateway refused the random ``canary`` name without resolving it.

    Passes when the decision log has the canary's requests and none was allowed or got as far as an
    address check (``address-refused``, ``resolve-failed``: the name was looked up). A log without them
    fails (the probes did not reach the gateway), without counting as escaped.
    """
    canary_decisions = [d for d in decisions if canary in str(d.get("origin", ""))]
    canary_resolved = [d for d in canary_decisions if d.get("decision") == "allow"
                       or str(d.get("reason", "")).startswith(("address-refused", "resolve-failed"))]
    return ProbeResult(name="canary-not-resolved-by-gateway", category="summary", target=canary,
                       expected="blocked", observed=f"{len(canary_decisions)} decisions, {len(canary_resolved)} resolved",
                       passed=bool(canary_decisions) and not canary_resolved, escaped=bool(canary_resolved))


def target_summary_probes(targets: AuditTargets, hits: Hits) -> list[ProbeResult]:
    """Summary verdicts on the targets' own records: the recorder saw nothing, and the targets saw no
    peer but the gateway."""
    recorder_hits = [h for h in hits if h["target"] == "recorder"]
    foreign = [h for h in hits if h.get("peer") not in (targets.gateway_ip, targets.gateway_ip6)]
    return [
        ProbeResult(name="recorder-saw-nothing", category="summary", target=f"{targets.recorder_ip} (all ports)",
                    expected="blocked", observed=f"{len(recorder_hits)} hits", passed=not recorder_hits,
                    escaped=bool(recorder_hits)),
        ProbeResult(name="targets-reached-only-via-gateway", category="summary", target=targets.allowed_ip,
                    expected="blocked", observed=f"{len(foreign)} hits from other peers", passed=not foreign,
                    escaped=bool(foreign), detail=foreign or None),
    ]


def audit(policy: NetworkPolicy, *, image: Optional[str] = None, client: Any = None,
          ready_timeout: float = 120.0, console: Optional[ConsoleLike] = None,
          swap_from: Optional[NetworkPolicy] = None, via_pool: bool = False) -> AuditReport:
    """Start the host canary, the web console (unless ``console``, one already listening, is given),
    targets and a Docker sandbox with ``policy`` (``image``: the guest image tag, default the sandbox's;
    ``client``: a docker.DockerClient), attach the gateway to the targets, run the audit, remove
    everything; return the report.

    ``swap_from``: start the sandbox with this policy instead (it should let the guest reach
    :data:`~controller.audit.targets.SWAP_ORIGIN`) and swap ``policy`` in at runtime before the probes,
    across a connection held open (controller.audit.swap; the report's ``swap`` rows). ``via_pool``:
    claim the sandbox from a warm pool of one (``WarmPool(DockerSandbox, options, [Template()], 1)``)
    with the starting policy, swapped in by the claim, instead of starting it.

    Raises AuditImageMissing, another AuditError (SwapFailed: the policy could not be swapped in, the
    pool gave no sandbox), controller.sandbox.SandboxError or docker.errors.DockerException when the run
    cannot start.
    """
    import docker

    from controller.sandbox import LABEL_OWNER, LABEL_OWNER_ID, SandboxSpec
    from controller.sandbox.owner import owner_id
    from controller.sandbox.docker import DEFAULT_IMAGE, DockerOptions, DockerSandbox

    client = client or docker.from_env()
    image = image or DEFAULT_IMAGE
    try:
        client.images.get(image)
    except docker.errors.ImageNotFound:
        raise AuditImageMissing(f"image {image} not found; build it with `make desktop`") from None
    with contextlib.ExitStack() as stack:
        canary = stack.enter_context(HostCanary())
        console = console if console is not None else stack.enter_context(audit_console())
        pool = stack.enter_context(AuditPool(DockerSandbox, DockerOptions(image=image), ready_timeout=ready_timeout)) \
            if via_pool else None  # fills while the targets start
        targets = AuditTargets.start(client, image, {LABEL_OWNER: f"{socket.gethostname()}:{os.getpid()}",
                                                     LABEL_OWNER_ID: owner_id()})
        try:
            start_policy = swap_from if swap_from is not None else policy
            spec = SandboxSpec(policy=effective_policy(start_policy, targets), ready_timeout=ready_timeout)
            opened = pool.claim(spec) if pool is not None else \
                DockerSandbox.start(spec, DockerOptions(image=image), client=client)
            with opened as sandbox:
                targets.gateway_ip, targets.gateway_ip6 = sandbox.attach_gateway(targets.network_name)
                topology = audit_topology(sandbox)
                claim = dict(sandbox.provenance or {}) if pool is not None else None
                swap: Optional[SwapRecord] = None
                if swap_from is not None:
                    swap = swap_in(topology, sandbox.set_policy, targets, swap_from, policy, run_probes, claim=claim)
                elif pool is not None:
                    swap = pool_claim_record(sandbox)
                return run_audit(topology, policy, targets=targets, host_canary=canary, console=console, swap=swap)
        finally:
            targets.close()
