"""``desktop-sandbox mcp`` against clients that misbehave: one that never reads its answers, one that gives up
on a call while the call waits on an approval, one that gives up on ``run_task``, and arguments past the
tools' limits. Real servers (subprocesses), the ``mcp`` package's own client, real Docker sandboxes (two at
most: one over stdio, one over HTTP).

- a client that closes stdin without ever reading stdout: the process ends within the server's flush
  bound instead of waiting on a full pipe forever (no sandbox is started);
- a call cancelled by its client (its read timeout) while it waits on an elicitation: the question is
  withdrawn, so the click never reaches the desktop (not even when a later call is asked to approve it)
  and the next call is answered at once, not after the approval timeout;
- ``run_task`` waiting on a question in one HTTP session: a concurrent call of that session waits on a
  worker thread, so another session's requests are answered meanwhile (the server's event loop never
  waits on the model loop); the client giving up on ``run_task`` cancels its model loop.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from controller.mcp.serve import FLUSH_S
from wire.actions import MAX_KEY_NAME_CHARS, MAX_SCROLL_PX
from tests.mcp._client import (ROOT, ServerProcess, ThreadedClient, http_transport, read_record, server_argv,
                               server_env, stdio_params, text_of, wait_for)

HERE = Path(__file__).resolve().parent


def test_arguments_past_the_limits_are_refused_before_a_sandbox_starts():
    """In-process (the ``mcp`` package's ``Client`` on the server object): a key name longer than any
    key, or a scroll amount past the limit, is a tool error from the arguments' schema; no sandbox is
    started (the backend named here does not exist, so a start would fail with another message)."""
    from mcp import Client

    from controller.mcp.server import build_server
    from controller.mcp.session import McpOptions, SessionHub

    hub = SessionHub(McpOptions(backend="no-such-backend"))
    server = build_server(hub)

    async def main() -> list[Any]:
        async with Client(server) as client:
            return [await client.call_tool("keypress", {"keys": ["A" * (MAX_KEY_NAME_CHARS + 1)]}),
                    await client.call_tool("click", {"x": 1, "y": 1, "keys": ["B" * 100_000]}),
                    await client.call_tool("scroll", {"x": 1, "y": 1, "scroll_y": 10**400}),
                    await client.call_tool("scroll", {"x": 1, "y": 1, "scroll_x": -MAX_SCROLL_PX - 1})]

    results = anyio.run(main)
    texts = [text_of(r) for r in results]
    assert all(r.is_error for r in results), texts
    assert f"at most {MAX_KEY_NAME_CHARS} characters" in texts[0] and "at most" in texts[1], texts
    assert f"less than or equal to {MAX_SCROLL_PX}" in texts[2], texts
    assert f"greater than or equal to {-MAX_SCROLL_PX}" in texts[3], texts
    assert all(s.sandbox is None for s in hub.sessions())


def test_a_client_that_never_reads_stdout_does_not_keep_the_server_once_stdin_closes(desktop_image, tmp_path):
    proc = subprocess.Popen(server_argv("--runs-dir", str(tmp_path / "runs"), "--image", desktop_image), cwd=ROOT,
                            env=server_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        assert proc.stdin is not None and proc.stdout is not None

        def send(message: dict[str, Any]) -> None:
            assert proc.stdin is not None
            proc.stdin.write((json.dumps(message) + "\n").encode())
            proc.stdin.flush()

        send({"jsonrpc": "2.0", "id": 1, "method": "initialize",
              "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                         "clientInfo": {"name": "never-reads", "version": "1"}}})
        assert b'"id":1' in proc.stdout.readline()  # the last line this client reads
        send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        for i in range(200):  # their answers fill the stdout pipe, which is never read
            send({"jsonrpc": "2.0", "id": 10 + i, "method": "tools/list"})
        proc.stdin.close()
        closed = time.monotonic()
        try:
            code = proc.wait(FLUSH_S + 20)
        except subprocess.TimeoutExpired:
            raise AssertionError("the server still waits on a client that never reads, after stdin closed") from None
        assert code == 0 and time.monotonic() - closed < FLUSH_S + 20
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)


def test_a_cancelled_call_waiting_on_an_approval_never_runs_and_frees_the_session(desktop_image, tmp_path):
    """The client's read timeout (1 s) abandons a confirmed click while its person is still deciding
    (3 s), and the ``mcp`` client tells the server so (``notifications/cancelled``). The person then says
    yes to whatever is asked next; nothing but the first question is asked, and the click never ran."""
    from mcp.client.stdio import stdio_client
    from mcp_types import ElicitResult

    runs = tmp_path / "runs"
    asked: list[str] = []

    async def slow_yes(_ctx: Any, params: Any) -> Any:
        asked.append(params.message.split("\n")[0])
        if len(asked) == 1:
            await anyio.sleep(3)  # the client gives up on the call first
        return ElicitResult(action="accept", content={"approve": True})

    errlog = (tmp_path / "server.stderr").open("w")
    params = stdio_params("--confirm-actions", "click", "--approval-timeout", "60", "--runs-dir", str(runs),
                          "--image", desktop_image)
    client = ThreadedClient(stdio_client(params, errlog=errlog), elicit=slow_yes, name="mcp-hostile-cancel")
    try:
        assert not client.call("screenshot").is_error
        with pytest.raises(Exception, match="timed out"):
            client.run(lambda c: c.call_tool("click", {"x": 77, "y": 77}, read_timeout_seconds=1))
        wait_for(lambda: len(asked) == 1, "the question about the click")
        time.sleep(0.5)  # noqa: the withdrawal reaches the run's thread; a later call must not revive it
        started = time.monotonic()
        moved = client.call("move", {"x": 5, "y": 5}, timeout=30)
        assert not moved.is_error and time.monotonic() - started < 10, text_of(moved)
    finally:
        client.close()
    assert asked == ["desktop-sandbox asks (action): Run click (77,77) left?"], asked
    entries = read_record(runs)
    clicks = [e for e in entries if e["type"] == "action" and e["action"] == "click"]
    assert [c["error"] for c in clicks] == ["not approved"], clicks
    approvals = [e for e in entries if e["type"] == "approval"]
    assert [(a["decision"], a["by"]) for a in approvals] == [("withdrawn", "cancel")], approvals
    assert entries[-1]["type"] == "run_finished", entries[-1]


def test_run_task_holding_its_sandbox_stalls_no_other_session_and_a_cancel_stops_it(desktop_image, tmp_path):
    proc = ServerProcess("--port", "0", "--key-file", str(tmp_path / "mcp.key"), "--runs-dir", str(tmp_path / "runs"),
                         "--confirm-actions", "click", "--approval-timeout", "60", "--image", desktop_image)
    asked: list[str] = []

    async def never(_ctx: Any, params: Any) -> Any:
        asked.append(params.message)
        await anyio.sleep_forever()

    key = proc.key_file.read_text().strip()
    a = b = None
    try:
        a = ThreadedClient(http_transport(proc.url, key), elicit=never, name="mcp-hostile-task")
        b = ThreadedClient(http_transport(proc.url, key), name="mcp-hostile-other")
        assert not a.call("screenshot").is_error
        run_task = asyncio.run_coroutine_threadsafe(
            a.client.call_tool("run_task", {"task": "tests/mcp/hostile-click.toml"}, read_timeout_seconds=8), a.loop)
        wait_for(lambda: asked, "run_task's question about its click", timeout=60)
        shot = asyncio.run_coroutine_threadsafe(a.client.call_tool("screenshot", {}), a.loop)
        time.sleep(0.5)  # noqa: the screenshot call reaches the server and waits for the model loop
        started = time.monotonic()
        assert b.run(lambda c: c.list_tools(), timeout=5).tools  # another session: answered meanwhile
        assert time.monotonic() - started < 3
        with pytest.raises(Exception, match="timed out"):
            run_task.result(30)  # the client gives up on run_task: its model loop is cancelled
        assert not shot.result(30).is_error
    finally:
        for client in (a, b):
            if client is not None:
                client.close()
        assert proc.stop(signal.SIGTERM) == 0, proc.err()
    finished = [e for e in read_record(tmp_path / "runs") if e["type"] == "run_finished"]
    task_end = [e for e in finished if "run_task" in (e.get("reason") or "")]
    assert task_end and task_end[0]["status"] == "cancelled", finished
