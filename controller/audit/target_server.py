"""Audit target server: runs in a throwaway container on the audit's own network (standard library only).

``python3 target_server.py '<JSON config>'`` with config ``{"role": "allowed"|"recorder"|"flush", "http":
[ports], "tcp": [ports], "udp": [ports]}`` (flush: also ``"token"``).

* ``allowed`` answers HTTP on its ``http`` ports: ``GET /redirect?to=URL`` -> 302 to URL, anything else
  -> 200 ``audit-allowed <path>``.
* ``recorder`` accepts on every ``tcp``/``http`` port and ``udp`` port and answers nothing useful.

Every accepted TCP connection and every UDP datagram is printed to stdout as one JSON line
``{"hit": "tcp"|"udp"|"http", "port", "peer", "head"}`` so the audit can prove what did (and did not)
reach a target. ``{"ready": true}`` is printed once every socket is bound.

* ``flush`` (run with ``docker exec`` in a running target) sends ``token`` from loopback to each ``tcp``
  and ``udp`` port, once per address family the server listens on, and prints one JSON line
  ``{"sent": [{"hit", "port", "peer"}, ...]}`` naming the markers sent; the server records each as a hit
  whose ``head`` is the token once it has handled everything queued before it.
"""

from __future__ import annotations

import http.server
import json
import socket
import sys
import threading
from urllib.parse import parse_qs, urlsplit

_lock = threading.Lock()


def emit(record: dict) -> None:
    with _lock:
        sys.stdout.write(json.dumps(record) + "\n")
        sys.stdout.flush()


def _families() -> list[tuple[int, str]]:
    out = [(socket.AF_INET, "0.0.0.0")]
    if socket.has_ipv6:
        try:
            with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as probe:
                probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                probe.bind(("::", 0))
            out.append((socket.AF_INET6, "::"))
        except OSError:
            pass
    return out


def serve_http(port: int, family: int, host: str) -> None:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def do_GET(self):
            emit({"hit": "http", "port": port, "peer": self.client_address[0], "head": self.requestline,
                  "host": self.headers.get("Host")})
            parts = urlsplit(self.path)
            if parts.path == "/redirect":
                target = parse_qs(parts.query).get("to", ["/"])[0]
                self.send_response(302)
                self.send_header("Location", target)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            body = f"audit-allowed {self.path}".encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    class Server(http.server.ThreadingHTTPServer):
        address_family = family
        daemon_threads = True

        def server_bind(self):
            if family == socket.AF_INET6:
                self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            super().server_bind()

    server = Server((host, port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()


def serve_tcp(port: int, family: int, host: str) -> None:
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if family == socket.AF_INET6:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    sock.bind((host, port))
    sock.listen(64)

    def loop() -> None:
        while True:
            conn, peer = sock.accept()
            conn.settimeout(0.5)
            try:
                head = conn.recv(64)
            except OSError:
                head = b""
            emit({"hit": "tcp", "port": port, "peer": peer[0], "head": head.decode("latin-1")})
            conn.close()

    threading.Thread(target=loop, daemon=True).start()


def serve_udp(port: int, family: int, host: str) -> None:
    sock = socket.socket(family, socket.SOCK_DGRAM)
    if family == socket.AF_INET6:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    sock.bind((host, port))

    def loop() -> None:
        while True:
            data, peer = sock.recvfrom(4096)
            emit({"hit": "udp", "port": port, "peer": peer[0], "head": data[:64].decode("latin-1")})

    threading.Thread(target=loop, daemon=True).start()


def flush(config: dict) -> None:
    token = str(config["token"]).encode("ascii")
    sent = []
    for family, _host in _families():
        loopback = "::1" if family == socket.AF_INET6 else "127.0.0.1"
        for proto, kind in (("tcp", socket.SOCK_STREAM), ("udp", socket.SOCK_DGRAM)):
            for port in config.get(proto, []):
                try:
                    with socket.socket(family, kind) as sock:
                        sock.settimeout(2.0)
                        if kind == socket.SOCK_STREAM:
                            sock.connect((loopback, port))
                            sock.sendall(token)
                        else:
                            sock.sendto(token, (loopback, port))
                except OSError:
                    continue
                sent.append({"hit": proto, "port": port, "peer": loopback})
    emit({"sent": sent})


def main(argv: list[str]) -> int:
    config = json.loads(argv[0])
    if config.get("role") == "flush":
        flush(config)
        return 0
    for family, host in _families():
        for port in config.get("http", []):
            if config.get("role") == "allowed":
                serve_http(port, family, host)
            else:
                serve_tcp(port, family, host)
        for port in config.get("tcp", []):
            serve_tcp(port, family, host)
        for port in config.get("udp", []):
            serve_udp(port, family, host)
    emit({"ready": True})
    threading.Event().wait()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
