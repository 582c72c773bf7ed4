"""The image's session helpers (images/session/), run here against a real Xvfb and real processes."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.require import require_commands

SESSION = Path(__file__).resolve().parents[2] / "images" / "session"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"session_{name}", SESSION / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


xserver = _load("xserver")


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_stale_lock_with_dead_pid_is_removed(tmp_path):
    (tmp_path / ".X11-unix").mkdir()
    (tmp_path / ".X42-lock").write_text(f"{_dead_pid():>10}\n")
    (tmp_path / ".X11-unix" / "X42").write_text("")
    assert xserver.remove_stale_lock(42, str(tmp_path)) is True
    assert not (tmp_path / ".X42-lock").exists()
    assert not (tmp_path / ".X11-unix" / "X42").exists()


def test_lock_of_live_server_is_kept(tmp_path):
    (tmp_path / ".X42-lock").write_text(f"{os.getpid():>10}\n")
    assert xserver.remove_stale_lock(42, str(tmp_path)) is False
    assert (tmp_path / ".X42-lock").exists()


def test_no_lock_nothing_to_do(tmp_path):
    assert xserver.remove_stale_lock(42, str(tmp_path)) is False


def test_display_number():
    assert xserver.display_number(":99") == 99
    assert xserver.display_number(":7.0") == 7
    with pytest.raises(ValueError):
        xserver.display_number("host:0")


def test_await_display_execs_once_display_accepts_clients(tmp_path):
    """await.py --display waits for a real Xvfb (started after it) and then execs the command."""
    require_commands("X", "Xvfb", install="apt-get install xvfb")
    r, w = os.pipe()
    xvfb = None
    marker = tmp_path / "ran"
    waiter = None
    try:
        # Pick a free display first, then restart it under the waiter.
        xvfb = subprocess.Popen(["Xvfb", "-displayfd", str(w), "-screen", "0", "320x200x24", "-nolisten", "tcp"],
                                pass_fds=(w,))
        number = int(os.read(r, 16).decode().strip())
        xvfb.terminate()
        xvfb.wait(10)
        env = {**os.environ, "DISPLAY": f":{number}"}
        waiter = subprocess.Popen(
            [sys.executable, str(SESSION / "await.py"), "--display", "--timeout", "30", "--",
             sys.executable, "-c", f"open({str(marker)!r}, 'w').write('ok')"], env=env)
        assert waiter.poll() is None and not marker.exists()
        xvfb = subprocess.Popen(["Xvfb", f":{number}", "-screen", "0", "320x200x24", "-nolisten", "tcp"])
        assert waiter.wait(30) == 0
        assert marker.read_text() == "ok"
    finally:
        os.close(r)
        os.close(w)
        for p in (waiter, xvfb):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()


def test_await_file_times_out(tmp_path):
    out = subprocess.run([sys.executable, str(SESSION / "await.py"), "--file", str(tmp_path / "never"),
                          "--timeout", "0.3", "--", "true"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 1 and "timed out" in out.stderr
