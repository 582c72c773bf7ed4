"""controller.gateway.relay without Docker: which addresses it listens on (this host's interfaces), which
peers it takes (its default gateways), and the relaying itself on loopback (bytes both ways, bytes sent
before the agent's side is connected, half-close, back-pressure, refused peers)."""

from __future__ import annotations

import asyncio
import hashlib
import ipaddress
import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from controller.gateway.relay import Relay, default_gateways, interface_addresses, listen_addresses

IO_TIMEOUT_S = 10.0


def test_interface_addresses_include_loopback():
    addrs = interface_addresses()
    assert ipaddress.IPv4Address("127.0.0.1") in addrs.values()


def test_listen_addresses_skip_loopback_and_excluded_networks():
    addrs = [a for a in interface_addresses().values() if not a.is_loopback]
    everything = listen_addresses([])
    assert "127.0.0.1" not in everything
    assert sorted(map(str, addrs)) == everything
    if addrs:
        excluded = ipaddress.IPv4Network(f"{addrs[0]}/32")
        assert str(addrs[0]) not in listen_addresses([excluded])
    assert listen_addresses([ipaddress.IPv4Network("0.0.0.0/0")]) == []


ROUTES = """Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT
eth0\t00000000\t0180A8C0\t0003\t0\t0\t0\t00000000\t0\t0\t0
eth1\t0070A8C0\t00000000\t0001\t0\t0\t0\t00F0FFFF\t0\t0\t0
eth0\t0080A8C0\t00000000\t0001\t0\t0\t0\t00F0FFFF\t0\t0\t0
"""


def test_default_gateways_are_read_from_the_route_table():
    # The table a Docker gateway container has: default route via the egress bridge (192.168.128.1).
    assert default_gateways(ROUTES) == [ipaddress.IPv4Address("192.168.128.1")]
    assert default_gateways(ROUTES.splitlines()[0] + "\n") == []  # no default route
    assert default_gateways("") == []
    assert isinstance(default_gateways(), list)  # this host's own table reads without error


# -- relaying on loopback ---------------------------------------------------------------------------------

class Upstream:
    """A TCP server on 127.0.0.1 that runs ``serve(conn)`` per connection; counts connections."""

    def __init__(self, serve: Callable[[socket.socket], None]) -> None:
        self.serve = serve
        self.accepted = 0
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.05)
        self.port = self.sock.getsockname()[1]
        self.stop = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except (TimeoutError, OSError):
                continue
            self.accepted += 1
            conn.settimeout(IO_TIMEOUT_S)
            threading.Thread(target=self._run, args=(conn,), daemon=True).start()

    def _run(self, conn: socket.socket) -> None:
        try:
            self.serve(conn)
        except OSError:
            pass
        finally:
            conn.close()

    def close(self) -> None:
        self.stop.set()
        self.sock.close()


class RunningRelay:
    """A :class:`Relay` on 127.0.0.1 in a thread of its own; ``port`` is where it listens."""

    def __init__(self, target_port: int, allow: list[ipaddress.IPv4Network] | None) -> None:
        self.loop = asyncio.new_event_loop()
        relay = Relay("127.0.0.1", target_port, allow)
        self.server = self.loop.run_until_complete(relay.start(["127.0.0.1"], 0))
        self.port = self.server.sockets[0].getsockname()[1]
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def connect(self) -> socket.socket:
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=IO_TIMEOUT_S)
        sock.settimeout(IO_TIMEOUT_S)
        return sock

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.server.close)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(IO_TIMEOUT_S)


def read_all(sock: socket.socket) -> bytes:
    """Everything until the peer's end of stream."""
    out = bytearray()
    while chunk := sock.recv(1 << 16):
        out += chunk
    return bytes(out)


def echo_until_eof(conn: socket.socket) -> None:
    """Read everything up to the client's half-close, then answer its SHA-256 and length, and close."""
    digest, total = hashlib.sha256(), 0
    while chunk := conn.recv(1 << 16):
        digest.update(chunk)
        total += len(chunk)
    conn.sendall(digest.hexdigest().encode() + b" %d" % total)


@pytest.fixture
def relay_to() -> Iterator[Callable[..., tuple[Upstream, RunningRelay]]]:
    made: list[tuple[Upstream, RunningRelay]] = []

    def make(serve: Callable[[socket.socket], None],
             allow: list[ipaddress.IPv4Network] | None = None) -> tuple[Upstream, RunningRelay]:
        upstream = Upstream(serve)
        relay = RunningRelay(upstream.port, allow)
        made.append((upstream, relay))
        return upstream, relay

    yield make
    for upstream, relay in made:
        relay.close()
        upstream.close()


def test_bytes_pass_both_ways_request_after_request(relay_to):
    def answer_lines(conn: socket.socket) -> None:
        buf = b""
        while chunk := conn.recv(4096):
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                conn.sendall(b"re:" + line + b"\n")

    _, relay = relay_to(answer_lines)
    with relay.connect() as sock:
        for i in range(50):  # sent at once after connecting: the first lines arrive before the agent's side is up
            sock.sendall(b"line %d\n" % i)
            got = b""
            while not got.endswith(b"\n"):
                got += sock.recv(4096)
            assert got == b"re:line %d\n" % i


def test_bytes_sent_at_once_and_a_half_close_before_the_agent_side_is_up_are_relayed(relay_to):
    _, relay = relay_to(echo_until_eof)
    data = bytes(range(256)) * 64
    for _ in range(20):
        with relay.connect() as sock:
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)  # half-close: the answer must still come back
            assert read_all(sock) == hashlib.sha256(data).hexdigest().encode() + b" %d" % len(data)


def test_a_large_answer_to_a_slow_reader_arrives_whole(relay_to):
    data = hashlib.sha256(b"seed").digest() * (8 * 1024 * 1024 // 32)  # 8 MiB

    def flood(conn: socket.socket) -> None:
        conn.sendall(data)

    _, relay = relay_to(flood)
    with relay.connect() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 * 1024)
        got = bytearray()
        while chunk := sock.recv(4096):
            got += chunk
            if len(got) < 256 * 1024:
                time.sleep(0.001)  # a slow reader at first: the relay must hold back, not drop
    assert len(got) == len(data) and bytes(got) == data


def test_a_peer_outside_the_allowed_networks_is_closed_before_anything_is_relayed(relay_to):
    upstream, relay = relay_to(echo_until_eof, allow=[ipaddress.IPv4Network("192.0.2.1/32")])
    with relay.connect() as sock:
        try:
            sock.sendall(b"GET /livez HTTP/1.1\r\n\r\n")
            sock.shutdown(socket.SHUT_WR)
            answer = read_all(sock)
        except OSError:  # reset by the relay: before or after our bytes, depending on timing
            answer = b""
    assert answer == b""
    assert upstream.accepted == 0


def test_an_allowed_peer_is_relayed(relay_to):
    upstream, relay = relay_to(echo_until_eof, allow=[ipaddress.IPv4Network("127.0.0.0/8")])
    with relay.connect() as sock:
        sock.sendall(b"abc")
        sock.shutdown(socket.SHUT_WR)
        assert read_all(sock) == hashlib.sha256(b"abc").hexdigest().encode() + b" 3"
    assert upstream.accepted == 1


def test_a_client_is_closed_when_the_agent_cannot_be_reached():
    with socket.create_server(("127.0.0.1", 0)) as placeholder:
        dead_port = placeholder.getsockname()[1]  # nothing listens there once closed
    relay = RunningRelay(dead_port, None)
    try:
        with relay.connect() as sock:
            try:
                sock.sendall(b"x")
                assert read_all(sock) == b""
            except OSError:  # reset rather than closed: also no answer
                pass
    finally:
        relay.close()


class FakeTransport(asyncio.Transport):
    """Records what a leg does to its transport."""

    def __init__(self) -> None:
        super().__init__()
        self.written: list[bytes] = []
        self.eof_written = self.closed = self.paused = False

    def set_write_buffer_limits(self, high=None, low=None) -> None:  # noqa: ANN001
        pass

    def write(self, data) -> None:  # noqa: ANN001
        self.written.append(bytes(data))

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        self.eof_written = True

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False

    def close(self) -> None:
        self.closed = True


def test_bytes_and_eof_that_arrive_before_the_link_are_kept_and_passed_on():
    """Some asyncio versions (3.11.2, the image's) start reading a new connection even when its
    protocol paused reading in connection_made: what arrives then must not be lost."""
    from controller.gateway.relay import _Leg

    client, upstream = _Leg(), _Leg()
    client_t, upstream_t = FakeTransport(), FakeTransport()
    client.connection_made(client_t)
    client.data_received(b"GET / HTTP/1.1\r\n")
    assert client_t.paused  # no more is read until linked
    client.data_received(b"\r\n")
    assert client.eof_received() is True  # kept open: the answer still has to come back
    upstream.connection_made(upstream_t)
    upstream.link(client)
    client.link(upstream)
    assert b"".join(upstream_t.written) == b"GET / HTTP/1.1\r\n\r\n" and upstream_t.eof_written
    upstream.data_received(b"HTTP/1.1 200 OK\r\n\r\n")
    assert client_t.written == [b"HTTP/1.1 200 OK\r\n\r\n"]
    assert upstream.eof_received() is False  # both directions done: both legs close
    assert client_t.closed
