"""``desktop-sandbox mcp --http``: a server in a subprocess on a free loopback port, driven by the ``mcp``
package's client over streamable HTTP with the bearer key, on real Docker sandboxes (1280x800).

The server runs with ``--max-edge 800 --max-bytes 4000 --confirm-actions click --idle-timeout 5``; its
clients declare no elicitation, so a click is refused by the "nobody to ask" rule. Requests without the
key, with another key, or naming another host are refused before anything else. A session's DELETE
removes its sandbox, and so does the idle timeout of a client gone without one; SIGTERM removes every
sandbox still held and the server exits 0.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import stat
from typing import Any, Iterator

import pytest

from tests.mcp._client import (SANDBOX_LINE, ServerProcess, ThreadedClient, http_transport, image_of, read_record,
                               sandbox_containers, text_of, wait_for)

INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
              "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                         "clientInfo": {"name": "raw", "version": "1"}}}


@pytest.fixture(scope="module")
def server(docker_client, desktop_image, tmp_path_factory) -> Iterator[dict[str, Any]]:
    work = tmp_path_factory.mktemp("mcp-http")
    key_file = work / "secret" / "mcp.key"
    key_file.parent.mkdir(mode=0o700)
    proc = ServerProcess("--port", "0", "--key-file", str(key_file), "--runs-dir", str(work / "runs"),
                         "--max-edge", "800", "--max-bytes", "4000", "--confirm-actions", "click",
                         "--idle-timeout", "5", "--image", desktop_image)
    try:
        yield {"proc": proc, "key_file": key_file, "runs": work / "runs"}
    finally:
        if proc.proc.poll() is None:
            proc.stop(signal.SIGTERM)


def _sandboxes(proc: ServerProcess) -> list[str]:
    return [m.group(1) for m in map(SANDBOX_LINE.search, proc.snapshot()) if m]


def _post(url: str, headers: dict[str, str]) -> Any:
    import httpx2

    return httpx2.post(url, content=json.dumps(INITIALIZE),
                       headers={"content-type": "application/json", "accept": "application/json, text/event-stream",
                                **headers}, timeout=30)


def test_every_request_needs_the_key_and_this_host(server):
    proc, key_file = server["proc"], server["key_file"]
    assert proc.key_file == key_file and stat.S_IMODE(os.stat(key_file).st_mode) == 0o600
    key = key_file.read_text().strip()
    assert len(key) >= 32 and key not in proc.err() and key not in " ".join(proc.proc.args)
    url = proc.url
    for headers in ({}, {"Authorization": "Bearer " + "x" * len(key)}, {"Authorization": key},
                    {"Authorization": f"Basic {key}"}):
        refused = _post(url, headers)
        assert refused.status_code == 401 and refused.headers["www-authenticate"] == "Bearer", headers
        assert refused.json()["error"]["code"] == "unauthorized"
    port = url.split(":")[2].split("/")[0]
    rebound = _post(url, {"Authorization": f"Bearer {key}", "Host": f"attacker.example:{port}"})
    assert rebound.status_code == 403 and rebound.json()["error"]["code"] == "bad_host"
    foreign = _post(url, {"Authorization": f"Bearer {key}", "Origin": "http://attacker.example"})
    assert foreign.status_code == 403
    accepted = _post(url, {"Authorization": f"Bearer {key}"})
    assert accepted.status_code == 200 and accepted.headers.get("mcp-session-id")
    assert _sandboxes(proc) == []  # an initialize alone starts no sandbox


def test_a_session_gets_screenshots_within_the_limits_and_its_delete_removes_the_sandbox(server, docker_client):
    proc = server["proc"]
    key = server["key_file"].read_text().strip()
    client = ThreadedClient(http_transport(proc.url, key), name="mcp-http-tests")
    try:
        assert client.client.protocol_version == "2025-11-25"  # the auto mode fell back to the handshake
        assert not client.call("launch", {"app": "terminal"}).is_error
        assert not client.call("type", {"text": "ls -la /usr/bin /etc /usr/lib\n"}).is_error
        client.call("wait")
        result = client.call("screenshot")
        data, mime, size = image_of(result)
        assert max(size) <= 800 and len(data) <= 4000, (size, len(data))
        assert mime == "image/jpeg"  # the terminal's text makes PNG too large: the cap re-encoded it
        refused = client.call("click", {"x": 10, "y": 10})
        assert refused.is_error and "nobody can be asked (the MCP client declared no elicitation" in text_of(refused)
        sandbox = _sandboxes(proc)[-1]
        assert sandbox_containers(docker_client, sandbox)
    finally:
        client.close()  # the session's DELETE
    wait_for(lambda: not sandbox_containers(docker_client, sandbox), "the sandbox's removal")
    entries = read_record(server["runs"])
    denied = [e for e in entries if e["type"] == "approval" and e.get("action", "").startswith("click")]
    assert denied and denied[-1]["decision"] == "denied" and denied[-1]["by"] == "no-approver"
    wait_for(lambda: read_record(server["runs"])[-1]["type"] == "run_finished", "the record's end")


def test_a_client_gone_without_a_delete_loses_its_sandbox_after_the_idle_timeout(server, docker_client):
    proc = server["proc"]
    key = server["key_file"].read_text().strip()
    asked: list[str] = []

    async def approve(_ctx: Any, params: Any) -> Any:
        from mcp_types import ElicitResult

        asked.append(params.message)
        return ElicitResult(action="accept", content={"approve": True})

    client = ThreadedClient(http_transport(proc.url, key, terminate_on_close=False), elicit=approve,
                            name="mcp-http-gone")
    try:
        assert not client.call("screenshot").is_error
        clicked = client.call("click", {"x": 20, "y": 30})  # asked on the call's own event stream
        assert not clicked.is_error and len(asked) == 1 and "click (20,30) left" in asked[0], text_of(clicked)
        sandbox = _sandboxes(proc)[-1]
        assert sandbox_containers(docker_client, sandbox)
    finally:
        client.close()  # its connections closed, no DELETE: the session idles from now on
    assert sandbox_containers(docker_client, sandbox)  # --idle-timeout 5: not yet
    wait_for(lambda: not sandbox_containers(docker_client, sandbox), "the idle session's end", timeout=60)
    assert any(f"removing sandbox {sandbox}" in line for line in proc.snapshot())


def test_sigterm_removes_every_sandbox_and_the_server_exits_0(server, docker_client):
    proc = server["proc"]
    key = server["key_file"].read_text().strip()
    client = ThreadedClient(http_transport(proc.url, key, terminate_on_close=False), name="mcp-http-held")
    try:
        assert not client.call("screenshot").is_error
        before = set(_sandboxes(proc))
        sandbox = _sandboxes(proc)[-1]
        assert sandbox in before and sandbox_containers(docker_client, sandbox)
        assert proc.stop(signal.SIGTERM) == 0, proc.err()
        assert not sandbox_containers(docker_client, sandbox), proc.err()
        assert proc.stdout == ""  # nothing on stdout: the lines about the server are on stderr
    finally:
        with contextlib.suppress(Exception):  # the client of a stopped server may fail to close
            client.close(timeout=30)
    finished = [e for e in read_record(server["runs"]) if e["type"] == "run_finished"]
    assert len(finished) == 3, finished  # every session's record, this one's too
