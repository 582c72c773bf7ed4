"""Run a private Xvfb and an agent process on this machine (tests, benchmarks, local trials).

:class:`Xvfb` picks a free display number itself (``-displayfd``), so parallel runs never clash.
:class:`AgentProcess` starts ``python -m guest serve`` as a real subprocess on a free loopback
port with a token file readable only by the current user, and waits for ``/livez``.
"""

from __future__ import annotations

import json
import os
import secrets
import select
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path



def terminate(proc: subprocess.Popen | None, timeout: float = 5.0) -> None:
    """Stop ``proc`` if it still runs: SIGTERM, then SIGKILL after ``timeout`` seconds; always reaped."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()

class Xvfb:
    """A private ``Xvfb`` at ``width`` x ``height`` x ``depth``; ``display`` is its name (``":N"``).
    ``args``: more server options (e.g. ``("-extension", "DAMAGE")`` to leave an extension out)."""

    def __init__(self, width: int = 1280, height: int = 800, depth: int = 24, timeout: float = 15.0,
                 args: tuple[str, ...] = ()) -> None:
        self.width, self.height, self.depth = width, height, depth
        self.timeout = timeout
        self.args = tuple(args)
        self.proc: subprocess.Popen[bytes] | None = None
        self.display = ""

    def start(self, display: str | None = None) -> "Xvfb":
        """Start the server (on ``display`` when given, e.g. to restart on the same number)."""
        screen = ["-screen", "0", f"{self.width}x{self.height}x{self.depth}"]
        common = ["-nolisten", "tcp", "-noreset", "+extension", "XTEST", *self.args]
        if display:
            self.proc = subprocess.Popen(["Xvfb", display, *screen, *common],
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            self.display = display
            self._wait_socket(int(display.lstrip(":")))
            return self
        rfd, wfd = os.pipe()
        try:
            self.proc = subprocess.Popen(["Xvfb", "-displayfd", str(wfd), *screen, *common],
                                         pass_fds=(wfd,), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            os.close(wfd)
            wfd = -1
            data = b""
            deadline = time.monotonic() + self.timeout
            while not data.endswith(b"\n"):
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([rfd], [], [], left)[0]:
                    raise RuntimeError("Xvfb did not report its display number")
                chunk = os.read(rfd, 32)
                if not chunk:
                    raise RuntimeError("Xvfb exited before reporting its display number")
                data += chunk
            self.display = ":" + data.decode().strip()
        finally:
            os.close(rfd)
            if wfd >= 0:
                os.close(wfd)
        return self

    def _wait_socket(self, number: int) -> None:
        path = f"/tmp/.X11-unix/X{number}"
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            if self.proc and self.proc.poll() is not None:
                raise RuntimeError(f"Xvfb {self.display} exited with {self.proc.returncode}")
            try:
                with socket.socket(socket.AF_UNIX) as s:
                    s.connect(path)
                return
            except OSError:
                time.sleep(0.02)
        raise RuntimeError(f"Xvfb {self.display} did not start")

    def stop(self) -> None:
        """Terminate the server and wait for it."""
        terminate(self.proc)
        self.proc = None

    def restart(self) -> None:
        """Stop and start again on the same display number."""
        name = self.display
        self.stop()
        self.start(name)

    def env(self) -> dict[str, str]:
        """The current environment with ``DISPLAY`` pointing at this server."""
        return dict(os.environ, DISPLAY=self.display)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class AgentProcess:
    """``python -m guest serve`` on ``display``, bound to 127.0.0.1 on a free port.

    ``token`` is random, written to a 0600 file; ``base_url`` is the agent's URL. ``extra_args``
    go to ``serve`` as they are (e.g. ``["--busy-timeout", "1"]``); ``apps`` becomes the
    ``--apps`` allowlist file; ``cwd`` is the agent's working directory (and so that of every app it
    launches), the caller's when None.
    """

    def __init__(self, display: str, *, apps: dict[str, list[str]] | None = None,
                 files_roots: list[str] | None = None, extra_args: list[str] | None = None,
                 env: dict[str, str] | None = None, cwd: str | None = None) -> None:
        self.display = display
        self.cwd = cwd
        self.apps = apps
        self.files_roots = files_roots or []
        self.extra_args = extra_args or []
        self.env = env
        self.token = secrets.token_urlsafe(24)
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self._dir = tempfile.TemporaryDirectory(prefix="ds-agent-")
        self.log_path = Path(self._dir.name) / "agent.log"

    def start(self, timeout: float = 20.0) -> "AgentProcess":
        """Start the agent and wait until ``/livez`` answers."""
        token_file = Path(self._dir.name) / "token"
        fd = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(self.token + "\n")
        argv = [sys.executable, "-m", "guest", "serve", "--display", self.display,
                "--bind", f"127.0.0.1:{self.port}", "--token-file", str(token_file)]
        if self.apps is not None:
            apps_file = Path(self._dir.name) / "apps.json"
            apps_file.write_text(json.dumps(self.apps))
            argv += ["--apps", str(apps_file)]
        for root in self.files_roots:
            argv += ["--files-root", root]
        argv += self.extra_args
        log = open(self.log_path, "ab")
        repo_root = str(Path(__file__).resolve().parent.parent)
        env = dict(self.env or os.environ)
        env["PYTHONPATH"] = repo_root + os.pathsep + env.get("PYTHONPATH", "")
        self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=self.cwd)
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"agent exited with {self.proc.returncode}: {self.log_path.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(self.base_url + "/livez", timeout=1) as resp:
                    if resp.status == 200:
                        return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("agent did not answer /livez in time")

    def stop(self) -> None:
        """Terminate the agent and remove its token file."""
        terminate(self.proc)
        self.proc = None
        self._dir.cleanup()
