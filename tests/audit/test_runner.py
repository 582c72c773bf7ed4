"""The audit's runner against a hostile guest's answers, the host canary's flush, and the one probe list
on a VM-shaped topology (no targets), all without Docker or a VM."""

from __future__ import annotations

import json
import socket
from dataclasses import replace

import pytest

from controller.audit import (
    DENY_BODY, AuditTopology, HostCanary, ProbeRunFailed, build_probes, audit_topology, run_audit,
)
from controller.audit.judges import through_proxy
from controller.audit.probes import ProbePlan
from controller.audit.runner import MAX_PROBE_OUTPUT, run_probes
from controller.sandbox.vm import SLIRP_DNS, SLIRP_HOST
from controller.gateway.policy import NetworkPolicy
from controller.sandbox import ExecResult

from .report_shape import check_console_probes, console_port
from .standin import CANARY, StandInSandbox, targets


def _topology(exec_in_guest) -> AuditTopology:
    return replace(audit_topology(StandInSandbox()), exec_in_guest=exec_in_guest)


def _probes(topology: AuditTopology):
    return build_probes(ProbePlan(topology, targets(), CANARY, 9, NetworkPolicy(), console_port=39999))


def test_missing_misnamed_and_malformed_observations_are_errors_not_trusted():
    def answer(argv, *, timeout=None):
        specs = json.loads(argv[3])
        results = [{"name": s["name"], "observed": "refused", "detail": None} for s in specs]
        results[0]["name"] = "someone-else"          # not the probe's observation
        results[1]["observed"] = ["refused"]         # no outcome word
        results[2]["observed"] = "refused\x1b[2J" + "x" * 500  # terminal escapes, overlong
        return ExecResult(0, json.dumps({"results": results[:-1]}).encode(), b"")  # the last one missing

    topology = _topology(answer)
    probes = _probes(topology)
    observations = run_probes(topology, probes, timeout=5)
    assert [o["name"] for o in observations] == [p.name for p in probes]
    assert observations[0]["observed"] == observations[1]["observed"] == observations[-1]["observed"] == "error"
    assert "\x1b" not in observations[2]["observed"] and len(observations[2]["observed"]) <= 80
    assert observations[3]["observed"] == "refused"


@pytest.mark.parametrize("stdout, code", [
    (b"not json", 0),
    (b'{"results": {"a": 1}}', 0),
    (b'{"results": []}' + b" " * MAX_PROBE_OUTPUT, 0),
    (b"", 124),
])
def test_a_probe_run_that_is_no_report_cannot_pass(stdout, code):
    topology = _topology(lambda argv, *, timeout=None: ExecResult(code, stdout, b"killed\x1b]0;x\x07"))
    with pytest.raises(ProbeRunFailed) as caught:
        run_probes(topology, _probes(topology), timeout=5)
    assert "\x1b" not in str(caught.value)


@pytest.mark.parametrize("detail", [None, [], "x", {"hops": "x"}, {"hops": [1, {"status": "403"}]}, {"hops": []}])
def test_judges_read_any_detail_without_crashing(detail):
    assert through_proxy("status:403", detail) is True  # no gateway refusal body: an answer got through
    report_probes = _probes(_topology(None))
    for probe in report_probes:
        passed, escaped = probe.judge("status:200", detail, [])
        assert isinstance(passed, bool) and isinstance(escaped, bool)


def test_host_canary_flush_waits_for_hits_and_keeps_its_markers_out():
    with HostCanary() as canary:
        for _ in range(3):
            with socket.create_connection(("127.0.0.1", canary.port), timeout=5):
                pass
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
            udp.sendto(b"x", ("127.0.0.1", canary.port))
        assert canary.flush(timeout=10)
        assert sorted(h["proto"] for h in canary.hits) == ["tcp", "tcp", "tcp", "udp"]
        assert canary.flush(timeout=10)
        assert len(canary.hits) == 4


def _vm_like(sandbox: StandInSandbox) -> AuditTopology:
    return AuditTopology(
        backend="vm", sandbox_id=sandbox.id, image_id=sandbox.image_id, proxy_port=3128,
        gateway_addresses=(("guest", "10.0.2.100"),), relay_port=None, host_label="host",
        host_ips=(SLIRP_HOST, SLIRP_DNS), host_ports=(40001, 40002), dns_servers=(SLIRP_DNS, SLIRP_HOST, "10.0.2.100"),
        loopback_ports=(40001, 40002), gateway_on_host=True, scan_batch=256, exec_in_guest=sandbox.exec_in_guest,
        gateway_log=lambda tail: sandbox.logs("gateway", tail), decision_log=sandbox.decision_log)


@pytest.mark.parametrize("through, escaped", [(set(), []), ({"host-udp-10.0.2.2"}, ["host-udp-10.0.2.2"])])
def test_the_same_probe_list_serves_a_backend_without_targets(through, escaped):
    policy = NetworkPolicy(mode="allowlist", allow=["https://example.com"])
    report = run_audit(_vm_like(StandInSandbox(through | {"policy-origin-https://example.com"})), policy, timeout=30)
    names = [p.name for p in report.probes]
    assert len(names) == len(set(names))
    assert [p.name for p in report.probes if p.category == "summary"] == [
        "host-canary", "canary-not-resolved-by-gateway", "console-reachable-from-host"]
    assert not [n for n in names if n.startswith(("direct-tcp-v4", "doh-direct", "proxy-private", "gateway-relay"))]
    assert {"host-tcp-10.0.2.2", "proxy-loopback-127.0.0.1:40001", "policy-origin-https://example.com"} <= set(names)
    assert report.effective_policy == report.policy and report.target_hits == []
    assert report.escaped == escaped and report.passed is not escaped
    # the console on the host's loopback, through QEMU's alias of it (10.0.2.2) and the gateway's loopback
    data = json.loads(report.to_json())
    check_console_probes(data, [SLIRP_HOST, SLIRP_DNS], console_port(data))


def test_host_header_probes_escape_when_let_through_or_seen_by_a_target():
    probes = {p.name: p for p in _probes(_topology(None)) if p.category == "host-header"}
    assert sorted(probes) == sorted(["host-header-denied", "host-header-other-port", "host-header-duplicate",
                                     "host-header-userinfo", "host-header-tunnel-denied",
                                     "host-header-tunnel-absolute"])
    assert probes["host-header-duplicate"].spec["host"] == ["allowed.audit.test:8080", "denied.audit.test:8080"]
    assert probes["host-header-tunnel-denied"].spec["request"] == {
        "path": "/host-header/host-header-tunnel-denied", "host": "denied.audit.test:8080"}
    refused = {"hops": [{"status": 403, "body": DENY_BODY + "host-mismatch: Host x names y, not z\n"}]}
    answered = {"hops": [{"status": 200, "body": "audit-allowed /host-header/x"}]}
    other = [{"target": "allowed", "hit": "http", "port": 8080, "peer": "172.26.0.4", "head": "GET /probe HTTP/1.1"}]
    for name, probe in probes.items():
        path = f"/host-header/{name}"
        seen = [{"target": "allowed", "hit": "http", "port": 8080, "peer": "172.26.0.4",
                 "head": f"GET http://denied.audit.test:8080{path} HTTP/1.1"}]
        recorder = [{"target": "recorder", "hit": "tcp", "port": 8080, "peer": "172.26.0.4", "head": ""}]
        assert probe.judge("status:403", refused, other) == (True, False), name
        assert probe.judge("status:403", DENY_BODY + "not-allowlisted\n", []) == (True, False), name
        assert probe.judge("status:200", answered, []) == (False, True), name
        assert probe.judge("status:403", refused, seen) == (False, True), name
        assert probe.judge("status:403", refused, recorder) == (False, True), name
