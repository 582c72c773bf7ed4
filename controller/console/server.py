""":class:`ConsoleServer`: the web console in a background thread on 127.0.0.1.

::

    server = ConsoleServer(Path("runs")).start()
    print(f"console: {server.url}")      # http://127.0.0.1:PORT/s/<secret>/login?t=<one-time token>
    server.add_run(live)                 # a LiveRun in progress: its page, events, screen, approvals
    ...
    server.stop()

It binds 127.0.0.1 only, on a free port the kernel picks (port 0); :meth:`ConsoleServer.start` returns
once uvicorn listens (its real port read from the listening socket), or raises after a deadline.
Who may use it and how: :mod:`controller.console.auth`; the routes: :mod:`controller.console.app`.
"""

from __future__ import annotations

import threading
from pathlib import Path
from urllib.parse import quote

from controller.asgi import ThreadedUvicorn
from controller.console.app import ConsoleState, create_app
from controller.console.auth import RUN_PAGE, Auth, Guard
from controller.console.streams import MAX_CLIENT_MESSAGE, WAIT_S, PageSocketProtocol
from controller.console.runs import valid_run_id
from controller.run.live import LiveRun
from wire.connections import ConnectionGuard, listen, uvicorn_config

START_TIMEOUT_S = 15.0
"""Longest wait for uvicorn to listen (seconds)."""
STOP_TIMEOUT_S = 10.0
"""Longest wait for the server thread to end (seconds)."""
DRAIN_S = 2 * WAIT_S + 0.5
"""Longest wait, as the console stops, for the run pages' sockets to say what their runs said last
(``end`` included) and close, before the server closes what is still open (seconds)."""
HOST = "127.0.0.1"
WEBSOCKETS = {"ws": PageSocketProtocol, "ws_max_size": MAX_CLIENT_MESSAGE, "ws_per_message_deflate": False}
"""uvicorn's WebSocket settings (a run page's socket, controller.console.streams.live_socket): the
``websockets`` library with a small send buffer, a client's message capped, no compression (frames are
JPEG already)."""


class ConsoleServer:
    """The console over ``runs_dir`` (see the module docstring). ``url``: the one-time login URL,
    set by :meth:`start`; ``port``: the port it listens on."""

    def __init__(self, runs_dir: Path) -> None:
        self.auth = Auth()
        self.state = ConsoleState(Path(runs_dir), self.auth)
        self.port: int | None = None
        self._server: ThreadedUvicorn | None = None
        self._thread: threading.Thread | None = None

    @property
    def origin(self) -> str:
        """``http://127.0.0.1:PORT``."""
        if self.port is None:
            raise RuntimeError("the console has not started")
        return f"http://{HOST}:{self.port}"

    @property
    def base(self) -> str:
        """``http://127.0.0.1:PORT/s/<secret>``: the console's root; every page is under it."""
        return self.origin + self.auth.base

    @property
    def home_path(self) -> str:
        """``/s/<secret>/``: the path of the runs list (what a request without a session gets 401 for)."""
        return self.auth.base + "/"

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT/s/<secret>/login?t=<token>``: opens one browser session, once."""
        return f"{self.base}/login?t={self.auth.login_token}"

    def url_for_run(self, run_id: str) -> str:
        """:attr:`url` that then opens the page of run ``run_id`` (``&next=/runs/<id>``) instead of the
        runs list."""
        return f"{self.url}&next={quote(RUN_PAGE + run_id, safe='/')}"

    def start(self, timeout: float = START_TIMEOUT_S) -> "ConsoleServer":
        """Listen on 127.0.0.1 (a free port) in a background thread; returns once it listens.
        RuntimeError when it did not within ``timeout`` seconds."""
        if self._thread is not None:
            raise RuntimeError("the console was already started")
        # a request the Guard lets through authenticates its connection (wire.connections: the head
        # deadline and the cap hold for the others)
        app = Guard(ConnectionGuard(create_app(self.state), token=None, check_host=False), self.auth)
        config = uvicorn_config(app, lifespan="off", log_level="warning", access_log=False,
                                timeout_graceful_shutdown=3, server_header=False, **WEBSOCKETS)
        sock = listen(HOST, 0)
        self._server = server = ThreadedUvicorn(config)

        def serve() -> None:
            try:
                server.run(sockets=[sock])
            finally:
                server.ready.set()  # a failed start (SystemExit in startup) wakes start() too

        self._thread = threading.Thread(target=serve, name="desktop-sandbox-console", daemon=True)
        self._thread.start()
        if not server.ready.wait(timeout) or not server.started:
            self.stop()
            raise RuntimeError(f"the console did not start listening on {HOST} within {timeout:g} s")
        sockets = [s for listener in server.servers for s in (listener.sockets or ())]
        self.port = sockets[0].getsockname()[1]
        self.auth.port = self.port
        return self

    def add_run(self, live: LiveRun) -> None:
        """Show ``live`` (a run in progress) in the console under its ``run_id`` (ValueError for an
        id a URL cannot carry: :func:`controller.console.runs.valid_run_id`)."""
        if not valid_run_id(live.run_id):
            raise ValueError(f"run id {live.run_id!r} cannot be served (letters, digits, '.', '_', '-')")
        self.state.live[live.run_id] = live

    def stop(self) -> None:
        """Stop serving: streams end (the run pages' sockets send what their runs said last, for at most
        :data:`DRAIN_S`), the thread is joined (at most :data:`STOP_TIMEOUT_S`)."""
        self.state.closing.set()
        if self._server is not None and self._server.started:
            # uvicorn's shutdown closes an open WebSocket at once (1012): a page would miss the run's end
            self.state.no_sockets.wait(DRAIN_S)
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(STOP_TIMEOUT_S)
        for pool in (self.state.waits, self.state.frames, self.state.inputs):
            pool.shutdown(wait=False, cancel_futures=True)

    def __enter__(self) -> "ConsoleServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
