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
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
from pathlib import Path


class LaunchError(Exception):
    """A refused launch: HTTP ``status``, error ``code`` and message."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def load_allowlist(path: str | None) -> dict[str, list[str]]:
    """Read the ``{name: [argv...]}`` JSON allowlist; ``None`` gives an empty allowlist.

    Raises ValueError when the file is not such a mapping.
    """
    if path is None:
        return {}
    data = json.loads(Path(path).read_text())
    if not isinstance(data, dict) or not all(
        isinstance(k, str) and isinstance(v, list) and v and all(isinstance(a, str) for a in v)
        for k, v in data.items()
    ):
        raise ValueError(f"{path}: expected a JSON object mapping app name -> non-empty argv list")
    return data


class Launcher:
    """Starts allowlisted apps on ``display`` and reaps them."""

    def __init__(self, allowlist: dict[str, list[str]], display: str) -> None:
        self.allowlist = dict(allowlist)
        self.display = display
        self.children: dict[int, subprocess.Popen[bytes]] = {}
        self._lock = threading.Lock()

    def launch(self, app: str, args: list[str]) -> int:
        """Start ``allowlist[app] + args``; returns the child's pid.

        Raises:
            LaunchError: 400 ``unknown_app`` for a name not on the allowlist, 400 ``launch_failed``
            when the program cannot be started.
        """
        argv = self.allowlist.get(app)
        if argv is None:
            raise LaunchError(400, "unknown_app", f"{app!r} is not an allowlisted app")
        if any("\x00" in a for a in args):
            raise LaunchError(400, "invalid_request", "arguments must not contain NUL bytes")
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

    def _reap(self, proc: subprocess.Popen[bytes]) -> None:
        proc.wait()
        with self._lock:
            self.children.pop(proc.pid, None)
