"""guest/netprobe.py against real loopback sockets, and the audit's pure helpers."""

from __future__ import annotations

import io
import json
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from controller.audit import DENY_BODY, _proxy_refused, ip_forms, through_proxy
from controller.gateway.policy import parse_ip_literal
from guest import netprobe

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def tcp_listener():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    yield sock.getsockname()[1]
    sock.close()


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_tcp_connected_and_refused(tcp_listener):
    [ok, refused] = netprobe.run([
        {"name": "a", "kind": "tcp", "host": "127.0.0.1", "port": tcp_listener},
        {"name": "b", "kind": "tcp", "host": "127.0.0.1", "port": closed_port()},
    ])
    assert (ok["name"], ok["observed"]) == ("a", "connected")
    assert refused["observed"] == "refused"


def test_udp_reply_and_no_reply():
    echo = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    echo.bind(("127.0.0.1", 0))

    def serve():
        data, peer = echo.recvfrom(100)
        echo.sendto(b"pong:" + data, peer)

    threading.Thread(target=serve, daemon=True).start()
    silent = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    silent.bind(("127.0.0.1", 0))
    try:
        results = netprobe.run([
            {"name": "echo", "kind": "udp", "host": "127.0.0.1", "port": echo.getsockname()[1]},
            {"name": "silent", "kind": "udp", "host": "127.0.0.1", "port": silent.getsockname()[1], "timeout": 0.3},
        ])
    finally:
        echo.close()
        silent.close()
    assert results[0]["observed"] == "reply" and results[0]["detail"] == "pong:netprobe"
    assert results[1]["observed"] == "no-reply"


def test_dns_query_against_a_local_resolver_and_its_silence():
    server = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    server.bind(("127.0.0.1", 0))
    seen: list[bytes] = []

    def serve():
        query, peer = server.recvfrom(512)
        seen.append(query)
        ident = query[:2]
        question = query[12:]
        answer = b"\xc0\x0c" + struct.pack(">HHIH", 1, 1, 60, 4) + socket.inet_aton("192.0.2.7")
        server.sendto(ident + struct.pack(">HHHHH", 0x8180, 1, 1, 0, 0) + question + answer, peer)

    threading.Thread(target=serve, daemon=True).start()
    try:
        [result] = netprobe.run([{"name": "q", "kind": "dns", "server": "127.0.0.1",
                                  "port": server.getsockname()[1], "qname": "x.canary.audit.test"}])
    finally:
        server.close()
    assert result["observed"] == "answer" and result["detail"] == ["192.0.2.7"]
    assert b"\x06canary\x05audit\x04test\x00" in seen[0]
    [silent] = netprobe.run([{"name": "q", "kind": "dns", "server": "127.0.0.1", "port": closed_port(),
                              "qname": "x.audit.test", "transport": "tcp"}])
    assert silent["observed"] == "refused"


def test_resolve_and_scan(tcp_listener):
    results = netprobe.run([
        {"name": "r", "kind": "resolve", "host": "localhost"},
        {"name": "n", "kind": "resolve", "host": "no-such-name.invalid"},
        {"name": "s", "kind": "scan", "host": "127.0.0.1", "ports": [[tcp_listener, tcp_listener], [1, 3]]},
    ])
    assert results[0]["observed"] == "resolved"
    assert results[1]["observed"] == "failed"
    assert results[2]["observed"] == f"open:{tcp_listener}" and results[2]["detail"]["scanned"] == 4


def test_unknown_kind_is_an_error_observation_and_cli_prints_json():
    out = subprocess.run(
        [sys.executable, "-c", (REPO / "guest" / "netprobe.py").read_text(),
         json.dumps([{"name": "x", "kind": "nope"}, {"name": "v6", "kind": "ipv6"}])],
        capture_output=True, text=True, check=True,
    )
    data = json.loads(out.stdout)
    assert data["results"][0]["observed"] == "error"
    # This machine's own IPv6 state, read independently: "on" with any address or any route off loopback.
    addresses = _proc_lines("/proc/net/if_inet6")
    routes = [line for line in _proc_lines("/proc/net/ipv6_route") if line.split()[-1] != "lo"]
    ipv6 = data["results"][1]
    assert ipv6["observed"] == ("ipv6-on" if addresses or routes else "ipv6-off"), ipv6
    assert ipv6["detail"]["addresses"] == [line.split()[0] for line in addresses]
    assert ipv6["detail"]["routes"] == len(routes)


def _proc_lines(path: str) -> list[str]:
    try:
        return [line for line in Path(path).read_text().splitlines() if line.strip()]
    except OSError:
        return []


#: A /proc/net/ipv6_route line: the route to ::1 on the loopback device.
LO_ROUTE = ("00000000000000000000000000000001 80 " + "0" * 32 + " 00 " + "0" * 32
            + " 00000000 00000002 00000000 80200001 lo\n")


@pytest.mark.parametrize("files, expected", [
    ({}, "ipv6-off"),  # a kernel without IPv6: no such files
    ({"/proc/net/if_inet6": "", "/proc/net/ipv6_route": LO_ROUTE}, "ipv6-off"),
    ({"/proc/net/if_inet6": "00000000000000000000000000000001 01 80 10 80 lo\n", "/proc/net/ipv6_route": ""},
     "ipv6-on"),
    ({"/proc/net/if_inet6": "", "/proc/net/ipv6_route": LO_ROUTE + LO_ROUTE.replace(" lo", " eth0")}, "ipv6-on"),
])
def test_ipv6_is_off_only_without_any_address_or_route_off_loopback(monkeypatch, files, expected):
    def fake_open(path, *args, **kwargs):
        if path not in files:
            raise FileNotFoundError(path)
        return io.StringIO(files[path])

    monkeypatch.setattr(netprobe, "open", fake_open, raising=False)
    [result] = netprobe.run([{"name": "v6", "kind": "ipv6"}])
    assert result["observed"] == expected, result


@pytest.mark.parametrize("address", ["169.254.169.254", "127.0.0.1", "172.23.0.3", "10.1.2.3"])
def test_ip_forms_all_name_the_same_address(address):
    forms = ip_forms(address)
    assert len(set(forms)) == len(forms) >= 8
    for form in forms:
        parsed = parse_ip_literal(form)
        unmapped = parsed.ipv4_mapped if parsed.version == 6 else parsed
        assert str(unmapped) == address, form


def test_proxy_verdicts():
    denied = {"hops": [{"status": 403, "body": DENY_BODY + "deny-all\n"}]}
    assert _proxy_refused("status:403", denied) and not through_proxy("status:403", denied)
    upstream_403 = {"hops": [{"status": 403, "body": "Forbidden by the site"}]}
    assert through_proxy("status:403", upstream_403)
    assert through_proxy("status:502", {"hops": [{"status": 502, "body": "bad gateway"}]})
    assert through_proxy("tls-established", "TLSv1.3")
    assert not through_proxy("refused", "proxy down")
    assert _proxy_refused("status:400", {"hops": [{"status": 400, "body": ""}]})


class FakeProxy:
    """A loopback stand-in for the gateway: records each request head it gets and answers it with
    ``reply(head)`` (None: no answer). A CONNECT gets ``connect_answer``; after a 200 the request inside
    the tunnel is answered by ``reply`` too."""

    def __init__(self, reply, connect_answer: bytes = b"HTTP/1.1 200 Connection established\r\n\r\n") -> None:
        self.reply = reply
        self.connect_answer = connect_answer
        self.received: list[bytes] = []
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        self.done = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while not self.done.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        data = b""
        conn.settimeout(10)
        try:
            while b"\r\n\r\n" not in data:
                chunk = conn.recv(4096)
                if not chunk:
                    return
                data += chunk
            if data.startswith(b"CONNECT "):
                conn.sendall(self.connect_answer)
                self.received.append(data)
                if not self.connect_answer.startswith(b"HTTP/1.1 200 "):
                    self.done.wait(10)
                    return
                data = b""
                while b"\r\n\r\n" not in data:
                    chunk = conn.recv(4096)
                    if not chunk:
                        return
                    data += chunk
            self.received.append(data)
            answer = self.reply(data)
            if answer is not None:
                conn.sendall(answer)
            self.done.wait(10)
        except OSError:
            pass
        finally:
            conn.close()

    def close(self) -> None:
        self.done.set()
        self.sock.close()


def _ok(body: bytes = b"ok"):
    return lambda _data: b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)


@pytest.mark.parametrize("host, lines", [
    (None, [b"Host: allowed.test:8080"]),
    ("denied.test:8080", [b"Host: denied.test:8080"]),
    (["allowed.test:8080", "denied.test:8080"], [b"Host: allowed.test:8080", b"Host: denied.test:8080"]),
    ([], []),
])
def test_http_probe_sends_the_host_lines_it_is_given(host, lines):
    proxy = FakeProxy(_ok())
    try:
        spec = {"name": "h", "kind": "http", "proxy_host": "127.0.0.1", "proxy_port": proxy.port,
                "url": "http://allowed.test:8080/x", **({} if host is None else {"host": host})}
        [result] = netprobe.run([spec])
    finally:
        proxy.close()
    assert result["observed"] == "status:200" and result["detail"]["hops"][0]["body"] == "ok", result
    [request] = proxy.received
    head = request.split(b"\r\n")
    assert head[0] == b"GET http://allowed.test:8080/x HTTP/1.1"
    assert [line for line in head if line.lower().startswith(b"host:")] == lines


@pytest.mark.parametrize("host", [["a\r\nX-Injected: 1"], "a\nb", [1], {"a": 1}])
def test_a_host_that_would_break_the_request_is_an_error_observation(host):
    [result] = netprobe.run([{"name": "h", "kind": "http", "proxy_host": "127.0.0.1", "proxy_port": closed_port(),
                              "url": "http://a.test/", "host": host}])
    assert result["observed"] == "error", result


def test_connect_probe_sends_one_request_inside_the_tunnel():
    proxy = FakeProxy(_ok(b"inside"))
    try:
        [result] = netprobe.run([{"name": "t", "kind": "connect", "proxy_host": "127.0.0.1", "proxy_port": proxy.port,
                                  "authority": "allowed.test:8080",
                                  "request": {"path": "/p", "host": "denied.test:8080"}}])
    finally:
        proxy.close()
    assert result["observed"] == "status:200", result
    assert result["detail"]["connect"] == 200 and result["detail"]["hops"][0]["body"] == "inside"
    connect_head, inner = proxy.received
    assert connect_head.startswith(b"CONNECT allowed.test:8080 HTTP/1.1\r\n")
    assert inner.startswith(b"GET /p HTTP/1.1\r\nHost: denied.test:8080\r\n")


def test_a_refused_connect_reports_the_gateway_body():
    body = DENY_BODY.encode() + b"host-mismatch: x\n"
    proxy = FakeProxy(_ok(), b"HTTP/1.1 403 Forbidden\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
    try:
        [result] = netprobe.run([{"name": "t", "kind": "connect", "proxy_host": "127.0.0.1", "proxy_port": proxy.port,
                                  "authority": "allowed.test:8080", "request": {"path": "/p"}}])
    finally:
        proxy.close()
    assert result["observed"] == "status:403" and result["detail"] == body.decode()
    assert len(proxy.received) == 1
    assert not through_proxy(result["observed"], result["detail"])


@pytest.mark.parametrize("reply", [
    lambda _d: None,                                                     # never answers
    lambda _d: b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npartial",  # body never completes
    lambda _d: b"HTTP/1.1 200 OK\r\n" + b"X: y\r\n" * 4000,                # a head past the cap
])
def test_http_reads_are_capped_and_end_by_the_deadline(reply):
    proxy = FakeProxy(reply)
    try:
        started = time.monotonic()
        [result] = netprobe.run([{"name": "h", "kind": "http", "proxy_host": "127.0.0.1", "proxy_port": proxy.port,
                                  "url": "http://a.test/", "timeout": 1.0}])
        elapsed = time.monotonic() - started
    finally:
        proxy.close()
    assert elapsed < 5, elapsed
    assert result["observed"] in ("timeout", "error", "status:200"), result
    if result["observed"] == "status:200":
        assert result["detail"]["hops"][0]["body"] == "partial"


def test_a_long_body_is_read_only_to_the_cap():
    proxy = FakeProxy(_ok(b"x" * 100_000))
    try:
        [result] = netprobe.run([{"name": "h", "kind": "http", "proxy_host": "127.0.0.1", "proxy_port": proxy.port,
                                  "url": "http://a.test/"}])
    finally:
        proxy.close()
    assert result["observed"] == "status:200" and result["detail"]["hops"][0]["body"] == "x" * 200
