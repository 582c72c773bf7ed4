"""``desktop-sandbox mcp``: serve the tools over stdio (default) or streamable HTTP, until the end.

The protocol loop runs on a thread of its own; the main thread waits for it to end (stdio: the client
closed stdin, or the process is ending) or for SIGINT, SIGTERM or SIGHUP, then ends every session and
waits until each sandbox is removed (:meth:`controller.mcp.session.SessionHub.close_all`; signals are
ignored meanwhile, so a second Ctrl-C does not leave a sandbox behind). Ending a session finishes its run
record and releases every key and button first.

On stdio the process serves one session; stdout carries the protocol only (the ``mcp`` package points
fd 1 at stderr while it serves, so stray output cannot corrupt it) and there is no terminal to answer
approvals. Over HTTP each MCP session has a sandbox of its own (:mod:`controller.mcp.http`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import stat
import threading
from typing import Any, AsyncIterator, Callable, Iterator

from controller.mcp.session import McpOptions, SessionHub

log = logging.getLogger(__name__)

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
STOP_TIMEOUT_S = 10.0
"""Longest the HTTP server is given to stop once told to (seconds)."""
GRACE_S = 3
"""Seconds the HTTP server lets open connections (a client's event stream) finish when it stops."""


class _Stop:
    """Why the server stops: set by the protocol loop's end or by a signal."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.why = ""

    def set(self, why: str) -> None:
        if not self.event.is_set():
            self.why = why
            self.event.set()

    def wait(self) -> str:
        while not self.event.wait(3600):
            pass
        return self.why


@contextlib.contextmanager
def _signals(stop: _Stop) -> Iterator[None]:
    """While serving, a signal stops the server; from then on signals are ignored (every sandbox is
    removed first, whatever else arrives)."""
    for s in SIGNALS:
        signal.signal(s, lambda signum, _frame: stop.set(signal.Signals(signum).name))
    try:
        yield
    finally:
        for s in SIGNALS:
            signal.signal(s, signal.SIG_IGN)


FLUSH_S = 5.0
"""Longest the stdio server keeps writing its last answers once the client closed stdin (seconds)."""
MAX_LINE_BYTES = 16 * 1024 * 1024
"""Longest JSON-RPC line a client may send over stdio (bytes): a longer one ends the session."""


class _Lines:
    """The client's lines (text), read from the stdin pipe on the event loop itself."""

    def __init__(self, reader: asyncio.StreamReader) -> None:
        self.reader = reader

    def __aiter__(self) -> "_Lines":
        return self

    async def __anext__(self) -> str:
        try:
            line = await self.reader.readline()
        except (ValueError, asyncio.LimitOverrunError):  # over MAX_LINE_BYTES: the session ends
            log.error("a line from the client is longer than %d bytes: ending the session", MAX_LINE_BYTES)
            raise StopAsyncIteration from None
        if not line:
            raise StopAsyncIteration
        return line.decode("utf-8", "replace")


class _Out:
    """The answers, written to the stdout pipe on the event loop itself (``write`` then ``flush``)."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self.writer = writer

    async def write(self, text: str) -> None:
        self.writer.write(text.encode("utf-8"))

    async def flush(self) -> None:
        await self.writer.drain()


@contextlib.asynccontextmanager
async def _wire() -> AsyncIterator[tuple[Any, Any]]:
    """The stdio wire as streams the event loop reads and writes itself, with no worker thread a line (the
    ``mcp`` package's own stdio streams hop to a thread for every read, write and flush: milliseconds a
    call). As the package does, fd 0 then reads the null device and fd 1 writes to stderr while it serves,
    so a child or a stray print cannot touch the wire. (None, None) when stdin or stdout is not a pipe
    or socket: the package's own streams are used then."""
    if not all(stat.S_ISFIFO(os.fstat(fd).st_mode) or stat.S_ISSOCK(os.fstat(fd).st_mode) for fd in (0, 1)):
        yield None, None
        return
    loop = asyncio.get_running_loop()
    wire_in, wire_out = os.dup(0), os.dup(1)
    saved_in, saved_out = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.dup2(2, 1)
    reader = asyncio.StreamReader(limit=MAX_LINE_BYTES)
    in_transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader),
                                                   os.fdopen(wire_in, "rb", buffering=0))
    out_transport, protocol = await loop.connect_write_pipe(asyncio.streams.FlowControlMixin,
                                                            os.fdopen(wire_out, "wb", buffering=0))
    writer = asyncio.StreamWriter(out_transport, protocol, None, loop)
    try:
        yield _Lines(reader), _Out(writer)
    finally:
        in_transport.close()
        out_transport.close()
        os.dup2(saved_in, 0)
        os.dup2(saved_out, 1)
        os.close(saved_in)
        os.close(saved_out)


def serve_stdio(options: McpOptions, *, say: Callable[[str], None]) -> str:
    """Serve one MCP session over stdin/stdout until the client closes stdin or a signal; then remove
    its sandbox. Returns why it stopped (``stdin closed``, ``SIGTERM``, ...)."""
    import anyio
    from mcp.server.runner import serve_loop
    from mcp.server.stdio import stdio_server

    from controller.mcp.server import _lowlevel, build_server

    hub = SessionHub(options)
    server = build_server(hub)
    low = _lowlevel(server)
    stop = _Stop()

    async def main() -> None:
        with anyio.CancelScope() as scope:
            async with _wire() as (wire_in, wire_out), stdio_server(wire_in, wire_out) as (read_stream, write_stream):
                async with low.lifespan(low) as state:
                    # the handshake era only: a client probing server/discover is told Method not found
                    await serve_loop(low, read_stream, write_stream, lifespan_state=state,
                                     init_options=low.create_initialization_options())
                # stdin closed: what is left to write gets FLUSH_S (a client that never reads stdout must not
                # keep the process waiting on a full pipe forever)
                scope.deadline = anyio.current_time() + FLUSH_S

    def loop() -> None:
        try:
            anyio.run(main)
        except BaseException as exc:  # noqa: BLE001 - told to the main thread, which cleans up
            log.error("the stdio loop failed: %s: %s", type(exc).__name__, exc)
        finally:
            stop.set("stdin closed")

    with _signals(stop):
        thread = threading.Thread(target=loop, name="mcp-stdio", daemon=True)
        thread.start()
        why = stop.wait()
    if hub.sessions():
        say(f"stopping ({why}): removing the session's sandbox")
    hub.close_all(why)
    return why


def serve_http(options: McpOptions, *, port: int, key: str, idle_timeout_s: float,
               say: Callable[[str], None], on_listen: Callable[[str], None] | None = None) -> str:
    """Serve streamable HTTP on 127.0.0.1:``port`` (0: a free one) until a signal; ``on_listen(url)`` once
    it accepts requests. Each MCP session's sandbox is removed when it ends; every one at the stop.
    Returns why it stopped. Raises OSError when the port cannot be had, RuntimeError when it did not listen."""
    from controller.asgi import ThreadedUvicorn
    from controller.mcp import http
    from controller.mcp.server import build_server
    from wire.connections import listen, uvicorn_config

    hub = SessionHub(options)
    server = build_server(hub)
    sock = listen(http.HOST, port)
    bound = sock.getsockname()[1]
    app = server.streamable_http_app(streamable_http_path=http.PATH, transport_security=http.security_settings(bound),
                                     session_idle_timeout=idle_timeout_s, host=http.HOST)
    config = uvicorn_config(http.guarded_app(app, key), lifespan="on", log_level="warning", access_log=False,
                            timeout_graceful_shutdown=GRACE_S, server_header=False)
    uv = ThreadedUvicorn(config)
    stop = _Stop()
    quiet = _ShutdownCancels()
    uvicorn_log = logging.getLogger("uvicorn.error")
    uvicorn_log.addFilter(quiet)

    def run() -> None:
        try:
            uv.run(sockets=[sock])
        except BaseException as exc:  # noqa: BLE001 - told to the main thread
            log.error("the HTTP server failed: %s: %s", type(exc).__name__, exc)
        finally:
            uv.ready.set()
            stop.set("the HTTP server stopped")

    with _signals(stop):
        thread = threading.Thread(target=run, name="mcp-http", daemon=True)
        thread.start()
        if not uv.ready.wait(30) or not uv.started:
            uv.should_exit = True
            thread.join(STOP_TIMEOUT_S)
            sock.close()
            raise RuntimeError(f"the MCP server did not start listening on {http.HOST}:{bound}")
        url = f"http://{http.HOST}:{bound}{http.PATH}"
        if on_listen is not None:
            on_listen(url)
        why = stop.wait()
        uv.should_exit = True
    n = len(hub.sessions())
    say(f"stopping ({why}): {n} session(s); their sandboxes are removed")
    thread.join(STOP_TIMEOUT_S)
    hub.close_all(why)
    uvicorn_log.removeFilter(quiet)
    return why


class _ShutdownCancels(logging.Filter):
    """Leaves out uvicorn's traceback of a request cancelled because the server stops (a call still under
    way after :data:`GRACE_S`, a sandbox starting say: its session's sandbox is removed right after). Its
    one line saying how many requests it cancelled stays."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not isinstance(exc, asyncio.CancelledError)


__all__ = ["serve_http", "serve_stdio"]
