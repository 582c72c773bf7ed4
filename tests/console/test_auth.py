"""Who may use the console: the one-time login, the session cookie, CSRF, Origin and Host checks,
what another site's page may ask (Origin, Sec-Fetch-*), and the headers on every response -- against a
real ConsoleServer on 127.0.0.1."""

from __future__ import annotations

import socket

import httpx
import pytest

from controller.console.app import create_app
from tests.console.conftest import LIVE_ID, Session, image_bytes

SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data: blob:; connect-src 'self'; "
                               "frame-ancestors 'none'; base-uri 'none'; form-action 'self'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
    "Cross-Origin-Resource-Policy": "same-origin",
    "Cross-Origin-Opener-Policy": "same-origin",
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


def test_the_login_url_of_a_run_opens_the_run_s_page(console, live):
    url = console.url_for_run(LIVE_ID)
    assert url == f"{console.url}&next=/runs/{LIVE_ID}"
    page = f"{console.auth.base}/runs/{LIVE_ID}"
    with httpx.Client(base_url=console.base) as client:
        resp = client.get(url)
        assert resp.status_code == 303 and resp.headers["location"] == page and "set-cookie" in resp.headers
        assert client.get(page[len(console.auth.base):]).status_code == 200
        again = client.get(url)  # this browser is logged in: the link still leads to the run
        assert again.status_code == 303 and again.headers["location"] == page and "set-cookie" not in again.headers


OFF_THE_CONSOLE = [
    "//evil.example/", "https://x", "http://evil.example/runs/x", "javascript:alert(1)", "/\\evil.example",
    "\\\\evil.example/runs/x", "/s/other/..", "/s/other/runs/x", "/runs/..", "/runs/.", "/runs/x/../../..",
    "/runs/x/shots/y", "/runs/x?y", "/runs/x#y", " /runs/x", "/runs/x\r\nSet-Cookie: a=b", "/runs/x\x00",
    "/runs/x\u202e", "/runs/%2e%2e", "/runs/" + "a" * 201, "runs/x", "",
]
"""``next`` values a hostile login link may carry (sent percent-encoded): none may lead anywhere but
the runs list."""


@pytest.mark.parametrize("next_page", OFF_THE_CONSOLE)
def test_a_login_link_never_leads_off_the_console_or_out_of_its_base(console, next_page):
    resp = httpx.get(console.base + "/login", params={"t": console.auth.login_token, "next": next_page})
    assert resp.status_code == 303 and resp.headers["location"] == console.auth.base + "/", resp.headers


@pytest.mark.parametrize("raw", ["%2F%2Fevil.example%2F", "/runs/%2e%2e", "/runs/x%0d%0aLocation:%20//evil.example",
                                 "/runs/x%00", "%5C%5Cevil.example"])
def test_a_login_link_s_next_is_read_after_percent_decoding_and_still_stays_home(console, raw):
    resp = httpx.get(f"{console.url}&next={raw}")
    assert resp.status_code == 303 and resp.headers["location"] == console.auth.base + "/", resp.headers


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


RUN = f"/runs/{LIVE_ID}"
DATA = (f"{RUN}/state", f"{RUN}/events", f"{RUN}/approvals", f"{RUN}/screen.jpg", f"{RUN}/screen.mjpeg?fps=1",
        f"{RUN}/shots/shot-0001.png", "/static/console.js", "/static/console.css")
"""Every GET that answers data, a stream, an image, a script or a style (never served to another site)."""
PAGES = ("/", RUN)
"""The pages a person may be sent to from another site (a top-level navigation)."""
NAVIGATION = {"Sec-Fetch-Mode": "navigate", "Sec-Fetch-Dest": "document"}


def _get(session: Session, path: str, headers: dict[str, str]) -> tuple[int, str | None, httpx.Headers]:
    """GET ``path`` as the logged-in browser with ``headers``: (status, error code or None, headers).
    A stream is closed once its head arrived."""
    with session.client.stream("GET", path, headers=headers, timeout=httpx.Timeout(10.0)) as resp:
        code = None
        if resp.headers.get("content-type") == "application/json" and resp.status_code >= 400:
            resp.read()
            code = _error(resp)
        return resp.status_code, code, resp.headers


@pytest.fixture
def recorded_shot(live) -> None:
    """The live run's record holds ``shot-0001.png``."""
    (live.record_dir / "shot-0001.png").write_bytes(image_bytes("PNG"))


@pytest.mark.parametrize("site", ["same-site", "cross-site", "Cross-Site", "sideways"])
def test_another_site_gets_no_data_stream_or_image(session, live, recorded_shot, site):
    """Sec-Fetch-Site other than same-origin / none: 403 ``cross_site`` JSON at once (no stream opened),
    whatever the request's mode; a page only to a top-level navigation."""
    for path in DATA:
        for extra in ({}, {"Sec-Fetch-Mode": "no-cors", "Sec-Fetch-Dest": "image"}, NAVIGATION):
            status, code, headers = _get(session, path, {"Sec-Fetch-Site": site, **extra})
            assert (status, code) == (403, "cross_site"), (path, extra)
            assert headers["content-type"] == "application/json" and headers["content-length"], path
            _secured_headers(headers)
    for path in PAGES:
        for extra in ({}, {"Sec-Fetch-Mode": "navigate", "Sec-Fetch-Dest": "iframe"},
                      {"Sec-Fetch-Mode": "cors", "Sec-Fetch-Dest": "empty"},
                      {"Sec-Fetch-Mode": "no-cors", "Sec-Fetch-Dest": "document"}):
            assert _get(session, path, {"Sec-Fetch-Site": site, **extra})[:2] == (403, "cross_site"), (path, extra)
        status, code, headers = _get(session, path, {"Sec-Fetch-Site": site, **NAVIGATION})
        assert (status, code) == (200, None), path
        assert headers["content-type"].startswith("text/html")
        _secured_headers(headers)


@pytest.mark.parametrize("headers", [{}, {"Sec-Fetch-Site": "same-origin"}, {"Sec-Fetch-Site": "none", **NAVIGATION},
                                     {"Sec-Fetch-Site": "same-origin", "Origin": "ORIGIN"}])
def test_the_console_s_own_requests_and_requests_without_those_headers_are_served(session, live, recorded_shot,
                                                                                 headers):
    """The console's own pages (same-origin, their own Origin), a URL the person opened (none), curl (no
    header at all): served, the Cross-Origin-Resource-Policy header on each answer."""
    headers = {k: v.replace("ORIGIN", session.server.origin) for k, v in headers.items()}
    for path in DATA + PAGES:
        status, code, answer = _get(session, path, headers)
        # not started (no agent attached): the live screen answers 409 not_started, the rest 200
        assert status in (200, 409) and code in (None, "not_started"), (path, status, code)
        _secured_headers(answer)


@pytest.mark.parametrize("origin", ["http://evil.example", "http://127.0.0.1:1", "null", "http://localhost:PORT",
                                    "https://127.0.0.1:PORT", "http://127.0.0.1:PORT/"])
def test_a_foreign_origin_is_refused_on_every_get(session, live, recorded_shot, origin):
    """An Origin that is not the console's as the request addresses it (another port, another name for
    the same port, ``null``): 403 ``bad_origin``, even with Sec-Fetch-Site same-origin, pages included."""
    origin = origin.replace("PORT", str(session.server.port))
    for path in DATA + PAGES:
        for extra in ({}, {"Sec-Fetch-Site": "same-origin"}, {"Sec-Fetch-Site": "cross-site", **NAVIGATION}):
            status, code, headers = _get(session, path, {"Origin": origin, **extra})
            assert (status, code) == (403, "bad_origin"), (path, origin, extra)
            _secured_headers(headers)
    # the same Origin check as for a POST: localhost's own origin is the console's when addressed so
    host = f"localhost:{session.server.port}"
    assert _get(session, "/", {"Host": host, "Origin": f"http://{host}"})[:2] == (200, None)


def test_login_from_another_site(console):
    """A cross-site GET of the login URL that is not a navigation (an image, a fetch) is refused and
    does not spend the token; a link the person follows (a top-level navigation) logs in."""
    for headers in ({"Sec-Fetch-Site": "same-site", "Sec-Fetch-Mode": "no-cors", "Sec-Fetch-Dest": "image"},
                    {"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "cors", "Origin": "http://127.0.0.1:1"}):
        resp = httpx.get(console.url, headers=headers)
        assert resp.status_code == 403 and _error(resp) in ("cross_site", "bad_origin"), headers
        assert "set-cookie" not in resp.headers
    with httpx.Client(base_url=console.base) as client:
        resp = client.get(console.url, headers={"Sec-Fetch-Site": "cross-site", **NAVIGATION})
        assert resp.status_code == 303 and "set-cookie" in resp.headers
        assert client.get("/", headers={"Sec-Fetch-Site": "cross-site", **NAVIGATION}).status_code == 200


def test_every_route_answers_with_the_resource_policy(session, live, recorded_shot):
    """Every route of the app (read from the app itself), its refusals and errors: CORP same-origin."""
    routes = [r for r in create_app(session.server.state).routes if getattr(r, "methods", None)]
    assert len(routes) >= 12, routes
    for route in routes:
        path = route.path.format(run_id=LIVE_ID, request_id="req_nope", name="shot-0001.png")
        for method in route.methods - {"HEAD"}:
            if method == "GET":
                answers = [_get(session, path, {})[2], _get(session, path, {"Sec-Fetch-Site": "cross-site"})[2],
                           _get(session, path, {"Origin": "null"})[2]]
            else:
                answers = [session.post(path, {"answer": "deny"}).headers,
                           session.post(path, {}, headers={"Sec-Fetch-Site": "cross-site"}).headers,
                           session.post(path, {}, drop=("X-CSRF-Token",)).headers]
            for headers in answers:
                _secured_headers(headers)
    for resp in (httpx.get(session.server.origin + "/"), httpx.get(session.server.base + RUN + "/events"),
                 session.get("/static/nothing.js"), session.get("/nowhere", headers={"Sec-Fetch-Site": "same-site"})):
        _secured(resp)


def test_refusals_are_logged_without_the_secret(session, live, caplog):
    """Each refusal is one INFO line on ``controller.console``: method, path inside the base, status, code."""
    import logging

    caplog.set_level(logging.INFO, logger="controller.console")
    session.get(f"{RUN}/screen.jpg", headers={"Sec-Fetch-Site": "same-site"})
    session.get(f"{RUN}/a%20b%0A", headers={"Origin": "null"})  # a space and a line break
    httpx.get(session.server.origin + "/elsewhere")
    lines = [r.getMessage() for r in caplog.records if r.name == "controller.console"]
    assert lines == [f"refused GET {RUN}/screen.jpg: 403 cross_site", f"refused GET {RUN}/a%20b%0A: 403 bad_origin",
                     "refused GET -: 404 not_found"], lines
    assert not any(session.server.auth.base in line or session.server.auth.login_token in line for line in lines)


def _secured_headers(headers: httpx.Headers) -> None:
    for name, value in SECURITY_HEADERS.items():
        assert headers.get(name) == value, (name, headers)
