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

import secrets
import socket
from pathlib import Path
from typing import Any, Optional

from controller.audit import (
    TARGET_DOMAIN,
    AuditReport,
    HostCanary,
    Probe,
    blocked,
    canary_resolution_probe,
    connected,
    host_canary_probe,
    host_port,
    ip_forms,
    judge_probes,
    no_hits,
    policy_origin_probe,
    run_probes,
    through_proxy,
    utc_now,
)
from controller.gateway.policy import NetworkPolicy

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
    host_hit_free = no_hits(target="host")

    def add(name: str, category: str, target: str, expected: str, spec: dict[str, Any], judge: Any) -> None:
        probes.append(Probe(name, category, target, expected, {"name": name, **spec}, judge))  # type: ignore[arg-type]

    host_side = [SLIRP_HOST, SLIRP_DNS, *host_ips]
    sensitive_ports = sorted({canary_port, agent_host_port, gateway_host_port, *COMMON_PORTS})
    for host in host_side:
        add(f"direct-tcp-{host}", "direct", f"{host}:{','.join(map(str, sensitive_ports))}", "blocked",
            {"kind": "scan", "host": host, "ports": [[p, p] for p in sensitive_ports], "timeout": 1.5},
            blocked(connected, host_hit_free))
        for port in (canary_port, 53, 123):
            add(f"direct-udp-{host}-{port}", "direct", host_port(host, port), "blocked",
                {"kind": "udp", "host": host, "port": port}, blocked(connected, host_hit_free))
    add("direct-metadata-v4", "direct", "169.254.169.254:80", "blocked",
        {"kind": "tcp", "host": "169.254.169.254", "port": 80}, blocked(connected))
    for host in ("2001:db8::1", "fd00:ec2::254"):
        add(f"direct-tcp-v6-{host}", "direct", host_port(host, 443), "blocked",
            {"kind": "tcp", "host": host, "port": 443}, blocked(connected))
    add("ipv6-off", "direct", "guest interfaces", "blocked", {"kind": "ipv6"},
        lambda observed, detail, hits: (observed == "ipv6-off", observed != "ipv6-off"))

    # DNS: no resolver in the guest, and QEMU's forwarder is off
    add("resolve-canary", "dns", canary_name, "blocked", {"kind": "resolve", "host": canary_name},
        blocked(connected))
    add("resolve-denied", "dns", f"denied.{TARGET_DOMAIN}", "blocked",
        {"kind": "resolve", "host": f"denied.{TARGET_DOMAIN}"}, blocked(connected))
    for server in (SLIRP_DNS, SLIRP_HOST, gateway_guest_ip, *host_ips):
        for transport in ("udp", "tcp"):
            add(f"dns-{transport}-{server}", "dns", host_port(server, 53), "blocked",
                {"kind": "dns", "server": server, "port": 53, "name": canary_name, "transport": transport},
                blocked(connected))
    add("proxy-canary-name", "dns", f"http://{canary_name}:8080/", "blocked",
        {"kind": "http", **proxy, "url": f"http://{canary_name}:8080/"}, blocked(through_proxy))

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
            {"kind": "http", **proxy, "url": url}, blocked(through_proxy, host_hit_free))
    for form in ["169.254.169.254", "0xa9fea9fe", "127.0.0.1", "[::1]", SLIRP_HOST]:
        add(f"connect-{form}:443", "proxy-connect", f"{form}:443", "blocked",
            {"kind": "connect", **proxy, "authority": f"{form}:443", "tls": True}, blocked(through_proxy))
    add(f"connect-127.0.0.1:{agent_host_port}", "proxy-connect", f"127.0.0.1:{agent_host_port}", "blocked",
        {"kind": "connect", **proxy, "authority": f"127.0.0.1:{agent_host_port}", "tls": False},
        blocked(through_proxy))

    # the gateway's guest-side address: only the proxy port answers
    ok = ("none-open", f"open:{proxy_port}")
    add("gateway-ports", "gateway", f"{gateway_guest_ip}:1-65535", "blocked",
        {"kind": "scan", "host": gateway_guest_ip, "ports": [[1, 65535]], "timeout": 1.0, "batch": 256},  # 256: under the default fd limit
        lambda o, d, h: (o in ok, o not in ok))
    add("gateway-udp-53", "gateway", host_port(gateway_guest_ip, 53), "blocked",
        {"kind": "udp", "host": gateway_guest_ip, "port": 53}, blocked(connected))

    denied_url = f"http://denied.{TARGET_DOMAIN}:8080/"
    add("denied-origin", "origins", denied_url, "blocked", {"kind": "http", **proxy, "url": denied_url},
        blocked(through_proxy))
    probes.extend(policy_origin_probe(origin_text, proxy_host, proxy_port) for origin_text in policy.allow)
    return probes


def run_vm_audit(sandbox: Any, policy: NetworkPolicy, canary: HostCanary, *, timeout: float = 600.0) -> AuditReport:
    """Run every probe in ``sandbox`` (a started :class:`~controller.sandbox.vm.VMSandbox`) and judge them.

    Returns the report; raises AuditError when the probe program cannot run in the guest.
    """
    from controller.sandbox.vm import GATEWAY_GUEST_ADDR, GATEWAY_PROXY_PORT

    started = utc_now()
    canary_name = f"c{secrets.token_hex(6)}.canary.{TARGET_DOMAIN}"
    probes = build_vm_probes(
        proxy_host=GATEWAY_GUEST_ADDR, proxy_port=GATEWAY_PROXY_PORT, gateway_guest_ip=GATEWAY_GUEST_ADDR,
        agent_host_port=sandbox.agent_host_port, gateway_host_port=sandbox.gateway_host_port,
        canary_port=canary.port, canary_name=canary_name, host_ips=host_addresses(), policy=policy,
    )
    observations = run_probes(sandbox, probes, timeout=timeout)
    judged_hits = canary.target_hits()
    policy_json = policy.model_dump(mode="json")
    report = AuditReport(started=started, sandbox=sandbox.id, image=sandbox.image_id, policy=policy_json,
                         effective_policy=policy_json, canary=canary_name, host_hits=list(canary.hits))
    report.probes.extend(judge_probes(probes, observations, judged_hits))
    decisions = sandbox.decision_log()
    report.decisions = decisions
    report.probes.extend([host_canary_probe(canary, "host-canary"), canary_resolution_probe(canary_name, decisions)])
    report.finished = utc_now()
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
