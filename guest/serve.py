"""``python -m guest serve``: check the options, bind, log one start line, run the agent under uvicorn.

Startup checks (each failure is :class:`StartupError`: one line on stderr, exit status 2, no
traceback): the token file is readable UTF-8 and not empty; ``--bind`` is ``HOST:PORT`` and can be
bound; every ``--files-root`` is an existing directory; the ``--apps`` file is readable and is a JSON
object mapping names to non-empty argv lists; the numeric limits are positive; ``$AGENT_LAUNCH_SOCKET``,
when set, is an absolute path (the launch broker's socket, :mod:`guest.launch`). A display that is not
up yet is not an error: the agent serves and answers 503 ``display_unavailable`` until it is. Before
serving it makes malloc keep freed screenshot buffers (:func:`guest.capture.retain_frame_buffers`).

Logging (stderr, ``--log-level``, default ``info``): one start line,
``agent listening on http://HOST:PORT, display :N (WxHxD), ...`` (or ``display :N unavailable yet
(why)``), then one line per request (:mod:`guest.accesslog`: client address, method, path with its
query, status, milliseconds), written after the response went out; ``--no-access-log`` turns it off.
Bodies and headers are never logged, so neither typed text nor the bearer token reaches the log.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import asyncio

    from .actions import Executor

log = logging.getLogger("guest.agent")

LOG_LEVELS = ("debug", "info", "warning", "error")


class StartupError(Exception):
    """An option the agent cannot start with; ``str()`` is the one line printed to stderr."""


@dataclass(frozen=True)
class Bind:
    """A parsed ``--bind``: ``host`` without brackets, ``port`` (0 = any free port)."""

    host: str
    port: int

    def url(self, port: int | None = None) -> str:
        """``http://HOST:PORT`` (IPv6 hosts in brackets)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port if port is None else port}"


def parse_bind(value: str) -> Bind:
    """``HOST:PORT`` (``[::1]:8000`` for IPv6) -> :class:`Bind`. Raises StartupError."""
    host, sep, port = value.rpartition(":")
    host = host.strip()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port.isascii() or not port.isdigit() or int(port) > 65535:
        raise StartupError(f"--bind must be HOST:PORT, not {value!r}")
    return Bind(host, int(port))


def read_token(path: str) -> str:
    """The bearer token: the file's text without surrounding whitespace. Raises StartupError."""
    try:
        with open(path, encoding="utf-8") as fh:
            token = fh.read().strip()
    except OSError as exc:
        raise StartupError(f"cannot read the token file {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise StartupError(f"the token file {path} is not UTF-8 text") from None
    if not token:
        raise StartupError(f"the token file {path} is empty")
    return token


def check_roots(roots: list[str]) -> list[str]:
    """Each ``--files-root`` must be an existing directory (``~`` expanded). Raises StartupError."""
    for root in roots:
        path = os.path.expanduser(root)
        if not os.path.exists(path):
            raise StartupError(f"--files-root {root} does not exist")
        if not os.path.isdir(path):
            raise StartupError(f"--files-root {root} is not a directory")
    return roots


def read_apps(path: str | None) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """The ``--apps`` allowlist: plain and channel apps (see :func:`guest.launch.load_apps`). Raises
    StartupError."""
    from .launch import load_apps

    try:
        return load_apps(path)
    except OSError as exc:
        raise StartupError(f"cannot read the --apps file {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise StartupError(f"the --apps file {path} is not UTF-8 text") from None
    except ValueError as exc:  # json.JSONDecodeError is a ValueError
        detail = str(exc).removeprefix(f"{path}: ")
        raise StartupError(f"the --apps file {path} is not valid: {detail}") from None


def bind_socket(bind: Bind) -> socket.socket:
    """A listening TCP socket on ``bind`` (so the start line is true once logged; its backlog that of
    :mod:`wire.connections`, accepting as :func:`wire.connections.governed` says). Raises StartupError."""
    from wire.connections import LISTEN_BACKLOG, governed

    try:
        infos = socket.getaddrinfo(bind.host, bind.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise StartupError(f"cannot resolve the --bind host {bind.host!r}: {exc.strerror}") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(LISTEN_BACKLOG)
    except OSError as exc:
        sock.close()
        raise StartupError(f"cannot listen on {bind.host}:{bind.port}: {exc.strerror or exc}") from None
    return governed(sock)


def check_launch_socket() -> str | None:
    """``$AGENT_LAUNCH_SOCKET`` (None when unset or empty). Raises StartupError when it is not absolute."""
    from .launch import LAUNCH_SOCKET_ENV

    path = os.environ.get(LAUNCH_SOCKET_ENV) or None
    if path is not None and not os.path.isabs(path):
        raise StartupError(f"${LAUNCH_SOCKET_ENV} must be an absolute path, not {path!r}")
    return path


def positive(name: str, value: float) -> float:
    """``value`` if it is > 0. Raises StartupError naming the option."""
    if not value > 0:
        raise StartupError(f"{name} must be greater than 0, not {value:g}")
    return value


def configure_logging(level: str) -> None:
    """One format on stderr for the agent and uvicorn; uvicorn's own start/stop chatter only at debug."""
    numeric = getattr(logging, level.upper())
    logging.basicConfig(level=numeric, stream=sys.stderr, force=True,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("uvicorn.error").setLevel(numeric if numeric <= logging.DEBUG else max(numeric, logging.WARNING))


def start_line(url: str, display: str, executor: Executor, apps: dict[str, list[str]], roots: list[str]) -> str:
    """The start message: URL, display geometry (or why it is not up yet), apps and file roots."""
    from .display import DisplayUnavailable

    try:
        info = executor.conn.info(timeout=2.0)
        screen = f"display {display} ({info.width}x{info.height}x{info.depth})"
    except (DisplayUnavailable, TimeoutError) as exc:
        screen = f"display {display} unavailable yet ({exc})"
    names = ", ".join(sorted(apps)) or "none"
    files = ", ".join(os.path.expanduser(r) for r in roots)
    return f"agent listening on {url}, {screen}, apps: {names}, files under: {files}"


class CoalescingTransport:
    """An asyncio transport that sends an answer's head together with the first write after it.

    uvicorn writes an answer's status line and headers, then its body, in separate calls; with
    ``TCP_NODELAY`` (asyncio sets it) each became its own TCP segment, so the client (and the
    gateway's relay on the way) woke twice per answer. A write that starts an answer (``HTTP/1.``) is
    held and sent joined to the next write, at once; if none comes in the same turn of the event
    loop (a streamed answer), a callback sends it alone. :meth:`close` sends what is held first.
    Everything else is the wrapped transport's.
    """

    def __init__(self, transport: "asyncio.Transport", loop: "asyncio.AbstractEventLoop") -> None:
        self._transport, self._loop = transport, loop
        self._head: bytes | None = None

    def write(self, data: bytes) -> None:
        if self._head is not None:
            head, self._head = self._head, None
            self._transport.write(head + data if data else head)
        elif data[:7] == b"HTTP/1.":
            self._head = bytes(data)
            self._loop.call_soon(self.flush)
        elif data:
            self._transport.write(data)

    def flush(self) -> None:
        """Send a held head now."""
        if self._head is not None:
            head, self._head = self._head, None
            if not self._transport.is_closing():
                self._transport.write(head)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def http_protocol() -> type:
    """The connection rules' h11 protocol (:class:`wire.connections.LimitedH11Protocol`) with its
    transport wrapped in :class:`CoalescingTransport`."""
    from wire.connections import LimitedH11Protocol

    class CoalescingH11Protocol(LimitedH11Protocol):
        def connection_made(self, transport: Any) -> None:  # type: ignore[override]
            super().connection_made(CoalescingTransport(transport, self.loop))

    return CoalescingH11Protocol


def serve(ns: argparse.Namespace) -> int:
    """Run the agent for parsed ``serve`` options ``ns``; returns the exit status (2: bad option)."""
    try:
        token = read_token(ns.token_file)
        bind = parse_bind(ns.bind)
        roots = check_roots(ns.files_root or ["~"])
        apps, channel_apps = read_apps(ns.apps)
        check_launch_socket()
        for name in ("max_file_bytes", "busy_timeout", "wait_cap", "wait_quiet", "request_timeout"):
            positive("--" + name.replace("_", "-"), getattr(ns, name))
        sock = bind_socket(bind)
    except StartupError as exc:
        print(f"guest serve: {exc}", file=sys.stderr)
        return 2

    import uvicorn

    from wire.connections import ConnectionGuard, uvicorn_config

    from .accesslog import AccessLog
    from .app import AgentConfig, create_app
    from .capture import retain_frame_buffers

    configure_logging(ns.log_level)
    if not retain_frame_buffers():
        log.debug("malloc keeps no freed screenshot buffers here (no glibc mallopt); screenshots are slower")
    config = AgentConfig(display=ns.display, token=token, files_roots=roots, max_file_bytes=ns.max_file_bytes,
                         apps=apps, channel_apps=channel_apps, busy_timeout=ns.busy_timeout, wait_cap=ns.wait_cap,
                         wait_quiet=ns.wait_quiet, request_timeout=ns.request_timeout, token_file=ns.token_file)
    app = create_app(config)
    port = sock.getsockname()[1]
    log.info("%s", start_line(bind.url(port), config.display, app.state.executor, apps, roots))
    asgi = AccessLog(app) if ns.access_log else app
    # The connection rules (wire.connections): a request carrying the token authenticates its connection.
    # An authenticated idle connection stays open 300 s, past a live model's thinking time between steps;
    # the controller's client gives it up sooner (controller.agent_transport.KEEPALIVE_EXPIRY_S, 240 s).
    guarded = ConnectionGuard(asgi, token=token, check_host=False)
    config.on_token = lambda new: setattr(guarded, "expected", new.encode())  # POST /v1/token: the guard follows
    server = uvicorn.Server(uvicorn_config(guarded, protocol=http_protocol(), log_config=None, log_level=None,
                                           access_log=False, timeout_keep_alive=300))
    server.run(sockets=[sock])
    return 0
