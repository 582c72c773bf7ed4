"""Who may use the console: the one-time login, the session cookie, CSRF, Origin and Host checks, and
the headers on every response -- against a real ConsoleServer on 127.0.0.1."""

from __future__ import annotations

import socket

import httpx
import pytest

from tests.console.conftest import Session

SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data: blob:; connect-src 'self'; "
                               "frame-ancestors 'none'; base-uri 'none'; form-action 'self'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


def _error(resp: httpx.Response) -> str:
    body = resp.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message"}, body
    return body["error"]["code"]


def _secured(resp: httpx.Response) -> None:
    for name, value in SECURITY_HEADERS.items():
        assert resp.headers.get(name) == value, (resp.request.url, name, resp.headers)


def test_binds_loopback_only_and_prints_a_one_time_url(console):
    assert console.url.startswith(f"http://127.0.0.1:{console.port}{console.auth.base}/login?t=")
    assert len(console.auth.base) >= len("/s/") + 22  # 128 secret bits in the path
    token = console.url.split("t=", 1)[1]
    assert len(token) >= 43
    addresses = [s.getsockname() for srv in console._server.servers for s in srv.sockets]
    assert addresses and all(a[0] == "127.0.0.1" for a in addresses), addresses
    # nothing answers on this machine's other address (when it has one) at that port
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
            udp.connect(("10.255.255.255", 1))  # no packet is sent: this only picks the outgoing address
            local = udp.getsockname()[0]
    except OSError:
        local = None
    if local and not local.startswith("127."):
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"http://{local}:{console.port}/", timeout=2)


def test_no_cookie_is_401_json_or_a_plain_page(console):
    resp = httpx.get(console.base + "/")
    assert resp.status_code == 401 and _error(resp) == "unauthenticated"
    _secured(resp)
    page = httpx.get(console.base + "/runs/x", headers={"Accept": "text/html"})
    assert page.status_code == 401 and page.headers["content-type"].startswith("text/html")
    assert "unauthenticated" in page.text and "<script" not in page.text
    forged = httpx.get(console.base + "/", cookies={console.auth.cookie_name: "not-a-session"})
    assert forged.status_code == 401


def test_login_sets_a_strict_httponly_cookie_and_the_token_is_spent(console):
    with httpx.Client(base_url=console.base) as client:
        resp = client.get(console.url)
        assert resp.status_code == 303 and resp.headers["location"] == console.auth.base + "/"
        _secured(resp)
        cookie = resp.headers["set-cookie"]
        parts = [p.strip() for p in cookie.split(";")]
        assert parts[0].startswith(console.auth.cookie_name + "=") and len(parts[0].split("=", 1)[1]) >= 43
        assert "HttpOnly" in parts and "SameSite=Strict" in parts and f"Path={console.auth.base}" in parts, cookie
        assert client.get("/").status_code == 200
    again = httpx.get(console.url)
    assert again.status_code == 403 and _error(again) == "token_spent"
    wrong = httpx.get(console.url[:-3] + "xyz")
    assert wrong.status_code == 403 and _error(wrong) == "invalid_token"
    assert httpx.get(console.base + "/login").status_code == 403


def test_a_wrong_token_does_not_spend_the_right_one(console):
    assert httpx.get(console.base + "/login?t=guess").status_code == 403
    Session(console).close()  # still logs in


def test_post_needs_the_csrf_token_the_own_origin_and_the_own_host(session, live):
    request = live.registry.open("action", "ok?")
    path = f"/runs/{live.run_id}/approvals/{request.id}"
    no_csrf = session.post(path, {"answer": "approve"}, drop=("X-CSRF-Token",))
    assert no_csrf.status_code == 403 and _error(no_csrf) == "bad_csrf"
    wrong_csrf = session.post(path, {"answer": "approve"}, headers={"X-CSRF-Token": session.csrf[:-1] + ("B" if session.csrf.endswith("A") else "A")})
    assert wrong_csrf.status_code == 403 and _error(wrong_csrf) == "bad_csrf"
    foreign = session.post(path, {"answer": "approve"}, headers={"Origin": "http://evil.example"})
    assert foreign.status_code == 403 and _error(foreign) == "bad_origin"
    other_port = session.post(path, {"answer": "approve"}, headers={"Origin": f"http://127.0.0.1:{session.server.port + 1}"})
    assert other_port.status_code == 403 and _error(other_port) == "bad_origin"
    no_origin = session.post(path, {"answer": "approve"}, drop=("Origin",))
    assert no_origin.status_code == 403 and _error(no_origin) == "bad_origin"
    null_origin = session.post(path, {"answer": "approve"}, headers={"Origin": "null"})
    assert null_origin.status_code == 403
    rebound = session.post(path, {"answer": "approve"}, headers={"Host": f"evil.example:{session.server.port}"})
    assert rebound.status_code == 403 and _error(rebound) == "bad_host"
    _secured(rebound)
    assert request.pending, "a refused POST must not answer"
    ok = session.post(path, {"answer": "approve"})
    assert ok.status_code == 202 and request.state == "approved"


def test_every_request_checks_host(session, console):
    for host in (f"evil.example:{console.port}", "127.0.0.1", f"127.0.0.1:{console.port + 1}", f"127.0.0.2:{console.port}"):
        resp = session.get("/", headers={"Host": host})
        assert resp.status_code == 403 and _error(resp) == "bad_host", host
        assert httpx.get(console.url, headers={"Host": host}).status_code == 403
    assert session.get("/", headers={"Host": f"localhost:{console.port}"}).status_code == 200
    # the cookie works only with the host it was set for, but the Host check itself admits localhost
    post = session.post("/runs/none/takeover", headers={"Host": f"localhost:{console.port}",
                                                        "Origin": f"http://localhost:{console.port}"})
    assert post.status_code == 404 and _error(post) == "unknown_run"


def test_security_headers_on_every_kind_of_response(session, live):
    for resp in (session.get("/"), session.get("/static/console.js"), session.get("/nowhere"),
                 session.get(f"/runs/{live.run_id}/approvals"), session.post("/runs/x/takeover", drop=("Origin",)),
                 httpx.get(session.server.base + "/runs/x")):
        _secured(resp)
    assert session.get("/nowhere").status_code == 404 and _error(session.get("/nowhere")) == "not_found"


def test_nothing_is_served_outside_the_secret_base_path(session, console):
    """Cookies are not kept apart by port: any program on another 127.0.0.1 port could have the browser
    send it the console's cookie, were it scoped to ``/``. Scoped to the secret base, it never is."""
    cookie = {console.auth.cookie_name: session.client.cookies.get(console.auth.cookie_name)}
    assert cookie[console.auth.cookie_name]
    for path in ("/", "/runs/x", "/login?t=" + console.auth.login_token, "/static/console.js",
                 console.auth.base[:-1] + "/", console.auth.base + "x/", "/s/" + "A" * 22 + "/"):
        resp = httpx.get(console.origin + path, cookies=cookie)
        assert resp.status_code == 404 and _error(resp) == "not_found", path
        _secured(resp)
    assert httpx.get(console.base + "/", cookies=cookie).status_code == 200


def test_a_cookie_tossed_by_another_port_does_not_log_the_person_out(session, console):
    """Another program's page may set ``ds_console_<port>=junk; Path=/``: the browser then sends both
    cookies; the console takes the one that opens a session."""
    real = session.client.cookies.get(console.auth.cookie_name)
    for header in (f"{console.auth.cookie_name}={real}; {console.auth.cookie_name}=junk",
                   f"{console.auth.cookie_name}=junk; {console.auth.cookie_name}={real}"):
        assert httpx.get(console.base + "/", headers={"Cookie": header}).status_code == 200
    assert httpx.get(console.base + "/", headers={"Cookie": f"{console.auth.cookie_name}=junk"}).status_code == 401
