"""The probe list: every probe the audit runs in the guest, declared once for every backend.

``build_probes(plan)`` resolves each probe's addresses from the sandbox's ``AuditTopology`` (gateway,
host, resolvers, published ports) and, on backends that have them, the audit's own targets (Docker: the
recorder and allowed containers); the host's web console's port adds the ``console`` group
(controller.audit.console). Probes that need the targets are left out without them. docs/audit.md
lists the groups and why each probe is there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from controller.audit.console import console_probes
from controller.audit.judges import (
    LOOPBACK_FORMS,
    Hits,
    Judge,
    Probe,
    anything,
    blocked,
    connected,
    hops,
    host_port,
    ip_forms,
    no_hits,
    one_of,
    through_proxy,
)
from controller.audit.report import Expected
from controller.audit.targets import (
    ALLOWED_NAME,
    DENIED_NAME,
    DOH_NAME,
    DOT_NAME,
    FIXTURE_ORIGIN,
    RECORDER_UDP_PORTS,
    TARGET_HTTP_PORT,
    AuditTargets,
)
from controller.audit.topology import AuditTopology
from controller.gateway.policy import NetworkPolicy, Origin

HOST_PORTS = [22, 53, 80, 443, 2375, 2376, 3128, 8000, 8080]
"""Host TCP ports probed from the guest (plus the sandbox's published ports and the host canary)."""
METADATA = "169.254.169.254"
DOCUMENTATION_V6 = ["2001:db8::1", "fd00:ec2::254"]
"""IPv6 addresses outside the sandbox (documentation prefix, AWS's IPv6 metadata address)."""
METADATA_FORMS = ip_forms(METADATA) + ["[fd00:ec2::254]", "metadata.google.internal", "100.100.100.200"]


@dataclass(frozen=True)
class ProbePlan:
    """What the probe list is resolved from: the sandbox's ``topology``, the audit's ``targets`` (None on
    backends without them), the run's DNS ``canary_name``, the host canary's ``canary_port`` and the
    audited ``policy`` (its allowed origins each get a probe) and the host's web console's port."""

    topology: AuditTopology
    targets: Optional[AuditTargets]
    canary_name: str
    canary_port: int
    policy: NetworkPolicy
    console_port: Optional[int] = None
    """The port of the web console on the host's 127.0.0.1 (the ``console`` group); None: no console."""


def build_probes(plan: ProbePlan) -> list[Probe]:
    """The full probe list for ``plan``, in report order; probe names are unique (a second probe of the
    same name is dropped)."""
    topo, t = plan.topology, plan.targets
    gateway_ip = topo.proxy_host
    proxy = {"proxy_host": gateway_ip, "proxy_port": topo.proxy_port}
    probes: list[Probe] = []
    names: set[str] = set()

    def add(name: str, category: str, target: str, expected: Expected, spec: dict[str, Any], judge: Judge) -> None:
        if name not in names:
            names.add(name)
            probes.append(Probe(name, category, target, expected, {"name": name, **spec}, judge))

    def proxied(name: str, category: str, url: str, hit_free: Any = anything, **extra: Any) -> None:
        add(name, category, url, "blocked", {"kind": "http", **proxy, "url": url, **extra},
            blocked(through_proxy, hit_free))

    def tunnel(name: str, category: str, authority: str, hit_free: Any = anything, **extra: Any) -> None:
        add(name, category, authority, "blocked", {"kind": "connect", **proxy, "authority": authority, **extra},
            blocked(through_proxy, hit_free))

    # direct TCP/UDP to outside addresses (the recorder, which the gateway can reach), v4 and v6
    if t is not None:
        for port in [22, 80, 443, 853, 8080]:
            add(f"direct-tcp-v4-{port}", "direct", host_port(t.recorder_ip, port), "blocked",
                {"kind": "tcp", "host": t.recorder_ip, "port": port}, blocked(connected, no_hits(port)))
        for port in RECORDER_UDP_PORTS:
            add(f"direct-udp-v4-{port}", "direct", host_port(t.recorder_ip, port), "blocked",
                {"kind": "udp", "host": t.recorder_ip, "port": port}, blocked(connected, no_hits(port)))
    for host in ([t.recorder_ip6] if t is not None and t.recorder_ip6 else []) + DOCUMENTATION_V6:
        add(f"direct-tcp-v6-{host}", "direct", host_port(host, 443), "blocked",
            {"kind": "tcp", "host": host, "port": 443}, blocked(connected, no_hits(443)))
        add(f"direct-udp-v6-{host}", "direct", host_port(host, 53), "blocked",
            {"kind": "udp", "host": host, "port": 53}, blocked(connected, no_hits(53)))
    add("ipv6-off", "direct", "guest interfaces", "blocked", {"kind": "ipv6"}, one_of("ipv6-off"))
    add("direct-metadata-v4", "direct", f"{METADATA}:80", "blocked",
        {"kind": "tcp", "host": METADATA, "port": 80}, blocked(connected))

    # DNS: lookups in the guest, raw queries to every resolver the guest might reach, the canary
    for name, label in ((plan.canary_name, "canary"), (DENIED_NAME, "denied"), (ALLOWED_NAME, "allowed")):
        add(f"resolve-{label}", "dns", name, "blocked", {"kind": "resolve", "host": name},
            blocked(connected, no_hits()))
    recorder = [t.recorder_ip] if t is not None else []
    for server in dict.fromkeys([*topo.dns_servers, *recorder, *topo.host_ips]):
        for transport in ("udp", "tcp"):
            add(f"dns-{transport}-{server}", "dns", host_port(server, 53), "blocked",
                {"kind": "dns", "server": server, "port": 53, "qname": plan.canary_name, "transport": transport},
                blocked(connected, no_hits(53)))
    proxied("proxy-canary-name", "dns", f"http://{plan.canary_name}:{TARGET_HTTP_PORT}/", no_hits())

    # DNS over HTTPS / TLS (names of the recorder)
    tunnel("doh-connect", "doh-dot", f"{DOH_NAME}:443", no_hits(443), tls=True, sni=DOH_NAME)
    add("doh-http", "doh-dot", f"http://{DOH_NAME}/dns-query", "blocked",
        {"kind": "http", **proxy, "url": f"http://{DOH_NAME}/dns-query?dns=AAABAAABAAAAAAAAB2V4YW1wbGUDY29tAAABAAE"},
        blocked(through_proxy, no_hits(80)))
    tunnel("dot-connect", "doh-dot", f"{DOT_NAME}:853", no_hits(853), tls=True, sni=DOT_NAME)
    if t is not None:
        for name, port in (("doh-direct", 443), ("dot-direct", 853)):
            add(name, "doh-dot", host_port(t.recorder_ip, port), "blocked",
                {"kind": "tcp", "host": t.recorder_ip, "port": port}, blocked(connected, no_hits(port)))

    # metadata, private, loopback and host addresses in every spelling, through the proxy
    literal: list[tuple[str, str, int]] = [("metadata", form, 80) for form in METADATA_FORMS]
    if t is not None:
        literal += [("private", form, TARGET_HTTP_PORT) for form in ip_forms(t.recorder_ip)]
    loopback_ports = [*topo.loopback_ports, *([plan.canary_port] if topo.gateway_on_host else [])]
    literal += [("loopback", form, port) for port in loopback_ports for form in LOOPBACK_FORMS]
    literal.append(("loopback", "127.0.0.1", topo.proxy_port))
    if topo.relay_port is not None:
        literal += [("private", ip, topo.relay_port) for _label, ip in topo.gateway_addresses]
    literal += [("host", ip, plan.canary_port) for ip in topo.host_ips]
    for category, form, port in literal:
        if category == "private":
            hit_free = no_hits(port)
        elif port == plan.canary_port:
            hit_free = no_hits(target="host")
        else:
            hit_free = anything
        proxied(f"proxy-{category}-{form}:{port}", f"proxy-{category}", f"http://{form}:{port}/latest/meta-data/",
                hit_free)
    recorder_forms = [t.recorder_ip, ip_forms(t.recorder_ip)[1]] if t is not None else []
    for form in [METADATA, "0xa9fea9fe", *recorder_forms, "127.0.0.1", "[::1]"]:
        tunnel(f"connect-{form}:443", "proxy-connect", f"{form}:443", no_hits(443), tls=True)
    for host_ip in topo.host_ips:  # the host's own addresses, as a tunnel target
        tunnel(f"connect-{host_ip}:443", "proxy-connect", f"{host_ip}:443", no_hits(target="host"), tls=True)
    for port in topo.loopback_ports:  # the sandbox's ports on the host's loopback, as a plain tunnel
        tunnel(f"connect-127.0.0.1:{port}", "proxy-connect", f"127.0.0.1:{port}", tls=False)

    # the gateway's other ports and its relay
    ok = ("none-open", f"open:{topo.proxy_port}")
    add("gateway-ports", "gateway", f"{gateway_ip}:1-65535", "blocked",
        {"kind": "scan", "host": gateway_ip, "ports": [[1, 65535]], "timeout": 1.0, "batch": topo.scan_batch},
        one_of(*ok))
    if topo.relay_port is not None:
        for label, ip in topo.gateway_addresses:
            add(f"gateway-relay-{label}", "gateway", host_port(ip, topo.relay_port), "blocked",
                {"kind": "tcp", "host": ip, "port": topo.relay_port}, blocked(connected))
    add("gateway-udp-53", "gateway", host_port(gateway_ip, 53), "blocked",
        {"kind": "udp", "host": gateway_ip, "port": 53}, blocked(connected))
    if topo.control_port is not None:  # the gateway's control API: never from the guest, directly or proxied
        port = topo.control_port
        for label, ip in topo.gateway_addresses:
            add(f"gateway-control-{label}", "gateway", host_port(ip, port), "blocked",
                {"kind": "tcp", "host": ip, "port": port}, blocked(connected))
        control_hosts = ["127.0.0.1", *(() if topo.gateway_on_host else (ip for _label, ip in topo.gateway_addresses))]
        for ip in control_hosts:
            proxied(f"proxy-control-{ip}:{port}", "gateway", f"http://{ip}:{port}/v1/origin-requests")
            tunnel(f"connect-control-{ip}:{port}", "gateway", f"{ip}:{port}", tls=False)

    # the host: its services, the sandbox's published ports and the host canary
    host_ports = sorted({*HOST_PORTS, *topo.host_ports, plan.canary_port})
    for host_ip in topo.host_ips:
        add(f"{topo.host_label}-tcp-{host_ip}", topo.host_label, f"{host_ip}:{','.join(map(str, host_ports))}",
            "blocked", {"kind": "scan", "host": host_ip, "ports": [[p, p] for p in host_ports], "timeout": 1.5},
            blocked(connected, no_hits(target="host")))
        for port in (plan.canary_port, 53, 123):  # the host canary, and the host's DNS and NTP
            name = f"{topo.host_label}-udp-{host_ip}" + ("" if port == plan.canary_port else f"-{port}")
            add(name, topo.host_label, host_port(host_ip, port), "blocked",
                {"kind": "udp", "host": host_ip, "port": port}, blocked(connected, no_hits(target="host")))

    if plan.console_port is not None:  # the host's web console, every way the probes above reach the host
        probes.extend(console_probes(topo, plan.console_port))
    probes.extend(origin_probes(plan, proxy))
    probes.extend(host_header_probes(plan, proxy))
    return probes


def origin_probes(plan: ProbePlan, proxy: dict[str, Any]) -> list[Probe]:
    """The ``origins`` group: a denied origin; with targets, the allowed target's origin and a redirect
    from it to the denied one (expected to work / be refused at the second hop when the policy names
    :data:`FIXTURE_ORIGIN`, both refused otherwise); one ``allowed`` probe per other origin the policy
    allows."""
    denied_url = f"http://{DENIED_NAME}:{TARGET_HTTP_PORT}/"
    out = [Probe("denied-origin", "origins", denied_url, "blocked", {"name": "denied-origin", "kind": "http", **proxy,
                                                                      "url": denied_url},
                 blocked(through_proxy, no_hits(TARGET_HTTP_PORT)))]
    fixture = Origin.parse(FIXTURE_ORIGIN)
    if plan.targets is not None:
        allowed_url = f"{FIXTURE_ORIGIN}/probe"
        redirect_url = f"{FIXTURE_ORIGIN}/redirect?to={denied_url}redirected"
        if fixture in plan.policy.origins:
            out.append(Probe("allowed-origin", "origins", allowed_url, "allowed",
                             {"name": "allowed-origin", "kind": "http", **proxy, "url": allowed_url}, _allowed_answer))
            out.append(Probe("redirect-allowed-to-denied", "origins", redirect_url, "blocked",
                             {"name": "redirect-allowed-to-denied", "kind": "http", **proxy, "url": redirect_url,
                              "follow": True}, _redirect_refused))
        else:
            for name, url in (("allowed-origin", allowed_url), ("redirect-allowed-to-denied", redirect_url)):
                out.append(Probe(name, "origins", url, "blocked",
                                 {"name": name, "kind": "http", **proxy, "url": url, "follow": True},
                                 blocked(through_proxy, no_hits(target="allowed"))))
    for origin_text in plan.policy.allow:
        if plan.targets is None or Origin.parse(origin_text) != fixture:
            out.append(policy_origin_probe(origin_text, proxy["proxy_host"], proxy["proxy_port"]))
    if plan.targets is not None and asks_for(plan.policy, fixture):
        held_url = f"{FIXTURE_ORIGIN}{HELD_PATH}"
        out.append(Probe("ask-origin-held", "origins", held_url, "blocked",
                         {"name": "ask-origin-held", "kind": "http", **proxy, "url": held_url,
                          "timeout": HELD_PROBE_S}, _held))
    return out


HELD_PATH = "/ask-origin-held"
"""Path of the ``ask-origin-held`` probe's request (the allowed target records it if it ever arrives)."""

HELD_PROBE_S = 4.0
"""Seconds the ``ask-origin-held`` probe waits for an answer that must not come while nobody approves."""


def asks_for(policy: NetworkPolicy, origin: Origin) -> bool:
    """True when ``policy`` (mode ask) would hold a connection to ``origin`` for a person's answer: the
    origin is in its ``ask`` tier and neither in ``allow`` nor ``quiet``."""
    return (policy.mode == "ask" and origin not in policy.origins and policy.quiet_match(origin) is None
            and policy.ask_match(origin) is not None)


def _held(observed: str, detail: Any, hits: Hits) -> tuple[bool, bool]:
    """The ``ask-origin-held`` probe: with nobody to answer, the gateway holds the request -- the guest's
    deadline passes (``timeout``) or the gateway's does (403 ``timeout``). An escape when anything came
    back from behind the gateway or the allowed target saw the request."""
    escaped = through_proxy(observed, detail) or any(
        h.get("target") == "allowed" and HELD_PATH in str(h.get("head", "")) for h in hits)
    last = hops(detail)[-1:]
    gateway_timeout = observed == "status:403" and bool(last) and last[0].get("body", "").strip().endswith("timeout")
    return not escaped and (observed == "timeout" or gateway_timeout), escaped


HOST_HEADER_PATH = "/host-header/"
"""Path prefix of the ``host-header`` probes' requests; each probe's own path is this plus its name."""


def host_header_probes(plan: ProbePlan, proxy: dict[str, Any]) -> list[Probe]:
    """The ``host-header`` group (with targets only): requests for the allowed target whose other fields
    name another destination — a ``Host`` naming the denied target, another port, two ``Host`` headers,
    user info; the same inside a CONNECT tunnel to the allowed target, and an absolute-form request for
    the denied target with the allowed ``Host`` there. Each is expected refused by the gateway whatever
    the policy (a policy that names :data:`FIXTURE_ORIGIN` lets the plain requests reach the Host check;
    the tunnel ones reach it only when it also names ``https://allowed.audit.test:8080``). A probe
    escaped when the gateway let it through or a target recorded its path, or the recorder its port."""
    if plan.targets is None:
        return []
    allowed = f"{ALLOWED_NAME}:{TARGET_HTTP_PORT}"
    denied = f"{DENIED_NAME}:{TARGET_HTTP_PORT}"
    out: list[Probe] = []

    def judge(path: str) -> Judge:
        return blocked(through_proxy, lambda hits: no_hits(TARGET_HTTP_PORT)(hits) and not any(
            path in str(h.get("head", "")) for h in hits))

    plain = [("host-header-denied", denied), ("host-header-other-port", f"{ALLOWED_NAME}:{TARGET_HTTP_PORT + 1}"),
             ("host-header-duplicate", [allowed, denied]), ("host-header-userinfo", f"{ALLOWED_NAME}@{denied}")]
    for name, host in plain:
        path = HOST_HEADER_PATH + name
        url = f"{FIXTURE_ORIGIN}{path}"
        out.append(Probe(name, "host-header", f"{url} Host: {host}", "blocked",
                         {"name": name, "kind": "http", **proxy, "url": url, "host": host}, judge(path)))
    tunneled = [("host-header-tunnel-denied", HOST_HEADER_PATH + "host-header-tunnel-denied", denied),
                ("host-header-tunnel-absolute", f"http://{denied}{HOST_HEADER_PATH}host-header-tunnel-absolute",
                 allowed)]
    for name, target, host in tunneled:
        out.append(Probe(name, "host-header", f"CONNECT {allowed}, GET {target} Host: {host}", "blocked",
                         {"name": name, "kind": "connect", **proxy, "authority": allowed, "tls": False,
                          "request": {"path": target, "host": host}},
                         judge(HOST_HEADER_PATH + name)))
    return out


def _allowed_answer(observed: str, detail: Any, _hits: Hits) -> tuple[bool, bool]:
    """The allowed target answered 200 with its own body (never an escape: it is expected allowed)."""
    last = hops(detail)[-1:]
    return observed == "status:200" and bool(last) and "audit-allowed" in last[0].get("body", ""), False


def _redirect_refused(observed: str, detail: Any, hits: Hits) -> tuple[bool, bool]:
    """The allowed target's 302 arrived and the gateway refused the second hop (to the denied origin);
    an escape when the second hop got through or the recorder saw it."""
    found = hops(detail)
    first_ok = bool(found) and found[0]["status"] == 302
    escaped = (len(found) == 2 and through_proxy(observed, detail)) or not no_hits(TARGET_HTTP_PORT)(hits)
    return first_ok and len(found) == 2 and not escaped, escaped


def policy_origin_probe(origin_text: str, proxy_host: str, proxy_port: int) -> Probe:
    """The probe that an origin the policy allows (``scheme://host:port``) gets through the proxy at
    ``proxy_host:proxy_port``: CONNECT with TLS (SNI unless an IP literal) for https, a GET for http."""
    proxy = {"proxy_host": proxy_host, "proxy_port": proxy_port}
    origin = Origin.parse(origin_text)
    if origin.scheme == "https":
        spec = {"kind": "connect", **proxy, "authority": host_port(origin.host, origin.port), "tls": True,
                "sni": None if origin.is_ip_literal else origin.host}
    else:
        spec = {"kind": "http", **proxy, "url": f"{origin_text}/"}
    name = f"policy-origin-{origin_text}"
    return Probe(name, "origins", origin_text, "allowed", {"name": name, **spec},
                 lambda o, d, h: (through_proxy(o, d), False))
