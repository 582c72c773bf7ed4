"""The audit of a policy swapped in at runtime, end to end: real targets, a real sandbox (started cold,
or claimed from a real warm pool), the policy swapped through the gateway's control API while the guest
holds a connection open, then the whole probe list in the real guest.

Skipped when the Docker engine or the desktop image is missing, unless DESKTOP_SANDBOX_REQUIRE_IMAGE=1.
Each report is checked against docs/audit.md (tests/audit/report_shape.py).
"""

from __future__ import annotations

import json

import pytest

from controller.audit import FIXTURE_ORIGIN, SWAP_ORIGIN, audit
from controller.audit.swap import CUT_WITHIN_S, HOLD_PATH
from controller.gateway.policy import NetworkPolicy

from .report_shape import check_report
from .test_audit_docker import IMAGE, _failures, _no_audit_networks, docker_client  # noqa: F401 - the fixture

pytestmark = [pytest.mark.docker, pytest.mark.slow]

START = NetworkPolicy(mode="allowlist", allow=[SWAP_ORIGIN])
"""The policy the sandbox starts with: the allowed target's second origin, which neither audited policy names."""


def _swap_checks(report) -> tuple[list[dict], list[dict]]:
    """Assert what every swapped audit shows of its swap; return the decisions (before, after) it."""
    data = json.loads(report.to_json())
    check_report(data)
    assert report.passed, "\n".join(_failures(report))
    rows = {p.name: p for p in report.probes if p.category == "swap"}
    reachable, held, logged = rows.values()
    assert reachable.observed == "status:200" and reachable.detail["target_recorded"]
    assert held.observed == "cut" and held.expected == "blocked", held
    assert 0 <= held.detail["ended_after_swap_s"] <= CUT_WITHIN_S and held.detail["open_at_swap"], held.detail
    assert held.detail["gateway_closed"] >= 1
    assert logged.observed == "1 policy_swapped lines"
    swap = report.swap
    assert swap["how"] == "set_policy" and swap["from"] == START.model_dump(mode="json")
    before, after = report.decisions[:swap["decisions_before"]], report.decisions[swap["decisions_before"]:]
    assert {(d["origin"], d["decision"]) for d in before} == {(SWAP_ORIGIN, "allow")}, before
    [swapped] = [d for d in after if d["reason"] == "policy_swapped"]
    assert (swapped["origin"], swapped["via"], swapped["client"]) == (SWAP_ORIGIN, "policy", logged.detail[0]["client"])
    # the target saw the probe before the swap and the held connection's request, from the gateway only
    swap_hits = sorted(h["head"].split()[1] for h in report.target_hits if h["port"] == 8081)
    assert swap_hits[0] == "/swap-before" and swap_hits[1].startswith(HOLD_PATH + "/") and len(swap_hits) == 2
    return before, after


def test_deny_all_swapped_in_at_runtime_cuts_the_held_connection_and_blocks_every_probe(docker_client):
    report = audit(NetworkPolicy(), image=IMAGE, client=docker_client, swap_from=START)
    _before, after = _swap_checks(report)
    assert {(d["decision"], d["reason"]) for d in after} == {("deny", "deny-all"), ("deny", "policy_swapped")}
    assert report.swap["policy"]["mode"] == "deny-all" and report.swap["claim"] is None
    assert report.effective_policy == NetworkPolicy().model_dump(mode="json")
    _no_audit_networks(docker_client)


def test_an_allowlist_swapped_in_on_a_sandbox_claimed_from_a_warm_pool(docker_client):
    """The warm pool's sandbox, claimed with START (the claim swaps it in over the pool's deny-all, and the
    probe before the swap shows the claimed policy enforced), then the allowlist swapped in and audited."""
    policy = NetworkPolicy(mode="allowlist", allow=[FIXTURE_ORIGIN])
    report = audit(policy, image=IMAGE, client=docker_client, swap_from=START, via_pool=True)
    _before, after = _swap_checks(report)
    assert report.swap["claim"]["source"] == "pool", report.swap
    assert report.swap["policy"]["allow"] == [FIXTURE_ORIGIN]
    assert next(p for p in report.probes if p.name == "allowed-origin").observed == "status:200"
    assert {d["origin"] for d in after if d["decision"] == "allow"} == {FIXTURE_ORIGIN}
    _no_audit_networks(docker_client)
