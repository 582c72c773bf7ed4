"""The connection rules (``wire.connections``) of the gateway's control API, in the real gateway process
(mitmproxy and the control API on one event loop) with a low descriptor limit: a flood of connections
that never finish their request head leaves the API answering a client with the token at once and is
closed by the head deadline; a ``Host`` that does not name the API is refused before the token."""

from __future__ import annotations

import json
import secrets
import time
from typing import Iterator

import httpx
import pytest

from tests.gateway.conftest import Gateway, free_port, start_gateway
from tests.slow_clients import FLOOD, LOW_LIMIT, Unfinished, descriptors, limit_descriptors, raw_request

pytestmark = pytest.mark.slow

ANSWER_S = 5.0
"""Longest a request with the token may take while the flood is held (seconds)."""


class Control:
    def __init__(self, gateway: Gateway, port: int, token: str) -> None:
        self.gateway, self.port, self.token = gateway, port, token
        self.url = f"http://127.0.0.1:{port}/v1/origin-requests"

    def listing(self) -> httpx.Response:
        return httpx.get(self.url, headers={"Authorization": f"Bearer {self.token}"}, timeout=ANSWER_S)


@pytest.fixture(scope="module")
def control(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Control]:
    tmp = tmp_path_factory.mktemp("control")
    token = secrets.token_urlsafe(24)
    (tmp / "token").write_text(token + "\n")
    port = free_port()
    gateway = start_gateway(tmp, {"mode": "ask"}, ["--control-listen", f"127.0.0.1:{port}",
                                                   "--control-token-file", str(tmp / "token")])
    try:
        yield Control(gateway, port, token)
    finally:
        gateway.process.terminate()
        try:
            gateway.process.wait(timeout=10)
        except Exception:  # noqa: BLE001
            gateway.process.kill()


def test_unfinished_connections_past_the_descriptor_limit_leave_the_control_api_answering(control):
    pid = control.gateway.process.pid
    assert control.listing().status_code == 200
    limit_descriptors(pid)
    flood = Unfinished(("127.0.0.1", control.port), FLOOD)
    try:
        held = descriptors(pid)
        started = time.monotonic()
        answer = control.listing()
        assert answer.status_code == 200, answer.text
        assert time.monotonic() - started < ANSWER_S
        assert held < LOW_LIMIT, f"{held} descriptors open under a limit of {LOW_LIMIT}"
        closed = flood.wait_all_closed()
        assert closed == FLOOD, f"{closed} of {FLOOD} unfinished connections closed by the head deadline"
        assert control.listing().status_code == 200
    finally:
        flood.close()


@pytest.mark.parametrize("hosts", [
    pytest.param(["evil.example:{port}"], id="another-name"),
    pytest.param(["127.0.0.1.nip.io:{port}"], id="a-name-resolving-to-loopback"),
    pytest.param([""], id="empty"),
    pytest.param(["127.0.0.1:{port}", "evil.example:{port}"], id="two-host-headers"),
    pytest.param(["localhost:{other}"], id="another-port"),
])
def test_a_host_that_does_not_name_the_control_api_is_refused_before_the_token(control, hosts):
    headers = [("Host", h.format(port=control.port, other=control.port + 1)) for h in hosts]
    status, body = raw_request(("127.0.0.1", control.port), "GET", "/v1/origin-requests",
                               headers + [("Authorization", f"Bearer {control.token}")])
    assert 400 <= status < 500, (status, body)
    error = json.loads(body)["error"]
    assert error["code"] in ("bad_host", "bad_request") and error["message"], error


def test_the_control_api_answers_its_address_and_localhost(control):
    for name in ("127.0.0.1", "localhost"):
        status, body = raw_request(("127.0.0.1", control.port), "GET", "/v1/origin-requests",
                                   [("Host", f"{name}:{control.port}"), ("Authorization", f"Bearer {control.token}")])
        assert status == 200, body
