"""A signal while a command waits: the real command line in a subprocess (the leader of its own session),
its sandboxes local desktops (``tests/loop/cli_local.py``: Xvfb and the real agent; the real gateway in
mode ask; Debian's chromium), SIGINT, SIGTERM or SIGHUP sent once the command shows it waits for:

==========================================  ============================================================
a person's answer on the terminal           a safety check, stdin a terminal (pty): its prompt shown
a person's answer in the console            the same with ``--ui`` and no terminal: "waiting for an
                                            answer in the console"
an origin request                           the gateway holds the guest's connection; the terminal asks
                                            about it while the model's next screenshot waits
a sign-in request                           chromium shows the sign-in demo site; the terminal asks
a ready condition                           a ``[[ready]]`` file that never appears
the live model's answer                     a loopback model server that never answers
an agent call stalled by the desktop        a program holding the X server grabbed
``up``, ``serve``, ``console`` idle         their line printed (``up``: its token file written)
==========================================  ============================================================

Each must end within :data:`EXIT_S` of the signal: ``run-task`` exit 130 with its record finished
``cancelled`` by that signal and the pending request withdrawn with the signal as reason (never denied
by a timeout); ``up``, ``serve`` and ``console`` exit 0. Nothing of the command's session is left (the
desktop's processes, the gateway, chromium), nor ``up``'s token file."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from controller.run.entries import Entry
from controller.run.record import read_entries
from tests.helpers import chromium_missing

ROOT = Path(__file__).resolve().parents[2]
SIGNIN_SITE = ROOT / "images" / "signin-demo" / "site.py"
EXIT_S = 5.0
"""Longest a command may take from the signal to its exit (the wait ends within about 0.1 s; the rest is
the teardown of a local desktop)."""
DEADLINE_S = 120.0
"""Longest wait for a command to show that it waits."""

pytestmark = pytest.mark.slow


class Command:
    """``python -m tests.loop.cli_local DESKTOP ARGS`` in a session of its own; its output read as it
    comes (a prompt has no newline). ``terminal``: its stdin a pty (a terminal to ask on), else
    /dev/null."""

    def __init__(self, tmp_path: Path, desktop: str, *args: Any, terminal: bool = False,
                 env: dict[str, str] | None = None) -> None:
        self.xdg = tmp_path / "xdg"
        self.xdg.mkdir(mode=0o700, parents=True)
        given = env
        env = {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "COLUMNS",
                                                                 "FORCE_COLOR")}
        env.update(PYTHONPATH=str(ROOT), XDG_RUNTIME_DIR=str(self.xdg), **(given or {}))
        self._pty: int | None = None
        stdin: Any = subprocess.DEVNULL
        if terminal:
            self._pty, stdin = os.openpty()
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.loop.cli_local", desktop, *map(str, args)],
                                     cwd=ROOT, env=env, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     start_new_session=True)
        if terminal:
            os.close(stdin)
        self._out = {"stdout": b"", "stderr": b""}
        self._lock = threading.Lock()
        self._readers = [threading.Thread(target=self._read, args=(pipe, name), daemon=True)
                         for pipe, name in ((self.proc.stdout, "stdout"), (self.proc.stderr, "stderr"))]
        for reader in self._readers:
            reader.start()

    def _read(self, pipe: Any, name: str) -> None:
        while chunk := os.read(pipe.fileno(), 65536):
            with self._lock:
                self._out[name] += chunk

    def text(self, name: str = "stderr") -> str:
        with self._lock:
            return self._out[name].decode("utf-8", "replace")

    def wait_for(self, what: str, condition: Any) -> None:
        """Poll ``condition()`` until it holds; fail when the command ends first or :data:`DEADLINE_S` passes."""
        deadline = time.monotonic() + DEADLINE_S
        while not condition():
            if self.proc.poll() is not None:
                pytest.fail(f"the command ended (exit {self.proc.returncode}) before {what}:\n{self.text()[-3000:]}")
            if time.monotonic() > deadline:
                pytest.fail(f"no {what} within {DEADLINE_S:g}s:\n{self.text()[-3000:]}")
            time.sleep(0.02)

    def shows(self, text: str) -> None:
        """Wait until ``text`` is on its stderr."""
        self.wait_for(repr(text), lambda: text in self.text())

    def interrupt(self, signum: int) -> tuple[int, float]:
        """Send ``signum``; its exit status and the seconds it took to exit (failing past
        :data:`EXIT_S` x 2: a command that waits on is not waited for)."""
        sent = time.monotonic()
        self.proc.send_signal(signum)
        try:
            code = self.proc.wait(timeout=EXIT_S * 2)
        except subprocess.TimeoutExpired:
            pytest.fail(f"still running {EXIT_S * 2:g}s after {signal.Signals(signum).name}:\n{self.text()[-3000:]}")
        took = time.monotonic() - sent
        for reader in self._readers:
            reader.join(10)
        return code, took

    def session(self) -> list[str]:
        """Processes still in the command's session."""
        left = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                text = stat.read_text()
            except OSError:
                continue
            end = text.rindex(")")
            if int(text[end + 2:].split()[3]) == self.proc.pid:
                left.append(text[: end + 1])
        return left

    def close(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        if self._pty is not None:
            os.close(self._pty)


@pytest.fixture
def command(tmp_path) -> Iterator[Any]:
    """``command(desktop, *args, terminal=False, env=None) -> Command``; whatever is left is killed afterwards."""
    started: list[Command] = []

    def start(desktop: str, *args: Any, terminal: bool = False, env: dict[str, str] | None = None) -> Command:
        cmd = Command(tmp_path / f"cmd{len(started)}", desktop, *args, terminal=terminal, env=env)
        started.append(cmd)
        return cmd

    yield start
    for cmd in started:
        cmd.close()


def write_task(tmp_path: Path, body: str, turns: list[dict[str, Any]]) -> Path:
    """A task ``waits.toml`` with ``body`` and its offline script of ``turns``."""
    (tmp_path / "waits.offline.jsonl").write_text("".join(json.dumps(t) + "\n" for t in turns))
    path = tmp_path / "waits.toml"
    path.write_text(f'name = "waits"\ninstructions = "x"\nmax_steps = 5\n{body}\n'
                    '[offline]\nscript = "waits.offline.jsonl"\n')
    return path


SAFETY_CHECK = [{"actions": [{"type": "move", "x": 5, "y": 6}],
                 "pending_safety_checks": [{"id": "sc_1", "code": "sensitive_action", "message": "about to act"}]},
                {"message": "done"}]
A_CHECK = '[[checks]]\nkind = "file"\npath = "~/Documents/never.txt"\nmatch = "text"\nvalue = "x"\n'


def cancelled_run(cmd: Command, runs: Path, signum: int) -> list[Entry]:
    """``cmd``, a ``run-task`` that got ``signum``: exited 130 within :data:`EXIT_S`, its record finished
    ``cancelled`` by that signal, nothing of its session left. Returns the record's entries."""
    code, took = cmd.interrupt(signum)
    err = cmd.text()[-3000:]
    name = signal.Signals(signum).name
    assert code == 130, f"exit {code}:\n{err}"
    assert took < EXIT_S, f"{took:.1f}s from {name} to the exit:\n{err}"
    assert cmd.session() == [], "processes of the command's session left"
    [record] = runs.glob("*/record.jsonl")
    assert cmd.text("stdout").strip().splitlines()[-1:] == [str(record)]
    entries = read_entries(record.parent)
    assert entries[-1].type == "run_finished", entries[-1]
    assert (entries[-1].status, entries[-1].reason) == ("cancelled", f"cancelled by {name}")
    return entries


def withdrawn(entries: list[Entry], what: str) -> list[tuple[str, str, str | None]]:
    """The ``approval`` lines of ``what`` as (decision, by, message)."""
    return [(e.decision, e.by, e.message) for e in entries if e.type == "approval" and e.what == what]


def test_a_signal_while_the_terminal_asks_for_an_approval_withdraws_it(command, tmp_path):
    task = write_task(tmp_path, A_CHECK, SAFETY_CHECK)
    runs = tmp_path / "runs"
    cmd = command("plain", "run-task", task, "--offline", "--runs-dir", runs, "--approval-timeout", "120",
                  terminal=True)
    cmd.shows("Approve these safety checks and run the call's actions? [y/N]")
    entries = cancelled_run(cmd, runs, signal.SIGTERM)
    assert withdrawn(entries, "safety_check") == [("withdrawn", "cancel", "cancelled by SIGTERM")]
    assert "action" not in [e.type for e in entries]  # nothing of the call ran


def test_a_signal_while_the_console_is_asked_without_a_terminal_withdraws_it(command, tmp_path):
    task = write_task(tmp_path, A_CHECK, SAFETY_CHECK)
    runs = tmp_path / "runs"
    cmd = command("plain", "run-task", task, "--offline", "--runs-dir", runs, "--approval-timeout", "120", "--ui")
    cmd.shows("waiting for an answer in the console")
    entries = cancelled_run(cmd, runs, signal.SIGINT)
    assert withdrawn(entries, "safety_check") == [("withdrawn", "cancel", "cancelled by SIGINT")]
    assert "action" not in [e.type for e in entries]


def test_a_signal_while_an_origin_request_is_held_withdraws_it(command, tmp_path):
    task = write_task(tmp_path, A_CHECK + '[network]\nmode = "ask"\nask = ["http://ask.test"]\n',
                      [{"actions": [{"type": "move", "x": 5, "y": 6}]}, {"message": "done"}])
    runs = tmp_path / "runs"
    cmd = command("ask", "run-task", task, "--offline", "--runs-dir", runs, terminal=True)
    cmd.shows("Origin request: the guest asks to connect to http://ask.test:")
    entries = cancelled_run(cmd, runs, signal.SIGHUP)
    assert withdrawn(entries, "origin_access") == [("withdrawn", "cancel", "cancelled by SIGHUP")]


@pytest.fixture
def signin_site() -> Iterator[str]:
    """The sign-in demo site on 127.0.0.1 (a free port); yields its origin."""
    proc = subprocess.Popen([sys.executable, str(SIGNIN_SITE), '{"http": [0], "bind": "127.0.0.1"}'],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        yield f"http://127.0.0.1:{json.loads(proc.stdout.readline())['ports'][0]}"
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.mark.skipif(chromium_missing() is not None, reason=str(chromium_missing()))
def test_a_signal_while_a_sign_in_request_is_asked_withdraws_it(command, tmp_path, signin_site):
    task = write_task(tmp_path, (
        '[model]\ntools = ["browser"]\n'
        f'[[launch]]\napp = "chromium"\nargs = ["{signin_site}/"]\n'
        f'[network]\nmode = "allowlist"\nallow = ["{signin_site}"]\n' + A_CHECK), [
        {"browser": [{"member": "wait_for",
                      "arguments": {"text": "How do you want to sign in?", "timeout_ms": 20000}}]},
        {"message": "done"}])
    runs = tmp_path / "runs"
    cmd = command("chromium", "run-task", task, "--offline", "--runs-dir", runs, "--approval-timeout", "120",
                  terminal=True)
    cmd.shows("Have you verified the sign-in destination? [y/N]")
    entries = cancelled_run(cmd, runs, signal.SIGTERM)
    assert [(e.outcome, e.detail, e.submitted) for e in entries if e.type == "sign_in"] == [
        ("withdrawn", "cancelled by SIGTERM", [])]


@pytest.fixture
def silent_model() -> Iterator[tuple[str, list[bytes]]]:
    """A loopback server that reads each request and never answers; yields its ``/v1`` URL and the
    request heads it got."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    heads: list[bytes] = []
    held: list[socket.socket] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            held.append(conn)
            with contextlib.suppress(OSError):
                heads.append(conn.recv(65536))

    threading.Thread(target=serve, daemon=True).start()
    yield f"http://127.0.0.1:{sock.getsockname()[1]}/v1", heads
    sock.close()
    for conn in held:
        conn.close()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_while_the_live_model_is_asked_ends_the_request(command, tmp_path, silent_model, signum):
    url, heads = silent_model
    task = write_task(tmp_path, A_CHECK, [{"message": "done"}])
    runs = tmp_path / "runs"
    cmd = command("plain", "run-task", task, "--live", "--runs-dir", runs,
                  env={"OPENAI_API_KEY": "sk-test-not-a-key", "OPENAI_BASE_URL": url})
    cmd.wait_for("the model request", lambda: heads)
    time.sleep(0.5)
    entries = cancelled_run(cmd, runs, signum)
    assert "model_response" not in [e.type for e in entries]
    time.sleep(0.3)
    assert len(heads) == 1 and heads[0].startswith(b"POST /v1/responses ")  # not sent again


def _display_of(cmd: Command) -> str:
    """The X display of the command's desktop (``DISPLAY`` of a process of its session)."""
    for pid in [p.name for p in Path("/proc").iterdir() if p.name.isdigit()]:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            if int(stat[stat.rindex(")") + 2:].split()[3]) != cmd.proc.pid:
                continue
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except (OSError, ValueError, IndexError):
            continue
        for entry in env:
            if entry.startswith(b"DISPLAY="):
                return entry[len(b"DISPLAY="):].decode()
    pytest.fail("no process of the command's session has a DISPLAY")


def test_a_signal_while_a_desktop_program_holds_the_x_server_cuts_the_agent_call(command, tmp_path):
    """A program on the desktop that grabs the X server stalls every call of the agent (each up to its
    30 s deadline): the call under way is cut short and the teardown's calls get no more, so the run
    reaches the sandbox's removal (its ``network_log`` line, written just before) within a second or
    two of the signal while the grab still holds. (The grab ends then: the test's local desktop, unlike
    a container, lets its agent finish the stalled request before it stops.)"""
    from Xlib import display as xdisplay

    turns = [{"actions": [{"type": "move", "x": 10 + i, "y": 10}, {"type": "wait"}]} for i in range(60)]
    task = write_task(tmp_path, A_CHECK, [*turns, {"message": "done"}])
    runs = tmp_path / "runs"
    cmd = command("plain", "run-task", task, "--offline", "--runs-dir", runs)
    cmd.shows("ready in")
    grabber = xdisplay.Display(_display_of(cmd))
    try:
        grabber.grab_server()
        grabber.sync()
        time.sleep(1.0)  # the next call of the agent is under way, and stalls
        sent = time.monotonic()
        cmd.proc.send_signal(signal.SIGTERM)
        [record] = runs.glob("*/record.jsonl")
        while '"network_log"' not in record.read_text() and time.monotonic() - sent < 15:
            time.sleep(0.05)
        took = time.monotonic() - sent
    finally:
        with contextlib.suppress(Exception):
            grabber.close()
    assert took < 2.5, f"{took:.1f}s from SIGTERM to the sandbox's removal:\n{cmd.text()[-3000:]}"
    assert cmd.proc.wait(timeout=EXIT_S * 2) == 130, cmd.text()[-3000:]
    entries = read_entries(record.parent)
    assert (entries[-1].type, entries[-1].status, entries[-1].reason) == (
        "run_finished", "cancelled", "cancelled by SIGTERM")


def test_a_signal_while_a_ready_file_is_awaited_ends_the_wait(command, tmp_path):
    task = write_task(tmp_path, A_CHECK + '[[launch]]\napp = "terminal"\n'
                      '[[ready]]\nfile = "~/never-written"\ntimeout_s = 90\n', [{"message": "done"}])
    runs = tmp_path / "runs"
    cmd = command("plain", "run-task", task, "--offline", "--runs-dir", runs)
    cmd.shows("launched terminal (pid")
    entries = cancelled_run(cmd, runs, signal.SIGHUP)
    assert "model_response" not in [e.type for e in entries]


@pytest.mark.parametrize("signum", [signal.SIGHUP, signal.SIGTERM], ids=["SIGHUP", "SIGTERM"])
def test_up_serve_and_console_end_at_once_when_idle(command, tmp_path, signum):
    """Each waits for a signal only: it stops (the sandbox removed, the token file gone) and exits 0."""
    up = command("plain", "up", "--backend", "local")
    up.wait_for("the token file", lambda: list(up.xdg.rglob("*.token")))
    serve = command("plain", "serve", "--port", "0", "--runs-dir", tmp_path / "serve-runs")
    serve.shows("agents-api: http://127.0.0.1:")
    console = command("plain", "console", "--runs-dir", tmp_path / "console-runs")
    console.wait_for("the console's line", lambda: "console: http://127.0.0.1:" in console.text("stdout"))
    for cmd in (up, serve, console):
        code, took = cmd.interrupt(signum)
        assert (code, took < EXIT_S) == (0, True), (code, took, cmd.text()[-3000:])
        assert cmd.session() == [], "processes of the command's session left"
    assert list(up.xdg.rglob("*.token")) == [] and "removing sandbox" in up.text()
    assert "agents-api: stopped" in serve.text()
