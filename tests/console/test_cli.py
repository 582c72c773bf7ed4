"""``desktop-sandbox console``: the real command in a subprocess prints one line ``console: <url>``, the
URL logs a browser session in once, the runs list shows the runs directory, Ctrl-C stops it (exit 0)."""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.console.conftest import write_record

ROOT = Path(__file__).resolve().parents[2]
URL = re.compile(r"console: (http://127\.0\.0\.1:([0-9]+)/s/[A-Za-z0-9_-]{22}/login\?t=[A-Za-z0-9_-]{43})\n")


def _readline(proc: subprocess.Popen, timeout: float) -> str:
    """One line of the process's stdout, waiting at most ``timeout`` seconds for it."""
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    assert ready, "the console printed nothing in time"
    return proc.stdout.readline()


def test_console_command_serves_the_runs_until_ctrl_c(runs_dir):
    write_record(runs_dir, "20300101-000000-cli-0001", "2030-01-01T00:00:00.000+00:00", "from-cli", "passed")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "controller.cli", "console", "--runs-dir", str(runs_dir)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=str(ROOT))
    try:
        line = _readline(proc, 30)
        found = URL.fullmatch(line)
        assert found, line
        url, port = found.group(1), int(found.group(2))
        assert url.startswith(f"http://127.0.0.1:{port}/s/")
        with httpx.Client(base_url=url.split("/login?", 1)[0], timeout=10) as client:
            assert client.get(url).status_code == 303
            page = client.get("/")
            assert page.status_code == 200 and "from-cli" in page.text
        assert httpx.get(url).status_code == 403  # spent
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=20)
        assert proc.returncode == 0, err
        assert out == "", out  # nothing after the one line
        assert "Traceback" not in err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_console_command_stops_on_sigterm(runs_dir):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "controller.cli", "console", "--runs-dir", str(runs_dir)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=str(ROOT))
    try:
        assert URL.fullmatch(_readline(proc, 30))
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=20)
        assert proc.returncode == 0 and time.monotonic() - started < 15
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_console_command_refuses_a_file_as_runs_dir(tmp_path):
    target = tmp_path / "file"
    target.write_text("")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-m", "controller.cli", "console", "--runs-dir", str(target)],
                          capture_output=True, text=True, env=env, cwd=str(ROOT), timeout=60)
    assert done.returncode == 2 and "not a directory" in done.stderr and "console:" not in done.stdout
