"""The real gateway (mitmproxy and the policy addon, ``python -m controller.gateway serve``) with its
control API, on loopback, for the origin access tests: a policy in mode ``ask`` over origin servers
this test starts on 127.0.0.x (the gateway resolves their names from a hosts map, so no DNS query
leaves the machine), a client that sends requests through the proxy, and a relay to the control API
that refuses connections until told to accept them (:class:`ControlRelay`)."""

from __future__ import annotations

import contextlib
import json
import secrets
import socket
import subprocess
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from controller.gateway import gateway_python
from tests.conformance.harness import poll
from tests.gateway.conftest import REPO, RecordingServer, free_port, start_server, wait_listening
from tests.require import unavailable


@dataclass
class AskGateway:
    """A running gateway: ``proxy`` (host, port), ``control_url`` and ``token`` of its control API, its
    decision ``log``, the ``origins`` (name -> :class:`RecordingServer`, each with its hits), its
    ``policy`` (the ``[network]`` table)."""

    proxy: tuple[str, int]
    control_url: str
    token: str
    log: Path
    process: subprocess.Popen
    origins: dict[str, RecordingServer] = field(default_factory=dict)
    policy: dict[str, Any] = field(default_factory=dict)

    def url(self, name: str, path: str = "/") -> str:
        """``http://<name>.test:<port><path>`` of origin ``name``."""
        return f"http://{name}.test:{self.origins[name].port}{path}"

    def origin(self, name: str) -> str:
        """The origin text the gateway writes for origin ``name``."""
        return f"http://{name}.test:{self.origins[name].port}"

    def decisions(self) -> list[dict[str, Any]]:
        """The decision log, parsed."""
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines() if line.strip()]

    def fetch(self, url: str, timeout: float = 30.0) -> int:
        """GET ``url`` through the proxy; the HTTP status (the gateway answers 403 when it refuses)."""
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({"http": f"http://{self.proxy[0]}:"
                                                                                  f"{self.proxy[1]}"}))
        try:
            with opener.open(url, timeout=timeout) as resp:
                return resp.status
        except urllib.error.HTTPError as exc:
            return exc.code

    def fetch_later(self, url: str) -> "Fetch":
        """:meth:`fetch` on a thread of its own (the gateway holds it until answered)."""
        return Fetch(self, url).start()

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        for server in self.origins.values():
            if server.server is not None:
                server.server.shutdown()
                server.server.server_close()


class Fetch:
    """One request through the proxy on its own thread: :meth:`result` waits for its status."""

    def __init__(self, gateway: AskGateway, url: str) -> None:
        self.gateway, self.url = gateway, url
        self.status: int | None = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> "Fetch":
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            self.status = self.gateway.fetch(self.url)
        except BaseException as exc:  # noqa: BLE001 - reported by result()
            self.error = exc

    def result(self, timeout: float = 30.0) -> int | None:
        """The status, or None when the request is still held after ``timeout`` seconds."""
        self._thread.join(timeout)
        if self.error is not None:
            raise self.error
        return self.status

    @property
    def done(self) -> bool:
        return not self._thread.is_alive()


def start_ask_gateway(tmp: Path, names: tuple[str, ...] = ("ask",), *, hold_timeout_s: float = 20.0,
                      max_pending: int = 5) -> AskGateway:
    """A gateway in mode ``ask`` whose ask tier is the origins ``http://<name>.test:<port>`` of one
    recording origin server per name (on 127.0.0.5, .6, ...), with its control API on a free loopback
    port. Skips (``GATEWAY``) when mitmproxy is not installed."""
    python = gateway_python()
    if python is None:
        unavailable("GATEWAY", "mitmproxy is not installed; set DESKTOP_SANDBOX_GATEWAY_PYTHON or create "
                    "build/gateway-venv (make deps)")
    origins = {name: start_server(name, f"127.0.0.{5 + i}") for i, name in enumerate(names)}
    hosts = {f"{name}.test": [server.host] for name, server in origins.items()}
    (tmp / "hosts.json").write_text(json.dumps(hosts))
    token = secrets.token_urlsafe(24)
    (tmp / "control.token").write_text(token)
    policy = {"mode": "ask", "ask": [f"http://{n}.test:{s.port}" for n, s in origins.items()], "quiet": [],
              "allow_addresses": [f"{s.host}/32" for s in origins.values()],
              "hold_timeout_s": hold_timeout_s, "max_pending": max_pending}
    port, control_port = free_port(), free_port()
    log = tmp / "decisions.jsonl"
    process = subprocess.Popen(
        [python, "-m", "controller.gateway", "serve", "--policy-json", json.dumps(policy), "--log", str(log),
         "--listen", f"127.0.0.1:{port}", "--confdir", str(tmp / "mitmproxy"),
         "--control-listen", f"127.0.0.1:{control_port}", "--control-token-file", str(tmp / "control.token"),
         "--hosts", str(tmp / "hosts.json")],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_listening(process, 60)
    except RuntimeError:
        for server in origins.values():
            if server.server is not None:
                server.server.shutdown()
        raise
    return AskGateway(("127.0.0.1", port), f"http://127.0.0.1:{control_port}", token, log, process, origins, policy)


def until(predicate: Any, timeout: float = 20.0, what: str = "condition") -> Any:
    """:func:`tests.conformance.harness.poll` with this module's default deadline (seconds)."""
    return poll(predicate, timeout=timeout, what=what)


class ControlRelay:
    """A TCP relay on 127.0.0.1 to the gateway's control API (``control_url``): its port is bound from the
    start but refuses connections (nothing listens) until :meth:`accept`, and again after :meth:`refuse`,
    which also cuts every connection it relays. ``url``: what a sandbox gives as its control URL. The
    ``Host`` a client sends (naming the relay) is rewritten to name the API, which checks it."""

    def __init__(self, control_url: str) -> None:
        host, port = control_url.removeprefix("http://").rstrip("/").rsplit(":", 1)
        self.target = (host, int(port))
        self._listener = socket.socket()
        self._listener.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._hosts = (f"Host: {self.url.removeprefix('http://')}\r\n".encode(),
                       f"Host: {host}:{port}\r\n".encode())
        self._open: list[socket.socket] = []
        self._lock = threading.Lock()
        self._refusing = False

    def accept(self) -> None:
        """Listen and relay each connection (a thread each way)."""
        self._listener.listen(16)
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        listener = self._listener
        while True:
            try:
                client, _ = listener.accept()
            except OSError:  # refuse() closed it
                return
            try:
                upstream = socket.create_connection(self.target, timeout=10)
            except OSError:
                client.close()
                continue
            with self._lock:
                if self._refusing:
                    client.close()
                    upstream.close()
                    return
                self._open += [client, upstream]
            for a, b, hosts in ((client, upstream, self._hosts), (upstream, client, None)):
                threading.Thread(target=self._pump, args=(a, b, hosts), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket, hosts: tuple[bytes, bytes] | None) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data.replace(*hosts) if hosts else data)
        except OSError:
            pass
        for sock in (source, sink):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def refuse(self) -> None:
        """Stop listening (connections are refused from now on) and cut every relayed connection."""
        with self._lock:
            self._refusing = True
            open_, self._open = self._open, []
        self._listener.close()
        for sock in open_:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
