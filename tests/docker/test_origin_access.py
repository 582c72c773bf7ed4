"""Origin access at the network layer in a real sandbox: the guest's request to an ``ask``-tier origin is
held by the gateway until the control API (on the host's 127.0.0.1) approves it, and the guest cannot
reach that control API. The origin is the audit's ``allowed`` target, a container on a Docker network
this test creates; nothing else is contacted."""

from __future__ import annotations

import concurrent.futures
import json
import os
import secrets
import socket
import time
from typing import Any, Callable, Iterator

import pytest

from tests.docker.conftest import record_ready
from tests.conformance.harness import poll

pytestmark = pytest.mark.docker

GUEST_PYTHON = "/opt/desktop-sandbox/bin/python"

#: One absolute-form GET through the guest's proxy (never bypassed); prints ``<status> <start of the body>``.
_FETCH = (
    "import sys, http.client\n"
    "connection = http.client.HTTPConnection('gateway', 3128, timeout=90)\n"
    "connection.request('GET', sys.argv[1])\n"
    "response = connection.getresponse()\n"
    "print(response.status, response.read(200).decode('utf-8', 'replace'))\n"
)

#: Direct TCP connections from the guest: prints ``{"host:port": "open" | "<error>"}``.
_CONNECT = (
    "import json, socket, sys\n"
    "out = {}\n"
    "for target in sys.argv[1:]:\n"
    "    host, port = target.rsplit(':', 1)\n"
    "    try:\n"
    "        socket.create_connection((host, int(port)), timeout=3).close()\n"
    "        out[target] = 'open'\n"
    "    except OSError as exc:\n"
    "        out[target] = type(exc).__name__\n"
    "print(json.dumps(out))\n"
)


def wait_for(condition: Callable[[], Any], timeout: float, what: str) -> Any:
    """:func:`tests.conformance.harness.poll` every 0.2 s (each look may be a command in the guest)."""
    return poll(condition, timeout=timeout, interval=0.2, what=what)


@pytest.fixture(scope="module")
def ask_sandbox(docker_client, desktop_image, test_labels) -> Iterator[tuple[Any, Any]]:
    """A sandbox in mode ask whose ask tier is the audit's allowed target (on a network of its own that
    only the gateway joins), with that target."""
    from controller.audit.targets import FIXTURE_ORIGIN, AuditTargets
    from controller.sandbox import LABEL_OWNER, LABEL_OWNER_ID, SandboxSpec
    from controller.sandbox.docker import DockerOptions, DockerSandbox
    from controller.sandbox.owner import owner_id

    owner = {LABEL_OWNER: f"{socket.gethostname()}:{os.getpid()}", LABEL_OWNER_ID: owner_id(), **test_labels}
    targets = AuditTargets.start(docker_client, desktop_image, owner_labels=owner)
    try:
        policy = {"mode": "ask", "ask": [FIXTURE_ORIGIN], "quiet": [], "hold_timeout_s": 60,
                  "allow_addresses": [a for a in (targets.allowed_ip, targets.allowed_ip6) if a]}
        sandbox = DockerSandbox.start(SandboxSpec(policy=policy),
                                      DockerOptions(image=desktop_image, extra_labels=test_labels), client=docker_client)
        record_ready(f"sandbox {sandbox.id} (ask)", sandbox.timings)
        with sandbox:
            targets.gateway_ip, targets.gateway_ip6 = sandbox.attach_gateway(targets.network_name)
            yield sandbox, targets
    finally:
        targets.close()


def control(sandbox: Any, method: str, path: str, **kwargs: Any) -> Any:
    import httpx

    headers = {"Authorization": f"Bearer {sandbox.gateway_control_token}"}
    return httpx.request(method, sandbox.gateway_control_url + path, headers=headers, timeout=10, trust_env=False,
                         **kwargs)


def guest_fetch(sandbox: Any, url: str) -> str:
    result = sandbox.exec_in_guest([GUEST_PYTHON, "-c", _FETCH, url], timeout=120)
    assert result.exit_code == 0, result.stderr.decode()
    return result.stdout.decode().strip()


def test_a_guest_request_is_held_until_approved(ask_sandbox):
    from controller.audit.targets import FIXTURE_ORIGIN

    sandbox, targets = ask_sandbox
    topology = sandbox.topology()
    assert topology.gateway_control_url == sandbox.gateway_control_url
    assert sandbox.gateway_control_url.startswith("http://127.0.0.1:")
    assert topology.gateway_control_token == sandbox.gateway_control_token and topology.gateway_control_port
    assert sandbox.gateway_control_token not in repr(topology)
    path = f"/held-{secrets.token_hex(4)}"
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    try:
        fetch = pool.submit(guest_fetch, sandbox, FIXTURE_ORIGIN + path)

        def pending() -> Any:
            data = control(sandbox, "GET", "/v1/origin-requests?state=pending").json()["data"]
            return next((r for r in data if r["origin"] == FIXTURE_ORIGIN), None)

        request = wait_for(pending, 60, "the held request")
        assert request["via"] == "http" and request["held"] == 1
        assert not fetch.done()
        assert targets.flush() and not [h for h in targets.hits() if path in str(h.get("head", ""))]
        assert control(sandbox, "POST", f"/v1/origin-requests/{request['id']}/decision",
                       json={"decision": "approve", "by": "test"}).status_code == 202
        status, _, body = fetch.result(timeout=120).partition(" ")
        assert status == "200" and body.startswith(f"audit-allowed {path}")
    finally:
        pool.shutdown(wait=False)
    assert targets.flush()
    assert len([h for h in targets.hits() if path in str(h.get("head", ""))]) == 1
    lines = [d for d in sandbox.decision_log() if d["origin"] == FIXTURE_ORIGIN]
    assert [(d["reason"], d["request_id"]) for d in lines] == [("approved", request["id"])]


def test_the_guest_cannot_reach_the_control_api(ask_sandbox):
    from controller.sandbox.docker import GATEWAY_CONTROL_TOKEN_FILE, GATEWAY_UID

    sandbox, targets = ask_sandbox
    topology = sandbox.topology()
    port = topology.gateway_control_port
    bindings = sandbox.gateway.attrs["NetworkSettings"]["Ports"][f"{port}/tcp"]
    assert bindings and all(b["HostIp"] == "127.0.0.1" for b in bindings)
    token_file = sandbox.exec_in_gateway(["stat", "-c", "%a %u", GATEWAY_CONTROL_TOKEN_FILE], timeout=20)
    assert token_file.stdout.decode().split() == ["400", str(GATEWAY_UID)]
    assert control(sandbox, "GET", "/v1/origin-requests").status_code == 200
    gateway_ips = [topology.gateway_guest_ip, topology.gateway_egress_ip, targets.gateway_ip]
    # directly: no answer on any of the gateway's addresses
    result = sandbox.exec_in_guest([GUEST_PYTHON, "-c", _CONNECT, *(f"{ip}:{port}" for ip in gateway_ips if ip)],
                                   timeout=60)
    assert result.exit_code == 0, result.stderr.decode()
    reached = json.loads(result.stdout)
    assert reached and "open" not in reached.values(), reached
    # through the proxy: refused as the gateway's own endpoint or a private address, never asked about
    for host in ["gateway", "127.0.0.1", *(ip for ip in gateway_ips if ip)]:
        answer = guest_fetch(sandbox, f"http://{host}:{port}/v1/origin-requests")
        assert answer.startswith("403 denied by sandbox egress policy: "), (host, answer)
    asked = control(sandbox, "GET", "/v1/origin-requests?state=all").json()["data"]
    assert all(r["origin"] != f"http://{host}:{port}" for r in asked for host in ["gateway", *gateway_ips])


def test_an_idle_guest_browser_raises_no_prompt(docker_client, desktop_image, test_labels):
    """The guest's Firefox, started and left alone in a sandbox in mode ask with the default tiers (ask:
    any origin) for 20 s after its first background request: its background traffic reaches the gateway
    (the positive control) and is refused as quiet; nobody is asked anything."""
    from controller.sandbox import SandboxSpec
    from controller.sandbox.docker import DockerOptions, DockerSandbox

    sandbox = DockerSandbox.start(SandboxSpec(policy={"mode": "ask"}),
                                  DockerOptions(image=desktop_image, extra_labels=test_labels), client=docker_client)
    record_ready(f"sandbox {sandbox.id} (ask, idle browser)", sandbox.timings)
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    with sandbox:
        # the guest's own browser (its policies and preferences), as the desktop user on the guest's display
        pool.submit(sandbox.exec_in_guest, ["env", "DISPLAY=:99", "firefox-esr", "about:blank"], timeout=240)
        wait_for(lambda: sandbox.decision_log() or control(sandbox, "GET", "/v1/origin-requests?state=all").json()[
            "data"], 120, "the browser's background traffic at the gateway")
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            asked = control(sandbox, "GET", "/v1/origin-requests?state=all").json()["data"]
            assert asked == [], [r["origin"] for r in asked]
            time.sleep(1)  # poll interval of a condition wait (no request may appear), bounded by the deadline
        decisions = sandbox.decision_log()
        assert decisions and {d["reason"] for d in decisions} == {"quiet"}, sorted(
            {(d["origin"], d["reason"]) for d in decisions})
    pool.shutdown(wait=False)
