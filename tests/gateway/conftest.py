"""Fixtures: real loopback test servers (allowed, and denied ones that record every hit) and the real
gateway proxy process."""

from __future__ import annotations

import datetime as dt
import http.server
import ipaddress
import json
import select
import socket
import ssl
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.helpers import reply
from tests.require import unavailable

from controller.gateway import gateway_python

REPO = Path(__file__).resolve().parents[2]




@dataclass
class RecordingServer:
    """HTTP server on a loopback address that records every accepted connection (``hits``)."""

    name: str
    host: str
    port: int
    hits: list[str] = field(default_factory=list)
    server: http.server.ThreadingHTTPServer | None = None
    tls: bool = False

    @property
    def authority(self) -> str:
        return f"{self.host}:{self.port}"


def _handler(record: RecordingServer):
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):  # quiet
            pass

        def do_GET(self):
            if self.path.startswith("/redirect?to="):
                self.send_response(302)
                self.send_header("Location", self.path.split("=", 1)[1])
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            reply(self, 200, f"{record.name} {self.path}".encode(), "text/plain")

    return Handler


def start_server(name: str, host: str, tls_context: ssl.SSLContext | None = None, port: int = 0) -> RecordingServer:
    """A :class:`RecordingServer` on ``host`` (``port`` 0: a free one), served on a daemon thread."""
    record = RecordingServer(name=name, host=host, port=port, tls=tls_context is not None)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET

    class Server(http.server.ThreadingHTTPServer):
        address_family = family
        daemon_threads = True

        def get_request(self):
            sock, addr = super().get_request()
            record.hits.append(f"{addr[0]}:{addr[1]}")
            if tls_context is not None:
                sock = tls_context.wrap_socket(sock, server_side=True)
            return sock, addr

        def handle_error(self, request, client_address):  # refused handshakes are expected in tests
            pass

    server = Server((host, port), _handler(record))
    record.port = server.server_address[1]
    record.server = server
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return record


def self_signed_context(tmp: Path, name: str) -> tuple[ssl.SSLContext, Path]:
    """Server TLS context with a fresh self-signed certificate for ``name``; returns (context, cert path)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = dt.datetime.now(dt.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path = tmp / f"{name}.crt"
    key_path = tmp / f"{name}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert_path, key_path)
    return context, cert_path


@dataclass
class Gateway:
    host: str
    port: int
    log: Path
    process: subprocess.Popen

    def decisions(self) -> list[dict]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines() if line.strip()]


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def start_gateway(tmp: Path, policy: dict, extra: list[str] | None = None) -> Gateway:
    """The real gateway process on a free loopback port; ``extra``: more ``serve`` arguments."""
    python = gateway_python()
    if python is None:
        unavailable("GATEWAY", "mitmproxy is not installed; set DESKTOP_SANDBOX_GATEWAY_PYTHON or create "
                    "build/gateway-venv (make deps)")
    port = free_port()
    log = tmp / "decisions.jsonl"
    process = subprocess.Popen(
        [python, "-m", "controller.gateway", "serve", "--policy-json", json.dumps(policy), "--log", str(log),
         "--listen", f"127.0.0.1:{port}", "--confdir", str(tmp / "mitmproxy"), *(extra or [])],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_listening(process, 30)
    return Gateway("127.0.0.1", port, log, process)


def wait_listening(process: subprocess.Popen, timeout: float) -> None:
    """Wait until the gateway ``process`` says ``gateway listening on`` on its stderr (which is then
    drained on a thread); kill it and raise RuntimeError with what it printed when it exits first or
    ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    lines: list[str] = []
    while time.monotonic() < deadline:
        ready, _, _ = select.select([process.stderr], [], [], 0.5)
        if ready:
            line = process.stderr.readline()
            lines.append(line)
            if "gateway listening on" in line:
                threading.Thread(target=process.stderr.read, daemon=True).start()  # keep draining
                return
        if process.poll() is not None:
            break
    process.kill()
    raise RuntimeError("gateway did not start:\n" + "".join(lines) + (process.stderr.read() or ""))


@pytest.fixture
def servers(tmp_path):
    """allowed: 127.0.0.2 (HTTP); denied: 127.0.0.3 and 127.0.0.1 (record hits); tls: HTTPS for the name
    'localhost' on its first resolved address; tls_other: a second HTTPS server (denied)."""
    first = socket.getaddrinfo("localhost", 0, type=socket.SOCK_STREAM)[0][4][0]
    tls_context, cert = self_signed_context(tmp_path, "localhost")
    started = {
        "allowed": start_server("allowed", "127.0.0.2"),
        "denied": start_server("denied", "127.0.0.3"),
        "loopback": start_server("loopback", "127.0.0.1"),
        "tls": start_server("tls", first, tls_context),
    }
    started["tls_cert"] = cert  # type: ignore[assignment]
    yield started
    for value in started.values():
        if isinstance(value, RecordingServer) and value.server is not None:
            value.server.shutdown()
            value.server.server_close()


@pytest.fixture
def gateway_factory(tmp_path):
    started: list[Gateway] = []

    def make(policy: dict) -> Gateway:
        gateway = start_gateway(tmp_path, policy)
        started.append(gateway)
        return gateway

    yield make
    for gateway in started:
        gateway.process.terminate()
        try:
            gateway.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            gateway.process.kill()


def is_v6(host: str) -> bool:
    return isinstance(ipaddress.ip_address(host), ipaddress.IPv6Address)
