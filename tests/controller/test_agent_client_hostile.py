"""The controller's agent client against a hostile guest: a fake agent on 127.0.0.1 that misbehaves at
the byte level (huge or absent Content-Length, unbounded bodies, one byte at a time, stalls, malformed
headers and fields, control characters in errors). Every call must fail with a clear ``AgentError``
code within its deadline plus a margin, and the host process's memory must stay flat while the peer
offers gigabytes. Ends with a whole run (``run_task``, offline, no Docker) against such an agent.

Safety valve: a sampler watches this process's RSS; past :data:`VALVE_BYTES` of growth the fake agent
ends whatever unbounded body it is sending, so a client that reads without a cap fails these tests
quickly instead of eating the machine's memory.
"""

from __future__ import annotations

import io
import json
import os
import socket
import struct
import threading
import time
import unicodedata
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from PIL import Image
from rich.console import Console

from controller.agent_client import (
    MAX_GUEST_TEXT,
    FILE_MAX_BYTES,
    JSON_MAX_BYTES,
    MAX_SCREEN_PX,
    AgentClient,
    AgentError,
    screenshot_cap,
)
from controller import agent_transport
from controller.agent_transport import HEAD_MAX_BYTES, KEEPALIVE_EXPIRY_S

GB = 1 << 30
MiB = 1 << 20
DEADLINE_S = 1.0          # the client's per-call deadline in these tests
MARGIN_S = 0.75           # how far past the deadline a call may still return
BLOCKED_S = 4.0           # a call still running after this long counts as blocked
MEMORY_BUDGET = 64 * MiB  # RSS growth allowed while the peer offers gigabytes
VALVE_BYTES = 320 * MiB   # RSS growth at which the fake agent stops sending (protects the machine)
CHUNK = b"\0" * (64 * 1024)


# -- memory ---------------------------------------------------------------------------------------------

def rss_bytes() -> int:
    """Resident set size of this process from /proc/self/statm (bytes)."""
    with open("/proc/self/statm", "rb") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class MemoryWatch:
    """Samples RSS every few ms from a thread; ``growth`` is the peak minus the baseline (bytes)."""

    def __init__(self, on_over: Callable[[], None]) -> None:
        self.baseline = rss_bytes()
        self.peak = self.baseline
        self._on_over = on_over
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.003):
            now = rss_bytes()
            self.peak = max(self.peak, now)
            if now - self.baseline > VALVE_BYTES:
                self._on_over()

    @property
    def growth(self) -> int:
        return self.peak - self.baseline

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.peak = max(self.peak, rss_bytes())


# -- the fake hostile agent -----------------------------------------------------------------------------

class _Gone(Exception):
    """The fake agent was told to stop sending (test over, or the memory valve)."""


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    query: str = ""


@dataclass
class Peer:
    """One connection as the fake agent's behaviour sees it."""

    conn: socket.socket
    agent: "HostileAgent"
    keep_alive: bool = False

    def send(self, data: bytes) -> None:
        if self.agent.stopped.is_set():
            raise _Gone
        self.conn.sendall(data)
        self.agent.sent += len(data)

    def head(self, status: int = 200, headers: dict[str, str] | None = None) -> None:
        lines = [f"HTTP/1.1 {status} X"] + [f"{k}: {v}" for k, v in (headers or {}).items()]
        self.send(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))

    def answer(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        """A well-framed answer; the connection stays open for the next request."""
        self.head(status, {"Content-Length": str(len(body)), **(headers or {})})
        self.send(body)
        self.keep_alive = True

    def json(self, status: int, value: Any) -> None:
        self.answer(status, json.dumps(value).encode(), {"Content-Type": "application/json"})

    def flood(self, total: float = float("inf"), chunked: bool = False, chunk: bytes = CHUNK) -> None:
        """Send ``total`` bytes (default: without end) as fast as the client takes them."""
        sent = 0
        while sent < total:
            if self.agent.valve.is_set():
                raise _Gone
            self.send(b"%x\r\n%s\r\n" % (len(chunk), chunk) if chunked else chunk)
            sent += len(chunk)

    def trickle(self, data: bytes, interval: float) -> None:
        """One byte of ``data`` every ``interval`` seconds."""
        for i in range(len(data)):
            self.send(data[i:i + 1])
            if self.agent.stopped.wait(interval):
                raise _Gone

    def hold(self) -> None:
        """Send nothing more and keep the connection open until the test ends."""
        self.agent.stopped.wait(30)


Behaviour = Callable[[Peer, Request], None]


class HostileAgent:
    """An HTTP/1.1 server on 127.0.0.1 whose every answer is ``behaviour(peer, request)``."""

    def __init__(self, behaviour: Behaviour) -> None:
        self.behaviour = behaviour
        self.requests: list[Request] = []
        self.sent = 0
        self.closed = 0  # connections this side has closed
        self.stopped = threading.Event()
        self.valve = threading.Event()
        self._conns: list[socket.socket] = []
        self._sock = socket.create_server(("127.0.0.1", 0))
        self._sock.settimeout(0.05)
        self.base_url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self.stopped.is_set():
            try:
                conn, _ = self._sock.accept()
            except (TimeoutError, OSError):
                continue
            self._conns.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _read_request(self, conn: socket.socket, buf: bytearray) -> Request | None:
        while b"\r\n\r\n" not in buf:
            data = conn.recv(65536)
            if not data:
                return None
            buf += data
        head, _, rest = bytes(buf).partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        method, target, _ = lines[0].split(" ", 2)
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        length = int(headers.get("content-length", "0"))
        while len(rest) < length:
            data = conn.recv(65536)
            if not data:
                return None
            rest += data
        buf[:] = rest[length:]
        path, _, query = target.partition("?")
        return Request(method, path, headers, rest[:length], query)

    def _serve(self, conn: socket.socket) -> None:
        buf = bytearray()
        try:
            while not self.stopped.is_set():
                request = self._read_request(conn, buf)
                if request is None:
                    return
                self.requests.append(request)
                peer = Peer(conn, self)
                self.behaviour(peer, request)
                if not peer.keep_alive:
                    return
        except (_Gone, OSError):
            pass
        finally:
            conn.close()
            self.closed += 1

    def stop(self) -> None:
        """Stop sending, drop every connection (unblocks a client stuck on one) and the listener."""
        self.stopped.set()
        for conn in list(self._conns):
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._thread.join(5)
        self._sock.close()


@dataclass
class Hostile:
    """What a test gets: the fake agent, a client with a short deadline, the memory watch."""

    agent: HostileAgent
    client: AgentClient
    memory: MemoryWatch

    def call(self, fn: Callable[[], Any], limit: float = BLOCKED_S) -> tuple[BaseException | None, float]:
        """Run ``fn`` in a thread; its exception (None if it returned) and seconds taken. Fails the test
        when it is still running after ``limit`` s (the fake agent is then stopped to free it)."""
        box: dict[str, Any] = {}

        def target() -> None:
            t0 = time.monotonic()
            try:
                box["result"] = fn()
            except BaseException as exc:  # noqa: BLE001 - handed to the test
                box["error"] = exc
            box["elapsed"] = time.monotonic() - t0

        thread = threading.Thread(target=target, daemon=True)
        thread.start()
        thread.join(limit)
        if thread.is_alive():
            self.agent.stop()
            thread.join(10)
            self.memory.stop()
            pytest.fail(f"the call was still blocked after {limit:g} s (deadline {DEADLINE_S:g} s); host RSS "
                        f"grew by {self.memory.growth / MiB:.0f} MiB while the peer sent "
                        f"{self.agent.sent / MiB:.0f} MiB")
        return box.get("error"), box["elapsed"]

    def refused(self, fn: Callable[[], Any], code: str, limit: float = BLOCKED_S) -> AgentError:
        """``fn`` raises AgentError ``code`` within the deadline plus the margin, memory kept flat."""
        error, elapsed = self.call(fn, limit)
        self.memory.stop()
        problems = []
        if not (isinstance(error, AgentError) and error.code == code):
            problems.append(f"expected AgentError {code}, got {error!r}")
        if elapsed >= DEADLINE_S + MARGIN_S:
            problems.append(f"took {elapsed:.2f} s")
        if self.memory.growth >= MEMORY_BUDGET:
            problems.append(f"host RSS grew by {self.memory.growth / MiB:.0f} MiB "
                            f"while the peer sent {self.agent.sent / MiB:.0f} MiB")
        assert not problems, "; ".join(problems)
        assert isinstance(error, AgentError)
        assert not any(unicodedata.category(c) in ("Cc", "Cf") for c in str(error)), repr(str(error))
        return error

    def assert_memory_flat(self) -> None:
        self.memory.stop()
        assert self.memory.growth < MEMORY_BUDGET, (
            f"host RSS grew by {self.memory.growth / MiB:.0f} MiB while the peer sent {self.agent.sent / MiB:.0f} MiB")


@pytest.fixture
def hostile() -> Iterator[Callable[..., Hostile]]:
    """Factory ``hostile(behaviour, **client_kwargs) -> Hostile``; everything stopped after the test."""
    made: list[Hostile] = []

    def make(behaviour: Behaviour, **client_kwargs: Any) -> Hostile:
        agent = HostileAgent(behaviour)
        client = AgentClient(agent.base_url, "token", **{"timeout": DEADLINE_S, **client_kwargs})
        h = Hostile(agent, client, MemoryWatch(agent.valve.set))
        made.append(h)
        return h

    yield make
    for h in made:
        h.memory.stop()
        h.agent.stop()
        h.client.close()


def png(width: int = 64, height: int = 40) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (width, height), (30, 60, 90)).save(buf, "PNG")
    return buf.getvalue()


SHOT_HEADERS = {"Content-Type": "image/png", "X-Screen-Size": "64x40", "X-Frame": "0,0,64,40",
                "X-Image-Size": "64x40"}


# -- size caps ------------------------------------------------------------------------------------------

def test_screenshot_declaring_3_gb_is_refused_before_its_body_is_read(hostile):
    def behaviour(peer: Peer, req: Request) -> None:
        peer.head(200, {"Content-Length": str(3 * GB), **SHOT_HEADERS})
        peer.flood(3 * GB)

    h = hostile(behaviour)
    err = h.refused(lambda: h.client.screenshot(), "too_large")  # unbounded request: the largest cap
    assert err.status == 0 and str(3 * GB) in err.message and str(screenshot_cap()) in err.message


def test_screenshot_without_content_length_is_cut_off_at_its_cap(hostile):
    def behaviour(peer: Peer, req: Request) -> None:
        peer.head(200, {"Transfer-Encoding": "chunked", **SHOT_HEADERS})
        peer.flood(chunked=True)

    h = hostile(behaviour)
    err = h.refused(lambda: h.client.screenshot(max_width=1280, max_height=800), "too_large")
    assert str(screenshot_cap(1280, 800)) in err.message
    assert h.agent.sent < 3 * screenshot_cap(1280, 800) + 8 * MiB  # it stopped reading soon after the cap


def test_actions_answer_without_end_is_cut_off_at_the_json_cap(hostile):
    def behaviour(peer: Peer, req: Request) -> None:  # close-delimited: no length, no chunks
        peer.head(200, {"Content-Type": "application/json", "Connection": "close"})
        peer.send(b'{"executed": 1, "pad": "')
        peer.flood(chunk=b"x" * 65536)

    h = hostile(behaviour)
    err = h.refused(lambda: h.client.actions([{"type": "wait"}]), "too_large")
    assert str(JSON_MAX_BYTES) in err.message


def test_read_file_is_held_to_the_agents_file_limit(hostile):
    def behaviour(peer: Peer, req: Request) -> None:
        if len(h.agent.requests) == 1:  # first a declared 3 GB, then a chunked answer without end
            peer.head(200, {"Content-Length": str(3 * GB)})
            peer.flood(3 * GB)
        else:
            peer.head(200, {"Transfer-Encoding": "chunked"})
            peer.flood(chunked=True)

    h = hostile(behaviour)
    assert FILE_MAX_BYTES == 16 * MiB
    declared = h.refused(lambda: h.client.read_file("/home/sandbox/a"), "too_large", limit=BLOCKED_S)
    assert str(3 * GB) in declared.message
    h.memory = MemoryWatch(h.agent.valve.set)
    counted = h.refused(lambda: h.client.read_file("/home/sandbox/b"), "too_large")
    assert str(FILE_MAX_BYTES) in counted.message


def test_error_bodies_are_capped_like_json(hostile):
    def behaviour(peer: Peer, req: Request) -> None:
        peer.head(404, {"Transfer-Encoding": "chunked"})
        peer.flood(chunked=True)

    h = hostile(behaviour)
    err = h.refused(lambda: h.client.read_file("/home/sandbox/a"), "too_large")
    assert str(JSON_MAX_BYTES) in err.message


# -- the overall deadline -------------------------------------------------------------------------------

def test_release_trickled_one_byte_inside_every_read_timeout_ends_at_the_deadline(hostile):
    def behaviour(peer: Peer, req: Request) -> None:
        body = b'{"released": true}' + b" " * 1000
        peer.head(200, {"Content-Length": str(len(body))})
        peer.trickle(body, DEADLINE_S / 4)

    h = hostile(behaviour)
    err = h.refused(h.client.release, "deadline")
    assert f"{DEADLINE_S:g} s" in err.message


def test_display_with_trickled_headers_ends_at_the_deadline(hostile):
    def behaviour(peer: Peer, req: Request) -> None:
        peer.trickle(b"HTTP/1.1 200 OK\r\n" + b"X-Pad: " + b"a" * 4000 + b"\r\n\r\n{}", DEADLINE_S / 4)

    h = hostile(behaviour)
    h.refused(h.client.display, "deadline")


def test_read_file_that_stalls_mid_body_ends_at_the_deadline(hostile):
    def behaviour(peer: Peer, req: Request) -> None:
        peer.head(200, {"Content-Length": "1000"})
        peer.send(b"x" * 10)
        peer.hold()

    h = hostile(behaviour)
    h.refused(lambda: h.client.read_file("/home/sandbox/a"), "deadline")


def test_a_large_declared_length_alone_takes_no_memory(hostile):
    """A length under the cap that the peer never sends: the call ends at the deadline and the client
    did not set aside memory for the declared body."""
    def behaviour(peer: Peer, req: Request) -> None:
        peer.head(200, {"Content-Length": str(250 * MiB), **SHOT_HEADERS})
        peer.send(b"\0" * 1000)
        peer.hold()

    assert 250 * MiB < screenshot_cap()
    h = hostile(behaviour)
    h.refused(lambda: h.client.screenshot(), "deadline")  # memory growth under MEMORY_BUDGET


def test_actions_that_never_answer_end_at_the_deadline(hostile):
    h = hostile(lambda peer, req: peer.hold())
    h.refused(lambda: h.client.actions([{"type": "wait"}]), "deadline")


def test_a_slow_but_steady_screenshot_is_still_bounded_by_the_deadline(hostile):
    """Bytes arrive fast enough that no single read times out, but the whole answer would take 10 s."""
    data = png()

    def behaviour(peer: Peer, req: Request) -> None:
        body = data + b"\0" * 100_000
        peer.head(200, {"Content-Length": str(len(body)), **SHOT_HEADERS})
        for i in range(0, len(body), 1000):
            peer.send(body[i:i + 1000])
            if h.agent.stopped.wait(0.1):
                return

    h = hostile(behaviour)
    h.refused(lambda: h.client.screenshot(max_width=64, max_height=40), "deadline")


# -- malformed answers ------------------------------------------------------------------------------------

@pytest.mark.parametrize("name,value", [
    ("X-Frame", "0,0,64"), ("X-Frame", "a,b,c,d"), ("X-Frame", "-1,0,64,40"), ("X-Frame", "0,0,64,40,1"),
    ("X-Frame", "1e3,0,64,40"), ("X-Frame", "0,0,64," + "9" * 5000), ("X-Frame", None),
    ("X-Screen-Size", "64X40"), ("X-Screen-Size", " 64x40x1"), ("X-Image-Size", "64x"),
    ("X-Image-Size", "0x0"), ("X-Image-Size", "99999x40"), ("X-Image-Size", None),
])
def test_malformed_screenshot_headers_are_bad_response(hostile, name, value):
    data = png()

    def behaviour(peer: Peer, req: Request) -> None:
        headers = {k: v for k, v in SHOT_HEADERS.items() if k != name}
        if value is not None:
            headers[name] = value
        peer.answer(200, data, headers)

    h = hostile(behaviour)
    err = h.refused(lambda: h.client.screenshot(max_width=1280, max_height=800), "bad_response")
    assert name in err.message and len(err.message) < 300


@pytest.mark.parametrize("call,body", [
    ("actions", {"executed": "1"}), ("actions", {"executed": True}), ("actions", {"executed": -1}),
    ("actions", {}), ("actions", [1]), ("launch", {"pid": "12"}), ("launch", {"pid": 0}),
    ("launch", {"pid": 1.5}), ("display", {"width": "1280", "height": 800, "depth": 24}),
    ("display", {"width": 1280, "height": 800}),
], ids=lambda v: v if isinstance(v, str) else json.dumps(v))
def test_wrong_json_fields_are_bad_response(hostile, call, body):
    h = hostile(lambda peer, req: peer.json(200, body))
    calls = {"actions": lambda: h.client.actions([{"type": "wait"}]),
             "launch": lambda: h.client.launch("probe"), "display": h.client.display}
    h.refused(calls[call], "bad_response")


@pytest.mark.parametrize("body,headers", [
    (b"not json", {}),
    (b"[" * 200_000 + b"]" * 200_000, {}),  # nested past the parser's recursion limit
    (b'{"executed": 1}', {"Content-Encoding": "gzip"}),
], ids=["not-json", "deep-nesting", "content-encoding"])
def test_answers_that_are_not_plain_json_are_bad_response(hostile, body, headers):
    h = hostile(lambda peer, req: peer.answer(200, body, headers))
    h.refused(lambda: h.client.actions([{"type": "wait"}]), "bad_response")


# -- guest text in error messages -----------------------------------------------------------------------

def test_error_json_with_control_characters_is_escaped_and_capped(hostile):
    evil = "\x1b[2J\x1b[31mpwned\x07\r\n\u202egnirts\u2028" + "A" * 5000

    def behaviour(peer: Peer, req: Request) -> None:
        peer.json(409, {"error": {"code": "busy\x1b[2J", "message": evil, "index": "3"}})

    h = hostile(behaviour)
    err, _ = h.call(lambda: h.client.actions([{"type": "wait"}]))
    assert isinstance(err, AgentError) and err.status == 409
    assert err.code == "http_error" and err.index is None  # a code that is no identifier is not passed on
    text = str(err)
    assert not any(unicodedata.category(c) in ("Cc", "Cf", "Zl") for c in text), repr(text)
    assert "\\x1b[31mpwned\\x07\\r\\n\\u202egnirts\\u2028" in text
    assert len(err.message) <= MAX_GUEST_TEXT and err.message.endswith("...")


def test_error_body_that_is_not_json_is_escaped_and_capped(hostile):
    h = hostile(lambda peer, req: peer.answer(500, b"\x1b]0;title\x07oops" + b"B" * 3000))
    err, _ = h.call(lambda: h.client.read_file("/home/sandbox/a"))
    assert isinstance(err, AgentError) and err.status == 500 and err.code == "http_error"
    assert err.message.startswith("\\x1b]0;title\\x07oops") and len(err.message) < 260


def test_well_formed_error_still_carries_the_agents_code_and_index(hostile):
    h = hostile(lambda peer, req: peer.json(400, {"error": {"code": "unknown_key", "message": "no key 'Foo'",
                                                            "index": 2}}))
    err, _ = h.call(lambda: h.client.actions([{"type": "keypress", "keys": ["Foo"]}]))
    assert isinstance(err, AgentError)
    assert (err.status, err.code, err.message, err.index) == (400, "unknown_key", "no key 'Foo'", 2)


def test_an_error_body_gets_the_json_cap_whatever_the_endpoints_cap(hostile):
    h = hostile(lambda peer, req: peer.json(413, {"error": {"code": "too_large", "message": "x" * 500}}),
                max_file_bytes=100)
    err, _ = h.call(lambda: h.client.read_file("/home/sandbox/a"))
    assert isinstance(err, AgentError) and (err.status, err.code) == (413, "too_large")


# -- the well-behaved path still works (over one kept-alive connection) -----------------------------------

def test_well_formed_answers_pass_over_one_connection(hostile):
    data = png()

    def behaviour(peer: Peer, req: Request) -> None:
        answers = {
            "/livez": {"status": "ok"}, "/v1/display": {"width": 1280, "height": 800, "depth": 24},
            "/v1/actions": {"executed": 2}, "/v1/release": {"released": True}, "/v1/launch": {"pid": 42},
        }
        if req.path == "/v1/screenshot":
            peer.answer(200, data, SHOT_HEADERS)
        elif req.path == "/v1/files":
            peer.answer(200, b"file bytes")
        else:
            peer.json(200, answers[req.path])

    h = hostile(behaviour)
    c = h.client
    assert c.livez() is True
    assert c.display() == {"width": 1280, "height": 800, "depth": 24}
    assert c.actions([{"type": "wait"}, {"type": "wait"}]) == 2
    shot = c.screenshot(max_width=1280, max_height=800)
    assert (shot.data, shot.mime, shot.frame, shot.image_size, shot.screen_size) == (
        data, "image/png", (0, 0, 64, 40), (64, 40), (64, 40))
    c.release()
    assert c.read_file("/home/sandbox/a") == b"file bytes"
    assert c.launch("probe") == 42
    assert len(h.agent.requests) == 7 and len(h.agent._conns) == 1  # keep-alive: one connection


# -- the combined request (actions, then the screenshot) ---------------------------------------------------

def test_actions_then_screenshot_in_one_request(hostile):
    data = png()

    def behaviour(peer: Peer, req: Request) -> None:
        assert (req.method, req.path) == ("POST", "/v1/actions")
        peer.answer(200, data, {**SHOT_HEADERS, "X-Executed": "1", "X-Settled": "true"})

    h = hostile(behaviour)
    step = h.client.actions_screenshot([{"type": "wait"}], max_width=1280, max_height=800)
    assert (step.executed, step.settled) == (1, True)
    assert (step.screenshot.data, step.screenshot.image_size, step.screenshot.frame) == (data, (64, 40), (0, 0, 64, 40))
    (req,) = h.agent.requests
    assert "screenshot=png" in req.query and "max_width=1280" in req.query
    assert json.loads(req.body) == {"actions": [{"type": "wait"}]}
    assert req.headers["content-type"] == "application/json"


@pytest.mark.parametrize("headers", [
    {"X-Executed": "1.5"}, {"X-Executed": "-1"}, {"X-Executed": "1", "X-Settled": "yes"},
    {"X-Executed": "9" * 40}, {"X-Settled": "true"},
], ids=["fraction", "negative", "settled-yes", "huge", "no-executed"])
def test_actions_then_screenshot_with_malformed_step_headers_is_bad_response(hostile, headers):
    h = hostile(lambda peer, req: peer.answer(200, png(), {**SHOT_HEADERS, **headers}))
    err = h.refused(lambda: h.client.actions_screenshot([{"type": "wait"}]), "bad_response")
    assert "X-Executed" in err.message or "X-Settled" in err.message


def test_actions_then_screenshot_is_capped_like_a_screenshot(hostile):
    def behaviour(peer: Peer, req: Request) -> None:
        peer.head(200, {"Transfer-Encoding": "chunked", "X-Executed": "1", **SHOT_HEADERS})
        peer.flood(chunked=True)

    h = hostile(behaviour)
    err = h.refused(lambda: h.client.actions_screenshot([{"type": "wait"}], max_width=320, max_height=200),
                    "too_large")
    assert str(screenshot_cap(320, 200)) in err.message


def test_an_agent_without_the_combined_request_gets_the_screenshot_fetched_after(hostile):
    """An older agent ignores ``?screenshot=`` and answers the actions alone: the client then asks for
    the screenshot itself."""
    data = png()

    def behaviour(peer: Peer, req: Request) -> None:
        if req.path == "/v1/actions":
            peer.json(200, {"executed": 1, "settled": False})
        else:
            assert req.path == "/v1/screenshot" and "format=jpeg" in req.query
            peer.answer(200, data, SHOT_HEADERS)

    h = hostile(behaviour)
    step = h.client.actions_screenshot([{"type": "wait"}], format="jpeg")
    assert (step.executed, step.settled, step.screenshot.data) == (1, False, data)
    assert [r.path for r in h.agent.requests] == ["/v1/actions", "/v1/screenshot"]


# -- HTTP framing ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("head,code", [
    (b"SSH-2.0-OpenSSH_9.2\r\n\r\n", "bad_response"),
    (b"HTTP/1.1 2000 OK\r\n\r\n", "bad_response"),
    (b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n", "bad_response"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 12, 13\r\n\r\n", "bad_response"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", "bad_response"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n0\r\n\r\n", "bad_response"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "bad_response"),
    (b"HTTP/1.1 101 Switching\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", "bad_response"),
    # Heads over the limit on the status lines and headers of an answer (HEAD_MAX_BYTES, 100 KiB).
    (b"HTTP/1.1 200 OK\r\nX-Pad: " + b"a" * (120 * 1024) + b"\r\n\r\n", "bad_response"),
    (b"HTTP/1.1 200 OK\r\n" + b"X-A: b\r\n" * 20000 + b"\r\n", "bad_response"),
    ((b"HTTP/1.1 100 Continue\r\nX-Pad: " + b"a" * 1000 + b"\r\n\r\n") * 200, "bad_response"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{}", "bad_response"),  # then the connection closes
    (b"", "bad_response"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n-2\r\n{}\r\n0\r\n\r\n", "bad_response"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}XY0\r\n\r\n", "bad_response"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 2\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
     "bad_response"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-A: \x1b[2J\r\n\r\n{}", "bad_response"),
    (b"HTTP/1.1 200 OK\r\nContent-Length : 2\r\n\r\n{}", "bad_response"),
], ids=["not-http", "status", "header-line", "two-lengths", "negative-length", "transfer-gzip", "chunk-size",
        "switching", "long-header", "many-headers", "many-interim", "short-body", "closed", "negative-chunk",
        "chunk-without-crlf", "chunked-and-length", "control-in-header", "space-before-colon"])
def test_malformed_framing_is_refused_with_a_code(hostile, head, code):
    """``livez`` needs only a 200: refused, these answers are refused for their framing alone."""
    def behaviour(peer: Peer, req: Request) -> None:
        peer.send(head)  # then the fake agent closes the connection

    h = hostile(behaviour)
    h.refused(h.client.livez, code)


def test_a_head_cut_short_is_bad_response(hostile):
    """The peer closes after the status line: no blank line ends the head, so there is no answer, even
    for a call that needs only the status."""
    h = hostile(lambda peer, req: peer.send(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n"))
    err = h.refused(h.client.livez, "bad_response")
    assert "head" in err.message


@pytest.mark.parametrize("over", [0, 1], ids=["at-the-limit", "one-byte-over"])
def test_the_head_limit_is_exact(hostile, over):
    """Status lines and headers of HEAD_MAX_BYTES in all, an interim answer included, are read; one
    byte more is bad_response."""
    body = json.dumps({"width": 1280, "height": 800, "depth": 24}).encode()
    head = (b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n"
            + b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n" % len(body)
            + b"".join(b"X-Pad-%02d: %s\r\n" % (i, b"p" * 1000) for i in range(95)))
    fill = HEAD_MAX_BYTES + over - len(head) - len(b"X-Fill: \r\n\r\n")
    head += b"X-Fill: " + b"f" * fill + b"\r\n\r\n"
    assert len(head) == HEAD_MAX_BYTES + over

    def behaviour(peer: Peer, req: Request) -> None:
        peer.send(head + body)
        peer.keep_alive = True

    h = hostile(behaviour)
    if over:
        h.refused(h.client.display, "bad_response")
    else:
        assert h.client.display() == {"width": 1280, "height": 800, "depth": 24}


def test_interim_answers_and_chunked_bodies_are_read_through(hostile):
    def behaviour(peer: Peer, req: Request) -> None:
        body = json.dumps({"width": 1280, "height": 800, "depth": 24}).encode()
        peer.send(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                  + b"%x;ext=1\r\n%s\r\n" % (10, body[:10]) + b"%x\r\n%s\r\n0\r\nTrailer: x\r\n\r\n" % (
                      len(body) - 10, body[10:]))
        peer.keep_alive = True

    h = hostile(behaviour)
    assert h.client.display() == {"width": 1280, "height": 800, "depth": 24}
    assert h.client.display()["depth"] == 24
    assert len(h.agent._conns) == 1  # a chunked answer read to its end leaves the connection usable


def test_a_connection_the_agent_closed_while_idle_is_not_reused(hostile):
    h = hostile(lambda peer, req: peer.head(200, {"Content-Length": "2"}) or peer.send(b"{}"))  # then closes
    assert h.client.livez() is True
    poll_until = time.monotonic() + 5
    while h.agent.closed < 1:  # the fake agent has closed its side
        assert time.monotonic() < poll_until, "the fake agent never closed the connection"
        time.sleep(0.01)
    assert h.client.livez() is True
    assert len(h.agent._conns) == 2


def _wait_closed(agent: HostileAgent, count: int) -> None:
    """Wait (up to 5 s) until the fake agent has closed ``count`` connections."""
    poll_until = time.monotonic() + 5
    while agent.closed < count:
        assert time.monotonic() < poll_until, "the fake agent never closed the connection"
        time.sleep(0.01)


def test_a_request_whose_send_fails_on_a_kept_alive_connection_goes_once_on_a_fresh_one(hostile, monkeypatch):
    """The agent resets the kept-alive connection just after the client's idle check passed (the check is
    made to miss it): sending fails before any byte of the request left, so nothing of it can have run,
    and it goes once more on a new connection."""
    def behaviour(peer: Peer, req: Request) -> None:
        peer.json(200, {"status": "ok"})
        if len(h.agent.requests) == 1:  # close with a reset
            peer.conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            peer.keep_alive = False

    monkeypatch.setattr(agent_transport._Connection, "stale", lambda self, now: False)
    h = hostile(behaviour)
    assert h.client.livez()
    _wait_closed(h.agent, 1)
    assert h.client.livez()
    assert len(h.agent.requests) == 2 and len(h.agent._conns) == 2


def test_a_request_that_left_on_a_dead_connection_is_not_sent_again(hostile, monkeypatch):
    """The agent closed the kept-alive connection (no reset) and the idle check is made to miss it: the
    request leaves, the agent might have run it, so the call fails instead of sending it again."""
    monkeypatch.setattr(agent_transport._Connection, "stale", lambda self, now: False)
    h = hostile(lambda peer, req: peer.head(200, {"Content-Length": "2"}) or peer.send(b"{}"))  # then closes
    assert h.client.livez()
    _wait_closed(h.agent, 1)
    error, _ = h.call(h.client.livez)
    assert isinstance(error, AgentError) and error.code in ("bad_response", "unreachable"), repr(error)
    assert len(h.agent.requests) == 1


def test_a_connection_idle_past_the_client_expiry_is_not_reused(hostile, monkeypatch):
    h = hostile(lambda peer, req: peer.json(200, {"status": "ok"}))
    assert h.client.livez() and h.client.livez()
    assert len(h.agent._conns) == 1
    monkeypatch.setattr(agent_transport, "KEEPALIVE_EXPIRY_S", 0.0)
    assert h.client.livez()
    assert len(h.agent._conns) == 2


def test_concurrent_calls_from_several_threads_each_get_a_connection(hostile):
    """Four threads call at once while the fake agent holds every answer until all four requests have
    arrived: they can only all succeed over four connections, which are then kept for later calls."""
    arrived = threading.Barrier(4, timeout=3)

    def behaviour(peer: Peer, req: Request) -> None:
        if len(h.agent.requests) <= 4:
            arrived.wait()
        peer.json(200, {"width": 1280, "height": 800, "depth": 24})

    h = hostile(behaviour)
    results: list[Any] = []
    threads = [threading.Thread(target=lambda: results.append(h.call(h.client.display)[0])) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(BLOCKED_S + 1)
    assert results == [None] * 4
    for _ in range(8):
        h.client.display()
    assert len(h.agent._conns) == 4 and len(h.agent.requests) == 12


def test_no_agent_listening_is_unreachable_and_a_closed_client_refuses(hostile):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens on it
    client = AgentClient(f"http://127.0.0.1:{port}", "token", timeout=DEADLINE_S)
    with pytest.raises(AgentError) as refused:
        client.livez()
    assert (refused.value.status, refused.value.code) == (0, "unreachable")
    client.close()
    with pytest.raises(AgentError) as closed:
        client.livez()
    assert closed.value.code == "unreachable" and "closed" in closed.value.message


def test_requests_carry_the_token_identity_and_the_host_and_no_proxy_is_used(hostile, monkeypatch):
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")
    monkeypatch.setenv("http_proxy", "http://127.0.0.1:9")
    h = hostile(lambda peer, req: peer.json(200, {"status": "ok"}))
    assert h.client.livez()
    (req,) = h.agent.requests
    assert req.headers["authorization"] == "Bearer token" and req.headers["accept-encoding"] == "identity"
    assert req.headers["host"] == h.agent.base_url.removeprefix("http://")
    assert (req.method, req.path, req.query) == ("GET", "/livez", "")


def test_constants_follow_the_agent_and_the_task_schema():
    from controller.run.tasks import Screen
    from guest.files import DEFAULT_MAX_BYTES

    assert FILE_MAX_BYTES == DEFAULT_MAX_BYTES
    assert HEAD_MAX_BYTES == 100 * 1024  # ARCHITECTURE.md, contract 1
    assert 60 <= KEEPALIVE_EXPIRY_S <= 300 - 30  # safely below the agent's keep-alive (guest/serve.py)
    limits = {name: [m.le for m in Screen.model_fields[name].metadata if getattr(m, "le", None)]
              for name in ("width", "height")}
    assert limits == {"width": [MAX_SCREEN_PX], "height": [MAX_SCREEN_PX]}
    assert screenshot_cap(1280, 800) == 1280 * 800 * 4 + MiB
    assert screenshot_cap(320, 200, crop=(0, 0, 100, 50)) == 100 * 50 * 4 + MiB
    assert screenshot_cap() == MAX_SCREEN_PX ** 2 * 4 + MiB
    with pytest.raises(ValueError):
        AgentClient("http://127.0.0.1:1", "t", timeout=0)


# -- a whole run against a hostile agent ------------------------------------------------------------------

class FakeSandbox:
    """The part of ``controller.sandbox.Sandbox`` the runner uses, around a client of the fake agent."""

    def __init__(self, client: AgentClient) -> None:
        self.agent = client
        self.id, self.image_id, self.guest_home = "hostile-1", "fake", "/home/sandbox"
        self.closed = 0

    def decision_log(self) -> list[dict[str, Any]]:
        return []

    def close(self) -> None:
        self.closed += 1
        self.agent.close()


@pytest.mark.parametrize("turns", ["loop", "ready"])
def test_a_run_against_a_hostile_agent_ends_error_with_a_complete_record_and_teardown(hostile, tmp_path, turns):
    """The agent turns hostile in the loop (after the model's first action) or already while the runner
    waits for a stable screen: screenshots then offer gigabytes without a length, release trickles and
    file reads stall. The run must end ``error`` soon, with ``run_started`` ... ``run_finished`` in the
    record, the sandbox closed and memory flat."""
    from controller.run.record import read_entries
    from controller.run.runner import RunOptions, run_task
    from controller.run.tasks import FileCheck, Task

    data = png()
    acted = threading.Event()
    if turns == "ready":
        acted.set()

    def behaviour(peer: Peer, req: Request) -> None:
        if req.path == "/v1/screenshot" and not acted.is_set():
            peer.answer(200, data, SHOT_HEADERS)
        elif req.path == "/v1/screenshot":
            peer.head(200, {"Transfer-Encoding": "chunked", **SHOT_HEADERS})
            peer.flood(chunked=True)
        elif req.path == "/v1/actions":
            acted.set()
            peer.json(200, {"executed": 1})
        elif req.path == "/v1/release":
            peer.head(200, {"Content-Length": "1000"})
            peer.trickle(b" " * 1000, DEADLINE_S / 4)
        else:  # /v1/files
            peer.head(200, {"Content-Length": "1000"})
            peer.hold()

    h = hostile(behaviour)
    sandbox = FakeSandbox(h.client)
    script = tmp_path / "script.jsonl"
    script.write_text(json.dumps({"actions": [{"type": "click", "x": 10, "y": 10, "button": "left"}]}) + "\n"
                      + json.dumps({"message": "done"}) + "\n")
    task = Task(name="hostile", instructions="x",
                checks=[FileCheck(kind="file", path="~/Documents/seed.txt", match="text", value="seed")])
    options = RunOptions(runs_dir=tmp_path / "runs", live=False, script=script, terminal=False)
    console = Console(file=io.StringIO(), width=200)
    box: dict[str, Any] = {}
    # budget: ready + first capture + one action, then one deadline each for release and the check's read
    error, elapsed = h.call(lambda: box.setdefault("outcome", run_task(task, lambda t: sandbox, options, console)),
                            limit=4 * DEADLINE_S + 8)
    assert error is None, repr(error)
    outcome = box["outcome"]
    h.memory.stop()
    assert h.memory.growth < MEMORY_BUDGET and outcome.status == "error" and "too_large" in outcome.reason, (
        f"{outcome.status}: {outcome.reason}; host RSS grew by {h.memory.growth / MiB:.0f} MiB")
    assert outcome.exit_code == 1 and "/v1/screenshot" in outcome.reason, outcome.reason
    entries = read_entries(outcome.record_dir)
    assert entries[0].type == "run_started" and entries[-1].type == "run_finished"
    assert entries[-1].status == "error"
    checks = [e.passed for e in entries if e.type == "check"]
    assert checks == ([False] if turns == "loop" else [])  # loop: verification ran, its read stalled, bounded
    assert sandbox.closed == 1
    h.assert_memory_flat()
    assert elapsed < 4 * DEADLINE_S + 6, f"the run took {elapsed:.1f} s"
