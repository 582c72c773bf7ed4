"""Recorded web origins in the real gateway process (mitmproxy with the policy addon, the control API's
``/v1/web``), origin servers of ours on loopback addresses, names from a hosts map (no DNS).

Mode record keeps the public plain-HTTP responses the policy let through (content-addressed, capped) and
counts the rest by reason; mode serve answers from the recording, denies what it lacks
(``not_recorded``, ``tunnel_not_recorded``) and opens no upstream connection at all (the origin
servers count every connection they accept); the control API refuses hostile recordings."""

from __future__ import annotations

import gzip
import hashlib
import http.client
import http.server
import json
import secrets
import socket
import threading
from pathlib import Path

import pytest

from tests.gateway.conftest import Gateway, free_port, self_signed_context, start_gateway, start_server
from tests.gateway.test_origin_requests import connect

httpx = pytest.importorskip("httpx")

pytestmark = pytest.mark.slow

ADDRESS = "127.0.0.2"
BIG = 200 * 1024
"""Bytes of the large bodies (over the per-body cap the tests set)."""
CAP = 64 * 1024


class Origin:
    """A plain-HTTP origin ``web.test`` on :data:`ADDRESS` whose pages say their ``version`` (a test may
    change it), and which counts every connection it accepts (``hits``)."""

    def __init__(self) -> None:
        self.version = "v1"
        self.hits = 0
        self.bodies: list[bytes] = []
        self.release = threading.Event()  # /stall/<n> sends its body but the last byte, then waits for this
        self.stall_bytes = CAP  # the length of a /stall/<n> body
        origin = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet
                pass

            def _send(self, status: int, body: bytes, headers: dict[str, str] | None = None,
                      chunked: bool = False) -> None:
                self.send_response(status)
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.send_header("X-Not-Kept", "server detail")
                if chunked:
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    for start in range(0, len(body), 16384):
                        part = body[start:start + 16384]
                        self.wfile.write(f"{len(part):x}\r\n".encode() + part + b"\r\n")
                    self.wfile.write(b"0\r\n\r\n")
                    return
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            def do_HEAD(self):
                self.do_GET()

            def do_GET(self):
                page = f"<html><body>page {origin.version}</body></html>".encode()
                if self.path == "/page":
                    self._send(200, page, {"Content-Type": "text/html; charset=utf-8"})
                elif self.path == "/cookie":
                    self._send(200, page, {"Content-Type": "text/html", "Set-Cookie": "session=secret"})
                elif self.path == "/huge":
                    self._send(200, b"x" * BIG, {"Content-Type": "application/octet-stream"})
                elif self.path == "/huge-chunked":
                    self._send(200, b"y" * BIG, {"Content-Type": "application/octet-stream"}, chunked=True)
                elif self.path == "/gzip":
                    self._send(200, gzip.compress(page), {"Content-Type": "text/html", "Content-Encoding": "gzip"})
                elif self.path == "/status-600":
                    self._send(600, page, {"Content-Type": "text/html"})
                elif self.path.startswith("/stall/"):
                    body = (self.path.encode() * (origin.stall_bytes // len(self.path) + 1))[:origin.stall_bytes]
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body[:-1])
                    self.wfile.flush()
                    origin.release.wait(60)
                    self.wfile.write(body[-1:])
                else:
                    self._send(404, b"no such page", {"Content-Type": "text/plain"})

            def do_POST(self):
                origin.bodies.append(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
                self._send(200, b"signed in", {"Content-Type": "text/plain"})

        class Server(http.server.ThreadingHTTPServer):
            daemon_threads = True

            def get_request(self):
                pair = super().get_request()
                origin.hits += 1
                return pair

        self.server = Server((ADDRESS, 0), Handler)
        self.port = self.server.server_address[1]
        self.url = f"http://web.test:{self.port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class WebGateway:
    """The gateway (allowlist: ``web.test`` over HTTP and ``tls.test`` over HTTPS) with its control API."""

    def __init__(self, tmp: Path) -> None:
        self.origin = Origin()
        context, _cert = self_signed_context(tmp, "tls.test")
        self.tls = start_server("tls", ADDRESS, context)
        self.hosts = tmp / "hosts.json"
        self.set_hosts({"web.test": [ADDRESS], "tls.test": [ADDRESS], "other.test": [ADDRESS]})
        self.token = secrets.token_urlsafe(24)
        (tmp / "token").write_text(self.token)
        self.control = f"http://127.0.0.1:{free_port()}"
        policy = {"mode": "allowlist", "allow": [self.origin.url, f"https://tls.test:{self.tls.port}"],
                  "allow_addresses": [ADDRESS]}
        self.gateway: Gateway = start_gateway(tmp, policy, [
            "--control-listen", self.control.removeprefix("http://"), "--control-token-file", str(tmp / "token"),
            "--hosts", str(self.hosts)])

    @property
    def proxy(self) -> tuple[str, int]:
        return self.gateway.host, self.gateway.port

    def set_hosts(self, mapping: dict[str, list[str]]) -> None:
        partial = self.hosts.with_suffix(".partial")
        partial.write_text(json.dumps(mapping))
        partial.replace(self.hosts)

    def api(self, method: str, path: str, **kwargs) -> httpx.Response:
        return httpx.request(method, self.control + path, headers={"Authorization": f"Bearer {self.token}"},
                             timeout=10, **kwargs)

    def configure(self, **config) -> dict:
        response = self.api("PUT", "/v1/web", json=config)
        assert response.status_code == 200, response.text
        return response.json()

    def fetch(self, method: str, path: str, *, headers: dict[str, str] | None = None, body: bytes = b"",
              url: str | None = None) -> tuple[int, dict[str, str], bytes]:
        """One absolute-form request through the proxy: (status, headers, body)."""
        target = (url or self.origin.url) + path
        host = target.split("//", 1)[1].split("/", 1)[0]
        sock = socket.create_connection((self.gateway.host, self.gateway.port), timeout=30)
        try:
            lines = [f"{method} {target} HTTP/1.1", f"Host: {host}", "Connection: close",
                     *(f"{k}: {v}" for k, v in (headers or {}).items())]
            if body:
                lines.append(f"Content-Length: {len(body)}")
            sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
            response = http.client.HTTPResponse(sock, method=method)
            response.begin()
            return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
        finally:
            sock.close()

    def close(self) -> None:
        self.gateway.process.terminate()
        try:
            self.gateway.process.wait(timeout=10)
        except Exception:  # noqa: BLE001
            self.gateway.process.kill()
        self.origin.close()
        self.tls.server.shutdown()
        self.tls.server.server_close()


@pytest.fixture(scope="module")
def web(tmp_path_factory):
    gateway = WebGateway(tmp_path_factory.mktemp("web"))
    yield gateway
    gateway.close()


@pytest.fixture(autouse=True)
def _fresh(web):
    web.origin.version = "v1"
    web.origin.release.clear()
    web.origin.stall_bytes = CAP
    web.set_hosts({"web.test": [ADDRESS], "tls.test": [ADDRESS], "other.test": [ADDRESS]})
    web.configure(mode="off")


def record_page(web: WebGateway) -> dict:
    """Mode record, ``/page`` fetched once: the gateway's answer."""
    web.configure(mode="record", max_body_bytes=CAP)
    status, _headers, body = web.fetch("GET", "/page")
    assert (status, body) == (200, b"<html><body>page v1</body></html>")
    return web.api("GET", "/v1/web").json()


def test_record_keeps_public_plain_http_responses_and_counts_the_rest(web):
    web.configure(mode="record", max_body_bytes=CAP)
    assert web.fetch("GET", "/page")[0] == 200
    assert web.fetch("HEAD", "/page")[0] == 200
    assert web.fetch("GET", "/nothing")[0] == 404
    assert web.fetch("GET", "/gzip")[1]["content-encoding"] == "gzip"
    assert web.fetch("GET", "/page", headers={"Cookie": "session=1"})[0] == 200
    assert web.fetch("GET", "/page", headers={"Authorization": "Bearer abc"})[0] == 200
    assert web.fetch("POST", "/form", body=b"user=ann&password=hunter2")[2] == b"signed in"
    assert web.fetch("GET", "/cookie")[0] == 200
    # a body over the cap reaches the guest whole and is not kept, declared or chunked
    assert web.fetch("GET", "/huge")[2] == b"x" * BIG
    assert web.fetch("GET", "/huge-chunked")[2] == b"y" * BIG
    status, _body, sock = connect(web, f"tls.test:{web.tls.port}")
    sock.close()
    assert status == 200
    state = web.api("GET", "/v1/web").json()
    kept = [(r["method"], r["url"].removeprefix(web.origin.url), r["status"]) for r in state["responses"]]
    assert kept == [("GET", "/page", 200), ("HEAD", "/page", 200), ("GET", "/nothing", 404), ("GET", "/gzip", 200)]
    assert state["skipped"] == {"credentials": 2, "request_body": 1, "sets_cookie": 1, "too_large": 2, "tunnel": 1}
    page, head, _missing, zipped = state["responses"]
    assert page["origin"] == web.origin.url and page["address"] == ADDRESS
    assert page["headers"] == [["content-type", "text/html; charset=utf-8"]]  # X-Not-Kept, Date... left out
    assert head["bytes"] == 0
    assert ["content-encoding", "gzip"] in zipped["headers"]
    for response in state["responses"]:
        body = web.api("GET", f"/v1/web/bodies/{response['sha256']}").content
        assert hashlib.sha256(body).hexdigest() == response["sha256"] and len(body) == response["bytes"]
        assert b"hunter2" not in body
    assert gzip.decompress(web.api("GET", f"/v1/web/bodies/{zipped['sha256']}").content).endswith(b"page v1</body></html>")
    assert state["bodies"] == 4 and state["bytes"] == sum(r["bytes"] for r in (page, _missing, zipped))


def test_the_total_cap_keeps_what_fits_and_counts_the_rest(web):
    web.configure(mode="record", max_body_bytes=CAP, max_total_bytes=40)
    assert web.fetch("GET", "/page")[0] == 200  # 33 bytes: fits
    assert web.fetch("GET", "/page")[0] == 200  # the same body: held once, no more bytes
    assert web.fetch("GET", "/nothing")[0] == 404  # 12 more bytes: over 40
    state = web.api("GET", "/v1/web").json()
    assert [r["url"].removeprefix(web.origin.url) for r in state["responses"]] == ["/page", "/page"]
    assert state["skipped"] == {"total_cap": 1} and state["bytes"] == 33


def test_a_status_outside_200_to_599_is_skipped_as_a_status(web):
    web.configure(mode="record", max_body_bytes=CAP)
    assert web.fetch("GET", "/status-600")[0] == 600
    state = web.api("GET", "/v1/web").json()
    assert state["responses"] == [] and state["skipped"] == {"status": 1}


def test_the_index_a_recording_answers_with_fits_what_the_controller_reads(tmp_path):
    """The longest URLs and headers a guest's requests and an origin's answers can have, as many as the
    recording takes: its index stays within what the controller reads back (``GET /v1/web``) and what a
    replay loads (``index.jsonl``); past that, responses are counted ``count_cap``, the earlier ones kept.
    The store itself, without a proxy: the size of what it holds is what is checked."""
    from controller.gateway.web import (
        MAX_HEADER_CHARS, MAX_INDEX_BYTES, MAX_RESPONSES, MAX_URL_CHARS, RECORDED_HEADERS, WebConfig, WebResponse,
        WebStore,
    )
    from controller.run.web import INDEX, load_recording, write_recording

    store = WebStore()
    store.configure(WebConfig(mode="record"))
    headers = [(name, "v" * MAX_HEADER_CHARS) for name in RECORDED_HEADERS]
    for n in range(MAX_RESPONSES):
        url = f"http://web.test/{n:05d}/"
        store.store({"method": "GET", "url": url + "x" * (MAX_URL_CHARS - len(url)), "origin": "http://web.test",
                     "address": ADDRESS, "status": 200, "headers": headers}, b"")
    answer = store.answer()
    assert answer["skipped"].get("count_cap", 0) > 0 and answer["responses"]
    assert len(json.dumps(answer).encode()) <= MAX_INDEX_BYTES
    folder = write_recording(tmp_path / "web", [WebResponse(**r) for r in answer["responses"]],
                             {hashlib.sha256(b"").hexdigest(): b""})
    assert (folder / INDEX).stat().st_size <= MAX_INDEX_BYTES
    assert len(load_recording(folder).responses) == len(answer["responses"])


def stalled(web: WebGateway, path: str) -> socket.socket:
    """A GET of ``path`` (``/stall/<n>``) through the proxy whose answer has reached us but for its last
    byte, which the origin sends once ``web.origin.release`` is set: the socket."""
    sock = socket.create_connection(web.proxy, timeout=30)
    host = web.origin.url.removeprefix("http://")
    sock.sendall(f"GET {web.origin.url}{path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, data
        data += chunk
    got = len(data.split(b"\r\n\r\n", 1)[1])
    while got < web.origin.stall_bytes - 1:
        chunk = sock.recv(1 << 20)
        assert chunk
        got += len(chunk)
    return sock


def drained(sock: socket.socket) -> None:
    """Read ``sock`` to its end, then close it."""
    with sock:
        while sock.recv(1 << 20):
            pass


def rss_mib(pid: int) -> float:
    """The resident memory of process ``pid`` (MiB)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def test_responses_captured_at_once_hold_no_more_memory_than_the_total_cap(web):
    """Many responses streaming at once (a guest opens them, an origin it controls trickles them) are
    captured within the total cap, not each up to the per-body cap: the gateway's memory stays bounded."""
    size, count = 4 * 1024 * 1024, 12
    web.origin.stall_bytes = size
    web.configure(mode="record", max_body_bytes=size, max_total_bytes=size)
    pid = web.gateway.process.pid
    before = rss_mib(pid)
    socks = [stalled(web, f"/stall/{n}") for n in range(count)]  # every one in flight at once
    grown = rss_mib(pid) - before
    web.origin.release.set()
    for sock in socks:
        drained(sock)
    state = web.api("GET", "/v1/web").json()
    assert len(state["responses"]) == 1 and state["skipped"] == {"total_cap": count - 1}
    assert grown < 2 * size / 2**20 + 8, f"the gateway grew {grown:.0f} MiB while {count} responses of " \
                                         f"{size // 2**20} MiB streamed at once (total cap {size // 2**20} MiB)"


def test_a_response_still_streaming_when_a_new_recording_starts_is_kept_in_neither(web):
    web.configure(mode="record", max_body_bytes=CAP)
    sock = stalled(web, "/stall/old")
    web.configure(mode="record", max_body_bytes=CAP)  # the next run's recording
    web.origin.release.set()
    drained(sock)
    assert web.fetch("GET", "/page")[0] == 200
    state = web.api("GET", "/v1/web").json()
    assert [r["url"].removeprefix(web.origin.url) for r in state["responses"]] == ["/page"]
    assert state["skipped"] == {}


def closed_by_peer(sock: socket.socket) -> bool:
    """Whether the peer closed ``sock`` (within 10 s)."""
    sock.settimeout(10)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False


def test_entering_serve_closes_the_connections_opened_before(web):
    """A tunnel or a kept-alive connection opened before the recording is served (a sandbox used before
    the run) would reach upstream past mode serve: entering it closes them."""
    status, _body, tunnel = connect(web, f"tls.test:{web.tls.port}")
    assert status == 200
    plain = socket.create_connection(web.proxy, timeout=30)
    host = web.origin.url.removeprefix("http://")
    plain.sendall(f"GET {web.origin.url}/page HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
    response = http.client.HTTPResponse(plain, method="GET")
    response.begin()
    assert response.read() == b"<html><body>page v1</body></html>" and not response.will_close
    lines = len(web.gateway.decisions())
    web.configure(mode="serve", responses=[])
    assert closed_by_peer(tunnel), "the tunnel opened before mode serve is still open"
    assert closed_by_peer(plain), "the connection opened before mode serve is still open"
    tunnel.close()
    plain.close()
    new = sorted((d["origin"], d["reason"], d["via"]) for d in web.gateway.decisions()[lines:])
    assert new == sorted([(f"https://tls.test:{web.tls.port}", "offline_web", "policy"),
                          (web.origin.url, "offline_web", "policy")])


def serve(web: WebGateway, recorded: dict) -> None:
    """Mode serve with ``recorded``'s responses and bodies (fetched from the gateway before)."""
    bodies = {r["sha256"]: web.api("GET", f"/v1/web/bodies/{r['sha256']}").content for r in recorded["responses"]}
    web.configure(mode="serve", responses=recorded["responses"])
    for sha, body in bodies.items():
        assert web.api("PUT", f"/v1/web/bodies/{sha}", content=body).status_code == 204


def test_serve_answers_as_recorded_denies_the_rest_and_never_connects(web):
    recorded = record_page(web)
    web.origin.version = "v2"  # the site changed since
    other = dict(recorded["responses"][0], url="http://other.test/page", origin="http://other.test")
    serve(web, {"responses": [*recorded["responses"], other]})
    web.set_hosts({})  # no name resolves now: the recording's addresses are used
    hits, lines = web.origin.hits, len(web.gateway.decisions())
    status, headers, body = web.fetch("GET", "/page")
    assert (status, body) == (200, b"<html><body>page v1</body></html>")
    assert headers["content-type"] == "text/html; charset=utf-8" and "x-not-kept" not in headers
    assert web.fetch("GET", "/page")[2] == b"<html><body>page v1</body></html>"  # the last one again
    status, _headers, body = web.fetch("GET", "/elsewhere")
    assert status == 403 and body == b"denied by sandbox egress policy: not_recorded\n"
    assert web.fetch("POST", "/page", body=b"a=1")[0] == 403  # never recorded: a request with a body
    # the policy applies first: a recorded origin it does not allow stays denied
    status, _headers, body = web.fetch("GET", "/page", url="http://other.test")
    assert status == 403 and body.endswith(b"not-allowlisted\n")
    assert web.fetch("GET", "/page", url="http://tls.test:1")[0] == 403
    status, body, sock = connect(web, f"tls.test:{web.tls.port}")
    sock.close()
    assert status == 403 and body.endswith(b"tunnel_not_recorded\n")
    tls_hits = len(web.tls.hits)
    assert web.origin.hits == hits, "the gateway opened a connection to the origin while serving"
    assert len(web.tls.hits) == tls_hits
    new = [(d["origin"].removeprefix(web.origin.url), d["decision"], d["reason"])
           for d in web.gateway.decisions()[lines:]]
    assert new == [("", "allow", "allowlisted"), ("", "allow", "allowlisted"), ("", "deny", "not_recorded"),
                   ("", "deny", "not_recorded"), ("http://other.test", "deny", "not-allowlisted"),
                   ("http://tls.test:1", "deny", "not-allowlisted"),
                   (f"https://tls.test:{web.tls.port}", "deny", "tunnel_not_recorded")]
    state = web.api("GET", "/v1/web").json()
    assert (state["mode"], state["served"], state["missing"]) == ("serve", 2, 3)


def test_the_control_api_refuses_hostile_recordings(web):
    recorded = record_page(web)
    [page] = recorded["responses"]
    for bad in ({**page, "sha256": "../../etc/passwd"}, {**page, "url": "http://web.test/\u00e9"},
                {**page, "headers": [["set-cookie", "a=b"]]}, {**page, "status": 206}, {**page, "extra": 1},
                {**page, "origin": "http://elsewhere.test"}, {**page, "address": "not-an-address"}):
        response = web.api("PUT", "/v1/web", json={"mode": "serve", "responses": [bad]})
        assert response.status_code == 400 and response.json()["error"]["code"] == "invalid_web", bad
    body = web.api("GET", f"/v1/web/bodies/{page['sha256']}").content
    assert web.api("PUT", f"/v1/web/bodies/{page['sha256']}", content=body).json()["error"]["code"] == "not_serving"
    web.configure(mode="serve", responses=[page], max_body_bytes=16)
    assert web.api("PUT", f"/v1/web/bodies/{'0' * 64}", content=b"x").json()["error"]["code"] == "not_indexed"
    answer = web.api("PUT", f"/v1/web/bodies/{page['sha256']}", content=body)
    assert answer.status_code == 413  # over this recording's cap of 16 bytes
    web.configure(mode="serve", responses=[page])
    tampered = body.replace(b"v1", b"v9")
    answer = web.api("PUT", f"/v1/web/bodies/{page['sha256']}", content=tampered)
    assert answer.status_code == 400 and answer.json()["error"]["code"] == "hash_mismatch"
    assert web.fetch("GET", "/page")[0] == 403  # its body never came: served as missing
    assert web.api("GET", f"/v1/web/bodies/{'f' * 64}").status_code == 404
    assert web.api("PUT", "/v1/web", content=b'{"mode": "off", "mode": "record"}').status_code == 400
