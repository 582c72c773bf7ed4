"""The connection rules (``wire.connections``) of ``desktop-sandbox serve --ui``: the Agents API and the web
console in one real server process, run with a low descriptor limit.

A flood of connections that never finish their request head, more than the process may hold descriptors,
must leave both servers answering a client with the key (the console: its login URL, then its cookie) at
once, keep the process under its limit, and be closed by the head deadline. A ``Host`` that does not name
the server (a rebound name, an empty one, two of them) is refused before the key is looked at.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator
from urllib.parse import urlsplit

import httpx
import pytest

from tests.agents_api.conftest import ABSENT_IMAGE, ROOT
from tests.slow_clients import FLOOD, LOW_LIMIT, Unfinished, descriptors, limit_descriptors, raw_request

pytestmark = pytest.mark.slow

ANSWER_S = 5.0
"""Longest a request with the key may take while the flood is held (seconds)."""


class Served:
    """The ``serve --ui`` process: ``api`` (``http://127.0.0.1:PORT/v1``), ``key``, ``console`` (the login
    URL), ``log`` (what it printed on stderr, read so far)."""

    def __init__(self, process: subprocess.Popen[bytes], api: str, key: str, console: str) -> None:
        self.process, self.api, self.key, self.console = process, api, key, console
        self.log = b""

    @property
    def api_address(self) -> tuple[str, int]:
        parts = urlsplit(self.api)
        return parts.hostname or "", parts.port or 0

    @property
    def console_address(self) -> tuple[str, int]:
        parts = urlsplit(self.console)
        return parts.hostname or "", parts.port or 0

    def read_log(self) -> str:
        assert self.process.stderr is not None
        while select.select([self.process.stderr], [], [], 0)[0]:
            chunk = os.read(self.process.stderr.fileno(), 65536)
            if not chunk:
                break
            self.log += chunk
        return self.log.decode("utf-8", "replace")


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    runs = tmp_path_factory.mktemp("serve") / "runs"
    process = subprocess.Popen([sys.executable, "-m", "controller.cli", "serve", "--ui", "--runs-dir", str(runs),
                                "--image", ABSENT_IMAGE], cwd=ROOT, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE)
    try:
        lines: dict[str, str] = {}
        buffer = b""
        deadline = time.monotonic() + 60
        assert process.stderr is not None
        while "agents-api" not in lines:
            if time.monotonic() > deadline or process.poll() is not None:
                pytest.fail(f"serve did not start: {buffer.decode('utf-8', 'replace')}")
            if select.select([process.stderr], [], [], 0.5)[0]:
                buffer += os.read(process.stderr.fileno(), 65536)
                for line in buffer.decode("utf-8", "replace").splitlines():
                    name, sep, rest = line.partition(": ")
                    if sep and name in ("console", "agents-api"):
                        lines[name] = rest
        api, _, key_file = lines["agents-api"].partition(" key-file: ")
        served = Served(process, api, Path(key_file).read_text().strip(), lines["console"])
        served.log = buffer
        yield served
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _sessions(served: Served) -> httpx.Response:
    return httpx.get(served.api + "/agents/sessions", headers={"Authorization": f"Bearer {served.key}"},
                     timeout=ANSWER_S)


def test_unfinished_connections_past_the_descriptor_limit_leave_the_api_and_the_console_answering(served):
    pid = served.process.pid
    assert _sessions(served).status_code == 200
    limit_descriptors(pid)
    api_flood = Unfinished(served.api_address, FLOOD)
    console_flood = Unfinished(served.console_address, FLOOD)
    try:
        held = descriptors(pid)
        started = time.monotonic()
        answer = _sessions(served)
        assert answer.status_code == 200, answer.text
        with httpx.Client(timeout=ANSWER_S) as browser:
            login = browser.get(served.console)
            assert login.status_code == 303, login.text
            page = browser.get(served.console.split("/login?", 1)[0] + "/")
            assert page.status_code == 200
        assert time.monotonic() - started < 2 * ANSWER_S
        assert held < LOW_LIMIT, f"{held} descriptors open under a limit of {LOW_LIMIT}"
        for flood in (api_flood, console_flood):
            closed = flood.wait_all_closed()
            assert closed == FLOOD, f"{closed} of {FLOOD} unfinished connections closed by the head deadline"
        assert _sessions(served).status_code == 200
    finally:
        api_flood.close()
        console_flood.close()
    log = served.read_log()
    assert "Too many open files" not in log and "out of descriptors" not in log, log[-2000:]


REBOUND_HOSTS = [
    pytest.param(["evil.example:{port}"], id="another-name"),
    pytest.param(["127.0.0.1.nip.io:{port}"], id="a-name-resolving-to-loopback"),
    pytest.param([""], id="empty"),
    pytest.param(["127.0.0.1:{port}", "evil.example:{port}"], id="two-host-headers"),
    pytest.param(["127.0.0.1:{other}"], id="another-port"),
    pytest.param([], id="none"),
]


def _refusal(body: bytes) -> str:
    error = json.loads(body)["error"]
    assert isinstance(error["message"], str) and error["message"]
    return error["code"]


@pytest.mark.parametrize("hosts", REBOUND_HOSTS)
def test_a_host_that_does_not_name_the_api_is_refused_before_the_key(served, hosts):
    address = served.api_address
    headers = [("Host", h.format(port=address[1], other=address[1] + 1)) for h in hosts]
    status, body = raw_request(address, "GET", "/v1/agents/sessions",
                               headers + [("Authorization", f"Bearer {served.key}")])
    assert 400 <= status < 500, (status, body)
    assert _refusal(body) in ("bad_host", "bad_request")


@pytest.mark.parametrize("hosts", REBOUND_HOSTS)
def test_a_host_that_does_not_name_the_console_is_refused(served, hosts):
    address = served.console_address
    headers = [("Host", h.format(port=address[1], other=address[1] + 1)) for h in hosts]
    status, body = raw_request(address, "GET", urlsplit(served.console).path + "?t=x", headers)
    assert 400 <= status < 500, (status, body)
    assert _refusal(body) in ("bad_host", "bad_request")


@pytest.mark.parametrize("name", ["127.0.0.1", "localhost", "LocalHost"])
def test_the_api_answers_its_own_address_and_localhost(served, name):
    address = served.api_address
    status, body = raw_request(address, "GET", "/v1/agents/sessions",
                               [("Host", f"{name}:{address[1]}"), ("Authorization", f"Bearer {served.key}")])
    assert status == 200, body
