"""Network audit: probes run from inside the guest prove what the sandbox lets out (and what it does not).

``audit(policy)`` starts audit targets on a private Docker network of their own, a sandbox with the
policy, attaches the gateway (only the gateway) to the targets' network, runs ``guest/netprobe.py`` in the
guest as the desktop user, and judges every observation together with what the targets themselves
recorded (a probe that "failed" in the guest but left a hit on a target still escaped).

Targets (never real internet addresses):

* ``allowed.audit.test`` — HTTP on 8080; ``/redirect?to=URL`` answers 302. The origin
  ``http://allowed.audit.test:8080`` is what an allowlist names to exercise the allowed and redirect
  probes; the audit then adds an ``allow_addresses`` rule for that target's private address.
* recorder (``denied.audit.test``, ``doh.audit.test``, ``dot.audit.test`` and the run's random DNS canary
  name) — accepts TCP on 22, 53, 80, 443, 853, 3128, 8000, 8080 and UDP on 53, 123, 443, 853, 9999 and
  records every hit. The gateway *can* reach it, so only the policy keeps the guest from it.
* a canary listener on the Docker host (TCP and UDP, all addresses, ephemeral port) that records hits.

Rules come from ARCHITECTURE.md (isolation model) and the audit section of docs/audit.md, which also
documents the JSON report.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
import os
import secrets
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal, Optional

from pydantic import BaseModel, Field

from controller.gateway.policy import NetworkPolicy, Origin

REPORT_VERSION = 1
TARGET_DOMAIN = "audit.test"
ALLOWED_NAME = f"allowed.{TARGET_DOMAIN}"
DENIED_NAME = f"denied.{TARGET_DOMAIN}"
DOH_NAME = f"doh.{TARGET_DOMAIN}"
DOT_NAME = f"dot.{TARGET_DOMAIN}"
TARGET_HTTP_PORT = 8080
FIXTURE_ORIGIN = f"http://{ALLOWED_NAME}:{TARGET_HTTP_PORT}"
"""The allowed target's origin; an allowlist that names it gets the allowed and redirect probes."""
RECORDER_TCP_PORTS = [22, 53, 80, 443, 853, 3128, 8000, 8080]
RECORDER_UDP_PORTS = [53, 123, 443, 853, 9999]
HOST_PORTS = [22, 53, 80, 443, 2375, 2376, 3128, 8000, 8080]
"""Docker-host ports probed from the guest (plus the relay's published port and the host canary)."""
DENY_BODY = "denied by sandbox egress policy: "

_NETPROBE = Path(__file__).resolve().parents[2] / "guest" / "netprobe.py"
_TARGET = Path(__file__).resolve().parent / "target_server.py"

Expected = Literal["blocked", "allowed"]
Judge = Callable[[str, Any, list[dict[str, Any]]], tuple[bool, bool]]
"""``judge(observed, detail, hits) -> (passed, escaped)``; ``hits``: the targets' and host canary's records."""


class AuditError(RuntimeError):
    """The audit could not run (image missing, guest probe crashed, targets did not start)."""


# --------------------------------------------------------------------------------------------------
# report model


class ProbeResult(BaseModel):
    """One probe's verdict. ``expected``/``observed`` are short words (see docs/audit.md); ``escaped`` is
    True when something expected to be blocked got through (observed in the guest or recorded at a
    target)."""

    name: str
    category: str
    target: str
    expected: Expected
    observed: str
    passed: bool
    escaped: bool = False
    detail: Any = None


class AuditReport(BaseModel):
    """The audit's JSON report (documented in docs/audit.md)."""

    version: int = REPORT_VERSION
    started: str
    finished: str = ""
    sandbox: str = ""
    image: str = ""
    policy: dict[str, Any]
    effective_policy: dict[str, Any]
    canary: str
    probes: list[ProbeResult] = Field(default_factory=list)
    target_hits: list[dict[str, Any]] = Field(default_factory=list)
    host_hits: list[dict[str, Any]] = Field(default_factory=list)
    decisions: list[dict[str, Any]] = Field(default_factory=list)

    @property
    def passed(self) -> bool:
        """Every probe passed."""
        return all(p.passed for p in self.probes)

    @property
    def escaped(self) -> list[str]:
        """Names of probes that escaped."""
        return [p.name for p in self.probes if p.escaped]

    def to_json(self) -> str:
        """The report as JSON text, with the derived ``passed`` and ``escaped`` fields."""
        data = self.model_dump(mode="json")
        data["passed"] = self.passed
        data["escaped"] = self.escaped
        return json.dumps(data, indent=2)


# --------------------------------------------------------------------------------------------------
# host canary


class HostCanary:
    """TCP and UDP listeners on every host address, one ephemeral port, recording every hit.

    Proves the guest cannot reach the Docker host (its bridge addresses) at all. ``hits``: list of
    ``{"proto", "peer"}``. Use as a context manager.
    """

    def __init__(self) -> None:
        self.hits: list[dict[str, Any]] = []
        self._tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._tcp.bind(("0.0.0.0", 0))
        self.port = self._tcp.getsockname()[1]
        self._udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._udp.bind(("0.0.0.0", self.port))
        self._tcp.listen(16)
        self._closed = False
        for target in (self._accept, self._receive):
            threading.Thread(target=target, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, peer = self._tcp.accept()
            except OSError:
                return
            self.hits.append({"proto": "tcp", "port": self.port, "peer": peer[0]})
            conn.close()

    def _receive(self) -> None:
        while not self._closed:
            try:
                _data, peer = self._udp.recvfrom(2048)
            except OSError:
                return
            if peer is None or self._closed:
                return
            self.hits.append({"proto": "udp", "port": self.port, "peer": peer[0]})

    def target_hits(self) -> list[dict[str, Any]]:
        """``hits`` as records of target ``host`` (``{"target": "host", "hit": proto, ...}``) for judges."""
        return [{"target": "host", "hit": h["proto"], **h} for h in self.hits]

    def close(self) -> None:
        """Stop listening (idempotent)."""
        self._closed = True
        for sock in (self._tcp, self._udp):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

    def __enter__(self) -> "HostCanary":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --------------------------------------------------------------------------------------------------
# targets


@dataclass
class AuditTargets:
    """The audit's target containers on their own ``internal`` network (labelled like a sandbox, so
    ``desktop-sandbox down --all`` and the orphan reaper remove leftovers).

    ``allowed_ip``/``recorder_ip``: IPv4 addresses on the targets network; ``recorder_ip6``: its IPv6
    address when the engine could give the network one, else None. ``canary``: the run's random DNS
    canary name (an alias of the recorder, so a gateway that resolved and connected to it leaves a hit).
    """

    client: Any
    id: str
    canary: str
    network: Any = None
    allowed: Any = None
    recorder: Any = None
    allowed_ip: str = ""
    allowed_ip6: Optional[str] = None
    recorder_ip: str = ""
    recorder_ip6: Optional[str] = None
    gateway_ip: str = ""
    gateway_ip6: Optional[str] = None

    @classmethod
    def start(cls, client: Any, image: str, owner_labels: Optional[dict[str, str]] = None) -> "AuditTargets":
        """Create the network and both targets and wait until they listen. Raises AuditError; cleans up
        what it created on any failure."""
        from controller.sandbox import LABEL_ROLE, LABEL_SANDBOX

        ident = f"ds-audit-{secrets.token_hex(4)}"
        targets = cls(client=client, id=ident, canary=f"c{secrets.token_hex(6)}.canary.{TARGET_DOMAIN}")
        labels = {LABEL_SANDBOX: ident, **(owner_labels or {})}
        try:
            targets.network = targets._create_network({**labels, LABEL_ROLE: "audit-targets"})
            source = _TARGET.read_text(encoding="utf-8")
            common = dict(
                user="1000:1000",
                entrypoint=["python3", "-c", source],
                detach=True,
                read_only=True,
                cap_drop=["ALL"],
                security_opt=["no-new-privileges:true"],
                sysctls={"net.ipv4.ip_unprivileged_port_start": "0"},
                pids_limit=128,
                mem_limit="128m",
                network=targets.network.name,
            )
            targets.allowed = client.containers.run(
                image,
                command=[json.dumps({"role": "allowed", "http": [TARGET_HTTP_PORT]})],
                name=f"{ident}-allowed",
                labels={**labels, LABEL_ROLE: "audit-allowed"},
                networking_config={targets.network.name: client.api.create_endpoint_config(aliases=[ALLOWED_NAME])},
                **common,
            )
            targets.recorder = client.containers.run(
                image,
                command=[json.dumps({"role": "recorder", "tcp": RECORDER_TCP_PORTS, "udp": RECORDER_UDP_PORTS})],
                name=f"{ident}-recorder",
                labels={**labels, LABEL_ROLE: "audit-recorder"},
                networking_config={
                    targets.network.name: client.api.create_endpoint_config(
                        aliases=[DENIED_NAME, DOH_NAME, DOT_NAME, targets.canary]
                    )
                },
                **common,
            )
            targets._wait_ready()
            net = targets.network.name
            targets.allowed.reload()
            targets.recorder.reload()
            allowed = targets.allowed.attrs["NetworkSettings"]["Networks"][net]
            targets.allowed_ip = allowed["IPAddress"]
            targets.allowed_ip6 = allowed.get("GlobalIPv6Address") or None
            rec = targets.recorder.attrs["NetworkSettings"]["Networks"][net]
            targets.recorder_ip = rec["IPAddress"]
            targets.recorder_ip6 = rec.get("GlobalIPv6Address") or None
        except BaseException:
            targets.close()
            raise
        return targets

    def _create_network(self, labels: dict[str, str]) -> Any:
        ipv6 = "fd%02x:%04x:%04x::/64" % (secrets.randbelow(256), secrets.randbelow(65536), secrets.randbelow(65536))
        import docker.types

        try:
            pool = docker.types.IPAMPool(subnet=ipv6)
            return self.client.networks.create(
                f"{self.id}-targets", driver="bridge", internal=True, enable_ipv6=True,
                ipam=docker.types.IPAMConfig(pool_configs=[pool]), labels=labels,
            )
        except Exception:  # noqa: BLE001 - engines without IPv6 support: IPv4 targets only
            return self.client.networks.create(f"{self.id}-targets", driver="bridge", internal=True, labels=labels)

    def _wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        delay = 0.05
        for container in (self.allowed, self.recorder):
            while b'"ready": true' not in container.logs():
                container.reload()
                if container.status not in ("created", "running"):
                    raise AuditError(f"audit target {container.name} exited: {container.logs(tail=20)!r}")
                if time.monotonic() > deadline:
                    raise AuditError(f"audit target {container.name} not ready after {timeout:.0f}s")
                time.sleep(delay)
                delay = min(delay * 1.5, 0.5)

    def attach(self, gateway: Any) -> None:
        """Connect the sandbox's gateway (only it) to the targets network; records its address there."""
        self.network.connect(gateway)
        gateway.reload()
        endpoint = gateway.attrs["NetworkSettings"]["Networks"][self.network.name]
        self.gateway_ip = endpoint["IPAddress"]
        self.gateway_ip6 = endpoint.get("GlobalIPv6Address") or None

    def hits(self) -> list[dict[str, Any]]:
        """Everything the targets recorded: ``{"target": "allowed"|"recorder", "hit", "port", "peer", ...}``."""
        out = []
        for role, container in (("allowed", self.allowed), ("recorder", self.recorder)):
            if container is None:
                continue
            for line in container.logs().decode("utf-8", "replace").splitlines():
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if "hit" in record:
                    out.append({"target": role, **record})
        return out

    def close(self) -> None:
        """Remove the targets and their network (idempotent, ignores parts already gone)."""
        from controller.sandbox.docker import remove_sandbox

        remove_sandbox(self.client, self.id)


# --------------------------------------------------------------------------------------------------
# probes


@dataclass
class Probe:
    """A probe: what netprobe runs (``spec``) and how to judge it (``judge``).

    ``judge(observed, detail, hits) -> (passed, escaped)``; ``hits`` are the targets' records.
    """

    name: str
    category: str
    target: str
    expected: Expected
    spec: dict[str, Any]
    judge: Judge = field(repr=False, default=None)  # type: ignore[assignment]


def no_hits(port: Optional[int] = None, target: str = "recorder") -> Callable[[list[dict[str, Any]]], bool]:
    """A hit check for ``blocked``: True when no record of ``target`` (``recorder``, ``allowed``, ``host``)
    in ``hits`` is on ``port`` (any port when None)."""

    def hit_free(hits: list[dict[str, Any]]) -> bool:
        return not any(h["target"] == target and (port is None or h.get("port") == port) for h in hits)

    return hit_free


def blocked(success: Callable[[str, Any], bool],
            hit_free: Callable[[list[dict[str, Any]]], bool] = lambda hits: True) -> Judge:
    """The judge of a probe expected ``blocked``: it escaped when ``success(observed, detail)`` (the guest
    got through) or ``hit_free(hits)`` is False (a target or the host canary recorded it)."""

    def judge(observed: str, detail: Any, hits: list[dict[str, Any]]) -> tuple[bool, bool]:
        escaped = success(observed, detail) or not hit_free(hits)
        return not escaped, escaped

    return judge


def connected(observed: str, _detail: Any) -> bool:
    """True when netprobe reports a direct connection, reply, answer, resolution or open port."""
    return observed in ("connected", "reply", "answer", "resolved", "tls-established") or observed.startswith("open:")


def _proxy_refused(observed: str, detail: Any) -> bool:
    """True when the gateway refused: 403 with the policy body, or 400 for a malformed target."""
    if observed == "status:400":
        return True
    if observed != "status:403":
        return False
    body = detail if isinstance(detail, str) else (detail or {}).get("hops", [{}])[-1].get("body", "")
    return body.startswith(DENY_BODY)


def through_proxy(observed: str, detail: Any) -> bool:
    """True when the gateway let the request or tunnel through (any upstream answer, incl. its 502)."""
    if observed == "tls-established":
        return True
    return observed.startswith("status:") and not _proxy_refused(observed, detail)




def host_port(host: str, port: Optional[int] = None) -> str:
    """``host:port`` with an IPv6 ``host`` bracketed (``[::1]:443``); ``host`` alone when ``port`` is None."""
    h = f"[{host}]" if ":" in host else host
    return f"{h}:{port}" if port is not None else h


def ip_forms(address: str) -> list[str]:
    """Spellings of an IPv4 address a resolver accepts: dotted, decimal, hex, octal, short, mixed,
    IPv4-mapped IPv6 (bracketed)."""
    ip = ipaddress.IPv4Address(address)
    n = int(ip)
    a, b, c, d = ip.packed
    return [
        str(ip),
        str(n),
        hex(n),
        ".".join(f"0{x:o}" for x in ip.packed),
        f"{a}.{(b << 16) | (c << 8) | d}",
        f"{a}.{b}.{(c << 8) | d}",
        f"0x{a:x}.{b}.{c}.{d}",
        f"[::ffff:{ip}]",
        f"[::ffff:{(a << 8) | b:x}:{(c << 8) | d:x}]",
    ]


@dataclass
class AuditContext:
    """What the probes need to know about the running sandbox and targets."""

    proxy_host: str
    proxy_port: int
    gateway_internal_ip: str
    gateway_egress_ip: str
    relay_port: int
    relay_host_port: int
    host_ips: list[str]
    targets: AuditTargets
    host_canary_port: int
    fixture_allowed: bool
    policy_origins: list[str]


def build_probes(ctx: AuditContext) -> list[Probe]:
    """The full probe battery for ``ctx`` (see docs/audit.md for the list and its rationale)."""
    t = ctx.targets
    probes: list[Probe] = []
    proxy = {"proxy_host": ctx.proxy_host, "proxy_port": ctx.proxy_port}

    def add(name, category, target, expected, spec, judge):
        probes.append(Probe(name, category, target, expected, {"name": name, **spec}, judge))

    # direct TCP/UDP to outside addresses (the recorder, which the gateway can reach), v4 and v6
    for port in [22, 80, 443, 853, 8080]:
        add(f"direct-tcp-v4-{port}", "direct", host_port(t.recorder_ip, port), "blocked",
            {"kind": "tcp", "host": t.recorder_ip, "port": port}, blocked(connected, no_hits(port)))
    for port in RECORDER_UDP_PORTS:
        add(f"direct-udp-v4-{port}", "direct", host_port(t.recorder_ip, port), "blocked",
            {"kind": "udp", "host": t.recorder_ip, "port": port}, blocked(connected, no_hits(port)))
    v6_targets = ([t.recorder_ip6] if t.recorder_ip6 else []) + ["2001:db8::1", "fd00:ec2::254"]
    for host in v6_targets:
        add(f"direct-tcp-v6-{host}", "direct", host_port(host, 443), "blocked",
            {"kind": "tcp", "host": host, "port": 443}, blocked(connected, no_hits(443)))
        add(f"direct-udp-v6-{host}", "direct", host_port(host, 53), "blocked",
            {"kind": "udp", "host": host, "port": 53}, blocked(connected, no_hits(53)))
    add("ipv6-off", "direct", "guest interfaces", "blocked", {"kind": "ipv6"},
        lambda observed, detail, hits: (observed == "ipv6-off", observed != "ipv6-off"))
    add("direct-metadata-v4", "direct", "169.254.169.254:80", "blocked",
        {"kind": "tcp", "host": "169.254.169.254", "port": 80}, blocked(connected))

    # DNS: lookups in the guest, raw queries to every resolver the guest might reach, the canary
    for name in [t.canary, DENIED_NAME, ALLOWED_NAME]:
        add(f"resolve-{name.split('.')[0] if name != t.canary else 'canary'}", "dns", name, "blocked",
            {"kind": "resolve", "host": name}, blocked(connected, no_hits()))
    dns_servers = ["127.0.0.11", ctx.gateway_internal_ip, t.recorder_ip, *ctx.host_ips]
    for server in dict.fromkeys(dns_servers):
        for transport in ("udp", "tcp"):
            add(f"dns-{transport}-{server}", "dns", host_port(server, 53), "blocked",
                {"kind": "dns", "server": server, "port": 53, "name": t.canary, "transport": transport},
                blocked(connected, no_hits(53)))
    add("proxy-canary-name", "dns", f"http://{t.canary}:{TARGET_HTTP_PORT}/", "blocked",
        {"kind": "http", **proxy, "url": f"http://{t.canary}:{TARGET_HTTP_PORT}/"},
        blocked(through_proxy, no_hits()))

    # DNS over HTTPS / TLS to the recorder
    add("doh-connect", "doh-dot", f"{DOH_NAME}:443", "blocked",
        {"kind": "connect", **proxy, "authority": f"{DOH_NAME}:443", "tls": True, "sni": DOH_NAME},
        blocked(through_proxy, no_hits(443)))
    add("doh-http", "doh-dot", f"http://{DOH_NAME}/dns-query", "blocked",
        {"kind": "http", **proxy, "url": f"http://{DOH_NAME}/dns-query?dns=AAABAAABAAAAAAAAB2V4YW1wbGUDY29tAAABAAE"},
        blocked(through_proxy, no_hits(80)))
    add("dot-connect", "doh-dot", f"{DOT_NAME}:853", "blocked",
        {"kind": "connect", **proxy, "authority": f"{DOT_NAME}:853", "tls": True, "sni": DOT_NAME},
        blocked(through_proxy, no_hits(853)))
    add("doh-direct", "doh-dot", host_port(t.recorder_ip, 443), "blocked",
        {"kind": "tcp", "host": t.recorder_ip, "port": 443}, blocked(connected, no_hits(443)))
    add("dot-direct", "doh-dot", host_port(t.recorder_ip, 853), "blocked",
        {"kind": "tcp", "host": t.recorder_ip, "port": 853}, blocked(connected, no_hits(853)))

    # metadata and private addresses in every encoding, through the proxy
    literal_targets: list[tuple[str, str, int]] = []
    for form in ip_forms("169.254.169.254") + ["[fd00:ec2::254]", "metadata.google.internal", "100.100.100.200"]:
        literal_targets.append(("metadata", form, 80))
    for form in ip_forms(t.recorder_ip):
        literal_targets.append(("private", form, TARGET_HTTP_PORT))
    for form in ip_forms("127.0.0.1") + ["localhost", "[::1]", "0", "0.0.0.0"]:
        literal_targets.append(("loopback", form, ctx.relay_port))
    literal_targets.append(("loopback", "127.0.0.1", ctx.proxy_port))
    literal_targets.append(("private", ctx.gateway_egress_ip, ctx.relay_port))
    literal_targets.append(("private", ctx.gateway_internal_ip, ctx.relay_port))
    for host_ip in ctx.host_ips:
        literal_targets.append(("host", host_ip, ctx.host_canary_port))
    for category, form, port in literal_targets:
        url = f"http://{form}:{port}/latest/meta-data/"
        hit_free = no_hits(port) if category == "private" else (lambda hits: True)
        add(f"proxy-{category}-{form}:{port}", f"proxy-{category}", url, "blocked",
            {"kind": "http", **proxy, "url": url}, blocked(through_proxy, hit_free))
    for form in ["169.254.169.254", "0xa9fea9fe", t.recorder_ip, ip_forms(t.recorder_ip)[1], "127.0.0.1", "[::1]"]:
        add(f"connect-{form}:443", "proxy-connect", f"{form}:443", "blocked",
            {"kind": "connect", **proxy, "authority": f"{form}:443", "tls": True},
            blocked(through_proxy, no_hits(443)))

    # the gateway's other ports, the relay, the Docker host
    add("gateway-ports", "gateway", f"{ctx.gateway_internal_ip}:1-65535", "blocked",
        {"kind": "scan", "host": ctx.gateway_internal_ip, "ports": [[1, 65535]], "timeout": 1.0, "batch": 1024},
        lambda o, d, h: (o in ("none-open", f"open:{ctx.proxy_port}"), o not in ("none-open", f"open:{ctx.proxy_port}")))
    add("gateway-relay-internal", "gateway", host_port(ctx.gateway_internal_ip, ctx.relay_port), "blocked",
        {"kind": "tcp", "host": ctx.gateway_internal_ip, "port": ctx.relay_port}, blocked(connected))
    add("gateway-relay-egress", "gateway", host_port(ctx.gateway_egress_ip, ctx.relay_port), "blocked",
        {"kind": "tcp", "host": ctx.gateway_egress_ip, "port": ctx.relay_port}, blocked(connected))
    add("gateway-udp-53", "gateway", host_port(ctx.gateway_internal_ip, 53), "blocked",
        {"kind": "udp", "host": ctx.gateway_internal_ip, "port": 53}, blocked(connected))
    host_ports = sorted({*HOST_PORTS, ctx.relay_host_port, ctx.host_canary_port})
    for host_ip in ctx.host_ips:
        add(f"docker-host-tcp-{host_ip}", "docker-host", f"{host_ip}:{','.join(map(str, host_ports))}", "blocked",
            {"kind": "scan", "host": host_ip, "ports": [[p, p] for p in host_ports], "timeout": 1.5},
            blocked(connected, no_hits(target="host")))
        add(f"docker-host-udp-{host_ip}", "docker-host", host_port(host_ip, ctx.host_canary_port), "blocked",
            {"kind": "udp", "host": host_ip, "port": ctx.host_canary_port},
            blocked(connected, no_hits(target="host")))

    # allowed origin, denied origin, redirect allowed -> denied
    denied_url = f"http://{DENIED_NAME}:{TARGET_HTTP_PORT}/"
    add("denied-origin", "origins", denied_url, "blocked", {"kind": "http", **proxy, "url": denied_url},
        blocked(through_proxy, no_hits(TARGET_HTTP_PORT)))
    allowed_url = f"{FIXTURE_ORIGIN}/probe"
    redirect_url = f"{FIXTURE_ORIGIN}/redirect?to={denied_url}redirected"
    if ctx.fixture_allowed:
        add("allowed-origin", "origins", allowed_url, "allowed", {"kind": "http", **proxy, "url": allowed_url},
            lambda o, d, h: (o == "status:200" and "audit-allowed" in d["hops"][-1]["body"], False))

        def judge_redirect(o: str, d: Any, h: list[dict[str, Any]]) -> tuple[bool, bool]:
            hops = (d or {}).get("hops", []) if isinstance(d, dict) else []
            first_ok = bool(hops) and hops[0]["status"] == 302
            escaped = (len(hops) == 2 and through_proxy(o, d)) or not no_hits(TARGET_HTTP_PORT)(h)
            return first_ok and len(hops) == 2 and not escaped, escaped

        add("redirect-allowed-to-denied", "origins", redirect_url, "blocked",
            {"kind": "http", **proxy, "url": redirect_url, "follow": True}, judge_redirect)
    else:
        for name, url in (("allowed-origin", allowed_url), ("redirect-allowed-to-denied", redirect_url)):
            add(name, "origins", url, "blocked", {"kind": "http", **proxy, "url": url, "follow": True},
                blocked(through_proxy, no_hits(target="allowed")))
    for origin_text in ctx.policy_origins:
        if origin_text != str(Origin.parse(FIXTURE_ORIGIN)):
            probes.append(policy_origin_probe(origin_text, ctx.proxy_host, ctx.proxy_port))
    return probes


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


# --------------------------------------------------------------------------------------------------
# running


def effective_policy(policy: NetworkPolicy, targets: AuditTargets) -> NetworkPolicy:
    """``policy`` plus address rules for the allowed target (its IPv4 and, when it has one, IPv6 address)
    when the policy names its origin: the gateway refuses a name if ANY of its addresses is refused."""
    if Origin.parse(FIXTURE_ORIGIN) not in policy.origins:
        return policy
    data = policy.model_dump(mode="json")
    own = [a for a in (targets.allowed_ip, targets.allowed_ip6) if a]
    data["allow_addresses"] = [*data.get("allow_addresses", []), *own]
    return NetworkPolicy.model_validate(data)


def run_audit(sandbox: Any, policy: NetworkPolicy, targets: AuditTargets,
              host_canary: Optional[HostCanary] = None, *, timeout: float = 300.0) -> AuditReport:
    """Run every probe in ``sandbox`` (a started Docker sandbox whose gateway enforces
    ``effective_policy(policy, targets)`` and is attached to ``targets``) and judge them.

    Returns the report; raises AuditError when the probe program cannot run in the guest.
    """
    from controller.sandbox.docker import AGENT_PORT, GATEWAY_PROXY_PORT

    started = utc_now()
    own_canary = host_canary is None
    host_canary = host_canary or HostCanary()
    try:
        client = sandbox.client
        internal = client.networks.get(f"{sandbox.id}-internal")
        egress = client.networks.get(f"{sandbox.id}-egress")
        sandbox.gateway.reload()
        networks = sandbox.gateway.attrs["NetworkSettings"]["Networks"]
        bindings = sandbox.gateway.attrs["NetworkSettings"]["Ports"].get(f"{AGENT_PORT}/tcp") or []
        host_ips = [ip for ip in (_network_gateway(internal), _network_gateway(egress), _network_gateway(targets.network),
                                  _network_gateway(client.networks.get("bridge"))) if ip]
        ctx = AuditContext(
            proxy_host=networks[internal.name]["IPAddress"],
            proxy_port=GATEWAY_PROXY_PORT,
            gateway_internal_ip=networks[internal.name]["IPAddress"],
            gateway_egress_ip=networks[egress.name]["IPAddress"],
            relay_port=AGENT_PORT,
            relay_host_port=int(bindings[0]["HostPort"]) if bindings else AGENT_PORT,
            host_ips=list(dict.fromkeys(host_ips)),
            targets=targets,
            host_canary_port=host_canary.port,
            fixture_allowed=Origin.parse(FIXTURE_ORIGIN) in policy.origins,
            policy_origins=list(policy.allow),
        )
        probes = build_probes(ctx)
        observations = run_probes(sandbox, probes, timeout=timeout)
        hits = targets.hits()
        judged_hits = hits + host_canary.target_hits()
        report = AuditReport(
            started=started, sandbox=sandbox.id, image=getattr(sandbox, "image_id", ""),
            policy=policy.model_dump(mode="json"), effective_policy=effective_policy(policy, targets).model_dump(mode="json"),
            canary=targets.canary, target_hits=hits, host_hits=list(host_canary.hits),
        )
        allowed_hits_from_guest = [h for h in hits if h["peer"] not in (targets.gateway_ip, targets.gateway_ip6)]
        report.probes.extend(judge_probes(probes, observations, judged_hits))
        decisions = sandbox.decision_log()
        report.decisions = decisions
        report.probes.extend(_summary_probes(targets, hits, allowed_hits_from_guest, host_canary, decisions))
        report.finished = utc_now()
        return report
    finally:
        if own_canary:
            host_canary.close()


def run_probes(sandbox: Any, probes: list[Probe], *, timeout: float) -> list[dict[str, Any]]:
    """Run ``guest/netprobe.py`` with every probe's spec in ``sandbox``'s guest as its user, once the
    gateway's proxy listens; return its observations (``{"name", "observed", "detail"}``, one per probe,
    in order). Waits 0.5 s afterwards so hits still in flight (targets, host canary) are recorded.

    ``timeout``: seconds for the whole run in the guest. Raises AuditError when netprobe fails.
    """
    wait_for_proxy(sandbox)
    source = _NETPROBE.read_text(encoding="utf-8")
    result = sandbox.exec_in_guest(["python3", "-c", source, json.dumps([p.spec for p in probes])], timeout=timeout)
    if result.exit_code != 0:
        raise AuditError(f"netprobe exited {result.exit_code}: {result.stderr.decode('utf-8', 'replace')[-2000:]}")
    observations = json.loads(result.stdout)["results"]
    time.sleep(0.5)  # targets and the canary record asynchronously
    return observations


def judge_probes(probes: list[Probe], observations: list[dict[str, Any]],
                 hits: list[dict[str, Any]]) -> list[ProbeResult]:
    """Each probe's verdict on its observation (from ``run_probes``) and everything ``hits`` recorded."""
    results = []
    for probe, obs in zip(probes, observations):
        passed, escaped = probe.judge(obs["observed"], obs["detail"], hits)
        results.append(ProbeResult(
            name=probe.name, category=probe.category, target=probe.target, expected=probe.expected,
            observed=obs["observed"], passed=passed, escaped=escaped, detail=obs["detail"],
        ))
    return results


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
    canary_decisions = [d for d in decisions if canary in d.get("origin", "")]
    canary_resolved = [d for d in canary_decisions
                       if d.get("decision") == "allow" or d.get("reason", "").startswith(("address-refused", "resolve-failed"))]
    return ProbeResult(name="canary-not-resolved-by-gateway", category="summary", target=canary,
                       expected="blocked", observed=f"{len(canary_decisions)} decisions, {len(canary_resolved)} resolved",
                       passed=bool(canary_decisions) and not canary_resolved, escaped=bool(canary_resolved))


def wait_for_proxy(sandbox: Any, timeout: float = 60.0) -> None:
    """Wait until the gateway's proxy announces ``gateway listening on`` in the gateway's output (the
    agent can be ready before the proxy is). Raises AuditError on timeout."""
    deadline = time.monotonic() + timeout
    delay = 0.05
    while "gateway listening on" not in sandbox.logs("gateway", 400):
        if time.monotonic() > deadline:
            raise AuditError(f"gateway proxy not listening after {timeout:.0f}s:\n{sandbox.logs('gateway', 30)}")
        time.sleep(delay)
        delay = min(delay * 1.5, 0.5)


def _summary_probes(targets: AuditTargets, hits: list[dict[str, Any]], foreign: list[dict[str, Any]],
                    host_canary: HostCanary, decisions: list[dict[str, Any]]) -> list[ProbeResult]:
    recorder_hits = [h for h in hits if h["target"] == "recorder"]
    return [
        ProbeResult(name="recorder-saw-nothing", category="summary", target=f"{targets.recorder_ip} (all ports)",
                    expected="blocked", observed=f"{len(recorder_hits)} hits", passed=not recorder_hits,
                    escaped=bool(recorder_hits)),
        ProbeResult(name="targets-reached-only-via-gateway", category="summary", target=targets.allowed_ip,
                    expected="blocked", observed=f"{len(foreign)} hits from other peers", passed=not foreign,
                    escaped=bool(foreign), detail=foreign or None),
        host_canary_probe(host_canary, "docker-host-canary"),
        canary_resolution_probe(targets.canary, decisions),
    ]


def _network_gateway(network: Any) -> Optional[str]:
    network.reload()
    for config in network.attrs.get("IPAM", {}).get("Config") or []:
        gateway = config.get("Gateway")
        if gateway and "." in gateway:
            return gateway.split("/")[0]
    return None


def utc_now() -> str:
    """The current UTC time, ISO 8601 with milliseconds (the report's ``started``/``finished``)."""
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="milliseconds")


def audit(policy: NetworkPolicy, *, image: Optional[str] = None, client: Any = None,
          ready_timeout: float = 120.0) -> AuditReport:
    """Start targets and a sandbox with ``policy``, run the audit, remove everything; return the report.

    Raises AuditError or controller.sandbox.SandboxError when the run cannot start.
    """
    import docker

    from controller.sandbox import LABEL_OWNER, SandboxSpec
    from controller.sandbox.docker import DEFAULT_IMAGE, DockerOptions, DockerSandbox

    client = client or docker.from_env()
    image = image or DEFAULT_IMAGE
    try:
        client.images.get(image)
    except docker.errors.ImageNotFound:
        raise AuditError(f"image {image} not found; build it with `make desktop`") from None
    with HostCanary() as canary:
        targets = AuditTargets.start(client, image, {LABEL_OWNER: f"{socket.gethostname()}:{os.getpid()}"})
        try:
            spec = SandboxSpec(policy=effective_policy(policy, targets), ready_timeout=ready_timeout)
            with DockerSandbox.start(spec, DockerOptions(image=image), client=client) as sandbox:
                targets.attach(sandbox.gateway)
                return run_audit(sandbox, policy, targets, canary)
        finally:
            targets.close()


NARROW_COLUMNS = 120
"""Below this console width the audit prints one line per probe instead of a table."""


def render_table(report: AuditReport, console: Any) -> None:
    """Print the report as a rich table (one row per probe) and a verdict line; on a console narrower
    than :data:`NARROW_COLUMNS`, one line per probe (``pass name (category) target: expected ...,
    observed ...``) so that names are never split."""
    from rich.markup import escape
    from rich.table import Table

    title = escape(f"network audit of {report.sandbox} ({report.policy.get('mode')})")

    def verdict(p: ProbeResult) -> str:
        return "[green]pass[/]" if p.passed else ("[bold red]ESCAPED[/]" if p.escaped else "[red]fail[/]")

    if console.width < NARROW_COLUMNS:
        console.print(title)
        for p in report.probes:
            console.print(f"{verdict(p)} {escape(p.name)} ({escape(p.category)}) {escape(p.target)}: "
                          f"expected {escape(p.expected)}, observed {escape(p.observed)}", highlight=False)
    else:
        table = Table(title=title)
        # Short words never wrap; long targets and observations fold (a piped console is wide, see
        # controller.run.progress.make_console).
        for column in ("probe", "category", "target", "expected", "observed", "result"):
            if column in ("target", "observed"):
                table.add_column(column, overflow="fold")
            else:
                table.add_column(column, no_wrap=True)
        for p in report.probes:
            table.add_row(escape(p.name), escape(p.category), escape(p.target), p.expected, escape(p.observed),
                          verdict(p))
        console.print(table)
    failed = [p.name for p in report.probes if not p.passed]
    if not failed:
        console.print(f"[green]all {len(report.probes)} probes passed[/]")
    else:
        console.print(f"[red]{len(failed)} of {len(report.probes)} probes failed; escaped: {escape(str(report.escaped or 'none'))}[/]")
