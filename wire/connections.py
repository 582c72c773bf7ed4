"""The connection rules every HTTP server of the project keeps: one home, importable by the guest agent,
the gateway and the controller alike (it needs uvicorn and h11, which all three carry).

The servers: the Agents API (``controller.agents_api.server``), the web console
(``controller.console.server``), the gateway's control API (``controller.gateway.control``), the guest
agent (``guest.serve``), the scripted model server (``controller.offline.scripted_server``) and the MCP
server over HTTP (``controller.mcp.serve``). Each runs
uvicorn with :func:`uvicorn_config` (its protocol :class:`LimitedH11Protocol`) on :func:`listen` sockets
and tells it which connections authenticated (:class:`ConnectionGuard`, or :func:`mark_authenticated`
from its own guard).

* **Head deadline**: a request's line and headers must be complete within :data:`HEAD_TIMEOUT_S` seconds,
  counted from the accept for a connection's first request, from the end of the last answer on a
  connection that has not authenticated, and from the first byte of the next request on one that has
  (its idle time between requests stays uvicorn's ``timeout_keep_alive``: the agent's 300 s). Past it
  the connection is closed without an answer.
* **Body floor**: while a request's body arrives, every :data:`BODY_WINDOW_S` seconds must bring at
  least :data:`BODY_MIN_BYTES_PER_S` a second (or the end of the body); a window in which the server
  itself stopped reading (its app has not read what came) does not count. Else the connection is closed.
* **Stalled answers**: an answer to a connection that has not authenticated must be taken by its client:
  once the server's writes to it wait (its buffers full) for :data:`STALLED_ANSWER_S` seconds, the
  connection is closed (so a client that sends requests and never reads their answers holds nothing).
* **Unauthenticated connections**: each server keeps at most :func:`unauthenticated_cap` connections
  that have not yet carried an authenticated request (:data:`UNAUTHENTICATED_MAX`, and at most a
  :data:`UNAUTHENTICATED_FD_DIVISOR`-th of the process's descriptor limit). A connection beyond that
  closes the oldest one, whatever it is doing: one being answered is no exception (a client may
  pipeline requests, or never read, to stay "being answered"). A request with the key leaves the
  unauthenticated ones as the app takes it up, a loop turn or two after its connection was accepted, long
  before a flood (:data:`ACCEPT_BATCH` connections a turn) has made it the oldest, so a flood of idle,
  slow, pipelining or never-reading connections makes room for a client with the key instead of
  keeping it out. A server listens on :func:`listen`
  sockets, which accept at most :data:`ACCEPT_BATCH` connections a turn of the event loop (the kernel
  queues up to :data:`LISTEN_BACKLOG` more), so a flood holds few descriptors beyond the cap.
* **Host** (:func:`host_refusal`): exactly one ``Host`` header naming the address the connection came
  in on with its port: the address literal (IPv6 in brackets), or ``localhost`` for a loopback address.
  A server reached through a port mapping on the host's loopback (the gateway's control API in Docker)
  also admits a loopback name with any port on a connection that came in on a non-loopback address. No
  other name passes, so a page whose name was rebound to the address (DNS rebinding) is refused: 403
  ``bad_host``, before authentication.
* **Malformed HTTP**: 400 ``{"error": {"code": "bad_request", "message"}}`` (not uvicorn's plain text).
"""

from __future__ import annotations

import asyncio
import errno
import hmac
import ipaddress
import json
import resource
import socket
from typing import Any, Awaitable, Callable, Iterable, Optional

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

HEAD_TIMEOUT_S = 5.0
"""Longest a request's line and headers may take to arrive (seconds; see the module docstring)."""
STALLED_ANSWER_S = 5.0
"""Longest the server's writes to a connection that has not authenticated may wait for its client to read
(seconds; see the module docstring)."""
BODY_WINDOW_S = 5.0
"""Window over which a request body's rate is measured (seconds)."""
BODY_MIN_BYTES_PER_S = 1024
"""Slowest a request body may arrive, averaged over each :data:`BODY_WINDOW_S` (bytes per second)."""
UNAUTHENTICATED_MAX = 128
"""Most connections a server keeps that have not carried an authenticated request."""
UNAUTHENTICATED_FD_DIVISOR = 4
"""The unauthenticated connections take at most this fraction (1/N) of the descriptor limit."""
LISTEN_BACKLOG = 1024
"""The kernel's queue of connections not accepted yet (``listen()``'s backlog)."""
ACCEPT_BATCH = 16
"""Most connections a :func:`listen` socket accepts in one turn of the event loop."""
EXTENSION = "desktop_sandbox.connection"
"""The ASGI scope extension (``scope["extensions"]``) through which an app marks its connection."""
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")
"""The names a port mapping on the host's loopback is reached by (``mapped`` in :func:`host_refusal`)."""
HOST_REFUSED = (403, "bad_host")
"""Status and code of a request refused for its ``Host``."""
BAD_REQUEST = (400, "bad_request")
"""Status and code of a request that is not HTTP/1.x (h11 refused it)."""

ErrorBody = Callable[[int, str, str], dict[str, Any]]


def error_body(status: int, code: str, message: str) -> dict[str, Any]:
    """The structured error ``{"error": {"code", "message"}}`` (``status`` unused: a server whose error
    shape carries more passes its own function of the same three)."""
    return {"error": {"code": code, "message": message}}


def unauthenticated_cap() -> int:
    """How many unauthenticated connections one server keeps now: :data:`UNAUTHENTICATED_MAX`, at most
    the soft ``RLIMIT_NOFILE`` divided by :data:`UNAUTHENTICATED_FD_DIVISOR`, at least 1."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft <= 0:
        return UNAUTHENTICATED_MAX
    return max(1, min(UNAUTHENTICATED_MAX, soft // UNAUTHENTICATED_FD_DIVISOR))


# -- Host ------------------------------------------------------------------------------------------------


def _address(text: str) -> Optional[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    try:
        address = ipaddress.ip_address(text.split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def _split_host(value: str) -> Optional[tuple[str, int]]:
    """``(name, port)`` of a ``Host`` value (lowercased; an IPv6 literal keeps its brackets; no port is
    80, http's), or None when it is not ``NAME[:PORT]``."""
    value = value.lower()
    if value.startswith("["):
        end = value.find("]")
        if end < 0:
            return None
        name, rest = value[:end + 1], value[end + 1:]
    else:
        colon = value.find(":")
        name, rest = (value, "") if colon < 0 else (value[:colon], value[colon:])
    if not name:
        return None
    if not rest:
        return name, 80
    port = rest[1:]
    if (not rest.startswith(":") or not (port.isascii() and port.isdigit()) or port.startswith("0") or len(port) > 5
            or int(port) > 65535):
        return None
    return name, int(port)


def _names_address(name: str, address: str) -> bool:
    """Whether the Host name ``name`` (lowercased, IPv6 in brackets) names ``address``, the local address a
    connection came in on: the same IP, or ``localhost`` for a loopback address. A local address that is
    no IP (a test transport's name) is named only by itself."""
    local = _address(address)
    if local is None:
        return name == address.lower()
    if name == "localhost":
        return local.is_loopback
    if name.startswith("[") and name.endswith("]"):
        inner = name[1:-1]
        return ":" in inner and _address(inner) == local  # [v4] is no Host syntax
    if ":" in name:
        return False
    given = _address(name)
    return isinstance(given, ipaddress.IPv4Address) and given == local


def host_refusal(headers: Iterable[tuple[bytes, bytes]], address: str, port: Optional[int], *,
                 mapped: bool = False) -> Optional[str]:
    """Why a request's ``Host`` does not name the server it came to, or None when it does.

    ``headers``: the request's raw (name, value) pairs (ASGI ``scope["headers"]``); ``address`` and
    ``port``: the local address the connection came in on (ASGI ``scope["server"]``; port None: 80).
    Passes: exactly one ``Host``, ``NAME[:PORT]`` with NAME the address's literal or, for a loopback
    address, ``localhost``, and PORT the port (none: 80). With ``mapped``, on a connection that came in on
    a non-loopback address, :data:`LOOPBACK_NAMES` with any port pass too (the server is published on the
    host's loopback by a port mapping whose host port it cannot know)."""
    values = [value for name, value in headers if name.lower() == b"host"]
    if len(values) != 1:
        return "the request must carry exactly one Host header naming this server"
    parsed = _split_host(values[0].decode("latin-1"))
    if parsed is None:
        return "the Host header is not NAME:PORT"
    name, given_port = parsed
    if mapped and name in LOOPBACK_NAMES:
        local = _address(address)
        if local is not None and not local.is_loopback:
            return None
    if not _names_address(name, address) or given_port != (80 if port is None else port):
        return ("the Host header must name this server by the address it listens on (or localhost for a loopback "
                "one) and its port")
    return None


def scope_host_refusal(scope: dict[str, Any], *, mapped: bool = False) -> Optional[str]:
    """:func:`host_refusal` for an ASGI scope (its ``headers`` and ``server``); a scope without a server
    address is refused."""
    server = scope.get("server")
    if not server:
        return "the server's own address is unknown; the Host header cannot be checked"
    return host_refusal(scope.get("headers") or (), str(server[0]), server[1], mapped=mapped)


# -- authenticated connections -----------------------------------------------------------------------


def mark_authenticated(scope: dict[str, Any]) -> None:
    """Tell the server that the connection this request came on carried an authenticated request: it
    leaves the unauthenticated ones (no cap, no head deadline while idle). A no-op for a scope that did
    not come through :class:`LimitedH11Protocol` (a test transport)."""
    mark = (scope.get("extensions") or {}).get(EXTENSION)
    if mark is not None:
        mark()


def bearer_matches(headers: Iterable[tuple[bytes, bytes]], expected: bytes) -> bool:
    """Whether the request carries exactly one ``Authorization: Bearer <expected>`` (the scheme
    case-insensitive, the credential compared in constant time)."""
    given = [value for name, value in headers if name.lower() == b"authorization"]
    if len(given) != 1:
        return False
    scheme, _, credential = given[0].partition(b" ")
    return scheme.lower() == b"bearer" and hmac.compare_digest(credential.strip(), expected)


class ConnectionGuard:
    """ASGI wrapper for a server's app: refuses a request whose ``Host`` fails :func:`host_refusal`
    (403 ``bad_host``, ``error(status, code, message)`` as the JSON body; ``check_host=False`` skips the
    check), marks the connection authenticated (:func:`mark_authenticated`) when the request carries
    ``Authorization: Bearer <token>`` (:func:`bearer_matches`) -- every request that passes the Host
    check when ``token`` is None (a server without a key) -- and passes the request to ``app``, which
    still authenticates it itself. ``mapped``: as in :func:`host_refusal`."""

    def __init__(self, app: Callable[..., Awaitable[None]], *, token: Optional[str], check_host: bool = True,
                 mapped: bool = False, error: ErrorBody = error_body) -> None:
        self.app, self.check_host, self.mapped, self.error = app, check_host, mapped, error
        self.expected = None if token is None else token.encode()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] in ("http", "websocket"):
            problem = scope_host_refusal(scope, mapped=self.mapped) if self.check_host else None
            if problem is not None:
                await refuse(scope, send, HOST_REFUSED[0], HOST_REFUSED[1], problem, self.error)
                return
            if self.expected is None or bearer_matches(scope.get("headers") or (), self.expected):
                mark_authenticated(scope)
        await self.app(scope, receive, send)


async def refuse(scope: dict[str, Any], send: Any, status: int, code: str, message: str,
                 error: ErrorBody = error_body) -> None:
    """Answer ``status`` with ``error(status, code, message)`` as JSON (a WebSocket is closed, 1008)."""
    if scope["type"] == "websocket":
        await send({"type": "websocket.close", "code": 1008})
        return
    body = json.dumps(error(status, code, message)).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


# -- the protocol --------------------------------------------------------------------------------------


class _Unauthenticated:
    """One server's connections that have not carried an authenticated request, oldest first."""

    def __init__(self) -> None:
        self.members: dict[LimitedH11Protocol, None] = {}

    def admit(self, protocol: "LimitedH11Protocol") -> None:
        """Add ``protocol``, first closing the oldest members beyond the cap, whatever they are doing."""
        cap = unauthenticated_cap()
        while self.members and len(self.members) >= cap:
            victim = next(iter(self.members))
            del self.members[victim]
            victim.drop()
        self.members[protocol] = None

    def forget(self, protocol: "LimitedH11Protocol") -> None:
        self.members.pop(protocol, None)


_REGISTRY_ATTRIBUTE = "desktop_sandbox_unauthenticated"
"""Where a server's :class:`_Unauthenticated` is kept: an attribute of its uvicorn ``ServerState``."""


class _Tagged:
    """The app, called with :data:`EXTENSION` in the scope: the connection's :meth:`mark_authenticated`."""

    __slots__ = ("app", "mark")

    def __init__(self, app: Callable[..., Awaitable[None]], mark: Callable[[], None]) -> None:
        self.app, self.mark = app, mark

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        scope["extensions"] = {**(scope.get("extensions") or {}), EXTENSION: self.mark}
        await self.app(scope, receive, send)


class LimitedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol keeping the module's rules: the head deadline, the body floor, the cap on
    unauthenticated connections, and a structured 400. Subclass it to change the transport (the agent's
    :class:`guest.serve.CoalescingTransport`)."""

    def __init__(self, config: uvicorn.Config, server_state: Any, app_state: dict[str, Any],
                 _loop: Optional[asyncio.AbstractEventLoop] = None) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self.app = _Tagged(self.app, self.mark_authenticated)
        self.authenticated = False
        self._stall: Optional[asyncio.TimerHandle] = None  # STALLED_ANSWER_S while writes wait
        unauthenticated = getattr(server_state, _REGISTRY_ATTRIBUTE, None)
        if unauthenticated is None:  # the server's first connection (one event loop: no race)
            unauthenticated = _Unauthenticated()
            setattr(server_state, _REGISTRY_ATTRIBUTE, unauthenticated)
        self._unauthenticated = unauthenticated
        self._timer: Optional[asyncio.TimerHandle] = None
        self._timer_kind = ""
        self._received = 0
        self._window_from = 0
        self._upgraded = False  # a WebSocket owns the connection: no deadline of this protocol applies

    @property
    def answering(self) -> bool:
        """Whether a request on this connection is being answered."""
        return self.cycle is not None and not self.cycle.response_complete

    def mark_authenticated(self) -> None:
        """This connection carried an authenticated request: it leaves the unauthenticated ones."""
        if not self.authenticated:
            self.authenticated = True
            self._unauthenticated.forget(self)
            self._unstall()

    def drop(self) -> None:
        """Close the connection now, without an answer (what is still to be written is discarded)."""
        self._disarm()
        self._unstall()
        self._unauthenticated.forget(self)
        if self.transport is not None and not self.transport.is_closing():
            if self.transport.get_write_buffer_size():
                self.transport.abort()  # close() would wait for a client that does not read
            else:
                self.transport.close()

    # uvicorn's protocol interface

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._unauthenticated.admit(self)
        self._arm("head", HEAD_TIMEOUT_S)

    def connection_lost(self, exc: Optional[Exception]) -> None:
        self._disarm()
        self._unstall()
        self._unauthenticated.forget(self)
        super().connection_lost(exc)

    def pause_writing(self) -> None:
        super().pause_writing()
        if not self.authenticated and not self._upgraded and self._stall is None:
            self._stall = self.loop.call_later(STALLED_ANSWER_S, self._stall_due)

    def resume_writing(self) -> None:
        super().resume_writing()
        self._unstall()

    def data_received(self, data: bytes) -> None:
        self._received += len(data)
        super().data_received(data)
        self._follow(answered=False)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._follow(answered=True)

    def handle_websocket_upgrade(self, event: h11.Request) -> None:
        self._disarm()  # the WebSocket protocol owns the connection from here
        self._upgraded = True
        self._unauthenticated.forget(self)
        super().handle_websocket_upgrade(event)

    def send_400_response(self, msg: str) -> None:
        body = json.dumps(error_body(BAD_REQUEST[0], BAD_REQUEST[1], "the request is not valid HTTP/1.1 (its line, "
                                     "a header, two Host headers, or a head over the size limit)")).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                   (b"connection", b"close")]
        try:
            for event in (h11.Response(status_code=BAD_REQUEST[0], headers=headers, reason=b"Bad Request"),
                          h11.Data(data=body), h11.EndOfMessage()):
                self.transport.write(self.conn.send(event))
        except h11.LocalProtocolError:
            pass  # an answer was already under way: only close
        self.transport.close()

    # the deadlines

    def _arm(self, kind: str, delay: float) -> None:
        self._disarm()
        self._timer_kind = kind
        self._timer = self.loop.call_later(delay, self._head_due if kind == "head" else self._body_due)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self._timer_kind = None, ""

    def _follow(self, answered: bool) -> None:
        """Set the deadline the connection's state calls for, after input or the end of an answer."""
        if self._upgraded or self.transport is None or self.transport.is_closing():
            self._disarm()
            return
        state = self.conn.their_state
        if state is h11.IDLE:  # waiting for a request's head
            if self._timer_kind == "body":
                self._disarm()
            if answered and not self.authenticated:
                self._arm("head", HEAD_TIMEOUT_S)  # counted from the end of the answer
            elif self._timer_kind != "head" and (not self.authenticated or self.conn.trailing_data[0]):
                self._arm("head", HEAD_TIMEOUT_S)  # counted from the first byte of the request
        elif state is h11.SEND_BODY:
            if self._timer_kind != "body":
                self._window_from = self._received
                self._arm("body", BODY_WINDOW_S)
        else:  # the request is in (the answer is the app's), or the connection is ending
            self._disarm()

    def _unstall(self) -> None:
        if self._stall is not None:
            self._stall.cancel()
            self._stall = None

    def _stall_due(self) -> None:
        self._stall = None
        if not self.authenticated and not self._upgraded and self.flow.write_paused:
            self.drop()

    def _head_due(self) -> None:
        self._timer, self._timer_kind = None, ""
        if self.conn.their_state is h11.IDLE and not self.answering:
            self.drop()

    def _body_due(self) -> None:
        self._timer, self._timer_kind = None, ""
        if self.conn.their_state is not h11.SEND_BODY or self.transport.is_closing():
            return
        if self.flow.read_paused or self._received - self._window_from >= BODY_MIN_BYTES_PER_S * BODY_WINDOW_S:
            self._window_from = self._received
            self._arm("body", BODY_WINDOW_S)
        else:
            self.drop()


class _Listener(socket.socket):
    """A listening socket that accepts at most :data:`ACCEPT_BATCH` connections a turn of the running
    event loop (asyncio accepts up to the backlog at once otherwise)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.accepted_this_turn = 0

    def accept(self) -> tuple[socket.socket, Any]:
        if self.accepted_this_turn >= ACCEPT_BATCH:
            raise BlockingIOError(errno.EAGAIN, "the next connections are accepted in the next turn")
        pair = super().accept()
        if self.accepted_this_turn == 0:
            try:
                asyncio.get_running_loop().call_soon(self._next_turn)
            except RuntimeError:  # accepted outside an event loop: no turns to count
                return pair
        self.accepted_this_turn += 1
        return pair

    def _next_turn(self) -> None:
        self.accepted_this_turn = 0


def governed(sock: socket.socket) -> socket.socket:
    """``sock`` (bound, listening or not) as a socket that accepts at most :data:`ACCEPT_BATCH`
    connections a turn of the event loop; ``sock`` itself is detached (use what this returns)."""
    if isinstance(sock, _Listener):
        return sock
    return _Listener(sock.family, sock.type, sock.proto, fileno=sock.detach())


def listen(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host``:``port`` (0: a free port) and listening (:data:`LISTEN_BACKLOG`),
    accepting as :func:`governed` says: what a server passes to uvicorn's ``run(sockets=[...])``.
    Raises OSError when it cannot bind."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(LISTEN_BACKLOG)
    except BaseException:
        sock.close()
        raise
    return governed(sock)


def uvicorn_config(app: Any, *, protocol: Optional[type] = None, **options: Any) -> uvicorn.Config:
    """``uvicorn.Config(app, **options)`` keeping this module's rules: HTTP/1.1 by :class:`LimitedH11Protocol`
    (or ``protocol``, a subclass of it), the listen backlog :data:`LISTEN_BACKLOG`, asyncio's own event
    loop (unless ``options`` name another). Serve it on
    :func:`listen` (or :func:`governed`) sockets: ``uvicorn.Server(config).run(sockets=[...])``. No WebSocket upgrades
    unless ``options`` name a ``ws`` protocol. ``app``
    still has to tell which connections authenticated (:class:`ConnectionGuard` or
    :func:`mark_authenticated`)."""
    protocol = protocol or LimitedH11Protocol
    if not issubclass(protocol, LimitedH11Protocol):
        raise TypeError("the protocol must be a LimitedH11Protocol")
    options.setdefault("loop", "asyncio")  # its selector loop accepts through the socket (uvloop would not)
    options.setdefault("ws", "none")  # a server takes WebSocket upgrades only where it names its protocol
    return uvicorn.Config(app, http=protocol, backlog=LISTEN_BACKLOG, **options)


__all__ = [
    "ACCEPT_BATCH", "BODY_MIN_BYTES_PER_S", "BODY_WINDOW_S", "ConnectionGuard", "EXTENSION", "HEAD_TIMEOUT_S",
    "HOST_REFUSED", "LISTEN_BACKLOG", "LOOPBACK_NAMES", "LimitedH11Protocol", "STALLED_ANSWER_S",
    "UNAUTHENTICATED_FD_DIVISOR",
    "UNAUTHENTICATED_MAX", "bearer_matches", "error_body", "governed", "host_refusal", "listen",
    "mark_authenticated", "refuse", "scope_host_refusal", "unauthenticated_cap", "uvicorn_config",
]
