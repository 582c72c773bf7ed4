"""Readiness, session processes, file plumbing and the decision log of a real sandbox."""

from __future__ import annotations

import pytest

from ._guest import guest_requests

SUPERVISOR_CONF = "/opt/desktop-sandbox/src/images/supervisor/desktop.conf"


def test_ready_agent_and_display(sandbox):
    assert sandbox.agent.livez()
    assert sandbox.agent.display() == {"width": 1280, "height": 800, "depth": 24}
    assert sandbox.timings["agent_live"] <= sandbox.timings["display_ready"]


def test_screenshot_through_relay(sandbox):
    shot = sandbox.agent.screenshot()
    assert shot.screen_size == (1280, 800)
    assert shot.data[:8] == b"\x89PNG\r\n\x1a\n"


def test_agent_refuses_without_token(sandbox):
    import httpx

    with httpx.Client(base_url=sandbox.agent_url, trust_env=False) as http:
        assert http.get("/livez").status_code == 200
        assert http.get("/v1/display").status_code == 401
        assert http.get("/v1/display", headers={"Authorization": "Bearer wrong"}).status_code == 401


def test_session_processes_supervised(sandbox):
    # The control socket is root's (the desktop user cannot use it: tests/docker/test_privsep.py).
    result = sandbox._exec(sandbox.desktop, ["supervisorctl", "-c", SUPERVISOR_CONF, "status"], user="0:0", timeout=20)
    states = {}
    for line in result.stdout.decode().splitlines():
        parts = line.split()
        if len(parts) >= 2:
            states[parts[0]] = parts[1]
    for program in ("xvfb", "openbox", "launcher", "agent"):
        assert states.get(program) == "RUNNING", result.stdout.decode()
    ps = sandbox.exec_in_guest(["ps", "-eo", "user:12,args"], timeout=10).stdout.decode().splitlines()[1:]
    users = {line.split()[0] for line in ps if line.strip()}
    assert users == {"root", "sandbox", "agent"}, ps
    root = sorted(line.split(None, 1)[1] for line in ps if line.split()[:1] == ["root"])
    assert len(root) == 2 and any("supervisord" in r for r in root) and any("launcher.py" in r for r in root), root


def test_launch_allowlisted_app_and_read_file(sandbox):
    """/v1/launch runs an allowlisted app as the desktop user; /v1/files reads what it wrote."""
    from controller.agent_client import AgentError

    log = "/home/sandbox/launch-probe.jsonl"
    pid = sandbox.agent.launch("probe", ["--log", log])
    assert pid > 0
    import time

    deadline = time.monotonic() + 20
    data = b""
    while time.monotonic() < deadline:
        try:
            data = sandbox.agent.read_file(log)
        except AgentError as exc:
            if exc.status != 404:
                raise
        if b'"ready"' in data:
            break
        time.sleep(0.1)
    assert b'"ready"' in data
    with pytest.raises(AgentError) as err:
        sandbox.agent.launch("sh", ["-c", "id"])
    assert err.value.status == 400
    sandbox.exec_in_guest(["kill", str(pid)], timeout=10)


def test_decision_log_records_each_request_with_its_decision(sandbox):
    """Each request the guest makes through the gateway is in the decision log, as the policy model."""
    from controller.gateway.policy import Decision

    before = len(sandbox.decision_log())
    urls = [f"http://denied-{i}.example.test:{8000 + i}/x" for i in range(3)]
    printed = guest_requests(sandbox, urls)
    assert printed.count(" 403") == 3, printed
    new = [Decision.model_validate(e) for e in sandbox.decision_log()[before:]]
    assert [(d.origin, d.decision) for d in new] == [(f"http://denied-{i}.example.test:{8000 + i}", "deny")
                                                     for i in range(3)]
    # the incremental read the run record uses gives the same lines, capped by lines and by bytes
    assert sandbox.decisions_since(before, 1000) == sandbox.decision_log()[before:]
    assert sandbox.decisions_since(before + 1, 1) == sandbox.decision_log()[before + 1:before + 2]
    assert sandbox.decisions_since(before, 1000, max_bytes=10) == []  # no complete line fits
    assert sandbox.decisions_since(before + 3, 1000) == []


def test_exec_output_is_capped(sandbox):
    """A guest command that prints without end is cut off at the cap instead of filling the host's memory."""
    from controller.sandbox import SandboxError

    with pytest.raises(SandboxError, match="printed more than 1000000 bytes"):
        sandbox._exec(sandbox.desktop, ["sh", "-c", "yes"], user="1000:1000", timeout=20, max_bytes=1_000_000)
    assert sandbox.exec_in_guest(["echo", "still usable"], timeout=10).stdout == b"still usable\n"
