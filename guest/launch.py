"""Start allowlisted applications (``POST /v1/launch``).

The allowlist maps an app name to a fixed argv prefix, e.g.
``{"browser": ["firefox-esr", "--new-instance"], "terminal": ["xterm"]}``; a request's ``args`` are
appended as separate argv entries. No shell is involved anywhere, so arguments are never parsed
as shell syntax. The child runs in its own session with ``DISPLAY`` set to the agent's display,
stdin/stdout/stderr on /dev/null, and is reaped by a watcher thread when it exits.

The allowlist limits *which programs* start, not what they do with their arguments: ``args`` reach
the program as they are, options included, so an allowlisted program that runs commands makes
``/v1/launch`` run any command as the agent's user (``terminal`` + ``["-e", "sh", "-c", ...]``; the
conformance suite relies on exactly that). That is intended: the endpoint serves the bearer-token
holder (the controller starting a task's apps), inside the guest, whose user can do the same at the
desktop; the model never calls it. An allowlist that must not allow this lists only programs
without such options, or a fixed argv ending in ``--`` where the program honours it.

Privilege separation: where the agent runs as a user of its own (the desktop image: user ``agent``,
not the desktop user ``sandbox``), it cannot start programs as the desktop user itself. With
``$AGENT_LAUNCH_SOCKET`` set (an absolute path of a Unix stream socket), :class:`Launcher` hands each
allowlisted argv to the launch broker listening there (:func:`serve_broker`, images/session/launcher.py,
run by supervisord as root with only CAP_SETUID/CAP_SETGID/CAP_KILL), which checks the connecting
process's uid (``SO_PEERCRED``) and the argv against the same allowlist and starts it as the desktop
user. The broker only ever switches to that one user, and its socket's directory is closed to the
desktop user, so the desktop user can neither reach it nor gain the agent's rights through it.
Protocol: one JSON line ``{"argv": [str, ...], "display": ":N"}`` (at most ``BROKER_MAX_REQUEST`` bytes)
answered by one JSON line ``{"pid": int}`` or ``{"error": str}``.

Channel apps. An allowlist entry may be an object ``{"argv": [...], "channel": "devtools-pipe"}``: a
browser the agent drives over Chromium's ``--remote-debugging-pipe`` (:mod:`guest.cdp`,
:mod:`guest.browser`). Such an app is never started by a plain request, and a plain app never by a
channel request (``"channel": true`` in the request line). For a channel request the broker makes two
pipes, starts the argv as the *channel user* (``--channel-user``, ``browser``: a user of its own, so
that neither the desktop user nor the agent can reach the browser's memory, profile or pipe ends through
``/proc``) with the pipes' browser ends as its fds 3 and 4, and answers ``{"pid": int, "channel": true}``
with the agent's two ends attached (``SCM_RIGHTS``: first the end the agent writes to, then the end it
reads from). No port, socket path or file is ever made for the channel. A channel app takes no options
beyond its allowlist entry (only URLs: nothing after the fixed argv may start with ``-``), so no request
can add ``--remote-debugging-port`` or ``--no-sandbox``.
"""

from __future__ import annotations

import fcntl
import json
import os
import pwd
import re
import socket
import socketserver
import struct
import subprocess
import threading
from pathlib import Path
from typing import Any, Callable

LAUNCH_SOCKET_ENV = "AGENT_LAUNCH_SOCKET"
"""Environment variable naming the launch broker's socket; unset or empty: launch directly."""
ENV_PROGRAM = "/usr/bin/env"
"""coreutils ``env``: the broker starts ``env -C HOME ARGV...`` so the directory is entered as the user."""
BROKER_MAX_REQUEST = 64 * 1024
"""Largest request line (bytes) the broker reads."""
BROKER_TIMEOUT_S = 10.0
"""Seconds either side waits for the other's line."""
_DISPLAY = re.compile(r":\d{1,5}(\.\d{1,3})?")
CHANNELS = ("devtools-pipe",)
"""Channel kinds an allowlist entry may name (see the module docstring)."""
SETPRIV = "/usr/bin/setpriv"
"""util-linux ``setpriv``: a channel app is spawned (``posix_spawn``, no code between fork and exec in
the threaded broker) as ``setpriv --reuid --regid --clear-groups env -C HOME ARGV...``."""


class LaunchError(Exception):
    """A refused launch: HTTP ``status``, error ``code`` and message."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def load_apps(path: str | None) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """Read the JSON allowlist: ``(plain apps, channel apps)``, each ``{name: argv}``. A value is an argv
    list (a plain app) or ``{"argv": [...], "channel": "devtools-pipe"}`` (a channel app, see the module
    docstring); ``None`` gives empty allowlists. Raises ValueError when the file is not such a mapping.
    """
    if path is None:
        return {}, {}
    data = json.loads(Path(path).read_text())
    problem = ValueError(f"{path}: expected a JSON object mapping app name -> non-empty argv list, or -> "
                         f'{{"argv": [...], "channel": {" | ".join(CHANNELS)}}}')
    if not isinstance(data, dict):
        raise problem
    plain: dict[str, list[str]] = {}
    channel: dict[str, list[str]] = {}
    for name, value in data.items():
        argv, into = value, plain
        if isinstance(value, dict):
            if set(value) != {"argv", "channel"} or value.get("channel") not in CHANNELS:
                raise problem
            argv, into = value["argv"], channel
        if not (isinstance(name, str) and isinstance(argv, list) and argv and all(isinstance(a, str) for a in argv)):
            raise problem
        into[name] = argv
    return plain, channel


def load_allowlist(path: str | None) -> dict[str, list[str]]:
    """The plain apps of the allowlist at ``path`` (:func:`load_apps`). Raises ValueError."""
    return load_apps(path)[0]


class Launcher:
    """Starts allowlisted apps on ``display`` and reaps them."""

    def __init__(self, allowlist: dict[str, list[str]], display: str, broker: str | None = None,
                 channel_apps: dict[str, list[str]] | None = None,
                 on_channel: Callable[[str, int, int, int], None] | None = None) -> None:
        """``broker``: the launch broker's socket path; ``None`` reads ``$AGENT_LAUNCH_SOCKET``.
        ``channel_apps``: the allowlist's channel apps (:func:`load_apps`); ``on_channel(app, pid,
        write_fd, read_fd)`` takes over the agent's ends of a started channel app's pipes (it owns and
        closes them); without it channel apps are unknown apps."""
        self.allowlist = dict(allowlist)
        self.channel_apps = dict(channel_apps or {}) if on_channel else {}
        self.on_channel = on_channel
        self.display = display
        self.broker = broker if broker is not None else (os.environ.get(LAUNCH_SOCKET_ENV) or None)
        self.children: dict[int, subprocess.Popen[bytes]] = {}
        self._lock = threading.Lock()

    def launch(self, app: str, args: list[str]) -> int:
        """Start ``allowlist[app] + args``; returns the child's pid.

        Raises:
            LaunchError: 400 ``unknown_app`` for a name not on the allowlist, 400 ``launch_failed``
            when the program cannot be started.
        """
        argv = self.allowlist.get(app)
        if argv is None and app in self.channel_apps:
            return self._launch_channel(app, [*self.channel_apps[app], *args])
        if argv is None:
            raise LaunchError(400, "unknown_app", f"{app!r} is not an allowlisted app")
        if any("\x00" in a for a in args):
            raise LaunchError(400, "invalid_request", "arguments must not contain NUL bytes")
        if self.broker:
            return self._launch_via_broker(app, [*argv, *args])
        env = dict(os.environ, DISPLAY=self.display)
        try:
            proc = subprocess.Popen(  # noqa: S603 - fixed argv from the allowlist, never a shell
                [*argv, *args], env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True,
            )
        except OSError as exc:
            raise LaunchError(400, "launch_failed", f"cannot start {app!r}: {exc.strerror}") from None
        with self._lock:
            self.children[proc.pid] = proc
        threading.Thread(target=self._reap, args=(proc,), daemon=True, name=f"reap-{proc.pid}").start()
        return proc.pid

    def _launch_channel(self, app: str, argv: list[str]) -> int:
        """Start channel app ``app`` (``argv`` in full) and hand its pipes to ``on_channel``; its pid."""
        assert self.on_channel is not None
        if any("\x00" in a for a in argv):
            raise LaunchError(400, "invalid_request", "arguments must not contain NUL bytes")
        extra = argv[len(self.channel_apps[app]):]
        if any(a.startswith("-") for a in extra):
            raise LaunchError(400, "invalid_request", f"{app!r} takes URLs only, no options (its options are "
                                                      "the allowlist's: a debugging port or --no-sandbox never)")
        if self.broker:
            pid, fds = self._ask_broker(app, argv, channel=True)
        else:
            env = dict(os.environ, DISPLAY=self.display)
            try:
                pid, fds = spawn_with_pipes(argv, env)
            except OSError as exc:
                raise LaunchError(400, "launch_failed", f"cannot start {app!r}: {exc.strerror or exc}") from None
            threading.Thread(target=_reap_pid, args=(pid,), daemon=True, name=f"reap-{pid}").start()
        self.on_channel(app, pid, fds[0], fds[1])
        return pid

    def _launch_via_broker(self, app: str, argv: list[str]) -> int:
        """Ask the broker to start ``argv`` as the desktop user; its pid. Raises LaunchError (400
        ``launch_failed``: refused, broker unreachable or silent within ``BROKER_TIMEOUT_S``)."""
        return self._ask_broker(app, argv, channel=False)[0]

    def _ask_broker(self, app: str, argv: list[str], *, channel: bool) -> tuple[int, list[int]]:
        """One broker request: ``(pid, fds)`` (``fds``: the channel's two ends, empty for a plain app).
        Raises LaunchError (400 ``launch_failed``: refused, unreachable or silent within
        ``BROKER_TIMEOUT_S``; 400 ``invalid_request``: a request longer than ``BROKER_MAX_REQUEST``)."""
        assert self.broker is not None
        body: dict[str, Any] = {"argv": argv, "display": self.display}
        if channel:
            body["channel"] = True
        request = json.dumps(body).encode() + b"\n"
        if len(request) > BROKER_MAX_REQUEST:
            raise LaunchError(400, "invalid_request", f"arguments longer than {BROKER_MAX_REQUEST} bytes")
        fds: list[int] = []
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(BROKER_TIMEOUT_S)
                sock.connect(self.broker)
                sock.sendall(request)
                reply = _read_line(sock, 4096, fds if channel else None)
        except OSError as exc:
            _close_all(fds)
            raise LaunchError(400, "launch_failed", f"cannot start {app!r}: launch broker: "
                              f"{exc.strerror or exc}") from None
        try:
            answer = json.loads(reply)
        except ValueError:
            answer = None
        if isinstance(answer, dict) and isinstance(answer.get("pid"), int) and answer["pid"] > 0:
            if not channel or len(fds) == 2:
                return int(answer["pid"]), fds
            answer = {"error": "the broker sent no channel"}
        _close_all(fds)
        error = answer.get("error") if isinstance(answer, dict) else None
        raise LaunchError(400, "launch_failed", f"cannot start {app!r}: {error or 'launch broker gave no pid'}")

    def _reap(self, proc: subprocess.Popen[bytes]) -> None:
        proc.wait()
        with self._lock:
            self.children.pop(proc.pid, None)


def _read_line(sock: socket.socket, limit: int, fds: list[int] | None = None) -> bytes:
    """Bytes up to the first newline (excluded), at most ``limit``. With ``fds`` (a list), file
    descriptors that come with the data (``SCM_RIGHTS``, at most 2) are appended to it. Raises OSError
    when the peer closes first or sends more."""
    data = b""
    while b"\n" not in data:
        if fds is not None:
            chunk, received, _flags, _addr = socket.recv_fds(sock, 4096, 2)
            fds.extend(received)
        else:
            chunk = sock.recv(4096)
        if not chunk:
            raise OSError("connection closed before a complete line")
        data += chunk
        if len(data) > limit:
            raise OSError(f"line longer than {limit} bytes")
    return data.split(b"\n", 1)[0]


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


def _reap_pid(pid: int) -> None:
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass


def spawn_with_pipes(argv: list[str], env: dict[str, str], prefix: list[str] | None = None) -> tuple[int, list[int]]:
    """Spawn ``prefix + argv`` (``posix_spawnp``, its own session, stdio on /dev/null) with two new
    pipes as its fds 3 (it reads) and 4 (it writes); returns ``(pid, [the end that writes to its fd 3,
    the end that reads its fd 4])``, both close-on-exec, owned by the caller. Raises OSError."""
    to_child = os.pipe()
    from_child = os.pipe()
    # The child's ends, moved above the numbers the actions write (a pipe end that happens to be fd 3 or 4
    # would be overwritten by the first dup2 before the second one copies it).
    ends = [fcntl.fcntl(to_child[0], fcntl.F_DUPFD_CLOEXEC, 10), fcntl.fcntl(from_child[1], fcntl.F_DUPFD_CLOEXEC, 10)]
    _close_all([to_child[0], from_child[1]])
    try:
        actions = [
            (os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0),
            (os.POSIX_SPAWN_OPEN, 1, "/dev/null", os.O_WRONLY, 0),
            (os.POSIX_SPAWN_OPEN, 2, "/dev/null", os.O_WRONLY, 0),
            (os.POSIX_SPAWN_DUP2, ends[0], 3),
            (os.POSIX_SPAWN_DUP2, ends[1], 4),
        ]
        full = [*(prefix or []), *argv]
        pid = os.posix_spawnp(full[0], full, env, file_actions=actions, setsid=True)
    except BaseException:
        _close_all([*ends, to_child[1], from_child[0]])
        raise
    _close_all(ends)
    return pid, [to_child[1], from_child[0]]


def allowed_argv(allowlist: dict[str, list[str]], argv: list[str]) -> bool:
    """True when ``argv`` starts with one allowlisted argv prefix (entries compared exactly)."""
    return any(len(argv) >= len(prefix) and argv[: len(prefix)] == prefix for prefix in allowlist.values())


class _BrokerHandler(socketserver.StreamRequestHandler):
    server: "_BrokerServer"

    def handle(self) -> None:
        self.connection.settimeout(BROKER_TIMEOUT_S)
        fds: list[int] = []
        try:
            answer = self.server.answer(self.connection, fds)
        except OSError as exc:
            answer = {"error": f"bad request: {exc.strerror or exc}"}
        try:
            line = json.dumps(answer).encode() + b"\n"
            if fds:
                socket.send_fds(self.connection, [line], fds)
            else:
                self.connection.sendall(line)
        except OSError:
            pass
        finally:
            _close_all(fds)


class _BrokerServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True

    def __init__(self, path: str, client_uid: int, user: pwd.struct_passwd, allowlist: dict[str, list[str]],
                 base_env: dict[str, str], channel_apps: dict[str, list[str]] | None = None,
                 channel_user: pwd.struct_passwd | None = None) -> None:
        self.client_uid, self.user, self.allowlist, self.base_env = client_uid, user, allowlist, base_env
        self.channel_apps, self.channel_user = channel_apps or {}, channel_user
        self.final_path = path
        super().__init__(f"{path}.binding", _BrokerHandler)

    def server_bind(self) -> None:
        try:
            os.unlink(self.server_address)
        except FileNotFoundError:
            pass
        super().server_bind()
        os.chmod(self.server_address, 0o666)

    def server_activate(self) -> None:
        # The socket is bound under a private name, opened to connections, and only then renamed to
        # the path clients use: a client that sees the path can connect (no ECONNREFUSED between bind
        # and listen, no EACCES before the chmod).
        # A broker that fails here leaves no socket behind; one killed here leaves the private name,
        # which the next broker on the same path unlinks before it binds.
        try:
            super().server_activate()
            os.replace(self.server_address, self.final_path)
        except BaseException:
            try:
                os.unlink(self.server_address)
            except FileNotFoundError:
                pass
            raise
        self.server_address = self.final_path

    def answer(self, conn: socket.socket, fds: list[int]) -> dict[str, object]:
        """Check and serve one request; a channel app's two ends are appended to ``fds``."""
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        _pid, uid, _gid = struct.unpack("3i", creds)
        if uid != self.client_uid:
            return {"error": f"uid {uid} may not launch"}
        try:
            request = json.loads(_read_line(conn, BROKER_MAX_REQUEST))
        except ValueError:
            return {"error": "request is not JSON"}
        argv = request.get("argv") if isinstance(request, dict) else None
        display = request.get("display") if isinstance(request, dict) else None
        if not (isinstance(argv, list) and argv and all(isinstance(a, str) and "\x00" not in a for a in argv)):
            return {"error": "argv must be a non-empty list of strings without NUL bytes"}
        if not isinstance(display, str) or not _DISPLAY.fullmatch(display):
            return {"error": "display must be :N"}
        if isinstance(request, dict) and request.get("channel") is True:
            return self._start_channel(argv, display, fds)
        if not allowed_argv(self.allowlist, argv):
            return {"error": "argv does not start with an allowlisted program"}
        env = dict(self.base_env, DISPLAY=display, HOME=self.user.pw_dir, USER=self.user.pw_name,
                   LOGNAME=self.user.pw_name, SHELL=self.user.pw_shell)
        # The working directory is entered as the user (``env -C``, after the switch): the broker's
        # uid 0 holds no CAP_DAC_OVERRIDE, so it may not enter the user's 0750 home itself.
        home = self.user.pw_dir if os.path.isdir(self.user.pw_dir) else "/"
        try:
            proc = subprocess.Popen(  # noqa: S603 - allowlisted argv, never a shell
                [ENV_PROGRAM, "-C", home, *argv], env=env, cwd="/", user=self.user.pw_uid, group=self.user.pw_gid,
                extra_groups=[], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True,
            )
        except (OSError, subprocess.SubprocessError) as exc:
            return {"error": f"{getattr(exc, 'strerror', None) or exc}"}
        threading.Thread(target=proc.wait, daemon=True, name=f"reap-{proc.pid}").start()
        return {"pid": proc.pid}

    def _start_channel(self, argv: list[str], display: str, fds: list[int]) -> dict[str, object]:
        """A channel app, as the channel user, with its pipes (module docstring)."""
        user = self.channel_user
        if user is None:
            return {"error": "this broker starts no channel apps (no --channel-user)"}
        fixed = next((p for p in self.channel_apps.values() if argv[:len(p)] == p), None)
        if fixed is None:
            return {"error": "argv does not start with an allowlisted channel app"}
        if any(a.startswith("-") for a in argv[len(fixed):]):
            return {"error": "a channel app takes no options beyond the allowlist's"}
        env = dict(self.base_env, DISPLAY=display, HOME=user.pw_dir, USER=user.pw_name,
                   LOGNAME=user.pw_name, SHELL=user.pw_shell, XAUTHORITY=os.path.join(user.pw_dir, ".Xauthority"))
        home = user.pw_dir if os.path.isdir(user.pw_dir) else "/"
        prefix = [SETPRIV, f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups", "--",
                  ENV_PROGRAM, "-C", home]
        try:
            pid, ends = spawn_with_pipes(argv, env, prefix)
        except OSError as exc:
            return {"error": f"{exc.strerror or exc}"}
        threading.Thread(target=_reap_pid, args=(pid,), daemon=True, name=f"reap-{pid}").start()
        fds.extend(ends)
        return {"pid": pid, "channel": True}


def serve_broker(path: str, client: str, user: str, apps_file: str, channel_user: str | None = None) -> None:
    """Serve launch requests on the Unix socket ``path`` (mode 0666: access is the directory's, which
    must be closed to ``user``) until killed: from processes of user ``client`` only, argv starting with
    an entry of the ``apps_file`` allowlist, each started as ``user`` (its uid, gid and no other groups;
    ``HOME``/``USER``/``LOGNAME``/``SHELL`` and ``DISPLAY`` set, the rest of the broker's environment
    kept, cwd its home, entered as that user (the program does not start when it cannot), own session,
    stdio on /dev/null) and reaped here. The socket is bound as ``path + ".binding"``, given its mode,
    and renamed to ``path`` (replacing what was there) only once it listens, so a client that finds
    ``path`` can connect. The directory must be writable by the broker's uid alone: the broker
    unlinks, chmods and renames names in it as root.

    ``channel_user``: the user channel apps run as (module docstring); without it none are started.

    Raises KeyError for an unknown user, ValueError for a bad allowlist, OSError when ``path`` cannot
    be bound.
    """
    client_uid = pwd.getpwnam(client).pw_uid
    target = pwd.getpwnam(user)
    channel_target = pwd.getpwnam(channel_user) if channel_user else None
    if target.pw_uid == 0 or (channel_target is not None and channel_target.pw_uid == 0):
        raise ValueError("the broker does not start programs as root")
    if channel_target is not None and channel_target.pw_uid in (target.pw_uid, client_uid):
        raise ValueError("the channel user must be a user of its own (not the desktop user, not the client)")
    allowlist, channel_apps = load_apps(apps_file)
    server = _BrokerServer(path, client_uid, target, allowlist, dict(os.environ), channel_apps, channel_target)
    with server:
        server.serve_forever()
