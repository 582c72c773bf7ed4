"""The sign-in demo site (images/signin-demo/site.py), run as a real server on 127.0.0.1, driven over HTTP."""

from __future__ import annotations

import http.client
import json
import selectors
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from html.parser import HTMLParser
from http.cookiejar import CookieJar
from pathlib import Path

import pytest

SITE = Path(__file__).resolve().parents[2] / "images" / "signin-demo" / "site.py"
EMAIL, PASSWORD, CODE = "person@example.test", "sandbox-demo-pass", "424242"
FORM = {"Content-Type": "application/x-www-form-urlencoded"}


class Site:
    def __init__(self, tmp: Path, **config) -> None:
        self.stderr_path = tmp / "stderr.log"
        config = {"http": [0, 0], "bind": "127.0.0.1", **config}
        with open(self.stderr_path, "wb") as err:
            self.proc = subprocess.Popen([sys.executable, str(SITE), json.dumps(config)],
                                         stdout=subprocess.PIPE, stderr=err)
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            if not sel.select(timeout=10):
                self.stop()
                raise AssertionError("no ready line within 10 s")
        line = self.proc.stdout.readline()
        assert line, f"site.py exited: {self.stderr()}"
        self.ready = json.loads(line)
        self.ports = self.ready["ports"]

    def url(self, path: str, which: int = 0) -> str:
        return f"http://127.0.0.1:{self.ports[which]}{path}"

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def stop(self) -> int:
        self.proc.terminate()
        try:
            return self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(timeout=10)


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    server = Site(tmp_path_factory.mktemp("signin"))
    yield server
    assert server.stop() == 0


def browser():
    return urllib.request.build_opener(urllib.request.HTTPCookieProcessor(CookieJar()))


def fetch(opener, url: str, form: dict | None = None):
    """(status, final path, headers, body text), redirects followed."""
    data = urllib.parse.urlencode(form).encode() if form is not None else None
    try:
        with opener.open(url, data=data, timeout=10) as r:
            return r.status, urllib.parse.urlsplit(r.geturl()).path, r.headers, r.read().decode()
    except urllib.error.HTTPError as e:
        with e:
            return e.code, urllib.parse.urlsplit(e.geturl()).path, e.headers, e.read().decode()


def raw(site: Site, method: str, path: str, body: bytes | None = None, headers: dict | None = None):
    conn = http.client.HTTPConnection("127.0.0.1", site.ports[0], timeout=10)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        r = conn.getresponse()
        return r.status, r.headers, r.read()
    finally:
        conn.close()


def sign_in(site: Site, method: str, secret: str, email: str = EMAIL):
    """Walks the flow; returns the browser, the last response and every page after the e-mail."""
    b = browser()
    status, _, _, body = fetch(b, site.url("/"))
    assert status == 200 and "<title>Sign in – Demo</title>" in body and body.count("<form") == 1
    assert 'id="m-code" name="method" value="email_code"' in body and 'id="m-pass"' in body
    status, path, _, body = fetch(b, site.url("/method"), {"method": method})
    assert (status, path) == (200, "/email") and 'autocomplete="username"' in body
    status, path, _, body = fetch(b, site.url("/email"), {"email": email})
    step = "/code" if method == "email_code" else "/password"
    assert (status, path) == (200, step)
    last = fetch(b, site.url(step), {step[1:]: secret})
    return b, last, [body, last[3]]


def session(site: Site, b) -> dict:
    status, _, headers, body = fetch(b, site.url("/session"))
    assert status == 200 and headers["Content-Type"] == "application/json"
    assert headers["Cache-Control"] == "no-store"
    return json.loads(body)


@pytest.mark.parametrize("method,secret", [("email_code", CODE), ("password", PASSWORD)])
def test_sign_in_succeeds(site, method, secret):
    b, (status, path, headers, body), pages = sign_in(site, method, secret)
    assert (status, path) == (200, "/account")
    assert '<h1>Account</h1><p id="who">Signed in</p>' in body
    assert headers["Content-Type"] == "text/html; charset=utf-8" and headers["Cache-Control"] == "no-store"
    assert all(EMAIL not in p and secret not in p for p in pages)
    assert session(site, b) == {"signed_in": True, "account": "demo-person", "method": method}
    # the other port serves the same app
    assert json.loads(fetch(b, site.url("/session", 1))[3])["signed_in"] is True
    assert fetch(b, site.url("/"))[1] == "/account" and fetch(b, site.url("/signout"))[1] == "/"
    assert session(site, b) == {"signed_in": False} and fetch(b, site.url("/account"))[1] == "/"


@pytest.mark.parametrize("method,secret,email", [
    ("email_code", "919191", EMAIL), ("password", "wrong-pass-7731", EMAIL),
    ("password", PASSWORD, "other@example.test"), ("email_code", CODE, "other@example.test"),
])
def test_wrong_secret_stays_signed_out(site, method, secret, email):
    b, (status, path, _, body), pages = sign_in(site, method, secret, email)
    assert (status, path) == (200, "/code" if method == "email_code" else "/password")
    assert "That did not work. Try again." in body
    assert all(email not in p and secret not in p for p in pages)
    assert session(site, b) == {"signed_in": False}


def test_cookies_and_guards(site):
    assert raw(site, "GET", "/session")[2] == b'{"signed_in": false}'
    status, headers, _ = raw(site, "POST", "/method", b"method=password", FORM)
    assert status == 303 and headers["Location"] == "/email"
    cookie = headers["Set-Cookie"]
    assert cookie.startswith("pre=") and {"HttpOnly", "SameSite=Lax", "Path=/"} <= set(cookie.split("; "))
    status, _, body = raw(site, "POST", "/method", b"method=sms", FORM)
    assert status == 400 and b'action="/method"' in body and b'class="error"' in body and b"sms" not in body
    # no pre-sign-in state: back to the start
    for method, path in [("POST", "/email"), ("GET", "/email"), ("GET", "/code"), ("POST", "/password")]:
        status, headers, _ = raw(site, method, path, b"" if method == "POST" else None)
        assert (status, headers["Location"]) == (303, "/"), path
    assert raw(site, "GET", "/account")[1]["Location"] == "/"


def stats(site: Site) -> dict:
    return json.loads(raw(site, "GET", "/stats")[2])


def test_stats_count_posts_and_oversized_body_is_refused(site):
    before = stats(site)
    assert set(before["posts"]) == {"/method", "/email", "/code", "/password"}
    sign_in(site, "email_code", CODE)
    assert raw(site, "POST", "/password", b"password=" + b"x" * (70 * 1024), FORM)[0] == 413
    after = stats(site)
    assert after["sign_ins"] == before["sign_ins"] + 1
    assert {p: after["posts"][p] - before["posts"][p] for p in after["posts"]} == \
        {"/method": 1, "/email": 1, "/code": 1, "/password": 1}


class Inputs(HTMLParser):
    """Counts forms, collects every <input>'s attributes and every <label>'s text."""

    def __init__(self, body: str) -> None:
        super().__init__()
        self.inputs, self.labels, self.forms, self._label = [], [], 0, None
        self.feed(body)
        self.close()

    def handle_starttag(self, tag, attrs):
        self.forms += tag == "form"
        if tag == "input":
            self.inputs.append(dict(attrs))
        elif tag == "label":
            self._label = []

    def handle_data(self, data):
        if self._label is not None:
            self._label.append(data)

    def handle_endtag(self, tag):
        if tag == "label" and self._label is not None:
            self.labels.append("".join(self._label))
            self._label = None


def test_hostile_many_fields(site):
    status, headers, body = raw(site, "GET", "/hostile/many-fields")
    p = Inputs(body.decode())
    assert status == 200 and p.forms == 1 and len(p.inputs) == 501
    assert [i["type"] for i in p.inputs] == ["text"] * 500 + ["password"]
    assert p.labels[:2] == ["Field 1", "Field 2"] and p.labels[499] == "Field 500" and p.labels[-1] == "Password"


def test_hostile_labels(site):
    status, _, body = raw(site, "GET", "/hostile/labels")
    text = body.decode()
    p = Inputs(text)
    assert status == 200 and [i["type"] for i in p.inputs] == ["password", "email"]
    assert all(c in p.labels[0] for c in ("\x1b[31m", "\x07", "\u202e")) and "&#0;" in text
    assert "A" * 1_048_576 in p.labels[1] and " address" in p.labels[1]
    assert len(text) > 2 * 1_048_576


def test_hostile_rerender(site):
    status, _, body = raw(site, "GET", "/hostile/rerender")
    text = body.decode()
    assert status == 200 and [i["type"] for i in Inputs(text).inputs] == ["password"]
    assert "replaceWith" in text and "setInterval" in text and "10000" in text and "'input'" in text
    status, _, body = raw(site, "POST", "/hostile/rerender", b"password=rerender-secret-55", FORM)
    assert status == 200 and json.loads(body) == {"got_password": True} and b"rerender-secret" not in body
    assert json.loads(raw(site, "POST", "/hostile/rerender", b"password=", FORM)[2]) == {"got_password": False}


def test_hostile_canvas(site):
    status, _, body = raw(site, "GET", "/hostile/canvas")
    assert status == 200 and b"<canvas" in body and b"Password" in body
    assert b"<input" not in body and b"<form" not in body


def test_hostile_navigate(site):
    status, _, body = raw(site, "GET", f"/hostile/navigate?to={site.ports[1]}&after_ms=250")
    text = body.decode()
    assert status == 200 and [i["type"] for i in Inputs(text).inputs] == ["password"]
    assert f'location = "http://" + location.hostname + ":" + {site.ports[1]} + "/"' in text and "250);" in text
    for query in ["to=0", "to=65536", "to=abc", "", "to=80&after_ms=60001", "to=80&after_ms=-1", "to=%2B80"]:
        assert raw(site, "GET", f"/hostile/navigate?{query}")[0] == 400, query


def test_hostile_fake_origin(site):
    status, _, body = raw(site, "GET", "/hostile/fake-origin")
    text = body.decode()
    p = Inputs(text)
    assert status == 200 and "<title>Sign in to https://bank.example</title>" in text
    assert "<h1>Sign in to https://bank.example</h1>" in text
    assert {"type": "hidden", "name": "origin", "value": "https://bank.example"} in p.inputs
    assert [i["type"] for i in p.inputs if i["type"] != "hidden"] == ["password"]


def test_hostile_forms_name_their_destination_and_count_what_reaches_it(site):
    other = f"http://127.0.0.1:{site.ports[1]}"
    expected = {"get": ('method="get"', 'action="/hostile/welcome"'), "cross-action": (f'action="{other}/hostile/steal"',),
                "cross-formaction": (f'formaction="{other}/hostile/steal"',), "base-href": (f'<base href="{other}/hostile/">',),
                "javascript-action": ('action="javascript:void(0)"',), "late-action": (f'this.action = "{other}/hostile/steal"',),
                "pattern": ('pattern="[0-9]{6}"',), "hold-rerender": ("replaceWith",)}
    for name, needles in expected.items():
        status, _, body = raw(site, "GET", f"/hostile/form/{name}?to={site.ports[1]}")
        assert status == 200 and all(n in body.decode() for n in needles), name
    for query in ["to=0", "to=abc", "to=%2B80"]:
        assert raw(site, "GET", f"/hostile/form/get?{query}")[0] == 400, query
    assert raw(site, "GET", "/hostile/form/get", headers={"Host": "bad host"})[0] == 400
    assert raw(site, "GET", "/hostile/form/nope")[0] == 404
    before = stats(site)["sinks"]
    assert raw(site, "GET", "/hostile/welcome?email=x")[0] == 200 and raw(site, "POST", "/hostile/steal", b"a=b", FORM)[0] == 200
    after = stats(site)["sinks"]
    assert {k: after[k] - before[k] for k in after} == {"/hostile/welcome": 1, "/hostile/steal": 1, "/hostile/done": 0,
                                                          "/hostile/hold": 0}


def test_a_redirect_page_sends_its_post_on_to_the_other_port_only(site):
    """``/hostile/redirect/CODES?to=ORIGIN``: each code a redirect, the last to the other port's steal sink;
    an origin on another host, a bad code or a bad port is 400 (the page redirects nowhere else)."""
    other = f"http://127.0.0.1:{site.ports[1]}"
    status, headers, _ = raw(site, "POST", f"/hostile/redirect/307/308?to={other}", b"a=b", FORM)
    assert status == 307 and headers["Location"] == f"/hostile/redirect/308?to={other}"
    status, headers, _ = raw(site, "POST", f"/hostile/redirect/308?to={other}", b"a=b", FORM)
    assert status == 308 and headers["Location"] == f"{other}/hostile/steal"
    for path in [f"/hostile/redirect/307?to=http://example.test:{site.ports[1]}",
                 "/hostile/redirect/307?to=http://127.0.0.1:0", f"/hostile/redirect/200?to={other}",
                 f"/hostile/redirect/307/999?to={other}", f"/hostile/redirect/307?to=https://127.0.0.1:{site.ports[1]}",
                 "/hostile/redirect/307"]:
        assert raw(site, "POST", path, b"a=b", FORM)[0] == 400, path


def test_a_held_post_waits_for_the_release(site):
    import threading

    answers: list = []
    poster = threading.Thread(target=lambda: answers.append(raw(site, "POST", "/hostile/hold", b"code=1", FORM)[0]))
    poster.start()
    deadline = time.monotonic() + 10
    while stats(site)["held"] != 1:
        assert time.monotonic() < deadline, "the POST was never held"
        time.sleep(0.02)  # poll interval of a bounded condition wait (the site holding the request)
    assert answers == []
    assert raw(site, "GET", "/hostile/release")[0] == 200
    poster.join(10)
    assert answers == [200] and stats(site)["held"] == 0


def test_log_holds_no_submitted_values(site):
    sign_in(site, "password", PASSWORD)
    sign_in(site, "email_code", CODE)
    sign_in(site, "password", "log-canary-3141")
    raw(site, "GET", f"/code?code={CODE}&password={PASSWORD}")
    raw(site, "GET", f"/log-test-end?code={CODE}")  # logged after the others: wait for it
    deadline = time.monotonic() + 10
    while "GET /log-test-end 404" not in site.stderr():
        assert time.monotonic() < deadline, site.stderr()[-2000:]
        time.sleep(0.02)
    log = site.stderr()
    assert "POST /password 303" in log and "POST /code 303" in log and "GET /code 303" in log
    for secret in (PASSWORD, CODE, "log-canary-3141", EMAIL):
        assert secret not in log


def test_ready_file_and_clean_exit(tmp_path):
    ready = tmp_path / "ready.json"
    server = Site(tmp_path, http=[0], ready_file=str(ready))
    try:
        assert json.loads(ready.read_text()) == server.ready == {"ready": True, "ports": server.ports}
        server.proc.send_signal(signal.SIGINT)
        assert server.proc.wait(timeout=10) == 0 and not ready.exists()
    finally:
        server.stop()
