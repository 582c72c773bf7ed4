"""The audit's JSON report against docs/audit.md, and ``audit --json``'s exit status, without Docker: the
real ``run_audit`` (probe list, judging, report) on a stand-in sandbox (tests/audit/standin.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Collection
from pathlib import Path

import pytest

from controller.audit import FIXTURE_ORIGIN
from controller.gateway.policy import NetworkPolicy

from .report_shape import (
    check_console_probes, check_model_is_documented, check_report, expected_probe_names, record_probe_list,
)
from .standin import run_standin_audit

ROOT = Path(__file__).resolve().parents[2]
ALLOWLIST = NetworkPolicy(mode="allowlist", allow=[FIXTURE_ORIGIN, "https://example.com"])
#: The probes a sandbox enforcing ALLOWLIST lets through (the redirect's first hop included).
ALLOWLIST_THROUGH = {"allowed-origin", "redirect-allowed-to-denied", "policy-origin-https://example.com"}


def test_the_document_names_the_report_models_fields():
    check_model_is_documented()


@pytest.mark.parametrize("policy, through", [(NetworkPolicy(), set()), (ALLOWLIST, ALLOWLIST_THROUGH)])
def test_a_report_has_the_documented_shape_and_a_result_for_every_probe(monkeypatch, policy, through):
    built = record_probe_list(monkeypatch)
    data = json.loads(run_standin_audit(policy, through).to_json())
    check_report(data)
    assert [p["name"] for p in data["probes"]] == expected_probe_names(built)
    assert data["passed"] and data["escaped"] == [], [p for p in data["probes"] if not p["passed"]]
    assert data["policy"] == policy.model_dump(mode="json")
    expected = {p["name"]: p["expected"] for p in data["probes"] if p["category"] != "summary"}
    assert sorted(n for n, e in expected.items() if e == "allowed") == sorted(through - {"redirect-allowed-to-denied"})
    # the web console run_audit started: every way to it from the guest refused, the host reached it
    [plan] = built.plans
    check_console_probes(data, plan.topology.host_ips, plan.console_port)


def test_an_escape_fails_the_report():
    data = json.loads(run_standin_audit(NetworkPolicy(), {"denied-origin", "direct-tcp-v4-443"}).to_json())
    check_report(data)
    assert not data["passed"] and data["escaped"] == ["direct-tcp-v4-443", "denied-origin"]


def _cli_on_standin(tmp_path: Path, *args: str, through: Collection[str] = ()) -> subprocess.CompletedProcess:
    """``desktop-sandbox audit ARGS`` whose ``controller.audit.audit`` is the stand-in run (no engine, so
    the Docker backend's image check, which needs one, is stood in for too)."""
    code = ("import controller.audit, tests.audit.standin as s; "
            f"controller.audit.audit = s.audit_factory({sorted(through)!r}); "
            "s.stand_in_for_the_image_check(); "
            "from controller.cli import app; app(prog_name='desktop-sandbox')")
    env = {k: v for k, v in os.environ.items() if k != "DOCKER_HOST"}
    env.update(PYTHONPATH=str(ROOT), DOCKER_HOST="unix:///nonexistent/docker.sock", COLUMNS="200")
    return subprocess.run([sys.executable, "-c", code, "audit", *args], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120, env=env, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("through, status", [(set(), 0), ({"denied-origin"}, 1), ({"ipv6-off"}, 1)])
def test_audit_json_exit_status_follows_the_report(tmp_path, through, status):
    out = tmp_path / "reports" / "audit.json"
    result = _cli_on_standin(tmp_path, "--json", str(out), through=through)
    assert result.returncode == status, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    data = json.loads(out.read_text())
    check_report(data)
    assert data["passed"] is (status == 0) and data["escaped"] == sorted(through)
    assert ("ESCAPED" in result.stdout) is bool(through)
