"""The agent client's transport: HTTP/1.1 to one agent, one deadline per call enforced at the socket.

:class:`AgentTransport` speaks HTTP/1.1 on the standard library: plain sockets kept alive between
calls, ``http.client`` to parse each answer's status line and headers, and a body framing of its own
(``Content-Length``, ``chunked`` or up to the close) held to the call's size cap. Every connect, send and
receive waits at most the time left before the call's deadline (``time.monotonic()`` seconds), so a
peer that trickles one byte just inside each read timeout, or stalls mid-answer, is cut off at the
deadline instead of resetting a per-read timer. Failures raise :class:`TransportError`, whose ``code``
:class:`controller.agent_client.AgentClient` passes on in ``AgentError`` (the rule: ARCHITECTURE.md,
contract 1). A caller that is stopping (a run cancelled) shortens every call with
:meth:`AgentTransport.stop_calls`: a call then in flight is cut once its grace has passed (its socket
shut down: ``interrupted``), and every later call gets no more than the grace, however the agent stalls
(a desktop program holding the X server grabbed stalls every call of the agent).

:class:`Deadlines` and :class:`DeadlineBackend` give an ``httpcore`` pool the same per-call deadline
(the gateway control client, :mod:`controller.run.origins`).
"""

from __future__ import annotations

import contextlib
import http.client
import re
import select
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any, Iterator, Mapping

import httpcore

from controller.model.errors import DesktopSandboxError
from controller.text import clean

HEAD_MAX_BYTES = 100 * 1024
"""Most bytes the status lines and headers of one answer may take, interim (1xx) answers included;
also the most a chunk-size line or a chunked body's trailer may take. ``http.client`` adds its own
limits inside it: a line at most 64 KiB, at most 100 header fields."""

KEEPALIVE_EXPIRY_S = 240.0
"""Seconds an idle connection is kept for the next call. Below the agent's own idle limit (uvicorn's
``timeout_keep_alive``, 300 s in ``guest/serve.py``), so the client never sends on a connection the
agent is about to close; long enough to outlast a live model's thinking time between steps."""

MAX_IDLE_CONNECTIONS = 8
"""Most idle connections kept per agent (one per caller that ran concurrently); more are closed."""

_RECV_BYTES = 64 * 1024  # most bytes one receive into the read buffer asks for
_PREALLOC_BYTES = 8 * 1024 * 1024  # a declared body up to this size is received into one buffer
_BIG_RECV_BYTES = 1024 * 1024  # most bytes one receive of a larger body asks for
_CTL = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")  # control characters no head line may hold (HTAB allowed)
_CHUNK_SIZE = re.compile(rb"([0-9A-Fa-f]{1,16})[ \t]*(?:;[^\r\n]*)?\r?\n")  # size, extensions, line end
_EOL = (b"\r\n", b"\n")
_NO_BODY = (204, 304)


class TransportError(DesktopSandboxError):
    """A call that got no usable answer. ``code``: ``unreachable`` (no connection, or it broke),
    ``deadline`` (no complete answer before the call's deadline), ``too_large`` (over the call's size
    cap), ``bad_response`` (not well-framed HTTP/1.1, or a ``Content-Encoding``) or ``interrupted``
    (cut short by :meth:`AgentTransport.stop_calls`). ``message`` is one
    printable line; text from the peer in it is escaped (:func:`controller.text.clean`)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code, self.message = code, message


def _bad(message: str) -> TransportError:
    return TransportError("bad_response", message)


@dataclass(frozen=True)
class Reply:
    """A complete answer: ``status``, ``headers`` as ``(name, value)`` pairs in the order received,
    and the whole ``body``."""

    status: int
    headers: list[tuple[str, str]]
    body: bytes


class _Connection:
    """One TCP connection to the agent, used by one call at a time; every wait on its socket ends by
    ``self.deadline``. Also the file ``http.client.HTTPResponse`` reads a head from (``makefile``,
    ``readline``, ``close``): lines are counted against :data:`HEAD_MAX_BYTES` and checked for control
    characters on the way."""

    __slots__ = ("sock", "buf", "deadline", "head_left", "head_ended", "idle_since", "reused", "sent", "cut")

    def __init__(self, address: tuple[str, int], deadline: float) -> None:
        self.deadline = deadline
        self.cut = False  # its socket was shut down by AgentTransport.stop_calls
        self.sock = socket.create_connection(address, timeout=self._left())
        try:
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            self.sock.close()
            raise
        self.buf = bytearray()  # bytes received and not yet taken, from its start
        self.head_left = HEAD_MAX_BYTES
        self.head_ended = False
        self.idle_since = 0.0
        self.reused = False
        self.sent = 0  # bytes of the current request the kernel took

    # -- socket waits, each bounded by the deadline ---------------------------------------------
    def _left(self) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the call's deadline has passed")
        return left

    def send(self, data: bytes) -> None:
        """Send all of ``data``; TimeoutError at the deadline, OSError when the connection broke."""
        view = memoryview(data)
        while view:
            self.sock.settimeout(self._left())
            n = self.sock.send(view)
            self.sent += n
            view = view[n:]

    def _fill(self) -> bool:
        """Receive more into the buffer; False when the peer closed its side."""
        self.sock.settimeout(self._left())
        data = self.sock.recv(_RECV_BYTES)
        self.buf += data
        return bool(data)

    def _line(self, limit: int) -> bytes:
        """The next line with its ``\\n``; at most ``limit`` bytes (cut there), or what is left at EOF."""
        buf, scanned = self.buf, 0
        while True:
            end = buf.find(b"\n", scanned, limit)
            if end >= 0:
                end += 1
                break
            if len(buf) >= limit:
                end = limit
                break
            scanned = len(buf)
            if not self._fill():
                end = len(buf)
                break
        line = bytes(buf[:end])
        del buf[:end]
        return line

    # -- the file http.client reads a head from ---------------------------------------------------
    def makefile(self, mode: str = "rb") -> "_Connection":
        """This connection, as the file ``http.client.HTTPResponse`` reads status and headers from."""
        return self

    def readline(self, limit: int = -1) -> bytes:
        """One head line for ``http.client`` (at most ``limit`` bytes). Raises TransportError
        ``bad_response`` past :data:`HEAD_MAX_BYTES` for the answer or for a control character."""
        allowed = self.head_left + 1
        line = self._line(allowed if limit < 0 else min(limit, allowed))
        self.head_left -= len(line)
        if self.head_left < 0:
            raise _bad(f"the status lines and headers are over {HEAD_MAX_BYTES} bytes")
        self.head_ended = line in _EOL
        eol = 2 if line.endswith(b"\r\n") else 1 if line.endswith(b"\n") else 0
        if _CTL.search(line, 0, len(line) - eol):
            raise _bad(f"a control character in the head: {clean(repr(line), 80)}")
        return line

    def close(self) -> None:
        """Nothing: ``http.client`` closes its file when done with a head; the socket outlives it."""

    # -- bodies -------------------------------------------------------------------------------------
    def _fixed(self, length: int) -> bytes:
        """Exactly ``length`` body bytes; ``bad_response`` when the peer closes first. A body up to
        :data:`_PREALLOC_BYTES` is received straight into its buffer; a larger one grows as bytes
        arrive, so a declared length alone never makes the client hold memory."""
        got = min(len(self.buf), length)
        if length > _PREALLOC_BYTES:
            grown = bytearray(self.buf[:got])
            del self.buf[:got]
            while len(grown) < length:
                self.sock.settimeout(self._left())
                data = self.sock.recv(min(length - len(grown), _BIG_RECV_BYTES))
                if not data:
                    raise _bad(f"the answer ended after {len(grown)} of its {length} body bytes")
                grown += data
            return bytes(grown)
        out = bytearray(length)
        out[:got] = self.buf[:got]
        del self.buf[:got]
        with memoryview(out) as view:
            while got < length:
                self.sock.settimeout(self._left())
                n = self.sock.recv_into(view[got:])
                if not n:
                    raise _bad(f"the answer ended after {got} of its {length} body bytes")
                got += n
        return bytes(out)

    def _until_close(self, cap: int) -> bytes:
        """The body up to the peer's close; ``too_large`` past ``cap`` bytes."""
        out = bytearray(self.buf)
        self.buf.clear()
        while len(out) <= cap:
            self.sock.settimeout(self._left())
            data = self.sock.recv(_RECV_BYTES)
            if not data:
                return bytes(out)
            out += data
        raise _too_large(cap)

    def _chunked(self, cap: int) -> bytes:
        """A chunked body, its trailer read and dropped; ``too_large`` as soon as a chunk would take it
        past ``cap`` bytes, ``bad_response`` for malformed framing."""
        out = bytearray()
        while True:
            line = self._line(HEAD_MAX_BYTES + 1)
            match = _CHUNK_SIZE.fullmatch(line)
            if match is None:
                if not line.endswith(b"\n") and len(line) <= HEAD_MAX_BYTES:
                    raise _bad("the answer ended inside its chunked body")
                raise _bad(f"a malformed chunk-size line: {clean(repr(line), 80)}")
            size = int(match.group(1), 16)
            if size == 0:
                break
            if len(out) + size > cap:
                raise _too_large(cap)
            while len(self.buf) < size:
                if not self._fill():
                    raise _bad("the answer ended inside a chunk")
            out += self.buf[:size]
            del self.buf[:size]
            if self._line(2) not in _EOL:
                raise _bad("a chunk not followed by CRLF")
        budget = HEAD_MAX_BYTES
        while True:
            line = self._line(budget + 1)
            budget -= len(line)
            if budget < 0:
                raise _bad(f"the chunked body's trailer is over {HEAD_MAX_BYTES} bytes")
            if line in _EOL:
                return bytes(out)
            if not line.endswith(b"\n"):
                raise _bad("the answer ended inside its trailer")

    # -- one exchange -------------------------------------------------------------------------------
    def answer(self, method: str, cap: int, error_cap: int) -> tuple[Reply, bool]:
        """Read one answer to the request just sent: the reply and whether the connection may carry
        another request. Interim 1xx answers are read through; the body of a 2xx answer is held to
        ``cap`` bytes, any other's to ``error_cap``. Raises TransportError, TimeoutError (deadline),
        OSError and ``http.client.HTTPException`` (its refusals of the head)."""
        self.head_left = HEAD_MAX_BYTES
        while True:
            self.head_ended = False
            resp = http.client.HTTPResponse(self, method=method)  # type: ignore[arg-type]
            resp.begin()
            resp.fp = None  # the head is read; the body is framed here
            if not self.head_ended:
                raise _bad("the answer ended inside its head")
            if resp.status == 101:
                raise _bad("101 Switching Protocols, which the request did not ask for")
            if resp.status >= 200:
                break
        msg = resp.msg
        if msg.defects or msg.get_payload():
            raise _bad(f"a header line that is not NAME: VALUE ({clean(msg.defects, 80)})")
        items = msg.items()
        codings: list[str] | None = None
        lengths: list[str] | None = None
        for name, value in items:  # one pass for the framing headers
            name = name.lower()
            if name == "content-length":
                lengths = [*(lengths or ()), value]
            elif name == "transfer-encoding":
                codings = [*(codings or ()), value]
            elif name == "content-encoding" and value.strip().lower() != "identity":
                raise _bad(f"unexpected Content-Encoding {clean(value, 40)}")
        limit = cap if 200 <= resp.status < 300 else error_cap
        keep = not resp.will_close
        if resp.status in _NO_BODY or method == "HEAD":
            body = b""
        elif codings is not None:
            if len(codings) != 1 or codings[0].strip().lower() != "chunked":
                raise _bad(f"Transfer-Encoding {clean(', '.join(codings), 60)}; only chunked is read")
            if lengths is not None:
                raise _bad("both Transfer-Encoding and Content-Length")
            body = self._chunked(limit)
        elif lengths is not None:
            values = {part.strip() for value in lengths for part in value.split(",")}
            declared = values.pop() if len(values) == 1 else ""
            if not (declared.isascii() and declared.isdigit()):
                raise _bad(f"a malformed Content-Length ({clean(', '.join(lengths), 60)})")
            if len(declared) > 18 or int(declared) > limit:
                raise TransportError("too_large", f"the answer declares {declared} bytes; the cap for this "
                                                  f"call is {limit} bytes")
            body = self._fixed(int(declared))
        else:
            body = self._until_close(limit)
            keep = False
        return Reply(resp.status, items, body), keep and not self.buf

    # -- pool bookkeeping ---------------------------------------------------------------------------
    def stale(self, now: float) -> bool:
        """True when the connection must not carry another request: idle past
        :data:`KEEPALIVE_EXPIRY_S`, or readable while idle (the peer closed it, or sent bytes nobody
        asked for). The same check httpcore makes before reusing a kept-alive connection."""
        if now - self.idle_since >= KEEPALIVE_EXPIRY_S or self.buf:
            return True
        try:
            fd = self.sock.fileno()
            if fd < 0:
                return True
            if hasattr(select, "poll"):
                poller = select.poll()
                poller.register(fd, select.POLLIN)
                return bool(poller.poll(0))
            return bool(select.select([fd], [], [], 0)[0])
        except (OSError, ValueError):
            return True

    def drop(self) -> None:
        """Close the socket."""
        try:
            self.sock.close()
        except OSError:
            pass


def _too_large(cap: int) -> TransportError:
    return TransportError("too_large", f"the answer is larger than the {cap}-byte cap for this call")


class AgentTransport:
    """HTTP/1.1 calls to one agent at ``host``:``port`` over kept-alive connections. Thread-safe: each
    call takes an idle connection (or opens one) and gives it back when the answer was read in full and
    the agent keeps it open; at most :data:`MAX_IDLE_CONNECTIONS` idle ones are kept, none longer than
    :data:`KEEPALIVE_EXPIRY_S`.

    ``headers`` (name to value, printable ASCII) go into every request after ``Host: host_header``.
    Nothing is taken from the environment (no proxies). Raises ValueError for a header that is not
    printable ASCII.
    """

    def __init__(self, host: str, port: int, host_header: str, headers: Mapping[str, str]) -> None:
        lines = [("Host", host_header), *headers.items()]
        for name, value in lines:
            if not (f"{name}{value}".isascii() and f"{name}{value}".isprintable() and ":" not in name):
                raise ValueError(f"a request header must be printable ASCII: {clean(name, 40)}")
        self._address = (host, port)
        self._fixed = "".join(f"{name}: {value}\r\n" for name, value in lines).encode("ascii")
        self._idle: list[_Connection] = []
        self._lock = threading.Lock()
        self._closed = False
        self._in_flight: set[_Connection] = set()
        self._grace: float | None = None  # set by stop_calls: the most any call may take now
        self._stops = 0  # stop_calls so far: a cut scheduled by an earlier one is void

    def stop_calls(self, grace_s: float | None) -> None:
        """The caller is stopping: each call in flight now that has not ended within ``grace_s``
        seconds is cut (its socket shut down: TransportError ``interrupted``), and each later call
        ends within ``grace_s`` seconds of its start. ``None``: calls get their own deadlines again
        (a cut not yet made is not made)."""
        with self._lock:
            self._stops += 1
            self._grace = grace_s
            stop, in_flight = self._stops, list(self._in_flight)
        if grace_s is None or not in_flight:
            return
        timer = threading.Timer(grace_s, self._cut, args=(stop, in_flight))
        timer.daemon = True
        timer.start()

    def _cut(self, stop: int, connections: list[_Connection]) -> None:
        with self._lock:
            if stop != self._stops:
                return
            cut = [conn for conn in connections if conn in self._in_flight]
            for conn in cut:
                conn.cut = True
        for conn in cut:
            try:
                conn.sock.shutdown(socket.SHUT_RDWR)  # wakes the call's send or receive at once
            except OSError:
                pass

    def _track(self, conn: _Connection | None, flying: bool) -> None:
        if conn is None:
            return
        with self._lock:
            if flying:
                self._in_flight.add(conn)
            else:
                self._in_flight.discard(conn)

    def request(self, method: str, target: str, body: bytes | None, *, deadline: float, cap: int,
                error_cap: int, content_type: str = "application/json") -> Reply:
        """Send ``method target`` (with ``body`` as ``content_type`` when given) and read the whole
        answer by ``deadline`` (``time.monotonic()`` seconds): a 2xx body at most ``cap`` bytes, any
        other at most ``error_cap``. A kept-alive connection is reused; when sending on one fails
        before the kernel took a byte of the request (the agent had closed it), the request goes once
        more on a fresh connection. Raises :class:`TransportError`."""
        with self._lock:
            if self._grace is not None:
                deadline = min(deadline, time.monotonic() + self._grace)
        head = b"%s %s HTTP/1.1\r\n%s" % (method.encode("ascii"), target.encode("ascii"), self._fixed)
        if body is None:
            data = head + b"\r\n"
        else:
            data = b"%sContent-Type: %s\r\nContent-Length: %d\r\n\r\n%s" % (
                head, content_type.encode("ascii"), len(body), body)
        conn: _Connection | None = None
        try:
            conn = self._checkout(deadline)
            self._track(conn, True)
            try:
                conn.send(data)
            except (BrokenPipeError, ConnectionResetError, ConnectionAbortedError):
                if not (conn.reused and conn.sent == 0) or conn.cut:
                    raise
                self._track(conn, False)
                conn.drop()
                conn = None
                conn = _Connection(self._address, deadline)
                self._track(conn, True)
                conn.send(data)
            reply, keep = conn.answer(method, cap, error_cap)
        except (TimeoutError, TransportError, http.client.HTTPException, OSError) as exc:
            _drop(conn)
            self._track(conn, False)
            if conn is not None and conn.cut:
                raise TransportError("interrupted", "cut short: the caller is stopping") from None
            if isinstance(exc, TimeoutError):
                raise TransportError("deadline", "no complete answer before the call's deadline") from None
            if isinstance(exc, TransportError):
                raise
            if isinstance(exc, http.client.HTTPException):  # before OSError: RemoteDisconnected is both
                raise _bad(f"not a complete HTTP/1.1 answer ({clean(f'{type(exc).__name__}: {exc}', 120)})") from None
            raise TransportError("unreachable", clean(str(exc) or type(exc).__name__, 120)) from None
        except BaseException:
            _drop(conn)
            self._track(conn, False)
            raise
        self._track(conn, False)
        if conn.cut:  # the answer was complete: the socket is shut down all the same
            keep = False
        if keep:
            self._checkin(conn)
        else:
            conn.drop()
        return reply

    def _checkout(self, deadline: float) -> _Connection:
        now = time.monotonic()
        with self._lock:
            if self._closed:
                raise TransportError("unreachable", "the client is closed")
            while self._idle:
                conn = self._idle.pop()
                if conn.stale(now):
                    conn.drop()
                    continue
                conn.deadline, conn.reused, conn.sent = deadline, True, 0
                return conn
        return _Connection(self._address, deadline)

    def _checkin(self, conn: _Connection) -> None:
        conn.idle_since = time.monotonic()
        with self._lock:
            if not self._closed and len(self._idle) < MAX_IDLE_CONNECTIONS:
                self._idle.append(conn)
                return
        conn.drop()

    def close(self) -> None:
        """Close the idle connections; a call in flight closes its own when it ends. Later calls raise
        TransportError ``unreachable``."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.drop()


def _drop(conn: _Connection | None) -> None:
    if conn is not None:
        conn.drop()


# -- the same deadline for an httpcore pool (the gateway control client) ------------------------------

class Deadlines:
    """The deadline (``time.monotonic()`` seconds) of the call running in each thread, if any."""

    def __init__(self) -> None:
        self._local = threading.local()

    @contextlib.contextmanager
    def until(self, deadline: float) -> Iterator[None]:
        """Within the block, this thread's calls end by ``deadline`` (``time.monotonic()`` seconds)."""
        previous = getattr(self._local, "deadline", None)
        self._local.deadline = deadline
        try:
            yield
        finally:
            self._local.deadline = previous

    def clamp(self, timeout: float | None, expired: type[Exception]) -> float | None:
        """``timeout`` (seconds) shortened to the time left; raises ``expired`` when none is left."""
        deadline = getattr(self._local, "deadline", None)
        if deadline is None:
            return timeout
        left = deadline - time.monotonic()
        if left <= 0:
            raise expired("the call's deadline has passed")
        return left if timeout is None else min(timeout, left)


class _DeadlineStream(httpcore.NetworkStream):
    def __init__(self, stream: httpcore.NetworkStream, deadlines: Deadlines) -> None:
        self._stream, self._deadlines = stream, deadlines

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._stream.read(max_bytes, self._deadlines.clamp(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._stream.write(buffer, self._deadlines.clamp(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._stream.close()

    def start_tls(self, ssl_context: Any, server_hostname: str | None = None,
                  timeout: float | None = None) -> httpcore.NetworkStream:
        stream = self._stream.start_tls(ssl_context, server_hostname,
                                        self._deadlines.clamp(timeout, httpcore.ConnectTimeout))
        return _DeadlineStream(stream, self._deadlines)

    def get_extra_info(self, info: str) -> Any:
        return self._stream.get_extra_info(info)


class DeadlineBackend(httpcore.NetworkBackend):
    """httpcore's plain sockets, each connect and every later read and write bounded by the calling
    thread's deadline in ``deadlines`` (for an ``httpcore.ConnectionPool``; the gateway control
    client's, :mod:`controller.run.origins`). Timeouts raise httpcore's ``ConnectTimeout``,
    ``ReadTimeout`` or ``WriteTimeout``."""

    def __init__(self, deadlines: Deadlines) -> None:
        self._inner, self._deadlines = httpcore.SyncBackend(), deadlines

    def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                    socket_options: Any = None) -> httpcore.NetworkStream:
        stream = self._inner.connect_tcp(host, port, self._deadlines.clamp(timeout, httpcore.ConnectTimeout),
                                         local_address, socket_options)
        return _DeadlineStream(stream, self._deadlines)

    def connect_unix_socket(self, path: str, timeout: float | None = None,
                            socket_options: Any = None) -> httpcore.NetworkStream:
        stream = self._inner.connect_unix_socket(path, self._deadlines.clamp(timeout, httpcore.ConnectTimeout),
                                                 socket_options)
        return _DeadlineStream(stream, self._deadlines)

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)
