"""The real ``desktop-sandbox`` command line in a subprocess, watched from outside: its output, its run
record, and the Docker events of the containers it owns (``desktop-sandbox.owner=<host>:<pid>``), so a
test can wait for a moment (never for time) and then signal or kill it, and afterwards check that it
left nothing behind. Used by test_signal_sweep.py and test_teardown.py (fixture ``cli_run``: import it).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

import pytest

from controller.sandbox import LABEL_OWNER, LABEL_ROLE

ROOT = Path(__file__).resolve().parents[2]
DEADLINE_S = 120.0
"""Longest wait for any moment or for the process to end (a whole pickup run takes about 15-20 s)."""
RUNS: Any = object()
"""Stands for the run's own records directory in a command line."""


def read_entries(path: Path) -> list[dict[str, Any]]:
    """The record's complete lines (a line being written right now is skipped)."""
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


class CliRun:
    """``python -m controller.cli ARGS`` as the leader of its own session, ``$XDG_RUNTIME_DIR`` (where
    ``up`` writes token files) a fresh directory, no ``OPENAI_API_KEY``."""

    def __init__(self, docker_client, tmp_path: Path, *args: Any, follow_desktop_log: bool = False) -> None:
        self.client = docker_client
        self.runs = tmp_path / "runs"
        self.xdg = tmp_path / "xdg"
        self.xdg.mkdir(mode=0o700, parents=True)
        self.env = {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "COLUMNS", "FORCE_COLOR")}
        self.env.update(PYTHONPATH=str(ROOT), XDG_RUNTIME_DIR=str(self.xdg))
        since = time.time() - 1
        argv = [str(self.runs) if a is RUNS else str(a) for a in args]
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "controller.cli", *argv], cwd=ROOT, env=self.env, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        self.owner = f"{socket.gethostname()}:{self.proc.pid}"
        self.stdout: list[str] = []
        self.stderr: list[str] = []
        self.events: list[dict[str, Any]] = []
        self.agent_ports: set[str] = set()
        self.desktop_log: list[str] = []
        self._follow = follow_desktop_log
        self._followers: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._readers = [threading.Thread(target=self._read, args=(self.proc.stdout, self.stdout), daemon=True),
                         threading.Thread(target=self._read, args=(self.proc.stderr, self.stderr), daemon=True)]
        self._stream = docker_client.events(since=since, decode=True,
                                            filters={"type": "container", "label": f"{LABEL_OWNER}={self.owner}"})
        for t in [*self._readers, threading.Thread(target=self._watch, daemon=True)]:
            t.start()

    # -- what can be seen of it -----------------------------------------------------------------------

    def _read(self, pipe, sink: list[str]) -> None:  # noqa: ANN001
        for line in pipe:
            with self._lock:
                sink.append(line.rstrip("\n"))

    def _watch(self) -> None:
        try:
            for event in self._stream:
                attrs = event.get("Actor", {}).get("Attributes", {})
                if event.get("Action") == "start" and attrs.get(LABEL_ROLE) == "gateway":
                    self._note_port(event["id"])
                if event.get("Action") == "start" and attrs.get(LABEL_ROLE) == "desktop" and self._follow:
                    follower = threading.Thread(target=self._follow_log, args=(event["id"],), daemon=True)
                    follower.start()
                    self._followers.append(follower)
                with self._lock:
                    self.events.append(event)
        except Exception:  # noqa: BLE001 - the stream is closed at the end
            pass

    def _note_port(self, container_id: str) -> None:
        """The gateway's published agent port (its docker-proxy must be gone afterwards)."""
        try:
            ports = self.client.api.inspect_container(container_id)["NetworkSettings"]["Ports"] or {}
        except Exception:  # noqa: BLE001 - already removed: nothing to note
            return
        for binding in ports.get("8000/tcp") or []:
            self.agent_ports.add(str(binding["HostPort"]))

    def _follow_log(self, container_id: str) -> None:
        """The desktop's output (the agent's access log) as it is written, until the container is gone."""
        try:
            for chunk in self.client.api.logs(container_id, stream=True, follow=True, stdout=True, stderr=True):
                with self._lock:
                    self.desktop_log.extend(chunk.decode("utf-8", "replace").splitlines())
        except Exception:  # noqa: BLE001
            pass

    def record(self) -> Path | None:
        found = sorted(self.runs.glob("*/record.jsonl"))
        return found[0] if found else None

    def entries(self) -> list[dict[str, Any]]:
        path = self.record()
        return read_entries(path) if path else []

    def container_events(self, action: str, role: str | None = None) -> list[dict[str, Any]]:
        with self._lock:
            return [e for e in self.events if e.get("Action") == action
                    and role in (None, e.get("Actor", {}).get("Attributes", {}).get(LABEL_ROLE))]

    def err(self) -> str:
        with self._lock:
            return "\n".join(self.stderr)

    def wait_for(self, what: str, condition: Callable[["CliRun"], bool], timeout: float = DEADLINE_S) -> None:
        """Poll ``condition(self)`` until it holds; fail when the process ends first or the deadline passes."""
        deadline = time.monotonic() + timeout
        while not condition(self):
            if self.proc.poll() is not None:
                pytest.fail(f"the run ended (exit {self.proc.returncode}) before {what}:\n{self.err()[-3000:]}")
            if time.monotonic() > deadline:
                pytest.fail(f"no {what} within {timeout:g}s:\n{self.err()[-3000:]}")
            time.sleep(0.01)

    def finish(self, timeout: float = DEADLINE_S) -> int:
        """Wait for the process to end (failing past ``timeout``); return its exit status once its
        output and the desktop's log have been read to their end."""
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the process did not end within {timeout:g}s:\n{self.err()[-3000:]}")
        for t in self._readers + self._followers:
            t.join(timeout=10)
        return self.proc.returncode

    def kill(self) -> None:
        """SIGKILL: nothing in the process can clean up."""
        self.proc.kill()
        self.finish()

    # -- what must be gone ----------------------------------------------------------------------------

    def leftovers(self) -> list[str]:
        """Containers and networks carrying this process's owner label."""
        flt = {"label": f"{LABEL_OWNER}={self.owner}"}
        return [c.name for c in self.client.containers.list(all=True, ignore_removed=True, filters=flt)] + [
            n.name for n in self.client.networks.list(filters=flt)]

    def session_processes(self) -> list[str]:
        """Processes still in the command's session (it was started as the session leader)."""
        left = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                text = stat.read_text()
            except OSError:
                continue
            name_end = text.rindex(")")
            fields = text[name_end + 2:].split()  # state, ppid, pgrp, session, ...
            if int(fields[3]) == self.proc.pid:
                left.append(text[: name_end + 1])
        return left

    def proxies(self) -> list[str]:
        """docker-proxy processes on the host still publishing one of the run's agent ports."""
        left = []
        for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
            try:
                argv = cmdline.read_bytes().decode(errors="replace").split("\0")
            except OSError:
                continue
            if argv and argv[0].endswith("docker-proxy") and "-host-port" in argv:
                if argv[argv.index("-host-port") + 1] in self.agent_ports:
                    left.append(" ".join(argv))
        return left

    def token_files(self) -> list[Path]:
        return sorted(self.xdg.rglob("*.token"))

    def assert_nothing_left(self) -> None:
        """No container, network, session process, docker-proxy or token file of this command."""
        assert self.leftovers() == [], f"containers/networks left:\n{self.err()[-3000:]}"
        assert self.session_processes() == [], "processes of the command's session left"
        assert self.proxies() == [], "docker-proxy of the run's agent port left"
        assert self.token_files() == [], "token file left"

    def close(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self._stream.close()
        from controller.sandbox.docker import _remove

        _remove(self.client, {"label": f"{LABEL_OWNER}={self.owner}"})


@pytest.fixture
def cli_run(docker_client, desktop_image, tmp_path):
    """Factory ``cli_run(*args, follow_desktop_log=False) -> CliRun`` (``RUNS`` in args: the run's
    records directory); whatever a failing test left behind is killed and removed afterwards."""
    started: list[CliRun] = []

    def start(*args: Any, follow_desktop_log: bool = False) -> CliRun:
        run = CliRun(docker_client, tmp_path / f"cli{len(started)}", *args, follow_desktop_log=follow_desktop_log)
        started.append(run)
        return run

    yield start
    for run in started:
        run.close()


# -- moments to wait for ---------------------------------------------------------------------------------

def record_open(run: CliRun) -> bool:
    """The run record exists."""
    return run.record() is not None


def container(action: str, role: str) -> Callable[[CliRun], bool]:
    """Docker reported ``action`` (create, start, kill, ...) for the run's ``role`` container."""
    def moment(run: CliRun) -> bool:
        return bool(run.container_events(action, role))
    moment.__doc__ = f"{role} container {action}"
    return moment


def entries(kind: str, n: int = 1) -> Callable[[CliRun], bool]:
    """The record holds ``n`` entries of ``kind``."""
    def moment(run: CliRun) -> bool:
        return sum(e.get("type") == kind for e in run.entries()) >= n
    moment.__doc__ = f"{n} {kind} entries"
    return moment


def teardown_begun(run: CliRun) -> bool:
    """Docker is killing one of the run's containers: their removal is under way."""
    return bool(run.container_events("kill"))


_ACK = re.compile(r"^(SIGINT|SIGTERM|SIGHUP): cancelling")


def acknowledged(n: int = 1) -> Callable[[CliRun], bool]:
    """The run printed that it is cancelling ``n`` times (one line per signal its handler got)."""
    def moment(run: CliRun) -> bool:
        with run._lock:
            return sum(bool(_ACK.match(line)) for line in run.stderr) >= n
    moment.__doc__ = f"{n} cancelling line(s)"
    return moment
