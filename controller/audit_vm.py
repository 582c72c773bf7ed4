"""Network audit of the VM backend: the same in-guest probes (``guest/netprobe.py``), judged the same way
(``controller.audit``), against the VM's topology.

In the VM the guest sits on QEMU's user-mode network with ``restrict=on``: the only address it can open a
connection to is the gateway's guest-forwarded address (10.0.2.100:3128); the gateway itself runs on the
host's loopback. So the probes ask:

* direct TCP/UDP from the guest to the host (QEMU's host alias 10.0.2.2, its DNS alias 10.0.2.3, and the
  host's own addresses) on the host canary's port, the agent's forwarded port, the gateway's port and
  common service ports; cloud metadata; IPv6 (off in the guest);
* DNS: lookups in the guest, raw queries to QEMU's resolver and the host, the run's random canary name;
* through the proxy: metadata and loopback addresses in every encoding (the agent's host port, the
  gateway's own port, the canary), the host's addresses, a denied origin, CONNECT to special addresses;
* a full TCP scan of the gateway's guest-side address (only the proxy port may answer) and a scan of
  the host alias.

A :class:`~controller.audit.HostCanary` on every host address records any connection or datagram that
got through, so "refused in the guest" is never the only evidence. No audit target containers are
used (the gateway is a host process here); origins a policy allows are probed as in the Docker audit.

Rule source: ARCHITECTURE.md ("VM path"), docs/audit.md (report format).
"""

from __future__ import annotations

import json
import secrets
import socket
import time
from pathlib import Path
from typing import Any, Optional

from controller.audit import (
    DENY_BODY,  # noqa: F401 - re-exported for readers of this module's judges
    TARGET_DOMAIN,
    AuditError,
    AuditReport,
    HostCanary,
    Probe,
    ProbeResult,
    _blocked,
    _connected,
    _fmt,
    _no_hits,
    _through_proxy,
    ip_forms,
    wait_for_proxy,
)
from controller.gateway.policy import NetworkPolicy, Origin

_NETPROBE = Path(__file__).resolve().parent.parent / "guest" / "netprobe.py"

SLIRP_HOST = "10.0.2.2"
"""QEMU user-mode network's alias for the host (reachable only when not ``restrict=on``)."""
SLIRP_DNS = "10.0.2.3"
"""QEMU user-mode network's built-in DNS forwarder (disabled by ``restrict=on``)."""
COMMON_PORTS = [22, 53, 80, 443, 2375, 3128, 8000, 8080]


def host_addresses() -> list[str]:
    """The host's own non-loopback IPv4 addresses (from its name; no packets are sent)."""
    found: list[str] = []
    try:
        infos = socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)
    except OSError:
        infos = []
    for *_rest, sockaddr in infos:
        address = sockaddr[0]
        if not address.startswith("127.") and address not in found:
            found.append(address)
    return found


def build_vm_probes(*, proxy_host: str, proxy_port: int, gateway_guest_ip: str, agent_host_port: int,
                    gateway_host_port: int, canary_port: int, canary_name: str, host_ips: list[str],
                    policy: NetworkPolicy) -> list[Probe]:
    """The probe battery for a VM sandbox (see the module docstring)."""
    probes: list[Probe] = []
    proxy = {"proxy_host": proxy_host, "proxy_port": proxy_port}
    host_hit_free = _no_hits(target="host")

    def add(name: str, category: str, target: str, expected: str, spec: dict[str, Any], judge: Any) -> None:
        probes.append(Probe(name, category, target, expected, {"name": name, **spec}, judge))  # type: ignore[arg-type]

    host_side = [SLIRP_HOST, SLIRP_DNS, *host_ips]
    sensitive_ports = sorted({canary_port, agent_host_port, gateway_host_port, *COMMON_PORTS})
    for host in host_side:
        add(f"direct-tcp-{host}", "direct", f"{host}:{','.join(map(str, sensitive_ports))}", "blocked",
            {"kind": "scan", "host": host, "ports": [[p, p] for p in sensitive_ports], "timeout": 1.5},
            _blocked(_connected, host_hit_free))
        for port in (canary_port, 53, 123):
            add(f"direct-udp-{host}-{port}", "direct", _fmt(host, port), "blocked",
                {"kind": "udp", "host": host, "port": port}, _blocked(_connected, host_hit_free))
    add("direct-metadata-v4", "direct", "169.254.169.254:80", "blocked",
        {"kind": "tcp", "host": "169.254.169.254", "port": 80}, _blocked(_connected))
    for host in ("2001:db8::1", "fd00:ec2::254"):
        add(f"direct-tcp-v6-{host}", "direct", _fmt(host, 443), "blocked",
            {"kind": "tcp", "host": host, "port": 443}, _blocked(_connected))
    add("ipv6-off", "direct", "guest interfaces", "blocked", {"kind": "ipv6"},
        lambda observed, detail, hits: (observed == "ipv6-off", observed != "ipv6-off"))

    # DNS: no resolver in the guest, and QEMU's forwarder is off
    add("resolve-canary", "dns", canary_name, "blocked", {"kind": "resolve", "host": canary_name},
        _blocked(_connected))
    add("resolve-denied", "dns", f"denied.{TARGET_DOMAIN}", "blocked",
        {"kind": "resolve", "host": f"denied.{TARGET_DOMAIN}"}, _blocked(_connected))
    for server in (SLIRP_DNS, SLIRP_HOST, gateway_guest_ip, *host_ips):
        for transport in ("udp", "tcp"):
            add(f"dns-{transport}-{server}", "dns", _fmt(server, 53), "blocked",
                {"kind": "dns", "server": server, "port": 53, "name": canary_name, "transport": transport},
                _blocked(_connected))
    add("proxy-canary-name", "dns", f"http://{canary_name}:8080/", "blocked",
        {"kind": "http", **proxy, "url": f"http://{canary_name}:8080/"}, _blocked(_through_proxy))

    # through the proxy: metadata, loopback (the agent's and the gateway's host ports, the canary), host
    literal: list[tuple[str, str, int]] = []
    for form in ip_forms("169.254.169.254") + ["[fd00:ec2::254]", "metadata.google.internal", "100.100.100.200"]:
        literal.append(("metadata", form, 80))
    for port in (agent_host_port, gateway_host_port, canary_port):
        for form in ip_forms("127.0.0.1") + ["localhost", "[::1]", "0", "0.0.0.0"]:
            literal.append(("loopback", form, port))
    for host in [SLIRP_HOST, *host_ips]:
        literal.append(("host", host, canary_port))
    for category, form, port in literal:
        url = f"http://{form}:{port}/latest/meta-data/"
        add(f"proxy-{category}-{form}:{port}", f"proxy-{category}", url, "blocked",
            {"kind": "http", **proxy, "url": url}, _blocked(_through_proxy, host_hit_free))
    for form in ["169.254.169.254", "0xa9fea9fe", "127.0.0.1", "[::1]", SLIRP_HOST]:
        add(f"connect-{form}:443", "proxy-connect", f"{form}:443", "blocked",
            {"kind": "connect", **proxy, "authority": f"{form}:443", "tls": True}, _blocked(_through_proxy))
    add(f"connect-127.0.0.1:{agent_host_port}", "proxy-connect", f"127.0.0.1:{agent_host_port}", "blocked",
        {"kind": "connect", **proxy, "authority": f"127.0.0.1:{agent_host_port}", "tls": False},
        _blocked(_through_proxy))

    # the gateway's guest-side address: only the proxy port answers
    ok = ("none-open", f"open:{proxy_port}")
    add("gateway-ports", "gateway", f"{gateway_guest_ip}:1-65535", "blocked",
        {"kind": "scan", "host": gateway_guest_ip, "ports": [[1, 65535]], "timeout": 1.0, "batch": 256},  # 256: under the default fd limit
        lambda o, d, h: (o in ok, o not in ok))
    add("gateway-udp-53", "gateway", _fmt(gateway_guest_ip, 53), "blocked",
        {"kind": "udp", "host": gateway_guest_ip, "port": 53}, _blocked(_connected))

    denied_url = f"http://denied.{TARGET_DOMAIN}:8080/"
    add("denied-origin", "origins", denied_url, "blocked", {"kind": "http", **proxy, "url": denied_url},
        _blocked(_through_proxy))
    for origin_text in policy.allow:
        origin = Origin.parse(origin_text)
        if origin.scheme == "https":
            spec = {"kind": "connect", **proxy, "authority": _fmt(origin.host, origin.port), "tls": True,
                    "sni": None if origin.is_ip_literal else origin.host}
        else:
            spec = {"kind": "http", **proxy, "url": f"{origin_text}/"}
        add(f"policy-origin-{origin_text}", "origins", origin_text, "allowed", spec,
            lambda o, d, h: (_through_proxy(o, d), False))
    return probes


def run_vm_audit(sandbox: Any, policy: NetworkPolicy, canary: HostCanary, *, timeout: float = 600.0) -> AuditReport:
    """Run every probe in ``sandbox`` (a started :class:`~controller.sandbox.vm.VMSandbox`) and judge them.

    Returns the report; raises AuditError when the probe program cannot run in the guest.
    """
    from controller.audit import _now
    from controller.sandbox.vm import GATEWAY_GUEST_ADDR, GATEWAY_PROXY_PORT

    started = _now()
    canary_name = f"c{secrets.token_hex(6)}.canary.{TARGET_DOMAIN}"
    probes = build_vm_probes(
        proxy_host=GATEWAY_GUEST_ADDR, proxy_port=GATEWAY_PROXY_PORT, gateway_guest_ip=GATEWAY_GUEST_ADDR,
        agent_host_port=sandbox.agent_host_port, gateway_host_port=sandbox.gateway_host_port,
        canary_port=canary.port, canary_name=canary_name, host_ips=host_addresses(), policy=policy,
    )
    wait_for_proxy(sandbox)
    source = _NETPROBE.read_text(encoding="utf-8")
    result = sandbox.exec_in_guest(["python3", "-c", source, json.dumps([p.spec for p in probes])], timeout=timeout)
    if result.exit_code != 0:
        raise AuditError(f"netprobe exited {result.exit_code}: {result.stderr.decode('utf-8', 'replace')[-2000:]}")
    observations = json.loads(result.stdout)["results"]
    time.sleep(0.5)  # let a late canary hit land
    judged_hits = [{"target": "host", "hit": h["proto"], **h} for h in canary.hits]
    policy_json = policy.model_dump(mode="json")
    report = AuditReport(started=started, sandbox=sandbox.id, image=sandbox.image_id, policy=policy_json,
                         effective_policy=policy_json, canary=canary_name, host_hits=list(canary.hits))
    for probe, obs in zip(probes, observations):
        passed, escaped = probe.judge(obs["observed"], obs["detail"], judged_hits)
        report.probes.append(ProbeResult(
            name=probe.name, category=probe.category, target=probe.target, expected=probe.expected,
            observed=obs["observed"], passed=passed, escaped=escaped, detail=obs["detail"],
        ))
    decisions = sandbox.decision_log()
    report.decisions = decisions
    canary_decisions = [d for d in decisions if canary_name in d.get("origin", "")]
    canary_resolved = [d for d in canary_decisions if d.get("decision") == "allow"
                       or d.get("reason", "").startswith(("address-refused", "resolve-failed"))]
    report.probes.extend([
        ProbeResult(name="host-canary", category="summary", target=f"0.0.0.0:{canary.port}", expected="blocked",
                    observed=f"{len(canary.hits)} hits", passed=not canary.hits, escaped=bool(canary.hits),
                    detail=canary.hits or None),
        ProbeResult(name="canary-not-resolved-by-gateway", category="summary", target=canary_name,
                    expected="blocked", observed=f"{len(canary_decisions)} decisions, {len(canary_resolved)} resolved",
                    passed=bool(canary_decisions) and not canary_resolved, escaped=bool(canary_resolved)),
    ])
    report.finished = _now()
    return report


def audit_vm(policy: NetworkPolicy, *, image: Optional[Path] = None, ready_timeout: float = 600.0,
             sandbox: Any = None) -> AuditReport:
    """Start a VM sandbox with ``policy`` (or use ``sandbox``, already started with it), run the audit,
    stop what it started; return the report. Raises AuditError or SandboxError when it cannot run.
    """
    from controller.sandbox import SandboxSpec
    from controller.sandbox.vm import VMOptions, VMSandbox

    with HostCanary() as canary:
        if sandbox is not None:
            return run_vm_audit(sandbox, policy, canary)
        spec = SandboxSpec(policy=policy, ready_timeout=ready_timeout)
        with VMSandbox.start(spec, VMOptions(image=image)) as started:
            return run_vm_audit(started, policy, canary)
