"""The network audit end to end: real targets, a real sandbox, probes run in the real guest.

Skipped when the Docker engine or the desktop image is missing, unless DESKTOP_SANDBOX_REQUIRE_IMAGE=1.
Each report is checked against docs/audit.md (tests/audit/report_shape.py).
"""

from __future__ import annotations

import json
import os
import socket

import pytest

from controller.audit import DENIED_NAME, DENY_BODY, FIXTURE_ORIGIN, TARGET_HTTP_PORT, audit
from controller.audit.console import audit_console
from controller.gateway.policy import NetworkPolicy
from controller.sandbox import LABEL_OWNER
from tests.require import unavailable

from .report_shape import check_console_probes, check_report, console_port, expected_probe_names, record_probe_list

pytestmark = [pytest.mark.docker, pytest.mark.slow]

IMAGE = os.environ.get("DESKTOP_SANDBOX_IMAGE", "desktop-sandbox:latest")
REQUIRED_CATEGORIES = {"direct", "dns", "doh-dot", "proxy-metadata", "proxy-private", "proxy-loopback",
                       "proxy-connect", "gateway", "docker-host", "console", "origins", "host-header", "summary"}


OURS = f"{LABEL_OWNER}={socket.gethostname()}:{os.getpid()}"
"""The label of what an audit run by this process starts (another process may audit at the same time)."""


@pytest.fixture(scope="module")
def docker_client():
    try:
        import docker

        client = docker.from_env()
        client.ping()
    except Exception as exc:  # noqa: BLE001
        unavailable("IMAGE", f"no Docker engine: {exc}")
    try:
        client.images.get(IMAGE)
    except Exception:  # noqa: BLE001
        unavailable("IMAGE", f"image {IMAGE} missing; run `make desktop`")
    yield client
    leftovers = [c.name for c in client.containers.list(all=True, ignore_removed=True, filters={"label": OURS})
                 if c.name.startswith("ds-audit-")]
    assert leftovers == [], f"audit left containers behind: {leftovers}"


def _failures(report) -> list[str]:
    return [f"{p.name}: expected {p.expected}, observed {p.observed} ({p.target})"
            for p in report.probes if not p.passed]


def _no_audit_networks(client) -> None:
    left = [n.name for n in client.networks.list(filters={"label": OURS}) if n.name.startswith("ds-audit-")]
    assert left == [], left


def test_deny_all_blocks_every_probe(docker_client, monkeypatch):
    built = record_probe_list(monkeypatch)
    report = audit(NetworkPolicy(), image=IMAGE, client=docker_client)
    data = json.loads(report.to_json())
    check_report(data)
    assert report.passed, "\n".join(_failures(report))
    assert {p.category for p in report.probes} >= REQUIRED_CATEGORIES
    assert all(p.expected == "blocked" for p in report.probes if p.name != "console-reachable-from-host")
    # the real web console on the host's loopback: as many probes as documented for this sandbox's host
    # addresses (every bridge gateway address), each refused; the host itself reached it
    [plan] = built.plans
    assert len(plan.topology.host_ips) >= 3, plan.topology.host_ips  # internal, egress, targets (, docker0)
    check_console_probes(data, plan.topology.host_ips, console_port(data))
    assert report.target_hits == [] and report.host_hits == []
    assert report.decisions and all(d["decision"] == "deny" for d in report.decisions)
    assert {d["reason"] for d in report.decisions} == {"deny-all"}
    # one result for every probe the audit built for this sandbox, in order, then the summary probes
    assert [p.name for p in report.probes] == expected_probe_names(built)
    _no_audit_networks(docker_client)


def test_allowlist_reaches_exactly_the_allowed_origin(docker_client):
    policy = NetworkPolicy(mode="allowlist", allow=[FIXTURE_ORIGIN])
    report = audit(policy, image=IMAGE, client=docker_client)
    check_report(json.loads(report.to_json()))
    assert report.passed, "\n".join(_failures(report))
    allowed = [p for p in report.probes if p.expected == "allowed" and p.category != "summary"]
    assert [p.name for p in allowed] == ["allowed-origin"]
    assert next(p for p in report.probes if p.name == "console-reachable-from-host").passed
    assert allowed[0].observed == "status:200"
    redirect = next(p for p in report.probes if p.name == "redirect-allowed-to-denied")
    assert [hop["status"] for hop in redirect.detail["hops"]] == [302, 403]
    # the allowed target saw exactly the allowed request and the redirect's first hop, from the gateway
    assert sorted(h["head"].split()[1] for h in report.target_hits) == [
        "/probe", f"/redirect?to=http://{DENIED_NAME}:{TARGET_HTTP_PORT}/redirected"]
    assert all(h["target"] == "allowed" for h in report.target_hits)
    allows = [d for d in report.decisions if d["decision"] == "allow"]
    assert {d["origin"] for d in allows} == {FIXTURE_ORIGIN}
    # the allowed origin's requests naming another destination met the gateway's Host check itself
    for name in ("host-header-denied", "host-header-other-port", "host-header-duplicate", "host-header-userinfo"):
        probe = next(p for p in report.probes if p.name == name)
        assert probe.detail["hops"][0]["body"].startswith(DENY_BODY + "host-mismatch: "), probe
    mismatches = [d for d in report.decisions if d["reason"].startswith("host-mismatch: ")]
    assert len(mismatches) == 4 and {d["origin"] for d in mismatches} == {FIXTURE_ORIGIN}
    _no_audit_networks(docker_client)


def test_audit_reports_an_escape_when_the_policy_lets_the_recorder_through(docker_client):
    """The audit must be able to fail: a policy that admits the recorder is caught, by the guest's
    observation and by the recorder's own record of the hit. The same policy also admits the web
    console's origin on loopback (``http://127.0.0.1:PORT``, ``http://localhost:PORT``,
    ``https://127.0.0.1:PORT``): the console probes the gateway then lets through must escape (it tried
    its own loopback, where nothing listens — 502 — or opened the tunnel), and only those."""
    with audit_console() as console:
        port = console.port
        leaky = NetworkPolicy(mode="allowlist", allow=[f"http://{DENIED_NAME}:{TARGET_HTTP_PORT}",
                                                        f"http://127.0.0.1:{port}", f"http://localhost:{port}",
                                                        f"https://127.0.0.1:{port}"],
                              allow_addresses=["0.0.0.0/0", "::/0"])
        report = audit(leaky, image=IMAGE, client=docker_client, console=console)
    data = json.loads(report.to_json())
    check_report(data)
    assert not report.passed
    assert "denied-origin" in report.escaped
    assert "recorder-saw-nothing" in report.escaped
    assert any(h["target"] == "recorder" and h["port"] == TARGET_HTTP_PORT for h in report.target_hits)
    assert console_port(data) == port
    escaped = {p.name: p.observed for p in report.probes if p.category == "console" and p.escaped}
    assert {f"console-proxy-127.0.0.1:{port}", f"console-connect-127.0.0.1:{port}",
            f"console-proxy-localhost:{port}"} <= set(escaped), escaped
    for name, observed in escaped.items():  # through the gateway, to a loopback spelling; never direct
        kind = "proxy" if name.startswith("console-proxy-") else "connect"
        assert observed == {"proxy": "status:502", "connect": "status:200"}[kind], (name, observed)
    allowed = {d["origin"] for d in report.decisions if d["decision"] == "allow" and f":{port}" in d["origin"]}
    assert allowed == {f"http://127.0.0.1:{port}", f"http://localhost:{port}", f"https://127.0.0.1:{port}"}
    assert next(p for p in report.probes if p.name == "console-reachable-from-host").passed
