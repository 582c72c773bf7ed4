"""The connection rules every HTTP server of the project keeps (``wire.connections``), on a real uvicorn
server on 127.0.0.1 running a small app behind :class:`ConnectionGuard` (key ``k``), with the deadlines
and the cap made short or small for the test: the ``Host`` rule, the head deadline (again after each
answer on a connection without the key, from the first byte on one with it), the body floor, the cap on
unauthenticated connections (the oldest closed first), and the structured 400 for what is not HTTP/1.1.
Each server's own test floods it as a process with a low descriptor limit (tests/*/test_connections.py,
tests/gateway/test_control_connections.py)."""

from __future__ import annotations

import json
import select
import socket
import threading
import time
from typing import Any, Iterator

import pytest
import uvicorn

from tests.conformance.harness import poll
from wire import connections
from wire.connections import ConnectionGuard, host_refusal, listen, uvicorn_config

KEY = "k"


async def _app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Reads the whole body, answers ``{"bytes": N}``; 401 without ``Authorization: Bearer k``."""
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    authorized = (b"authorization", f"Bearer {KEY}".encode()) in scope["headers"]
    payload = json.dumps({"bytes": len(body)} if authorized else {"error": {"code": "unauthorized"}}).encode()
    await send({"type": "http.response.start", "status": 200 if authorized else 401,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]})
    await send({"type": "http.response.body", "body": payload})


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[str, int]]:
    sock = listen("127.0.0.1", 0)
    port = sock.getsockname()[1]
    config = uvicorn_config(ConnectionGuard(_app, token=KEY), lifespan="off", log_level="warning", access_log=False)
    served = uvicorn.Server(config)
    thread = threading.Thread(target=served.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    poll(lambda: served.started, 10, what="the server listening")
    yield "127.0.0.1", port
    served.should_exit = True
    thread.join(10)


@pytest.fixture
def short(monkeypatch: pytest.MonkeyPatch) -> None:
    """Deadlines of half a second, a body floor of 400 bytes a second."""
    monkeypatch.setattr(connections, "HEAD_TIMEOUT_S", 0.5)
    monkeypatch.setattr(connections, "BODY_WINDOW_S", 0.5)
    monkeypatch.setattr(connections, "BODY_MIN_BYTES_PER_S", 400)


def _request(port: int, key: str | None = KEY, body: bytes = b"") -> bytes:
    auth = f"Authorization: Bearer {key}\r\n" if key is not None else ""
    return (f"POST / HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{auth}Content-Length: {len(body)}\r\n\r\n").encode() + body


def _answer(sock: socket.socket) -> tuple[int, dict]:
    """One answer read from ``sock`` (the test app always sends Content-Length)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(4096)
        assert chunk, "closed before an answer"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length"))
    while len(body) < length:
        body += sock.recv(4096)
    return int(head.split()[1]), json.loads(body)


def _closed_within(sock: socket.socket, seconds: float) -> bool:
    """Whether the server closes ``sock`` within ``seconds`` (nothing else may arrive)."""
    readable, _, _ = select.select([sock], [], [], seconds)
    if not readable:
        return False
    try:
        return sock.recv(4096) == b""
    except ConnectionResetError:
        return True


def _connect(address: tuple[str, int]) -> socket.socket:
    return socket.create_connection(address, timeout=10)


# -- Host ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("value, address, port, mapped, passes", [
    ("127.0.0.1:8000", "127.0.0.1", 8000, False, True),
    ("localhost:8000", "127.0.0.1", 8000, False, True),
    ("LocalHost:8000", "127.0.0.1", 8000, False, True),
    ("[::1]:8000", "::1", 8000, False, True),
    ("localhost:8000", "::1", 8000, False, True),
    ("evil.example:8000", "127.0.0.1", 8000, False, False),
    ("127.0.0.1.nip.io:8000", "127.0.0.1", 8000, False, False),
    ("localhost.:8000", "127.0.0.1", 8000, False, False),
    ("127.1:8000", "127.0.0.1", 8000, False, False),
    ("2130706433:8000", "127.0.0.1", 8000, False, False),
    ("[127.0.0.1]:8000", "127.0.0.1", 8000, False, False),
    ("127.0.0.1", "127.0.0.1", 8000, False, False),
    ("127.0.0.1:", "127.0.0.1", 8000, False, False),
    ("127.0.0.1:08000", "127.0.0.1", 8000, False, False),
    ("127.0.0.1:8001", "127.0.0.1", 8000, False, False),
    ("127.0.0.2:8000", "127.0.0.1", 8000, False, False),
    ("", "127.0.0.1", 8000, False, False),
    ("[::1]:8000", "127.0.0.1", 8000, False, False),
    ("localhost:8000", "10.0.2.15", 8000, False, False),
    ("10.0.2.15:8000", "10.0.2.15", 8000, False, True),
    # reached through a port mapping on the host's loopback (Docker publishes the gateway's control port)
    ("127.0.0.1:49153", "172.18.0.3", 8001, True, True),
    ("localhost:49153", "172.18.0.3", 8001, True, True),
    ("[::1]:49153", "172.18.0.3", 8001, True, True),
    ("172.18.0.3:8001", "172.18.0.3", 8001, True, True),
    ("evil.example:49153", "172.18.0.3", 8001, True, False),
    ("127.0.0.1.nip.io:49153", "172.18.0.3", 8001, True, False),
    ("127.0.0.1:49153", "127.0.0.1", 8001, True, False),  # on loopback itself the port is known
])
def test_the_host_rule(value, address, port, mapped, passes):
    refused = host_refusal([(b"host", value.encode())], address, port, mapped=mapped)
    assert (refused is None) is passes, refused


def test_the_host_rule_wants_exactly_one_host():
    assert host_refusal([], "127.0.0.1", 80) is not None
    assert host_refusal([(b"host", b"127.0.0.1:80"), (b"Host", b"127.0.0.1:80")], "127.0.0.1", 80) is not None
    assert host_refusal([(b"Host", b"127.0.0.1")], "127.0.0.1", 80) is None  # no port: http's 80


def test_a_refused_host_is_a_structured_403_before_the_app(server):
    with _connect(server) as sock:
        own, rebound = f"127.0.0.1:{server[1]}".encode(), f"evil.example:{server[1]}".encode()
        sock.sendall(_request(server[1]).replace(own, rebound))
        status, body = _answer(sock)
    assert status == 403 and body["error"]["code"] == "bad_host" and body["error"]["message"]


def test_what_is_not_http_is_a_structured_400(server):
    for request in (b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", b"NOT HTTP\r\n\r\n",
                    b"GET / HTTP/1.1\r\n" + b"X-Long: " + b"a" * 70000 + b"\r\n\r\n"):
        with _connect(server) as sock:
            try:
                sock.sendall(request)
            except ConnectionResetError:
                pass
            status, body = _answer(sock)
        assert status == 400 and body["error"]["code"] == "bad_request", request[:40]


# -- deadlines -----------------------------------------------------------------------------------------


def test_the_head_deadline_counts_from_the_accept_and_again_after_an_answer_without_the_key(server, short):
    with _connect(server) as silent, _connect(server) as partial, _connect(server) as refused:
        partial.sendall(b"GET / HTTP/1.1\r\nHost: ")
        refused.sendall(_request(server[1], key="wrong"))
        assert _answer(refused)[0] == 401
        for sock in (silent, partial, refused):
            assert _closed_within(sock, 3.0)


def test_a_connection_that_carried_the_key_idles_past_the_head_deadline_but_not_mid_head(server, short):
    with _connect(server) as sock:
        sock.sendall(_request(server[1]))
        assert _answer(sock)[0] == 200
        assert not _closed_within(sock, 1.5), "idle after an authenticated answer: uvicorn's keep-alive holds"
        sock.sendall(_request(server[1]))
        assert _answer(sock)[0] == 200
        sock.sendall(b"POST / HTTP/1.1\r\nHost: 127.0.0.1")  # the next head, never finished
        assert _closed_within(sock, 3.0)


def test_a_body_slower_than_the_floor_is_closed_and_one_above_it_is_answered(server, short):
    with _connect(server) as slow:
        slow.sendall(_request(server[1])[:-4].replace(b"Content-Length: 0", b"Content-Length: 100000") + b"\r\n\r\n")
        started = time.monotonic()
        while time.monotonic() - started < 3.0:
            try:
                slow.sendall(b"x" * 20)  # 100 bytes a second
            except OSError:
                break
            if _closed_within(slow, 0.2):
                break
        else:
            pytest.fail("a body at 100 B/s was not closed under a floor of 400 B/s")
    body = b"y" * 2000
    with _connect(server) as steady:
        steady.sendall(_request(server[1], body=body)[:-len(body)])
        for offset in range(0, len(body), 200):  # 1000 bytes a second, for two seconds
            steady.sendall(body[offset:offset + 200])
            time.sleep(0.2)  # the client's pace is what is tested
        assert _answer(steady) == (200, {"bytes": len(body)})


# -- the cap -------------------------------------------------------------------------------------------


def test_past_the_cap_the_oldest_unauthenticated_connection_is_closed_and_authenticated_ones_stay(
        server, monkeypatch):
    monkeypatch.setattr(connections, "UNAUTHENTICATED_MAX", 4)
    with _connect(server) as keyed:
        keyed.sendall(_request(server[1]))
        assert _answer(keyed)[0] == 200
        idle = [_connect(server) for _ in range(4)]
        try:
            for sock in idle:  # each accepted before the next is opened
                sock.sendall(b"G")
            assert not any(_closed_within(sock, 0.3) for sock in idle)
            newest = _connect(server)
            idle.append(newest)
            newest.sendall(_request(server[1]))
            assert _answer(newest)[0] == 200
            assert _closed_within(idle[0], 3.0), "the oldest unauthenticated connection makes room"
            assert not any(_closed_within(sock, 0.2) for sock in idle[1:4])
            keyed.sendall(_request(server[1]))
            assert _answer(keyed)[0] == 200
        finally:
            for sock in idle:
                sock.close()


def test_a_listening_socket_accepts_a_batch_a_turn_of_the_event_loop():
    import asyncio

    listener = listen("127.0.0.1", 0)
    clients = [socket.create_connection(listener.getsockname(), timeout=10)
               for _ in range(connections.ACCEPT_BATCH + 4)]

    async def turns() -> list[int]:
        listener.setblocking(False)
        counts = []
        for _ in range(2):
            accepted = 0
            while True:
                try:
                    conn, _ = listener.accept()
                except BlockingIOError:
                    break
                conn.close()
                accepted += 1
            counts.append(accepted)
            await asyncio.sleep(0)  # the next turn of the loop
        return counts

    try:
        assert asyncio.run(turns()) == [connections.ACCEPT_BATCH, 4]
    finally:
        listener.close()
        for sock in clients:
            sock.close()


def test_past_the_cap_a_connection_being_answered_without_the_key_is_closed_first_when_oldest(
        server, monkeypatch):
    """Connections without the key whose requests are being answered (here: bodies that trickle in) are
    no exception to the oldest-first rule: a client with the key that connected after them and sends its
    request a moment later, after another connection came, is answered."""
    monkeypatch.setattr(connections, "UNAUTHENTICATED_MAX", 4)
    head = _request(server[1], key=None).replace(b"Content-Length: 0", b"Content-Length: 100000")
    slow = [_connect(server) for _ in range(4)]
    keyed = fresh = None
    try:
        for sock in slow:
            sock.sendall(head + b"x" * 10)  # the app reads the body: each is being answered
        time.sleep(0.3)
        keyed = _connect(server)
        time.sleep(0.3)  # accepted, its request not sent yet
        fresh = _connect(server)
        time.sleep(0.3)
        keyed.sendall(_request(server[1]))
        assert _answer(keyed)[0] == 200
        assert _closed_within(slow[0], 3.0) and _closed_within(slow[1], 3.0)
    finally:
        for sock in [*slow, keyed, fresh]:
            if sock is not None:
                sock.close()


def test_a_connection_without_the_key_that_never_reads_its_answers_is_closed(server, monkeypatch):
    """Requests pipelined on a connection without the key whose client never reads: once the server's
    writes to it have waited :data:`STALLED_ANSWER_S`, it is closed (its buffers freed, its slot too)."""
    monkeypatch.setattr(connections, "STALLED_ANSWER_S", 0.5)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)
    sock.connect(server)
    data = _request(server[1], key=None) * 60000
    stop = threading.Event()

    def send() -> None:  # as fast as the server reads what it answers
        sent = 0
        sock.setblocking(False)
        while sent < len(data) and not stop.is_set():
            try:
                sent += sock.send(data[sent:])
            except BlockingIOError:
                select.select([], [sock], [], 0.1)
            except OSError:
                return

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    try:
        deadline = time.monotonic() + 20.0
        while time.monotonic() < deadline:
            # the server's side of the connection, in the kernel's table: gone once it is closed
            if not _server_side_open(server[1], sock.getsockname()[1]):
                break
            time.sleep(0.2)
        else:
            pytest.fail("a connection that never reads its answers is still open after 20 s")
    finally:
        stop.set()
        sender.join(5)
        sock.close()


def _server_side_open(port: int, client_port: int) -> bool:
    """Whether the server's end of the connection from ``client_port`` is still established."""
    import subprocess

    out = subprocess.run(["ss", "-tnH", "state", "established", f"( sport = :{port} and dport = :{client_port} )"],
                         capture_output=True, text=True, check=True).stdout
    return bool(out.strip())
