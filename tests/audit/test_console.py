"""The web console as an audit target, without Docker: the real ``run_audit`` and a real ConsoleServer on
the host's loopback, with the stand-in sandbox's guest (tests/audit/standin.py). A console probe that
gets through escapes; a console the host cannot reach fails the positive control, even though every
probe from the guest was refused."""

from __future__ import annotations

import json
import socket

import pytest

from controller.audit import ConsoleNotStarted
from controller.audit.console import audit_console, host_check
from controller.gateway.policy import NetworkPolicy
from controller.sandbox import ExecResult

from .report_shape import check_console_probes, check_report
from .standin import NETWORKS, StandInSandbox, run_standin_audit

HOST_IPS = [host for host, _ in NETWORKS.values()]


def test_the_audit_console_listens_on_loopback_only_and_is_gone_afterwards():
    with audit_console() as console:
        port = console.port
        assert host_check(port, console.auth.base + "/")["observed"] == "status:401"
        assert host_check(port)["observed"] == "status:404"  # nothing outside the secret base path
        listening = [line.split()[1] for line in open("/proc/net/tcp").read().splitlines()[1:]
                     if line.split()[3] == "0A" and int(line.split()[1].split(":")[1], 16) == port]
        assert listening == ["0100007F:%04X" % port]  # 127.0.0.1, nothing else
        assert f":{port:04X} " not in open("/proc/net/tcp6").read()
    assert host_check(port, timeout=2)["observed"] == "refused"


@pytest.mark.parametrize("ways", [("proxy-127.0.0.1",), ("connect-localhost", "tcp-172.17.0.1")])
def test_a_console_probe_that_gets_through_escapes(ways):
    with audit_console() as console:
        through = {f"console-{way}:{console.port}" for way in ways}
        report = run_standin_audit(NetworkPolicy(), through, console=console)
    data = json.loads(report.to_json())
    check_report(data)
    assert sorted(data["escaped"]) == sorted(through) and not data["passed"]
    for name in through:
        probe = next(p for p in data["probes"] if p["name"] == name)
        assert probe["category"] == "console" and f":{console.port}" in probe["target"], probe


class _UnboundPort:
    """A console that is not listening: a port bound on 127.0.0.1 with no listener (connections refused)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.home_path = "/"


def test_a_console_the_host_cannot_reach_fails_the_positive_control():
    dead = _UnboundPort()
    try:
        report = run_standin_audit(NetworkPolicy(), console=dead)
    finally:
        dead.sock.close()
    control = next(p for p in report.probes if p.name == "console-reachable-from-host")
    assert (control.passed, control.escaped, control.observed) == (False, False, "refused")
    # every probe from the guest was refused: without the control the report would have passed
    assert all(p.passed for p in report.probes if p.category == "console")
    assert not report.passed and report.escaped == []


class _ConsoleStopsMidRun(StandInSandbox):
    def __init__(self, console) -> None:  # noqa: ANN001
        super().__init__()
        self.console = console

    def exec_in_guest(self, argv, *, timeout=None) -> ExecResult:  # noqa: ANN001
        self.console.stop()
        return super().exec_in_guest(argv, timeout=timeout)


def test_a_console_that_stops_during_the_probes_fails_the_positive_control():
    with audit_console() as console:
        report = run_standin_audit(NetworkPolicy(), console=console, sandbox=_ConsoleStopsMidRun(console))
    control = next(p for p in report.probes if p.name == "console-reachable-from-host")
    assert control.detail["before"]["observed"] == "status:401"
    assert control.detail["after"]["observed"] != "status:401" and not control.passed and not report.passed


def test_the_console_group_has_the_documented_size_and_every_way(monkeypatch):
    from .report_shape import record_probe_list

    built = record_probe_list(monkeypatch)
    data = json.loads(run_standin_audit(NetworkPolicy()).to_json())
    [plan] = built.plans
    assert list(plan.topology.host_ips) == HOST_IPS
    check_console_probes(data, HOST_IPS, plan.console_port)


def test_a_console_given_without_a_port_is_refused():
    class NoPort:
        port = None

    with pytest.raises(ConsoleNotStarted):
        run_standin_audit(NetworkPolicy(), console=NoPort())
