"""The VM backend's host-side gateway with its control API (started as the backend starts it; no QEMU)."""

from __future__ import annotations

import http.client
import json
import os
import socket

import pytest

from controller.gateway import gateway_python
from tests.require import unavailable

httpx = pytest.importorskip("httpx")

pytestmark = pytest.mark.slow


def test_the_vm_gateway_serves_its_control_api_on_the_hosts_loopback_only(tmp_path):
    if gateway_python() is None:
        unavailable("GATEWAY", "mitmproxy is not installed; set DESKTOP_SANDBOX_GATEWAY_PYTHON or create "
                    "build/gateway-venv (make deps)")
    from controller.sandbox.vm import VMSandbox
    from controller.sandbox.vm_process import _stop_group

    workdir = tmp_path / "private"
    workdir.mkdir(mode=0o700)
    policy = workdir / "policy.json"
    policy.write_text(json.dumps({"mode": "ask", "allow_addresses": ["127.0.0.0/8"]}))
    sandbox = VMSandbox("dv-0123abcd", workdir)
    assert sandbox.gateway_control_url is None and sandbox.gateway_control_token is None
    try:
        proxy_port = sandbox._start_gateway(policy)
        port = sandbox.gateway_control_port
        assert sandbox.gateway_control_url == f"http://127.0.0.1:{port}" and port != proxy_port
        token = sandbox.gateway_control_token
        assert token and token != sandbox.agent_token
        assert (workdir / "control-token").stat().st_mode & 0o777 == 0o600
        assert (workdir / "control-token").read_text() == token
        answer = httpx.get(sandbox.gateway_control_url + "/v1/origin-requests",
                           headers={"Authorization": f"Bearer {token}"}, timeout=10)
        assert (answer.status_code, answer.json()) == (200, {"seq": 0, "data": []})
        assert httpx.get(sandbox.gateway_control_url + "/v1/origin-requests", timeout=10).status_code == 401
        # only on loopback: not on the host's other addresses
        for address in {a[4][0] for a in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)}:
            if not address.startswith("127."):
                with pytest.raises(OSError):
                    socket.create_connection((address, port), timeout=2).close()
        # the proxy never connects to it, whatever the address rules say
        sock = socket.create_connection(("127.0.0.1", proxy_port), timeout=10)
        try:
            sock.sendall(f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
            response = http.client.HTTPResponse(sock, method="CONNECT")
            response.begin()
            assert response.status == 403 and b"address_refused" in response.read()
        finally:
            sock.close()
    finally:
        _stop_group(sandbox.gateway)
    assert os.path.exists(workdir / "decisions.jsonl")
