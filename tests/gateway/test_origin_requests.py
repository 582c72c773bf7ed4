"""Origin requests in the real gateway process: mitmproxy with the policy addon and the control API on
127.0.0.1, origin servers on loopback addresses, names resolved from a hosts map (no DNS).

Each origin server records every accepted TCP connection, so "refused" means: 403 AND the server saw
nothing. Pending requests are always picked by origin, never "the first one".
"""

from __future__ import annotations

import concurrent.futures
import http.client
import json
import secrets
import socket
import ssl
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pytest

from tests.conformance.harness import poll
from tests.gateway.conftest import Gateway, RecordingServer, free_port, self_signed_context, start_gateway, start_server

httpx = pytest.importorskip("httpx")

pytestmark = pytest.mark.slow

ALLOWED_ADDRESS = "127.0.0.2"
REFUSED_ADDRESS = "127.0.0.9"


def wait_for(condition: Callable[[], Any], timeout: float = 10.0, what: str = "condition") -> Any:
    """:func:`tests.conformance.harness.poll`: ``condition``'s first truthy value, or a failure after
    ``timeout`` seconds."""
    return poll(condition, timeout=timeout, what=what)


@dataclass
class AskGateway:
    """A gateway with its control API: ``control`` base URL, ``token``, ``hosts`` (the map file)."""

    gateway: Gateway
    control: str
    token: str
    hosts: Path

    @property
    def proxy(self) -> tuple[str, int]:
        return self.gateway.host, self.gateway.port

    def api(self, method: str, path: str, *, token: str | None = None, **kwargs: Any) -> httpx.Response:
        headers = {"Authorization": f"Bearer {self.token if token is None else token}"}
        return httpx.request(method, self.control + path, headers=headers, timeout=10, **kwargs)

    def requests(self, state: str = "all") -> list[dict]:
        response = self.api("GET", f"/v1/origin-requests?state={state}")
        assert response.status_code == 200, response.text
        return response.json()["data"]

    def pending_for(self, origin: str, held: int = 1, timeout: float = 10.0) -> dict:
        """The pending request for ``origin`` once it holds at least ``held`` connections."""
        def find() -> dict | None:
            return next((r for r in self.requests("pending") if r["origin"] == origin and r["held"] >= held), None)

        return wait_for(find, timeout, f"a pending request for {origin} holding {held}")

    def answer(self, request_id: str, decision: str, by: str = "test") -> httpx.Response:
        return self.api("POST", f"/v1/origin-requests/{request_id}/decision", json={"decision": decision, "by": by})

    def decisions(self, origin: str) -> list[dict]:
        return [d for d in self.gateway.decisions() if d["origin"] == origin]

    def set_hosts(self, mapping: dict[str, list[str]]) -> None:
        partial = self.hosts.with_suffix(".partial")
        partial.write_text(json.dumps(mapping))
        partial.replace(self.hosts)


@pytest.fixture
def ask_gateway(tmp_path):
    """``make(policy, hosts)``: a gateway in mode ask (``policy`` adds to ``mode``, ``allow_addresses``:
    127.0.0.2) with its control API on a free 127.0.0.1 port and names resolved from ``hosts``."""
    started: list[Gateway] = []

    def make(policy: dict, hosts: dict[str, list[str]]) -> AskGateway:
        token = secrets.token_urlsafe(24)
        token_file = tmp_path / f"control-token-{len(started)}"
        token_file.write_text(token + "\n")
        hosts_file = tmp_path / f"hosts-{len(started)}.json"
        hosts_file.write_text(json.dumps(hosts))
        port = free_port()
        full = {"mode": "ask", "allow_addresses": [ALLOWED_ADDRESS], **policy}
        gateway = start_gateway(tmp_path, full, ["--control-listen", f"127.0.0.1:{port}", "--control-token-file",
                                                 str(token_file), "--hosts", str(hosts_file)])
        started.append(gateway)
        return AskGateway(gateway, f"http://127.0.0.1:{port}", token, hosts_file)

    yield make
    for gateway in started:
        gateway.process.terminate()
        try:
            gateway.process.wait(timeout=10)
        except Exception:  # noqa: BLE001
            gateway.process.kill()


@pytest.fixture
def origin_server():
    """An HTTP origin on 127.0.0.2 (admitted by the test's address rule), recording every connection."""
    server = start_server("origin", ALLOWED_ADDRESS)
    yield server
    server.server.shutdown()
    server.server.server_close()


def proxy_get(gw: AskGateway, url: str, timeout: float = 30) -> tuple[int, bytes]:
    """Absolute-form GET through the proxy; (status, body)."""
    host = url.split("//", 1)[1].split("/", 1)[0]
    sock = socket.create_connection(gw.proxy, timeout=timeout)
    try:
        sock.sendall(f"GET {url} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
        response = http.client.HTTPResponse(sock, method="GET")
        response.begin()
        return response.status, response.read()
    finally:
        sock.close()


def connect(gw: AskGateway, authority: str, timeout: float = 30) -> tuple[int, bytes, socket.socket]:
    """CONNECT through the proxy: (status, body of a refusal, socket after the response head)."""
    sock = socket.create_connection(gw.proxy, timeout=timeout)
    sock.sendall(f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode())
    response = http.client.HTTPResponse(sock, method="CONNECT")
    response.begin()
    body = response.read() if response.status != 200 else b""
    return response.status, body, sock


def tls_get(sock: socket.socket, name: str, cert: Path) -> tuple[int, bytes]:
    """GET / over TLS inside an open tunnel, verifying ``name`` against ``cert``."""
    context = ssl.create_default_context(cafile=str(cert))
    with context.wrap_socket(sock, server_hostname=name) as tls:
        tls.sendall(f"GET / HTTP/1.1\r\nHost: {name}\r\nConnection: close\r\n\r\n".encode())
        response = http.client.HTTPResponse(tls, method="GET")
        response.begin()
        return response.status, response.read()


def in_background(fn: Callable[..., Any], *args: Any) -> concurrent.futures.Future:
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    future = pool.submit(fn, *args)
    pool.shutdown(wait=False)
    return future


# ------------------------------------------------------------------------------------------ answers


def test_approve_resumes_the_held_tunnel_to_the_checked_address(ask_gateway, tmp_path):
    context, cert = self_signed_context(tmp_path, "ask.test")
    server = start_server("tls-origin", ALLOWED_ADDRESS, context)
    try:
        origin = f"https://ask.test:{server.port}"
        gw = ask_gateway({"ask": [origin], "hold_timeout_s": 10}, {"ask.test": [ALLOWED_ADDRESS]})

        def client() -> tuple[int, bytes]:
            status, _body, sock = connect(gw, f"ask.test:{server.port}")
            assert status == 200
            return tls_get(sock, "ask.test", cert)

        result = in_background(client)
        request = gw.pending_for(origin)
        assert request["via"] == "CONNECT" and request["state"] == "pending" and request["id"].startswith("oreq_")
        assert server.hits == [], "nothing may reach the origin before the answer"
        assert gw.answer(request["id"], "approve", "terminal").status_code == 202
        assert result.result(timeout=20) == (200, b"tls-origin /")
        assert len(server.hits) == 1
        [line] = gw.decisions(origin)
        assert line["decision"] == "allow" and line["reason"] == "approved"
        assert line["request_id"] == request["id"] and line["address"] == ALLOWED_ADDRESS
        assert isinstance(line["held_ms"], int) and line["held_ms"] >= 0
        done = gw.api("GET", f"/v1/origin-requests/{request['id']}").json()
        assert (done["state"], done["by"], done["held"]) == ("approved", "terminal", 0)
        assert done["decided_at"] is not None
        # remembered: the next tunnel passes without a request
        status, _body, sock = connect(gw, f"ask.test:{server.port}")
        assert status == 200 and tls_get(sock, "ask.test", cert)[0] == 200
        assert gw.decisions(origin)[-1]["reason"] == "approved_earlier"
        assert gw.decisions(origin)[-1]["request_id"] == request["id"]
        assert len(gw.requests("all")) == 1
    finally:
        server.server.shutdown()
        server.server.server_close()


def test_deny_refuses_and_is_remembered(ask_gateway, origin_server):
    origin = f"http://ask.test:{origin_server.port}"
    gw = ask_gateway({"ask": [origin], "hold_timeout_s": 10}, {"ask.test": [ALLOWED_ADDRESS]})
    result = in_background(proxy_get, gw, f"{origin}/page")
    request = gw.pending_for(origin)
    assert request["via"] == "http"
    assert gw.answer(request["id"], "deny").status_code == 202
    assert result.result(timeout=20) == (403, b"denied by sandbox egress policy: user_denied\n")
    # the next attempt is refused at once, without a new request
    assert proxy_get(gw, f"{origin}/again") == (403, b"denied by sandbox egress policy: denied_earlier\n")
    assert origin_server.hits == []
    assert [r["id"] for r in gw.requests("all")] == [request["id"]]
    assert [(d["reason"], d.get("request_id")) for d in gw.decisions(origin)] == [
        ("user_denied", request["id"]), ("denied_earlier", request["id"])]


def test_cancel_refuses_the_held_connection_only_and_asks_again(ask_gateway, origin_server):
    origin = f"http://ask.test:{origin_server.port}"
    gw = ask_gateway({"ask": [origin], "hold_timeout_s": 10}, {"ask.test": [ALLOWED_ADDRESS]})
    result = in_background(proxy_get, gw, f"{origin}/")
    first = gw.pending_for(origin)
    assert gw.answer(first["id"], "cancel", "console").status_code == 202
    assert result.result(timeout=20) == (403, b"denied by sandbox egress policy: cancelled\n")
    again = in_background(proxy_get, gw, f"{origin}/")
    second = gw.pending_for(origin)
    assert second["id"] != first["id"]
    assert gw.answer(second["id"], "approve").status_code == 202
    assert again.result(timeout=20)[0] == 200
    assert len(origin_server.hits) == 1
    assert [d["reason"] for d in gw.decisions(origin)] == ["cancelled", "approved"]


def test_no_answer_is_a_deny_by_timeout_and_a_late_answer_is_409(ask_gateway, origin_server):
    origin = f"http://ask.test:{origin_server.port}"
    gw = ask_gateway({"ask": [origin], "hold_timeout_s": 1}, {"ask.test": [ALLOWED_ADDRESS]})
    started = time.monotonic()
    status, body = proxy_get(gw, f"{origin}/")
    assert (status, body) == (403, b"denied by sandbox egress policy: timeout\n")
    assert 0.9 <= time.monotonic() - started < 10
    [request] = gw.requests("all")
    assert request["state"] == "timeout" and request["by"] is None
    for decision in ("approve", "deny", "cancel"):
        late = gw.answer(request["id"], decision)
        assert late.status_code == 409 and late.json()["error"]["code"] == "expired"
    assert origin_server.hits == []
    [line] = gw.decisions(origin)
    assert line["reason"] == "timeout" and line["held_ms"] >= 900
    # a timeout is not remembered: the next attempt asks again
    result = in_background(proxy_get, gw, f"{origin}/")
    assert gw.pending_for(origin)["id"] != request["id"]
    assert result.result(timeout=20)[0] == 403


def test_ten_parallel_connections_make_one_request_and_approve_resumes_all(ask_gateway, origin_server):
    origin = f"http://ask.test:{origin_server.port}"
    gw = ask_gateway({"ask": [origin], "hold_timeout_s": 20}, {"ask.test": [ALLOWED_ADDRESS]})
    with concurrent.futures.ThreadPoolExecutor(max_workers=10) as pool:
        results = [pool.submit(proxy_get, gw, f"{origin}/{n}") for n in range(10)]
        request = gw.pending_for(origin, held=10)
        assert len(gw.requests("all")) == 1
        assert gw.answer(request["id"], "approve").status_code == 202
        answers = sorted(r.result(timeout=30) for r in results)
    assert answers == sorted((200, f"origin /{n}".encode()) for n in range(10))
    assert len(origin_server.hits) == 10
    lines = gw.decisions(origin)
    assert len(lines) == 10 and {(d["reason"], d["request_id"]) for d in lines} == {("approved", request["id"])}


def test_a_client_that_gives_up_is_logged_and_the_request_stays_pending(ask_gateway, origin_server):
    origin = f"http://ask.test:{origin_server.port}"
    gw = ask_gateway({"ask": [origin], "hold_timeout_s": 10}, {"ask.test": [ALLOWED_ADDRESS]})
    sock = socket.create_connection(gw.proxy, timeout=10)
    sock.sendall(f"GET {origin}/ HTTP/1.1\r\nHost: ask.test:{origin_server.port}\r\n\r\n".encode())
    request = gw.pending_for(origin)
    sock.close()
    wait_for(lambda: [d for d in gw.decisions(origin) if d["reason"] == "client_gone"], what="client_gone")
    still = gw.api("GET", f"/v1/origin-requests/{request['id']}").json()
    assert still["state"] == "pending" and still["held"] == 0
    assert gw.answer(request["id"], "approve").status_code == 202
    assert proxy_get(gw, f"{origin}/")[0] == 200
    assert [d["reason"] for d in gw.decisions(origin)] == ["client_gone", "approved_earlier"]


# ------------------------------------------------------------------------------------- tiers, limits


def test_refused_addresses_stay_refused_even_after_an_approval(ask_gateway, origin_server):
    port = origin_server.port
    origin = f"http://ask.test:{port}"
    refused_server = start_server("refused", REFUSED_ADDRESS, port=port)  # the same port on a refused address
    try:
        _refused_addresses_stay_refused(ask_gateway, origin, refused_server)
    finally:
        refused_server.server.shutdown()
        refused_server.server.server_close()


def _refused_addresses_stay_refused(ask_gateway, origin: str, refused_server: RecordingServer) -> None:
    gw = ask_gateway({"ask": ["*"], "hold_timeout_s": 10},
                     {"ask.test": [ALLOWED_ADDRESS], "bad.test": [REFUSED_ADDRESS],
                      "mixed.test": [ALLOWED_ADDRESS, REFUSED_ADDRESS]})
    # a name that resolves to a refused address is refused at once: nobody is asked
    for name in ("bad.test", "mixed.test"):
        assert proxy_get(gw, f"http://{name}:{refused_server.port}/")[0] == 403
    assert proxy_get(gw, f"http://{REFUSED_ADDRESS}:{refused_server.port}/")[0] == 403
    assert gw.requests("all") == []
    result = in_background(proxy_get, gw, f"{origin}/")
    assert gw.answer(gw.pending_for(origin)["id"], "approve").status_code == 202
    assert result.result(timeout=20)[0] == 200
    # the approved name now resolves to a refused address (rebinding): still refused
    gw.set_hosts({"ask.test": [REFUSED_ADDRESS]})
    status, body = proxy_get(gw, f"{origin}/")
    assert status == 403 and body.startswith(b"denied by sandbox egress policy: address_refused")
    assert refused_server.hits == []
    denied = [d for d in gw.gateway.decisions() if d["decision"] == "deny"]
    assert [d["reason"] for d in denied] == ["address_refused"] * 4
    assert all(d["detail"].startswith(f"{REFUSED_ADDRESS} (") for d in denied)


def test_the_gateways_own_ports_are_refused_whatever_the_rules_say(ask_gateway):
    gw = ask_gateway({"ask": ["*"], "allow_addresses": ["127.0.0.0/8"], "hold_timeout_s": 10}, {})
    control_port = int(gw.control.rsplit(":", 1)[1])
    for port in (control_port, gw.gateway.port):
        status, body, sock = connect(gw, f"127.0.0.1:{port}")
        sock.close()
        assert status == 403 and b"address_refused" in body
        status, body = proxy_get(gw, f"http://127.0.0.1:{port}/v1/origin-requests")
        assert status == 403 and b"address_refused" in body
    assert gw.requests("all") == []
    refusals = [d for d in gw.gateway.decisions() if d["reason"] == "address_refused"]
    assert len(refusals) == 4 and all("own endpoint" in d["detail"] for d in refusals)


def test_quiet_origins_are_refused_without_a_request(ask_gateway, origin_server):
    origin = f"http://quiet.test:{origin_server.port}"
    gw = ask_gateway({"quiet": [origin], "hold_timeout_s": 10}, {"quiet.test": [ALLOWED_ADDRESS]})
    assert proxy_get(gw, f"{origin}/") == (403, b"denied by sandbox egress policy: quiet\n")
    assert gw.requests("all") == [] and origin_server.hits == []


def test_the_default_quiet_list_covers_the_browsers_background_hosts(ask_gateway):
    gw = ask_gateway({"hold_timeout_s": 10}, {"firefox.settings.services.mozilla.com": [ALLOWED_ADDRESS]})
    status, body, sock = connect(gw, "firefox.settings.services.mozilla.com:443")
    sock.close()
    assert (status, body) == (403, b"denied by sandbox egress policy: quiet\n")
    assert gw.requests("all") == []


def test_more_unknown_origins_than_max_pending_are_refused_as_prompt_limit(ask_gateway, origin_server):
    port = origin_server.port
    gw = ask_gateway({"ask": [f"http://*.ask.test:{port}"], "max_pending": 1, "hold_timeout_s": 10},
                     {"a.ask.test": [ALLOWED_ADDRESS], "b.ask.test": [ALLOWED_ADDRESS]})
    first = in_background(proxy_get, gw, f"http://a.ask.test:{port}/")
    request = gw.pending_for(f"http://a.ask.test:{port}")
    assert proxy_get(gw, f"http://b.ask.test:{port}/") == (403, b"denied by sandbox egress policy: prompt_limit\n")
    second = in_background(proxy_get, gw, f"http://a.ask.test:{port}/")  # the same origin still joins
    gw.pending_for(f"http://a.ask.test:{port}", held=2)
    assert [r["origin"] for r in gw.requests("all")] == [f"http://a.ask.test:{port}"]
    assert gw.answer(request["id"], "deny").status_code == 202
    assert first.result(timeout=20)[0] == second.result(timeout=20)[0] == 403
    assert origin_server.hits == []


def test_wildcards_match_whole_labels_only(ask_gateway, origin_server):
    port = origin_server.port
    names = ["a.ask.test", "x.y.ask.test", "ask.test", "badask.test", "ask.test.evil.test"]
    gw = ask_gateway({"ask": [f"http://*.ask.test:{port}"], "hold_timeout_s": 10, "max_pending": 5},
                     {name: [ALLOWED_ADDRESS] for name in names})
    for name in ("ask.test", "badask.test", "ask.test.evil.test"):
        assert proxy_get(gw, f"http://{name}:{port}/") == (403, b"denied by sandbox egress policy: policy\n"), name
    assert proxy_get(gw, f"https://a.ask.test:{port}/")[0] == 403  # another scheme
    held = [in_background(proxy_get, gw, f"http://{name}:{port}/") for name in ("a.ask.test", "x.y.ask.test")]
    for name in ("a.ask.test", "x.y.ask.test"):
        assert gw.answer(gw.pending_for(f"http://{name}:{port}")["id"], "deny").status_code == 202
    assert [h.result(timeout=20)[0] for h in held] == [403, 403]
    assert sorted(r["origin"] for r in gw.requests("all")) == [f"http://a.ask.test:{port}",
                                                                f"http://x.y.ask.test:{port}"]
    assert origin_server.hits == []


# --------------------------------------------------------------------------------------- control API


def test_every_endpoint_needs_the_token(ask_gateway, origin_server):
    origin = f"http://ask.test:{origin_server.port}"
    gw = ask_gateway({"ask": [origin], "hold_timeout_s": 10}, {"ask.test": [ALLOWED_ADDRESS]})
    result = in_background(proxy_get, gw, f"{origin}/")
    request = gw.pending_for(origin)
    calls = [("GET", "/v1/origin-requests", {}), ("GET", "/v1/origin-requests?state=all", {}),
             ("GET", f"/v1/origin-requests/{request['id']}", {}), ("GET", "/v1/origin-requests/events", {}),
             ("POST", f"/v1/origin-requests/{request['id']}/decision", {"json": {"decision": "approve", "by": "x"}}),
             ("GET", "/nothing-here", {})]
    for token in ("", "wrong", gw.token + "x", gw.token[:-1]):
        for method, path, kwargs in calls:
            response = httpx.request(method, gw.control + path, timeout=10,
                                     headers={"Authorization": f"Bearer {token}"} if token else {}, **kwargs)
            assert response.status_code == 401, (token, path)
            assert response.json()["error"]["code"] == "unauthorized"
            assert response.headers["www-authenticate"] == "Bearer"
    response = httpx.get(gw.control + "/v1/origin-requests", headers={"Authorization": gw.token}, timeout=10)
    assert response.status_code == 401  # without the Bearer scheme
    assert gw.api("GET", f"/v1/origin-requests/{request['id']}").json()["state"] == "pending"
    assert gw.answer(request["id"], "deny").status_code == 202
    assert result.result(timeout=20)[0] == 403


def test_answers_follow_the_contract(ask_gateway, origin_server):
    origin = f"http://ask.test:{origin_server.port}"
    gw = ask_gateway({"ask": [origin], "hold_timeout_s": 10}, {"ask.test": [ALLOWED_ADDRESS]})
    result = in_background(proxy_get, gw, f"{origin}/")
    request = gw.pending_for(origin)
    path = f"/v1/origin-requests/{request['id']}/decision"
    malformed = [b"", b"not json", b"[]", b'{"decision": "approve"}', b'{"decision": "yes", "by": "t"}',
                 b'{"decision": "approve", "by": ""}', b'{"decision": "approve", "by": 5}',
                 b'{"decision": "approve", "by": "t", "extra": 1}', b'{"decision": "approve", "by": "a\\u001bb"}',
                 b'{"decision": true, "by": "t"}', b'{"decision": "approve", "by": "' + b"x" * 5000 + b'"}',
                 # Strict JSON: a duplicate key (last-wins parsers would read "approve"), nesting deeper
                 # than the parser goes, non-JSON numbers.
                 b'{"decision": "deny", "decision": "approve", "by": "t"}', b"[" * 3000,
                 b'{"decision": ' + b"[" * 3000, b'{"decision": "approve", "by": "t", "n": NaN}']
    for body in malformed:
        response = gw.api("POST", path, content=body)
        assert response.status_code == 400 and response.json()["error"]["code"] == "invalid_answer", body
    assert gw.api("GET", f"/v1/origin-requests/{request['id']}").json()["state"] == "pending"
    unknown = gw.answer("oreq_" + "A" * 22, "approve")
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "unknown_request"
    missing = gw.api("GET", "/v1/origin-requests/oreq_nope")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "unknown_request"
    bad_state = gw.api("GET", "/v1/origin-requests?state=weird")
    assert bad_state.status_code == 400
    first = gw.answer(request["id"], "approve", "terminal")
    assert (first.status_code, first.json()) == (202, {})
    assert gw.answer(request["id"], "approve", "console").status_code == 202  # the same answer again
    for other in ("deny", "cancel"):
        conflict = gw.answer(request["id"], other)
        assert conflict.status_code == 409 and conflict.json()["error"]["code"] == "already_decided"
    assert result.result(timeout=20)[0] == 200
    final = gw.api("GET", f"/v1/origin-requests/{request['id']}").json()
    assert (final["state"], final["by"]) == ("approved", "terminal")
    assert set(final) == {"id", "origin", "reason", "via", "held", "created_at", "deadline_at", "state", "by",
                          "decided_at"}
    assert final["created_at"].endswith("+00:00") and final["deadline_at"] > final["created_at"]
    listing = gw.api("GET", "/v1/origin-requests?state=all").json()
    assert listing["seq"] == 2 and [r["id"] for r in listing["data"]] == [request["id"]]
    assert gw.api("GET", "/v1/origin-requests").json() == {"seq": 2, "data": []}


def read_events(lines: Any, count: int) -> list[dict]:
    """The next ``count`` events (``{"event", "id", "data"}``; comments skipped) from ``lines`` (an SSE
    response's ``iter_lines()``)."""
    events: list[dict] = []
    current: dict = {}
    for line in lines:
        if line.startswith(":"):
            continue
        if not line:
            if current:
                events.append(current)
                current = {}
                if len(events) == count:
                    return events
            continue
        key, _, value = line.partition(": ")
        current[key] = json.loads(value) if key == "data" else value
    raise AssertionError(f"stream ended after {events}")


def test_event_stream_snapshot_then_events_and_replay_after_reconnect(ask_gateway, origin_server):
    origin = f"http://ask.test:{origin_server.port}"
    gw = ask_gateway({"ask": [origin], "hold_timeout_s": 10}, {"ask.test": [ALLOWED_ADDRESS]})
    headers = {"Authorization": f"Bearer {gw.token}"}
    url = gw.control + "/v1/origin-requests/events"
    with httpx.stream("GET", url, headers=headers, timeout=20) as stream:
        assert stream.status_code == 200 and stream.headers["content-type"].startswith("text/event-stream")
        lines = stream.iter_lines()
        [snapshot] = read_events(lines, 1)
        assert snapshot["event"] == "snapshot" and snapshot["data"] == {"seq": 0, "pending": []}
        result = in_background(proxy_get, gw, f"{origin}/")
        [created] = read_events(lines, 1)
        assert created["event"] == "created" and created["id"] == "1"
        assert created["data"]["origin"] == origin and created["data"]["state"] == "pending"
    request_id = created["data"]["id"]
    assert gw.answer(request_id, "deny").status_code == 202  # while nobody watches
    assert result.result(timeout=20)[0] == 403
    with httpx.stream("GET", url, headers={**headers, "Last-Event-ID": "1"}, timeout=20) as stream:
        [replayed] = read_events(stream.iter_lines(), 1)
    assert replayed["event"] == "resolved" and replayed["id"] == "2"
    assert replayed["data"]["id"] == request_id and replayed["data"]["state"] == "denied"
    # An id the gateway never gave, or not one in ASCII digits (str.isdigit() holds for superscripts and
    # other scripts' digits, which int() refuses): a fresh snapshot.
    for stale in ("999", "junk", "\u00b2", "\u0665", "1\u00b9", "-1", "9" * 30):
        with httpx.stream("GET", url, headers={**headers, "Last-Event-ID": stale.encode("latin-1", "ignore")
                                               if stale.isascii() or ord(max(stale)) < 256 else stale.encode()},
                          timeout=20) as stream:
            assert stream.status_code == 200, stale
            [fresh] = read_events(stream.iter_lines(), 1)
        assert fresh["event"] == "snapshot" and fresh["data"] == {"seq": 2, "pending": []} and fresh["id"] == "2"


def test_a_gateway_stopped_with_held_connections_writes_a_line_for_each(ask_gateway, origin_server):
    """The gateway stopped (SIGTERM) while connections wait for an answer -- two plain-HTTP requests on one
    origin's request, a CONNECT on another's: each is refused and has its decision line, a deny naming
    the stop with its request id and how long it was held, so the record sees every connection end."""
    port = origin_server.port
    plain, tunnel = f"http://ask.test:{port}", f"https://tunnel.test:{port}"
    gw = ask_gateway({"ask": [plain, tunnel], "hold_timeout_s": 60},
                     {"ask.test": [ALLOWED_ADDRESS], "tunnel.test": [ALLOWED_ADDRESS]})
    held = [in_background(proxy_get, gw, f"{plain}/{n}") for n in range(2)]
    held.append(in_background(lambda: connect(gw, f"tunnel.test:{port}")[:2]))
    ids = {plain: gw.pending_for(plain, held=2)["id"], tunnel: gw.pending_for(tunnel)["id"]}
    gw.gateway.process.terminate()
    gw.gateway.process.wait(timeout=20)
    assert [future.result(timeout=20)[0] for future in held] == [403, 403, 403]
    assert origin_server.hits == []
    lines = [d for d in gw.gateway.decisions() if d["origin"] in ids]
    assert sorted((d["origin"], d["decision"], d["reason"], d["request_id"]) for d in lines) == sorted(
        [(plain, "deny", "gateway_stopped", ids[plain])] * 2 + [(tunnel, "deny", "gateway_stopped", ids[tunnel])])
    assert all(d["held_ms"] >= 0 and d["client"] for d in lines)
