"""The audit's probes for origin access (ARCHITECTURE.md, "Gateway control API" and contract 2, mode ask):
the gateway's control API is never reachable from the guest, and an ``ask``-tier origin is held, not
passed, while nobody answers. Judged on a stand-in sandbox (no Docker)."""

from __future__ import annotations

import dataclasses

from controller.audit import DENY_BODY, audit_topology
from controller.audit.probes import HELD_PATH, ProbePlan, build_probes
from controller.audit.targets import FIXTURE_ORIGIN, effective_policy
from controller.gateway.policy import NetworkPolicy
from tests.audit.standin import CANARY, StandInSandbox, targets

CONTROL_HOST_PORT = 49200


class WithControlAPI(StandInSandbox):
    """The stand-in Docker sandbox whose gateway has a control API (port 8001, published on 49200)."""

    def topology(self):
        return dataclasses.replace(super().topology(), gateway_control_url=f"http://127.0.0.1:{CONTROL_HOST_PORT}",
                                   gateway_control_token="secret", gateway_control_port=8001)


def probes_for(policy: NetworkPolicy, sandbox: StandInSandbox | None = None) -> dict:
    plan = ProbePlan(audit_topology(sandbox or WithControlAPI()), targets(), CANARY, 9, policy, console_port=39999)
    return {p.name: p for p in build_probes(plan)}


def test_the_control_api_is_probed_directly_through_the_proxy_and_on_the_host():
    topology = audit_topology(WithControlAPI())
    assert topology.control_port == 8001 and CONTROL_HOST_PORT in topology.host_ports
    assert 8001 in topology.loopback_ports
    probes = probes_for(NetworkPolicy())
    expected = {"gateway-control-internal", "gateway-control-egress", "proxy-control-127.0.0.1:8001",
                "proxy-control-172.24.0.2:8001", "proxy-control-172.25.0.2:8001", "connect-control-127.0.0.1:8001",
                "connect-control-172.24.0.2:8001", "connect-control-172.25.0.2:8001"}
    assert expected <= set(probes)
    assert str(CONTROL_HOST_PORT) in probes["docker-host-tcp-172.17.0.1"].target
    direct = probes["gateway-control-egress"]
    assert direct.spec == {"name": "gateway-control-egress", "kind": "tcp", "host": "172.25.0.2", "port": 8001}
    assert direct.judge("refused", None, []) == (True, False)
    assert direct.judge("connected", None, []) == (False, True)
    proxied = probes["proxy-control-172.25.0.2:8001"]
    assert proxied.judge("status:403", {"hops": [{"status": 403, "body": DENY_BODY + "address_refused"}]}, []) == (
        True, False)
    assert proxied.judge("status:401", {"hops": [{"status": 401, "body": '{"error": {}}'}]}, []) == (False, True)
    # a gateway without a control API: none of these probes
    assert not [n for n in probes_for(NetworkPolicy(), StandInSandbox()) if "control" in n]


def test_an_ask_tier_origin_must_be_held_while_nobody_answers():
    asking = NetworkPolicy.model_validate({"mode": "ask", "ask": [FIXTURE_ORIGIN]})
    held = probes_for(asking)["ask-origin-held"]
    assert held.expected == "blocked" and held.spec["url"] == FIXTURE_ORIGIN + HELD_PATH
    assert held.spec["timeout"] < asking.hold_timeout
    assert held.judge("timeout", {"hops": [], "error": "timed out"}, []) == (True, False)
    by_gateway = {"hops": [{"status": 403, "body": DENY_BODY + "timeout\n"}]}
    assert held.judge("status:403", by_gateway, []) == (True, False)
    refused_at_once = {"hops": [{"status": 403, "body": DENY_BODY + "address_refused\n"}]}
    assert held.judge("status:403", refused_at_once, []) == (False, False)
    passed = {"hops": [{"status": 200, "body": "audit-allowed " + HELD_PATH}]}
    assert held.judge("status:200", passed, []) == (False, True)
    seen = [{"target": "allowed", "hit": "http", "port": 8080, "peer": "x", "head": f"GET {HELD_PATH} HTTP/1.1"}]
    assert held.judge("timeout", {"hops": []}, seen) == (False, True)
    # the fixture's private address must be admitted, or the gateway refuses it before asking
    assert "172.26.0.2/32" in effective_policy(asking, targets()).allow_addresses
    for policy in (NetworkPolicy(), NetworkPolicy(mode="allowlist", allow=[FIXTURE_ORIGIN]),
                   NetworkPolicy.model_validate({"mode": "ask", "allow": [FIXTURE_ORIGIN]}),
                   NetworkPolicy.model_validate({"mode": "ask", "quiet": [FIXTURE_ORIGIN]}),
                   NetworkPolicy.model_validate({"mode": "ask", "ask": ["https://*.audit.test"]})):
        assert "ask-origin-held" not in probes_for(policy), policy
