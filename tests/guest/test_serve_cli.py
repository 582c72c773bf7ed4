"""``python -m guest serve`` as a user starts it: the start line, the access log (never the token or
typed text), clean one-line startup errors with exit status 2, ``--help`` defaults, and 503 messages
that say what happened to the display."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from controller.agent_client import AgentClient, AgentError
from guest.display import describe
from guest.localrun import AgentProcess, Xvfb
from tests.conformance.harness import poll

REPO = Path(__file__).resolve().parents[2]
NO_DISPLAY = ":9873"  # nothing listens there


def _log(agent: AgentProcess) -> str:
    return agent.log_path.read_text(encoding="utf-8", errors="replace")


@pytest.fixture
def small_xvfb():
    server = Xvfb(320, 200, 24).start()
    yield server
    server.stop()


def test_start_line_and_one_access_line_per_request_without_token_or_typed_text(small_xvfb, make_agent):
    agent = make_agent(small_xvfb.display)
    secret_text = "Zq7-typed-secret-Ωx"
    with AgentClient(agent.base_url, agent.token, timeout=20) as client:
        client.actions([{"type": "type", "text": secret_text}, {"type": "keypress", "keys": ["ctrl", "a"]}])
        client.screenshot()
        with pytest.raises(AgentError):
            client.actions([{"type": "type", "text": secret_text}, {"type": "move", "x": 999, "y": 0}])
    wrong = "wrong-token-Kp9vX"
    assert httpx.get(agent.base_url + "/v1/display", headers={"Authorization": f"Bearer {wrong}"}).status_code == 401

    expected = {'"POST /v1/actions" 200 ': 1, '"POST /v1/actions" 400 ': 1, '"GET /v1/screenshot?format=png" 200 ': 1,
                '"GET /v1/display" 401 ': 1}

    def counts() -> dict[str, int]:
        lines = _log(agent).splitlines()
        return {k: len([line for line in lines if "guest.access" in line and k in line]) for k in expected}

    poll(lambda: counts() == expected, 10, what=f"one access line per request, {expected}")
    log = _log(agent)
    start = [line for line in log.splitlines() if "agent listening on" in line]
    assert len(start) == 1, log
    assert f"agent listening on {agent.base_url}, display {small_xvfb.display} (320x200x24)" in start[0]
    assert agent.token not in log and wrong not in log
    assert secret_text not in log and "typed-secret" not in log
    assert "Traceback" not in log


def test_start_line_says_when_the_display_is_not_up_yet(make_agent):
    agent = make_agent(NO_DISPLAY, apps={"terminal": ["xterm"], "browser": ["firefox-esr"]})
    poll(lambda: "agent listening on" in _log(agent), 10, what="the start line")
    line = next(line for line in _log(agent).splitlines() if "agent listening on" in line)
    assert f"agent listening on {agent.base_url}, display {NO_DISPLAY} unavailable yet (" in line
    assert "apps: browser, terminal" in line


def _serve(*args: str, token_file: str | None = None) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "guest", "serve", "--display", NO_DISPLAY, *args]
    if token_file is not None:
        argv += ["--token-file", token_file]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run(argv, capture_output=True, text=True, timeout=30, cwd="/", env=env, check=False)


@pytest.fixture
def files(tmp_path: Path) -> dict[str, str]:
    token = tmp_path / "token"
    token.write_text("tok-" + "x" * 20 + "\n")
    (tmp_path / "bad.json").write_text("{not json")
    (tmp_path / "shape.json").write_text(json.dumps({"terminal": "xterm"}))
    (tmp_path / "latin1").write_bytes(b"\xff\xfe token")
    (tmp_path / "plain").write_text("x")
    return {"token": str(token), "dir": str(tmp_path)}


@pytest.mark.parametrize("args,token,words", [
    ([], "{dir}/missing-token", "cannot read the token file"),
    ([], "{dir}", "cannot read the token file"),
    ([], "{dir}/latin1", "not UTF-8"),
    (["--apps", "{dir}/missing.json"], "{token}", "cannot read the --apps file"),
    (["--apps", "{dir}/bad.json"], "{token}", "is not valid"),
    (["--apps", "{dir}/shape.json"], "{token}", "non-empty argv list"),
    (["--files-root", "{dir}/nowhere"], "{token}", "does not exist"),
    (["--files-root", "{dir}/plain"], "{token}", "is not a directory"),
    (["--bind", "localhost"], "{token}", "HOST:PORT"),
    (["--bind", "127.0.0.1:99999"], "{token}", "HOST:PORT"),
    (["--busy-timeout", "0"], "{token}", "--busy-timeout must be greater than 0"),
])
def test_startup_errors_are_one_line_and_exit_2(files, args, token, words):
    proc = _serve("--bind", "127.0.0.1:0", *[a.format(**files) for a in args], token_file=token.format(**files))
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("guest serve: "), proc.stderr
    assert words in proc.stderr and "Traceback" not in proc.stderr
    assert "tok-" not in proc.stderr


def test_a_port_in_use_is_one_line_and_exit_2(files):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        proc = _serve("--bind", f"127.0.0.1:{port}", token_file=files["token"])
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in proc.stderr


def test_serve_help_shows_the_defaults():
    proc = _serve("--help")
    assert proc.returncode == 0
    text = " ".join(proc.stdout.split())
    for default in ("(default: 127.0.0.1:8000)", "(default: 16777216)", "(default: 5.0)", "(default: 20.0)",
                    "(default: info)", "(default: the user's home)"):
        assert default in text, default


def test_display_gone_503_says_what_happened(make_agent):
    server = Xvfb(320, 200, 24).start()
    try:
        agent = make_agent(server.display)
        with AgentClient(agent.base_url, agent.token, timeout=20) as client:
            client.screenshot()
            client.display()
            server.stop()
            messages = []
            for call in (client.screenshot, client.display, client.screenshot):
                with pytest.raises(AgentError) as err:
                    call()
                assert (err.value.status, err.value.code) == (503, "display_unavailable")
                messages.append(err.value.message)
    finally:
        server.stop()
    for message in messages:
        assert server.display in message, message
        reason = re.search(r"\((.*?)\)", message)
        assert reason and reason.group(1).split(":")[-1].strip(), message
        assert not re.search(r":\s*($|\)|;)", message), message


def test_describe_never_gives_an_empty_reason():
    assert describe(AssertionError()) == "AssertionError while talking to the X server"
    assert describe(OSError(32, "Broken pipe")) == "[Errno 32] Broken pipe"


def test_access_lines_cannot_be_forged_and_can_be_turned_off(make_agent):
    logged = make_agent(NO_DISPLAY)
    quiet = make_agent(NO_DISPLAY, extra_args=["--no-access-log"])
    for agent in (logged, quiet):
        assert httpx.get(agent.base_url + "/livez%0A2025-01-01 INFO forged: line").status_code == 404
        assert httpx.get(agent.base_url + "/livez").status_code == 200
    poll(lambda: '"GET /livez" 200 ' in _log(logged), 10, what="the access line")
    lines = _log(logged).splitlines()
    assert not any(line.startswith("2025-01-01 INFO forged") for line in lines)
    assert any('"GET /livez%0A2025-01-01%20INFO%20forged%3A%20line" 404 ' in line for line in lines), lines
    assert "agent listening on" in _log(quiet) and "guest.access" not in _log(quiet)
