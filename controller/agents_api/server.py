"""``desktop-sandbox serve``: the local Agents API on 127.0.0.1, until SIGINT / SIGTERM.

::

    with AgentsServer(ServeOptions(port=0, key_file=None)) as server:
        print(server.line)   # agents-api: http://127.0.0.1:PORT/v1 key-file: PATH

The key: read from ``key_file`` when it exists (:func:`load_or_make_key`: one line, a regular file of
the server's user that only it may use, not a symlink, a key of :data:`MIN_KEY_LENGTH` characters or
more), else a new random one written there with mode 0600 (default file: ``<runs-dir>/agents-api.key``). The
state: :class:`controller.agents_api.store.Store` (``<runs-dir>/agents.db`` by default). At start the
sessions a previous server left behind are marked failed and their sandboxes removed
(:meth:`controller.agents_api.sessions.SessionHub.recover`); at stop every live session's sandbox is
removed.
"""

from __future__ import annotations

import os
import secrets
import stat
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

from controller.agents_api.app import create_app
from controller.agents_api.errors import ApiError
from controller.asgi import ThreadedUvicorn
from controller.agents_api.sessions import HubOptions, SessionHub
from controller.agents_api.store import Store
from controller.model.errors import DesktopSandboxError
from wire.connections import ConnectionGuard, listen, uvicorn_config

HOST = "127.0.0.1"
START_TIMEOUT_S = 15.0
STOP_TIMEOUT_S = 10.0


class KeyFileError(DesktopSandboxError, ValueError):
    """A key file that cannot be used (see :func:`load_or_make_key`); its message says why."""


MIN_KEY_LENGTH = 32
"""Fewest characters of a key read from a key file."""
MIN_KEY_DISTINCT = 10
"""Fewest different characters among them (a generated key has about 30)."""
MAX_KEY_LENGTH = 512
"""Most characters of a key."""


def key_problem(key: str) -> str | None:
    """Why ``key`` is not a key the server accepts, or None: it must be :data:`MIN_KEY_LENGTH` to
    :data:`MAX_KEY_LENGTH` printable ASCII characters without spaces, at least :data:`MIN_KEY_DISTINCT`
    of them different. Never names the key's characters."""
    if not key or len(key) > MAX_KEY_LENGTH or any(not (33 <= ord(c) < 127) for c in key):
        return f"must hold one key: {MIN_KEY_LENGTH} to {MAX_KEY_LENGTH} printable ASCII characters, no spaces"
    if len(key) < MIN_KEY_LENGTH or len(set(key)) < MIN_KEY_DISTINCT:
        return (f"holds a key too weak to guard the API: use at least {MIN_KEY_LENGTH} characters, "
                f"{MIN_KEY_DISTINCT} of them different (delete the file and a random one is made)")
    return None


def load_or_make_key(path: Path) -> str:
    """The key in ``path``; a new one (``sk-local-`` + 256 random bits, urlsafe) written there 0600 when
    the file does not exist. An existing file is opened without following a symlink and must be a
    regular file of the server's user that neither group nor others may use (mode 0600 or narrower),
    holding a key :func:`key_problem` accepts. Raises :class:`KeyFileError`."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        try:
            # opened without following a symlink and without blocking (a FIFO would wait for a writer),
            # then checked on what was opened
            rfd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:
            if os.path.islink(path):
                raise KeyFileError(f"the key file {path} is a symbolic link: name the file itself") from None
            raise KeyFileError(f"cannot read the key file {path}: {exc.strerror or exc}") from None
        try:
            st = os.fstat(rfd)
            if not stat.S_ISREG(st.st_mode):
                raise KeyFileError(f"{path} is not a regular file")
            if st.st_uid != os.geteuid():
                raise KeyFileError(f"the key file {path} belongs to uid {st.st_uid}, not to this server's user "
                                   f"(uid {os.geteuid()}): its key may be known to that user")
            if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
                raise KeyFileError(f"{path} may be read by others (mode {stat.S_IMODE(st.st_mode):o}): chmod 600 it")
            raw = os.read(rfd, MAX_KEY_LENGTH + 2)
        except OSError as exc:
            raise KeyFileError(f"cannot read the key file {path}: {exc.strerror or exc}") from None
        finally:
            os.close(rfd)
        try:
            text = raw.decode("utf-8").strip()
        except UnicodeDecodeError:
            text = "\x00"  # refused below as not printable
        problem = key_problem(text)
        if problem:
            raise KeyFileError(f"{path} {problem}")
        return text
    except OSError as exc:
        raise KeyFileError(f"cannot create the key file {path}: {exc.strerror or exc}") from None
    key = "sk-local-" + secrets.token_urlsafe(32)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(key + "\n")
    return key


@dataclass
class ServeOptions:
    """``port`` (0: a free one), ``key_file`` (None: ``<runs_dir>/agents-api.key``), ``db`` (None:
    ``<runs_dir>/agents.db``), and the sessions' :class:`HubOptions` fields."""

    port: int = 0
    key_file: Path | None = None
    db: Path | None = None
    hub: HubOptions = field(default_factory=HubOptions)


SWITCH_INTERVAL_S = 0.001
"""The interpreter's thread switch interval while a server runs (seconds; Python's default is 0.005): a
screenshot goes from the run's thread through the session's event thread to the stream's event loop,
and each hand-over waits for the interpreter lock up to this long while another thread computes
(measured: event latency p50 26.5 -> 21.1 ms)."""


class AgentsServer:
    """The server (see the module docstring). :meth:`start` returns once it accepts requests;
    ``url`` (``http://127.0.0.1:PORT/v1``), ``key``, ``key_file``, ``line`` are set then."""

    def __init__(self, options: ServeOptions) -> None:
        self.options = options
        runs = Path(options.hub.runs_dir)
        self.key_file = Path(options.key_file or runs / "agents-api.key")
        self.db_path = Path(options.db or runs / "agents.db")
        self.key = ""
        self.port: int | None = None
        self.stopped_sessions = 0
        """How many sessions :meth:`stop` failed (their sandboxes removed)."""
        self.closing = threading.Event()
        self.store: Store | None = None
        self.hub: SessionHub | None = None
        self.recovered: list[str] = []
        self._server: ThreadedUvicorn | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}/v1"

    @property
    def line(self) -> str:
        """The one line ``serve`` prints once it accepts requests."""
        return f"agents-api: {self.url} key-file: {self.key_file}"

    def start(self, timeout: float = START_TIMEOUT_S) -> "AgentsServer":
        """Open the store (StoreBusy when another server holds it), recover what a previous server left,
        listen. KeyFileError for a bad key file; RuntimeError when uvicorn did not listen in time."""
        if sys.getswitchinterval() > SWITCH_INTERVAL_S:
            sys.setswitchinterval(SWITCH_INTERVAL_S)
        Path(self.options.hub.runs_dir).mkdir(parents=True, exist_ok=True, mode=0o755)
        self.key = load_or_make_key(self.key_file)
        self.store = Store(self.db_path)
        self.hub = SessionHub(self.store, self.options.hub)
        self.recovered = self.hub.recover()
        self.hub.start_pool()
        # the connection rules (wire.connections): Host checked before the key, a head deadline, a cap on
        # connections that have not carried the key
        app = ConnectionGuard(create_app(self.hub, self.key, closing=self.closing), token=self.key,
                              error=lambda status, code, message: ApiError(status, code, message).body())
        config = uvicorn_config(app, lifespan="off", log_level="warning", access_log=False,
                                timeout_graceful_shutdown=3, server_header=False)
        try:
            sock = listen(HOST, self.options.port)
        except OSError as exc:
            self.stop()
            raise RuntimeError(f"the agents API cannot listen on {HOST}:{self.options.port}: "
                               f"{exc.strerror or exc}") from None
        self._server = server = ThreadedUvicorn(config)

        def serve() -> None:
            try:
                server.run(sockets=[sock])
            finally:
                server.ready.set()

        self._thread = threading.Thread(target=serve, name="agents-api", daemon=True)
        self._thread.start()
        if not server.ready.wait(timeout) or not server.started:
            self.stop()
            sock.close()
            raise RuntimeError(f"the agents API did not start listening on {HOST}:{self.options.port} "
                               f"within {timeout:g} s")
        sockets = [s for listener in server.servers for s in (listener.sockets or ())]
        self.port = sockets[0].getsockname()[1]
        return self

    def stop(self) -> None:
        """Stop: every live session failed and its sandbox removed (its streams get
        ``agent.session.failed`` and end), then the other streams end and the server closes; the store
        last."""
        if self.hub is not None:
            self.stopped_sessions = self.hub.shutdown()
        self.closing.set()
        if self.hub is not None:
            self.hub.notifier.notify_all()  # streams waiting for an event see the server closing now
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(STOP_TIMEOUT_S)
        if self.store is not None:
            self.store.close()
            self.store = None

    def __enter__(self) -> "AgentsServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve_forever(options: ServeOptions, *, ui: bool = False, say=print) -> None:  # noqa: ANN001
    """Run the server until SIGINT or SIGTERM: ``say(line)`` gets :attr:`AgentsServer.line` once it
    accepts requests (and, with ``ui``, the web console's ``console: URL`` line first: every turn is
    a live run there, its approvals answerable beside this API). Every sandbox is removed at the end.
    Raises :class:`KeyFileError`, :class:`controller.agents_api.store.StoreBusy`, RuntimeError."""
    import signal

    console_server = None
    if ui:
        from controller.console.server import ConsoleServer

        console_server = ConsoleServer(Path(options.hub.runs_dir)).start()
        options.hub.on_live = console_server.add_run
        say(f"console: {console_server.url}")
    stop = threading.Event()
    previous = {s: signal.signal(s, lambda *_: stop.set()) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    server = AgentsServer(options)
    try:
        server.start()
        say(server.line)
        while not stop.wait(3600):
            pass
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        if server.port:
            say("agents-api: stopping: each session's turn is cancelled and its sandbox removed")
        server.stop()
        if server.port:
            say(f"agents-api: stopped ({server.stopped_sessions} session(s) failed, their sandboxes removed)")
        if console_server is not None:
            console_server.stop()
