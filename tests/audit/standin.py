"""The audit without Docker: ``controller.audit.run_audit`` (the real probe list, judging and report) on
the topology ``controller.audit.audit_topology`` reads from a stand-in for a Docker sandbox, with stand-in
targets, whose guest sees each probe refused, as a deny-all
sandbox would, except the probes named in ``through``, which get through (an allowed origin, or an escape).

Used by tests/audit/test_report.py for the JSON report's shape and, through :func:`audit_factory`, for
the CLI's exit status (the CLI's ``audit`` looks up ``controller.audit.audit`` when it runs).
"""

from __future__ import annotations

import json
from collections.abc import Collection
from typing import Any, Optional
from urllib.parse import urlsplit

from controller.audit import DENY_BODY, AuditReport, AuditTargets, HostCanary, audit_topology, run_audit
from controller.gateway.policy import NetworkPolicy
from controller.sandbox import ExecResult, NetworkTopology

SANDBOX = "ds-0123abcd"
TARGETS = "ds-audit-4567cdef"
CANARY = "c0123456789ab.canary.audit.test"
#: (network, gateway address on the host side, the gateway container's address on it)
NETWORKS = {
    f"{SANDBOX}-internal": ("172.24.0.1", "172.24.0.2"),
    f"{SANDBOX}-egress": ("172.25.0.1", "172.25.0.2"),
    f"{TARGETS}-targets": ("172.26.0.1", "172.26.0.4"),
    "bridge": ("172.17.0.1", None),
}
GUEST = "172.24.0.3"


def _origin(spec: dict[str, Any]) -> str:
    if spec["kind"] == "connect":
        return f"https://{spec['authority']}"
    url = urlsplit(spec["url"])
    return f"{url.scheme}://{url.netloc}"


class StandInSandbox:
    """A started Docker sandbox as the audit asks it (``topology()`` with its gateway attached to the
    targets, a guest, the gateway's logs); its guest is refused everything but ``through``."""

    id = SANDBOX
    image_id = "sha256:" + "ab" * 32

    def topology(self) -> NetworkTopology:
        internal, egress = NETWORKS[f"{SANDBOX}-internal"], NETWORKS[f"{SANDBOX}-egress"]
        return NetworkTopology(
            backend="docker", proxy_host=internal[1], proxy_port=3128, gateway_guest_ip=internal[1],
            gateway_egress_ip=egress[1], agent_port=8000, agent_host_port=49153, gateway_host_port=None,
            host_ips=tuple(host for host, _ in NETWORKS.values()), dns_servers=("127.0.0.11",),
            networks={"internal": f"{SANDBOX}-internal", "egress": f"{SANDBOX}-egress"})

    def __init__(self, through: Collection[str] = ()) -> None:
        self.through = set(through)
        self.decisions: list[dict[str, Any]] = []

    def logs(self, role: str = "desktop", tail: int = 200) -> str:
        return "gateway listening on 172.24.0.2:3128\n" if role == "gateway" else ""

    def exec_in_guest(self, argv: list[str], *, timeout: Optional[float] = None) -> ExecResult:
        assert argv[:2] == ["python3", "-c"], argv
        results = [self._observe(spec) for spec in json.loads(argv[3])]
        return ExecResult(0, json.dumps({"results": results, "uid": 1000}).encode(), b"")

    def decision_log(self) -> list[dict[str, Any]]:
        return list(self.decisions)

    def _decide(self, origin: str, through: bool, via: str) -> None:
        self.decisions.append({
            "ts": "2026-11-30T02:00:12.000+00:00", "origin": origin, "decision": "allow" if through else "deny",
            "reason": "allowlisted" if through else "deny-all", "client": f"{GUEST}:51952",
            **({"address": "172.26.0.2"} if through else {}), "via": via})

    def _hop(self, url: str, through: bool) -> dict[str, Any]:
        self._decide(_origin({"kind": "http", "url": url}), through, "request")
        status, body = (200, "audit-allowed\n") if through else (403, DENY_BODY + "deny-all\n")
        return {"status": status, "location": None, "body": body, "url": url}

    def _observe(self, spec: dict[str, Any]) -> dict[str, Any]:
        through = spec["name"] in self.through
        kind = spec["kind"]
        if kind == "connect":
            self._decide(_origin(spec), through, "connect")
        if kind == "http":
            url = spec["url"]
            if through and spec.get("follow") and "/redirect?to=" in url:
                # the allowed origin answers 302; the gateway judges the second hop on its own
                self._decide(_origin(spec), True, "request")
                location = url.split("/redirect?to=", 1)[1]
                hops = [{"status": 302, "location": location, "body": "", "url": url}, self._hop(location, False)]
            else:
                hops = [self._hop(url, through)]
            observed, detail = f"status:{hops[-1]['status']}", {"hops": hops}
        elif kind == "connect":
            observed, detail = ("tls-established", "TLSv1.3") if through else ("status:403", DENY_BODY + "deny-all\n")
        elif kind == "tcp":
            observed, detail = ("connected", None) if through else ("refused", "[Errno 111] Connection refused")
        elif kind == "udp":
            observed, detail = ("reply", "pong") if through else ("no-reply", None)
        elif kind == "resolve":
            observed, detail = ("resolved", ["172.26.0.3"]) if through else ("failed", "[Errno -2] Name unknown")
        elif kind == "dns":
            observed, detail = ("answer", ["172.26.0.3"]) if through else ("no-reply", None)
        elif kind == "scan":
            count = sum(last - first + 1 for first, last in spec["ports"])
            observed, detail = ("open:22" if through else "none-open"), {"scanned": count, "unanswered": 0}
        elif kind == "ipv6":
            observed, detail = ("ipv6-on" if through else "ipv6-off"), {"addresses": [], "routes": 0,
                                                                          "disable_ipv6": True}
        else:
            raise AssertionError(f"a probe kind the stand-in does not know: {kind}")
        return {"name": spec["name"], "kind": kind, "observed": observed, "detail": detail}


class _Network:
    """What ``AuditTargets`` keeps of its Docker network: the name."""

    def __init__(self, name: str) -> None:
        self.name = name


def targets() -> AuditTargets:
    """Audit targets as ``AuditTargets.start`` and ``attach`` leave them (no containers: no hits)."""
    return AuditTargets(client=None, id=TARGETS, canary=CANARY, network=_Network(f"{TARGETS}-targets"),
                        allowed_ip="172.26.0.2", allowed_ip6="fd00:1::2", recorder_ip="172.26.0.3",
                        recorder_ip6="fd00:1::3", gateway_ip="172.26.0.4", gateway_ip6="fd00:1::4")


def run_standin_audit(policy: NetworkPolicy, through: Collection[str] = (), *, console: Any = None,
                      sandbox: Optional[StandInSandbox] = None) -> AuditReport:
    """``run_audit`` of ``policy`` on the stand-in (a real host canary, which nothing reaches; ``console``:
    the web console, by default a real one ``run_audit`` starts; ``sandbox``: another stand-in)."""
    with HostCanary() as canary:
        return run_audit(audit_topology(sandbox or StandInSandbox(through)), policy, targets=targets(),
                         host_canary=canary, console=console, timeout=30)


def audit_factory(through: Collection[str] = ()):
    """A replacement for ``controller.audit.audit`` (same call) that runs the stand-in audit."""

    def audit(policy: NetworkPolicy, *, image: Optional[str] = None, client: Any = None,
              ready_timeout: float = 120.0) -> AuditReport:
        return run_standin_audit(policy, through)

    return audit


def stand_in_for_the_image_check() -> None:
    """Make the Docker backend's ``ensure_image`` (run by the CLI before an audit; it asks the engine)
    accept any image, for a CLI run on the stand-in, where there is no engine."""
    from controller.sandbox.docker import DockerSandbox

    if hasattr(DockerSandbox, "ensure_image"):
        DockerSandbox.ensure_image = classmethod(lambda cls, options, say=print: options)  # type: ignore[method-assign]
