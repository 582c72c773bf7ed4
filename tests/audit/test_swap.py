"""The audit of a policy swapped in at runtime, without Docker: netprobe's ``hold`` kind against a real
loopback server standing for the proxy; the swap phase (controller.audit.swap) and the whole report on
a stand-in sandbox whose gateway closes the held connection at the swap — or does not, which must fail
the swap rows; the swap rows' judge on records that must not pass; the CLI's options."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Optional

import pytest

from controller.audit import SWAP_ORIGIN, AuditTargets, HostCanary, audit_topology, run_audit
from controller.audit.report import render_table
from controller.audit.runner import run_probes
from controller.audit.swap import CUT_WITHIN_S, ROWS, SwapRecord, hits_after, swap_in, swap_results
from controller.audit.targets import SWAP_PORT
from controller.gateway.policy import NetworkPolicy, Origin
from controller.sandbox import ExecResult
from guest import netprobe

from .report_shape import check_report
from .standin import CANARY, GUEST, TARGETS, StandInSandbox, _Network

ROOT = Path(__file__).resolve().parents[2]
START = NetworkPolicy(mode="allowlist", allow=[SWAP_ORIGIN])
CLIENT = f"{GUEST}:40404"


# -- netprobe's hold, against a loopback server standing for the proxy --------------------------------

class KeepAliveProxy:
    """Answers one request per connection with ``status`` (keep-alive), then keeps the connection open
    until :meth:`cut` closes it."""

    def __init__(self, status: int = 200) -> None:
        self.status = status
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.conns: list[socket.socket] = []
        self.requests: list[bytes] = []
        self.answered = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        conn, _ = self.listener.accept()
        self.conns.append(conn)
        data = b""
        while b"\r\n\r\n" not in data:
            data += conn.recv(4096)
        self.requests.append(data)
        body = b"audit-allowed /swap-held/x"
        conn.sendall(b"HTTP/1.1 %d X\r\nContent-Length: %d\r\n\r\n%s" % (self.status, len(body), body))
        self.answered.set()

    def cut(self) -> None:
        for conn in self.conns:
            conn.close()

    def close(self) -> None:
        self.cut()
        self.listener.close()


def _hold(proxy: KeepAliveProxy, **extra: Any) -> dict[str, Any]:
    spec = {"name": "h", "kind": "hold", "proxy_host": "127.0.0.1", "proxy_port": proxy.port,
            "url": f"{SWAP_ORIGIN}/swap-held/x", **extra}
    return netprobe.run([spec])[0]


def test_hold_reports_the_proxy_cutting_the_connection():
    proxy = KeepAliveProxy()
    try:
        threading.Thread(target=lambda: (proxy.answered.wait(10), time.sleep(0.3), proxy.cut()), daemon=True).start()
        started = time.monotonic()
        result = _hold(proxy, hold_s=20)
        assert time.monotonic() - started < 10
        assert result["observed"] == "cut" and result["detail"]["ended"] in ("eof", "reset"), result
        assert result["detail"]["hops"][0]["status"] == 200
        assert result["detail"]["client"].startswith("127.0.0.1:")
        assert b"Connection: close" not in proxy.requests[0] and proxy.requests[0].startswith(b"GET http://")
    finally:
        proxy.close()


def test_hold_ends_held_on_its_release_file_or_deadline(tmp_path):
    release = tmp_path / "release"
    proxy = KeepAliveProxy()
    try:
        threading.Thread(target=lambda: (proxy.answered.wait(10), time.sleep(0.3), release.touch()),
                         daemon=True).start()
        result = _hold(proxy, hold_s=20, release=str(release))
        assert result["observed"] == "held" and result["detail"]["ended"] == "released", result
    finally:
        proxy.close()
    proxy = KeepAliveProxy()
    try:
        result = _hold(proxy, hold_s=0.3)
        assert result["observed"] == "held" and result["detail"]["ended"] == "deadline", result
    finally:
        proxy.close()


def test_hold_refused_is_the_proxys_status_and_a_bad_release_is_an_error():
    proxy = KeepAliveProxy(status=403)
    try:
        assert _hold(proxy, hold_s=5)["observed"] == "status:403"
    finally:
        proxy.close()
    assert _hold(KeepAliveProxy(), release=["/tmp/x"])["observed"] == "error"


# -- the swap phase on a stand-in sandbox ------------------------------------------------------------

class RecordingTargets(AuditTargets):
    """Stand-in targets whose hits are what the stand-in guest reached through its stand-in gateway."""

    records: list[dict[str, Any]]

    def hits(self) -> list[dict[str, Any]]:
        return list(self.records)

    def flush(self, timeout: float = 10.0) -> bool:
        return True


def recording_targets() -> RecordingTargets:
    made = RecordingTargets(client=None, id=TARGETS, canary=CANARY, network=_Network(f"{TARGETS}-targets"),
                            allowed_ip="172.26.0.2", allowed_ip6="fd00:1::2", recorder_ip="172.26.0.3",
                            recorder_ip6="fd00:1::3", gateway_ip="172.26.0.4", gateway_ip6="fd00:1::4")
    made.records = []
    return made


class SwappingSandbox(StandInSandbox):
    """A stand-in whose gateway enforces ``START`` until ``set_policy``: the guest reaches
    :data:`SWAP_ORIGIN` (the target records it), holds a connection there until the gateway cuts it
    (``closes``: at the swap, with its ``policy_swapped`` line) or the audit's release file appears;
    everything else is refused as by a deny-all gateway."""

    def __init__(self, targets: RecordingTargets, *, closes: bool, through: tuple[str, ...] = ()) -> None:
        super().__init__(through)
        self.targets, self.closes = targets, closes
        self.cut, self.released = threading.Event(), threading.Event()
        self.swapped: Optional[dict[str, Any]] = None

    def exec_in_guest(self, argv: list[str], *, timeout: Optional[float] = None) -> ExecResult:
        if "sys.argv[1]" in argv[2]:  # the audit's release of the hold
            self.released.set()
            return ExecResult(0, b"", b"")
        specs = json.loads(argv[3])
        if len(specs) == 1 and str(specs[0].get("url", "")).startswith(SWAP_ORIGIN) and self.swapped is None:
            return ExecResult(0, json.dumps({"results": [self._reach(specs[0])]}).encode(), b"")
        return super().exec_in_guest(argv, timeout=timeout)

    def _reach(self, spec: dict[str, Any]) -> dict[str, Any]:
        path = spec["url"][len(SWAP_ORIGIN):]
        self._decide(SWAP_ORIGIN, True, "request")
        self.targets.records.append({"target": "allowed", "hit": "http", "port": SWAP_PORT, "peer": "172.26.0.4",
                                     "head": f"GET {path} HTTP/1.1", "host": f"allowed.audit.test:{SWAP_PORT}"})
        hop = {"status": 200, "location": None, "body": f"audit-allowed {path}", "url": spec["url"]}
        if spec["kind"] == "http":
            return {"name": spec["name"], "observed": "status:200", "detail": {"hops": [hop]}}
        ended = "eof" if self._wait_cut_or_release() else "released"
        return {"name": spec["name"], "observed": "cut" if ended == "eof" else "held",
                "detail": {"client": CLIENT, "hops": [hop], "held_s": 0.5, "ended": ended}}

    def _wait_cut_or_release(self) -> bool:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.cut.wait(0.02):
                return True
            if self.released.is_set():
                return False
        raise AssertionError("the audit neither swapped nor released the hold")

    def set_policy(self, policy: Any) -> dict[str, Any]:
        self.swapped = policy.model_dump(mode="json")
        closed = 0
        if self.closes and not policy.admits_origin(Origin.parse(SWAP_ORIGIN)):
            self.decisions.append({"ts": "2026-11-30T02:00:13.000+00:00", "origin": SWAP_ORIGIN, "decision": "deny",
                                   "reason": "policy_swapped", "client": CLIENT, "via": "policy"})
            self.cut.set()
            closed = 1
        return {"policy": self.swapped, "closed": closed, "pending_refused": 0}


def swapped_report(policy: NetworkPolicy, *, closes: bool, through: tuple[str, ...] = ()) -> dict[str, Any]:
    """The report (parsed JSON) of ``policy`` swapped in on a :class:`SwappingSandbox` (``through``: the
    probes its gateway lets through after the swap)."""
    targets = recording_targets()
    sandbox = SwappingSandbox(targets, closes=closes, through=through)
    topology = audit_topology(sandbox)
    with HostCanary() as canary:
        record = swap_in(topology, sandbox.set_policy, targets, START, policy, run_probes)
        report = run_audit(topology, policy, targets=targets, host_canary=canary, timeout=30, swap=record)
    data = json.loads(report.to_json())
    check_report(data)
    return data


def _rows(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {p["name"]: p for p in data["probes"] if p["category"] == "swap"}


def test_a_gateway_that_closes_the_held_connection_passes_the_swapped_audit(capsys):
    data = swapped_report(NetworkPolicy(), closes=True)
    assert data["passed"], [p for p in data["probes"] if not p["passed"]]
    rows = _rows(data)
    assert list(rows) == list(ROWS) and [p["name"] for p in data["probes"][:3]] == list(ROWS)
    assert rows["swap-held-connection-closed"]["observed"] == "cut"
    assert 0 <= rows["swap-held-connection-closed"]["detail"]["ended_after_swap_s"] <= CUT_WITHIN_S
    assert rows["swap-closed-connection-logged"]["observed"] == "1 policy_swapped lines"
    assert data["swap"]["how"] == "set_policy" and data["swap"]["from"]["allow"] == [SWAP_ORIGIN]
    assert data["swap"]["closed"] == 1 and data["swap"]["policy"]["mode"] == "deny-all"
    # the swap phase's hits at the allowed target do not fail the probes judged after it
    assert {h["head"].split()[1] for h in data["target_hits"]} >= {"/swap-before"}
    from controller.audit import AuditReport
    from rich.console import Console

    render_table(AuditReport.model_validate(data), Console(width=200, file=sys.stdout))
    assert "swapped in at runtime from allowlist" in capsys.readouterr().out


def test_a_gateway_that_keeps_the_old_connection_fails_the_swap_rows():
    started = time.monotonic()
    data = swapped_report(NetworkPolicy(), closes=False)
    assert time.monotonic() - started >= CUT_WITHIN_S  # the cut was waited for, then the hold released
    rows = _rows(data)
    held = rows["swap-held-connection-closed"]
    assert (held["observed"], held["passed"], held["escaped"]) == ("held", False, True)
    assert not rows["swap-closed-connection-logged"]["passed"]
    assert rows["swap-target-reachable-before"]["passed"]
    assert not data["passed"] and data["escaped"] == ["swap-held-connection-closed"]


def test_an_allowlist_that_keeps_the_swap_origin_must_keep_the_connection():
    keeps = NetworkPolicy(mode="allowlist", allow=[SWAP_ORIGIN])
    data = swapped_report(keeps, closes=True, through=(f"policy-origin-{SWAP_ORIGIN}",))
    rows = _rows(data)
    assert {r["expected"] for r in rows.values()} == {"allowed"}
    assert rows["swap-held-connection-closed"]["observed"] == "held", rows
    assert data["passed"], [p for p in data["probes"] if not p["passed"]]
    assert data["swap"]["closed"] == 0


def _record(**changes: Any) -> SwapRecord:
    """A record of a hold the gateway cut 0.2 s after the swap, with its log line: passes as it is."""
    base = SwapRecord(
        how="set_policy", start_policy=START.model_dump(mode="json"),
        answer={"policy": {"mode": "deny-all"}, "closed": 1, "pending_refused": 0}, decisions_before=1,
        before={"name": ROWS[0], "observed": "status:200",
                "detail": {"hops": [{"status": 200, "body": "audit-allowed /swap-before"}]}},
        hold={"name": ROWS[1], "observed": "cut", "detail": {"client": CLIENT, "ended": "eof"}},
        open_at_swap=True, ended_after_s=0.2, cut_expected=True,
        hits_before=[{"target": "allowed", "hit": "http", "port": SWAP_PORT, "peer": "172.26.0.4",
                      "head": "GET /swap-before HTTP/1.1"}])
    return replace(base, **changes)


LOG = [{"origin": SWAP_ORIGIN, "decision": "allow", "reason": "allowlisted", "client": CLIENT, "via": "request"},
       {"origin": SWAP_ORIGIN, "decision": "deny", "reason": "policy_swapped", "client": CLIENT, "via": "policy"}]


@pytest.mark.parametrize("case, changes, log, failing", [
    ("a connection cut before the swap (or opened after it) is no proof", {"open_at_swap": False}, LOG, {1}),
    ("cut too long after the swap", {"ended_after_s": CUT_WITHIN_S + 1}, LOG, {1}),
    ("released by the audit, not cut", {"ended_after_s": None}, LOG, {1}),
    ("the gateway counted nothing closed", {"answer": {"closed": 0}}, LOG, {1}),
    ("the line names another connection", {}, [LOG[0], {**LOG[1], "client": f"{GUEST}:40405"}], {2}),
    ("the line was there before the swap", {"decisions_before": 2}, LOG, {2}),
    ("the target never recorded the probe before", {"hits_before": []}, LOG, {0}),
    ("the probe before was refused", {"before": {"name": ROWS[0], "observed": "status:403", "detail": None}}, LOG, {0}),
    ("a guest that names no client", {"hold": {"name": ROWS[1], "observed": "cut", "detail": "x"}}, LOG, {2}),
])
def test_the_swap_rows_pass_only_on_a_cut_of_the_connection_open_at_the_swap(case, changes, log, failing):
    assert all(r.passed for r in swap_results(_record(), LOG))
    rows = swap_results(_record(**changes), log)
    assert {i for i, r in enumerate(rows) if not r.passed} == failing, case


def test_hits_after_leaves_out_exactly_the_hits_before():
    a, b = {"target": "allowed", "port": 8081, "head": "GET /a"}, {"target": "recorder", "port": 80, "head": ""}
    assert hits_after([a, a, b, a], [a, a]) == [b, a]
    assert hits_after([b], []) == [b]


# -- the command line ----------------------------------------------------------------------------------

def recording_audit(policy: NetworkPolicy, *, image: Any = None, **options: Any):
    """A stand-in for ``controller.audit.audit`` that writes what it was given to $AUDIT_CALL_FILE and
    runs the stand-in audit."""
    from .standin import run_standin_audit

    given = {"policy": policy.model_dump(mode="json"), "via_pool": options.get("via_pool", False),
             "swap_from": options["swap_from"].model_dump(mode="json") if "swap_from" in options else None}
    Path(os.environ["AUDIT_CALL_FILE"]).write_text(json.dumps(given))
    return run_standin_audit(policy)


def _cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    code = ("import controller.audit, tests.audit.standin as s, tests.audit.test_swap as t; "
            "controller.audit.audit = t.recording_audit; s.stand_in_for_the_image_check(); "
            "from controller.cli import app; app(prog_name='desktop-sandbox')")
    env = {k: v for k, v in os.environ.items() if k != "DOCKER_HOST"}
    env.update(PYTHONPATH=str(ROOT), DOCKER_HOST="unix:///nonexistent/docker.sock", COLUMNS="200",
               AUDIT_CALL_FILE=str(tmp_path / "call.json"))
    return subprocess.run([sys.executable, "-c", code, "audit", *args], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120, env=env, stdin=subprocess.DEVNULL)


def test_cli_swap_from_and_via_pool_reach_the_audit_and_are_refused_elsewhere(tmp_path):
    start = tmp_path / "start.toml"
    start.write_text(f'mode = "allowlist"\nallow = ["{SWAP_ORIGIN}"]\n')
    result = _cli(tmp_path, "--swap-from", str(start), "--via-pool")
    assert result.returncode == 0, (result.stdout, result.stderr)
    given = json.loads((tmp_path / "call.json").read_text())
    assert given["swap_from"]["allow"] == [SWAP_ORIGIN] and given["via_pool"] is True
    assert given["policy"]["mode"] == "deny-all"

    bad = tmp_path / "bad.toml"
    bad.write_text('mode = "allowlist"\nalow = []\n')
    refused = _cli(tmp_path, "--swap-from", str(bad))
    assert refused.returncode == 2 and "bad --swap-from policy" in refused.stderr + refused.stdout
    other = _cli(tmp_path, "--backend", "vm", "--via-pool")
    assert other.returncode == 2 and "docker backend only" in other.stderr + other.stdout, other
    assert "Traceback" not in refused.stderr + other.stderr
