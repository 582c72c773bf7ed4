"""The ``mcp`` package's own client, driven from synchronous tests: its event loop runs on a thread of its
own, so one client (one MCP session, one sandbox) can be shared by a module's tests.

``ServerProcess`` spawns ``python -m controller.cli mcp ...`` for an HTTP test and reads the line it
prints once it listens; over stdio the client spawns the server itself (:func:`stdio_params`).
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[2]
DEADLINE_S = 120.0
"""Longest wait for a tool call, a server's start or its end (a sandbox start takes about 8 s)."""
PROBE_LOG = "/home/sandbox/mcp-probe.jsonl"
"""Where the input-event probe of tests/mcp/screen-2560.toml logs what reaches the desktop."""
CONFORMANCE_APPS = "/opt/desktop-sandbox/src/images/apps.conformance.json"
"""The guest's app allowlist that adds the probe."""


def server_env() -> dict[str, str]:
    """The environment a server is started with: this one without ``OPENAI_API_KEY`` (``run_task`` then
    runs a task's offline script) and with the checkout on ``PYTHONPATH``."""
    env = {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "COLUMNS", "FORCE_COLOR")}
    env["PYTHONPATH"] = str(ROOT)
    return env


def server_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "controller.cli", "mcp", *args]


def stdio_params(*args: str) -> Any:
    """How the client spawns ``desktop-sandbox mcp ARGS`` over stdio (in the checkout, :func:`server_env`)."""
    from mcp import StdioServerParameters

    argv = server_argv(*args)
    return StdioServerParameters(command=argv[0], args=argv[1:], cwd=str(ROOT), env=server_env())


class ThreadedClient:
    """An :class:`mcp.Client` entered on an event loop of its own thread.

    ``target``: what ``Client`` connects to (stdio parameters, or a transport from :meth:`http`);
    ``elicit``: the elicitation callback (async ``(ctx, params) -> ElicitResult``) or None (the client
    then declares no elicitation); ``name``: its ``clientInfo.name``."""

    def __init__(self, target: Any, *, elicit: Callable[..., Any] | None = None, name: str = "mcp-tests") -> None:
        from mcp import Client
        from mcp_types import Implementation

        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="mcp-client", daemon=True)
        self._thread.start()
        self._stop: asyncio.Event | None = None
        self._entered = threading.Event()
        self.error: BaseException | None = None
        self.client: Any = None
        kwargs: dict[str, Any] = {"client_info": Implementation(name=name, version="1")}
        if elicit is not None:
            kwargs["elicitation_callback"] = elicit

        async def hold() -> None:
            self._stop = asyncio.Event()
            try:
                async with Client(target, **kwargs) as client:
                    self.client = client
                    self._entered.set()
                    await self._stop.wait()
            except BaseException as exc:  # noqa: BLE001 - told to the test
                self.error = exc
            finally:
                self._entered.set()

        self._held = asyncio.run_coroutine_threadsafe(hold(), self.loop)
        if not self._entered.wait(DEADLINE_S) or self.client is None:
            raise AssertionError(f"the client did not connect: {self.error!r}")

    def run(self, coro_fn: Callable[[Any], Any], timeout: float = DEADLINE_S) -> Any:
        """``await coro_fn(client)`` on the client's loop; its result."""
        return asyncio.run_coroutine_threadsafe(coro_fn(self.client), self.loop).result(timeout)

    def call(self, name: str, arguments: dict[str, Any] | None = None, timeout: float = DEADLINE_S) -> Any:
        """A tool call's ``CallToolResult``."""
        return self.run(lambda c: c.call_tool(name, arguments or {}), timeout)

    def close(self, timeout: float = DEADLINE_S) -> None:
        """Leave the client (stdio: stdin closed, the server waited for; HTTP: the session's DELETE)."""
        if self._stop is not None:
            self.loop.call_soon_threadsafe(self._stop.set)
        try:
            self._held.result(timeout)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout)


def http_transport(url: str, key: str | None, *, terminate_on_close: bool = True) -> Any:
    """A streamable-HTTP transport to ``url`` sending ``Authorization: Bearer KEY``."""
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    headers = {"Authorization": f"Bearer {key}"} if key else None
    return streamable_http_client(url, http_client=create_mcp_http_client(headers=headers),
                                  terminate_on_close=terminate_on_close)


class ServerProcess:
    """``desktop-sandbox mcp --http ARGS`` in a subprocess of its own session; :attr:`url` once it listens.
    Its stderr is collected (:meth:`err`)."""

    LINE = re.compile(r"mcp: (http://127\.0\.0\.1:\d+/mcp) key-file: (.+)$")

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen(server_argv("--http", *args), cwd=ROOT, env=server_env(), text=True,
                                     stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     start_new_session=True)
        self.lines: list[str] = []
        self.stdout = ""
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        match = wait_for(lambda: next((m for m in map(self.LINE.search, self.snapshot()) if m), None)
                         or (self.proc.poll() is not None and "ended"), "the server's listening line")
        if match == "ended":
            raise AssertionError(f"the server ended ({self.proc.returncode}):\n{self.err()}")
        self.url, self.key_file = match.group(1), Path(match.group(2))

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            with self._lock:
                self.lines.append(line.rstrip("\n"))

    def snapshot(self) -> list[str]:
        with self._lock:
            return list(self.lines)

    def err(self) -> str:
        return "\n".join(self.snapshot())[-4000:]

    def stop(self, signum: int, timeout: float = DEADLINE_S) -> int:
        """Send ``signum`` and wait for the process to end; its exit status."""
        self.proc.send_signal(signum)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise AssertionError(f"the server did not end within {timeout:g}s:\n{self.err()}") from None
        self._reader.join(10)
        assert self.proc.stdout is not None
        self.stdout = self.proc.stdout.read()
        return code


def wait_for(predicate: Callable[[], Any], what: str, timeout: float = DEADLINE_S) -> Any:
    """Poll ``predicate()`` until it gives something true (returned); fail past ``timeout``."""
    from tests.conformance.harness import poll

    return poll(predicate, timeout, interval=0.05, what=what)


def text_of(result: Any) -> str:
    """The text blocks of a tool result, joined."""
    return "\n".join(block.text for block in result.content if getattr(block, "type", None) == "text")


def image_of(result: Any) -> tuple[bytes, str, tuple[int, int]]:
    """The image of a screenshot result: its bytes, mime type and (width, height) as the bytes say."""
    from PIL import Image

    block = next(b for b in result.content if getattr(b, "type", None) == "image")
    data = base64.b64decode(block.data)
    with Image.open(io.BytesIO(data)) as img:
        return data, block.mime_type, img.size


def probe_events(client: ThreadedClient) -> list[dict[str, Any]]:
    """The probe's complete log lines, read through the ``read_file`` tool (none before it wrote any)."""
    result = client.call("read_file", {"path": PROBE_LOG})
    if result.is_error:
        return []
    text = result.content[1].text
    return [json.loads(line) for line in text[: text.rfind("\n") + 1].splitlines() if line]


def read_record(runs: Path) -> list[dict[str, Any]]:
    """Every complete line of the run records under ``runs`` (oldest record first)."""
    entries = []
    for path in sorted(runs.glob("*/record.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                entries.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return entries


def sandbox_containers(docker_client: Any, sandbox_id: str) -> list[str]:
    """Names of the containers carrying the sandbox id label ``sandbox_id`` (running or not)."""
    from controller.sandbox import LABEL_SANDBOX

    return [c.name for c in docker_client.containers.list(all=True, ignore_removed=True,
                                                          filters={"label": f"{LABEL_SANDBOX}={sandbox_id}"})]


SANDBOX_LINE = re.compile(r"sandbox (d[svk]-[0-9a-f]{8}) ready")
"""The server's stderr line naming a session's sandbox."""
