"""Small pieces several test folders share: an HTTP handler's reply, a quiet handler served on a
thread of this process, a process that has exited, the timings section of the
terminal summary, an origin web server in a container of the guest image, a local desktop whose agent
holds Debian's chromium (stopping a child process is :func:`guest.localrun.terminate`)."""

from __future__ import annotations

import http.server
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable

from controller.chromium import channel_app
from controller.sandbox.owner import process_start


def reply(handler: http.server.BaseHTTPRequestHandler, status: int, body: bytes,
          content_type: str | None = None) -> None:
    """Answer ``handler``'s request with ``status`` and ``body`` (a Content-Length, and a Content-Type
    when given)."""
    handler.send_response(status)
    if content_type is not None:
        handler.send_header("Content-Type", content_type)
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


def reply_json(handler: http.server.BaseHTTPRequestHandler, status: int, value: Any) -> None:
    """Answer with ``value`` as JSON (``application/json``)."""
    reply(handler, status, json.dumps(value).encode(), "application/json")


class QuietHandler(http.server.BaseHTTPRequestHandler):
    """A request handler that logs nothing (http.server writes every request to stderr)."""

    def log_message(self, *_: Any) -> None:
        pass


def serve_http(handler: type[http.server.BaseHTTPRequestHandler]) -> http.server.ThreadingHTTPServer:
    """A server of ``handler`` on 127.0.0.1 (a free port), serving on a daemon thread until its
    ``shutdown()``."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def exited_process() -> tuple[int, str]:
    """Pid and start time of a process of this host that has exited (and was waited for)."""
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    start = process_start(proc.pid)
    proc.stdin.close()
    proc.wait(timeout=30)
    return proc.pid, start



def timings_section(terminalreporter: Any, title: str, rows: list[tuple[str, dict[str, Any]]],
                    show: Callable[[Any], str]) -> None:
    """Write ``rows`` (what, its timings) as the section ``title`` of pytest's terminal summary, each
    value through ``show``: ``what: name value, name value``. Nothing when there are no rows."""
    if not rows:
        return
    terminalreporter.section(title)
    for what, timings in rows:
        terminalreporter.write_line(f"{what}: " + ", ".join(f"{k} {show(v)}" for k, v in timings.items()))


TARGET_SERVER = Path(__file__).resolve().parents[1] / "controller" / "audit" / "target_server.py"


def run_origin_target(client: Any, image: str, network: str, name: str, alias: str, port: int,
                      labels: dict[str, str], timeout: float = 60.0) -> Any:
    """A hardened container of ``image`` on Docker ``network`` (reachable there as ``alias``) serving
    HTTP on ``port`` with the audit's target server (an allowed origin), once it listens (:func:`run_server`)."""
    return run_server(client, image, ["python3", "-c", TARGET_SERVER.read_text(encoding="utf-8")],
                      json.dumps({"role": "allowed", "http": [port]}), network, name, alias, labels, timeout)


def run_server(client: Any, image: str, entrypoint: list[str], argument: str, network: str, name: str, alias: str,
               labels: dict[str, str], timeout: float = 60.0) -> Any:
    """A hardened container of ``image`` running ``entrypoint + [argument]`` on Docker ``network``
    (reachable there as ``alias``), once it printed ``"ready": true``. Raises AssertionError when it exits
    or is not ready within ``timeout`` seconds; the caller removes it."""
    container = client.containers.run(
        image, entrypoint=entrypoint, command=[argument], name=name, detach=True,
        user="1000:1000", read_only=True, cap_drop=["ALL"], security_opt=["no-new-privileges:true"],
        pids_limit=64, mem_limit="128m", labels=labels, network=network,
        networking_config={network: client.api.create_endpoint_config(aliases=[alias])})
    deadline = time.monotonic() + timeout
    while b'"ready": true' not in container.logs():
        container.reload()
        if container.status not in ("created", "running") or time.monotonic() > deadline:
            logs = container.logs(tail=20)
            container.remove(force=True)
            raise AssertionError(f"the {alias} container did not get ready: {logs!r}")
        time.sleep(0.1)  # poll interval of a bounded condition wait (the server listening)
    return container


SIGNIN_SITE = "/opt/desktop-sandbox/src/images/signin-demo/site.py"
"""The sign-in demo site inside the desktop image (images/signin-demo/site.py)."""


def run_signin_site(client: Any, image: str, network: str, name: str, labels: dict[str, str],
                    alias: str = "signin-demo", timeout: float = 60.0) -> Any:
    """The sign-in demo site (ports 8080 and 8081) in a container of ``image`` (:func:`run_server`)."""
    return run_server(client, image, ["python3", SIGNIN_SITE], '{"http": [8080, 8081]}', network, name, alias,
                      labels, timeout)


CHROMIUM = "/usr/bin/chromium"
"""Debian's chromium, the agent's channel app (``images/apps.json``)."""


def chromium_missing() -> str | None:
    """Why a local desktop with chromium cannot start here (a sentence), or None when it can: it needs
    :data:`CHROMIUM`, ``Xvfb``, and ``setpriv`` (chromium keeps its sandbox, so it runs as ``nobody``
    when the tests run as root)."""
    if not os.access(CHROMIUM, os.X_OK):
        return f"{CHROMIUM} not installed (apt-get install chromium)"
    missing = [c for c in ("Xvfb", "setpriv") if shutil.which(c) is None]
    return f"{', '.join(missing)} not installed (apt-get install xvfb util-linux)" if missing else None


@contextmanager
def chromium_desktop(*args: Any, sandbox: Any = None, chromium_args: tuple[str, ...] = (),
                     **options: Any) -> Iterator[Any]:
    """A started :class:`tests.loop.local_sandbox.LocalSandbox` (private Xvfb 1280x800 and the real agent;
    ``args`` and ``options`` go to it: ``pickup=True`` for the demo app), or of its subclass ``sandbox``,
    whose only app is Debian's chromium as the agent's channel app: its argv and channel as
    ``images/apps.json`` declares them plus ``chromium_args``, its profile in a directory of its own, run
    as ``nobody`` when the tests run as root (chromium keeps its sandbox; the guest runs it as the user
    ``browser``). Launch it with ``sandbox.agent.launch("chromium", [url])``. Everything is stopped and
    removed on exit."""
    from tests.loop.local_sandbox import LocalSandbox

    top = Path(tempfile.mkdtemp(prefix="ds-chromium-"))
    apps = channel_app(top, chromium_args)
    desktop = (sandbox or LocalSandbox)(*args, apps=apps, **options)
    try:
        yield desktop.start()
    finally:
        desktop.close()
        shutil.rmtree(top, ignore_errors=True)


@contextmanager
def probe_desktop(display: str, work: Path, extra_args: tuple[str, ...] = ()) -> Iterator[tuple[Any, Any, Any]]:
    """``(agent, client, desktop)`` on X display ``display``: the real agent (its only app the event-logging
    probe window, file roots ``work``, ``extra_args`` on its command line), an ``AgentClient`` (30 s
    timeout) and the conformance suite's ``AgentDesktop`` over them; all stopped on exit."""
    from controller.agent_client import AgentClient
    from guest.localrun import AgentProcess
    from tests.conformance.harness import AgentDesktop

    agent = AgentProcess(display, apps={"probe": [sys.executable, "-m", "guest", "probe"]},
                         files_roots=[str(work)], extra_args=list(extra_args)).start()
    try:
        with AgentClient(agent.base_url, agent.token, timeout=30) as client:
            desktop = AgentDesktop(client, str(work), display=display)
            try:
                yield agent, client, desktop
            finally:
                desktop.close()
    finally:
        agent.stop()


class FnSeam:
    """A driver seam (``controller.run.driver.DriverSeam``) made of plain callables, for tests of the
    driver alone: ``forward(actions)``, ``capture_wait()`` (None: nothing waits before a capture, so
    the settle wait and the capture may go in one request), ``gate(screenshot)``, ``sent(shot)``.
    Attributes may be swapped between calls."""

    def __init__(self, forward=None, capture_wait=None, gate=None, sent=None, rebind=None):
        self.forward, self.capture_wait, self.gate, self.sent, self.rebind = forward, capture_wait, gate, sent, rebind

    @property
    def waits_before_capture(self):
        return self.capture_wait is not None

    def step_boundary(self, screenshot):
        return bool(self.gate(screenshot)) if self.gate is not None else False

    def forwarding(self, actions):
        if self.forward is not None:
            self.forward(actions)

    def before_capture(self):
        return bool(self.capture_wait()) if self.capture_wait is not None else False

    def screen_changed(self, error):
        return self.rebind(error) if self.rebind is not None else False

    def screenshot_sent(self, shot):
        if self.sent is not None:
            self.sent(shot)
