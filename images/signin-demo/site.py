"""Sign-in demo site: a two-step sign-in flow, plus hostile pages for testing a browser form scanner.

Python standard library only (Debian bookworm's python3 3.11), one file, all state in memory.

    python3 site.py '{"http": [8080, 8081], "bind": "0.0.0.0", "ready_file": null}'

One JSON argument (none: the defaults ``{"http": [8080, 8081]}``). Every port in ``http`` serves the same
app (the same in-memory state); port 0 takes an ephemeral port. Once every port listens it prints
``{"ready": true, "ports": [...]}`` (the real ports) as one line on stdout, and writes the same line to
``ready_file`` when one is given (atomically; removed again on a clean exit). SIGTERM or SIGINT stops it
with exit status 0.

Account: ``person@example.test`` with password ``sandbox-demo-pass`` or e-mail code ``424242``.
Flow: ``GET /`` (choose a method) -> ``POST /method`` -> ``/email`` -> ``/code`` or ``/password`` ->
``/account``. ``GET /session`` is the site's own session state as JSON, ``GET /stats`` counts posts and
sign-ins (and the requests to the ``/hostile/form/*`` pages' destinations, ``sinks``, and the POSTs
``/hostile/hold`` keeps waiting, ``held``), ``GET /signout`` ends the session. ``/hostile/*`` are pages
built to trip a form scanner or a form fill (:data:`FORMS`).

Nothing a client submits is ever logged or echoed: the log has one line per request with the method,
the path without its query, and the status.
"""

from __future__ import annotations

import collections
import hmac
import html
import json
import os
import secrets
import signal
import sys
import tempfile
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs

ACCOUNT_EMAIL = "person@example.test"
ACCOUNT_PASSWORD = "sandbox-demo-pass"
ACCOUNT_CODE = "424242"
METHODS = ("email_code", "password")
DEFAULTS = {"http": [8080, 8081], "bind": "0.0.0.0", "ready_file": None}

MAX_BODY = 64 * 1024          # larger request bodies get 413
DRAIN_LIMIT = 1024 * 1024     # after a 413, read and drop up to this much so the close is not a reset
MAX_FIELDS = 1000             # form fields per body
MAX_STATES = 10_000           # pre-sign-in states and sessions each; the oldest are dropped beyond this
REQUEST_TIMEOUT_S = 30        # per socket operation; an idle or slow client is dropped after this
FLOW_POSTS = ("/method", "/email", "/code", "/password")
SINKS = ("/hostile/welcome", "/hostile/done", "/hostile/steal", "/hostile/hold")
"""Where the ``/hostile/form/*`` pages send their values: every request to one (any method) is counted."""
HOLD_TIMEOUT_S = 20
"""Longest a ``POST /hostile/hold`` waits for ``GET /hostile/release``."""
RETRY = "That did not work. Try again."


# --- state ------------------------------------------------------------------------------------------

class State:
    """Pre-sign-in states (``pre`` cookie), sessions (``sid`` cookie) and counters, behind one lock."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pre: collections.OrderedDict[str, dict] = collections.OrderedDict()
        self.sessions: collections.OrderedDict[str, dict] = collections.OrderedDict()
        self.posts = {path: 0 for path in FLOW_POSTS}
        self.sinks = {path: 0 for path in SINKS}
        self.sign_ins = 0
        self.hold = threading.Condition(self.lock)
        self.held = 0
        self.releases = 0

    @staticmethod
    def _put(table: collections.OrderedDict, value: dict) -> str:
        token = secrets.token_urlsafe(32)
        table[token] = value
        while len(table) > MAX_STATES:
            table.popitem(last=False)
        return token

    def start(self, method: str, old: str | None) -> str:
        """A fresh pre-sign-in state for ``method`` (the old one, if any, is dropped)."""
        with self.lock:
            if old:
                self.pre.pop(old, None)
            return self._put(self.pre, {"method": method, "email": None})

    def get_pre(self, token: str | None) -> dict | None:
        with self.lock:
            found = self.pre.get(token) if token else None
            return dict(found) if found else None

    def set_email(self, token: str, email: str) -> None:
        with self.lock:
            if token in self.pre:
                self.pre[token]["email"] = email

    def sign_in(self, pre_token: str, email: str, method: str) -> str:
        with self.lock:
            self.pre.pop(pre_token, None)
            self.sign_ins += 1
            return self._put(self.sessions, {"email": email, "method": method})

    def session(self, token: str | None) -> dict | None:
        with self.lock:
            found = self.sessions.get(token) if token else None
            return dict(found) if found else None

    def sign_out(self, sid: str | None, pre: str | None) -> None:
        with self.lock:
            if sid:
                self.sessions.pop(sid, None)
            if pre:
                self.pre.pop(pre, None)

    def count_post(self, path: str) -> None:
        with self.lock:
            if path in self.posts:
                self.posts[path] += 1

    def count_sink(self, path: str) -> None:
        with self.lock:
            if path in self.sinks:
                self.sinks[path] += 1

    def hold_request(self) -> None:
        """Keep a request waiting until :meth:`release` (at most :data:`HOLD_TIMEOUT_S`)."""
        with self.lock:
            generation = self.releases
            self.held += 1
            try:
                self.hold.wait_for(lambda: self.releases != generation, HOLD_TIMEOUT_S)
            finally:
                self.held -= 1

    def release(self) -> None:
        with self.lock:
            self.releases += 1
            self.hold.notify_all()

    def stats(self) -> dict:
        with self.lock:
            return {"posts": dict(self.posts), "sign_ins": self.sign_ins, "sinks": dict(self.sinks), "held": self.held}


STATE = State()


ACCOUNT_NAME = "demo-person"
"""The account's name in ``/session`` (the e-mail, a typed value, is never sent back)."""


def check_secret(method: str, email: str | None, secret: str) -> bool:
    """Whether ``email`` is the account's and ``secret`` its password or code (constant-time compare)."""
    expected = ACCOUNT_PASSWORD if method == "password" else ACCOUNT_CODE
    secret_ok = hmac.compare_digest(secret.encode("utf-8"), expected.encode("utf-8"))
    return secret_ok and (email or "").strip().lower() == ACCOUNT_EMAIL


# --- pages ------------------------------------------------------------------------------------------

CSS = """
*{box-sizing:border-box}
body{margin:0;font:22px/1.5 "DejaVu Sans",Arial,sans-serif;color:#111;background:#f3f5f8}
main{max-width:640px;margin:40px auto;padding:32px 40px;background:#fff;border:1px solid #cdd3dc;border-radius:10px}
h1{font-size:36px;margin:0 0 20px}
label{display:block;margin:14px 0 6px;font-weight:600}
fieldset{border:0;margin:0;padding:0}
.choice{display:flex;align-items:center;gap:12px;margin:12px 0}
.choice label{display:inline;margin:0;font-weight:400}
input[type=radio]{width:24px;height:24px;margin:0}
input[type=text],input[type=email],input[type=password]{width:100%;font-size:22px;padding:10px 12px;border:2px solid #8a94a3;border-radius:6px}
input:focus{outline:3px solid #1a64d6;outline-offset:1px}
button{margin-top:22px;font-size:22px;padding:10px 28px;border:0;border-radius:6px;background:#1a64d6;color:#fff;cursor:pointer}
.error{color:#a40000;font-weight:600}
a{color:#1a64d6}
.banner{height:160px;background:#1b7f3b;color:#fff;font-size:28px;text-align:right;padding:110px 40px 0}
"""


def page(title: str, body: str, script: str = "", banner: str = "") -> str:
    """A whole HTML page; ``banner``: text of the solid green band across the top (the account page's,
    which the offline script of tasks/sign-in-demo.toml waits for: #1b7f3b, the top 160 px)."""
    script_tag = f"<script>{script}</script>" if script else ""
    banner_tag = f'<div class="banner">{html.escape(banner)}</div>' if banner else ""
    return (
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        "<meta name=\"viewport\" content=\"width=device-width,initial-scale=1\">"
        f"<title>{html.escape(title)}</title><style>{CSS}</style></head>"
        f"<body>{banner_tag}<main>{body}</main>{script_tag}</body></html>\n"
    )


def error_line(message: str | None) -> str:
    return f'<p class="error" role="alert">{html.escape(message)}</p>' if message else ""


def method_page(error: str | None = None) -> str:
    return page("Sign in – Demo", (
        "<h1>Sign in</h1>" + error_line(error) +
        '<form method="post" action="/method"><fieldset><legend>How do you want to sign in?</legend>'
        '<div class="choice"><input type="radio" id="m-code" name="method" value="email_code">'
        '<label for="m-code">Email me a code</label></div>'
        '<div class="choice"><input type="radio" id="m-pass" name="method" value="password">'
        '<label for="m-pass">Use a password</label></div>'
        '</fieldset><button type="submit">Continue</button></form>'
    ))


def email_page(error: str | None = None) -> str:
    return page("Sign in – Demo", (
        "<h1>Sign in</h1>" + error_line(error) +
        '<form method="post" action="/email">'
        '<label for="email">E-mail address</label>'
        '<input type="email" id="email" name="email" autocomplete="username" required>'
        '<button type="submit">Next</button></form>'
        '<p><a href="/">Choose another way to sign in</a></p>'
    ))


def code_page(error: str | None = None) -> str:
    return page("Sign in – Demo", (
        "<h1>Enter your code</h1>" + error_line(error) +
        "<p>We sent a code to your e-mail address.</p>"
        '<form method="post" action="/code">'
        '<label for="code">Verification code</label>'
        '<input type="text" id="code" name="code" inputmode="numeric" autocomplete="one-time-code" required>'
        '<button type="submit">Sign in</button></form>'
        '<p><a href="/">Start again</a></p>'
    ))


def password_page(error: str | None = None) -> str:
    return page("Sign in – Demo", (
        "<h1>Enter your password</h1>" + error_line(error) +
        '<form method="post" action="/password">'
        '<label for="password">Password</label>'
        '<input type="password" id="password" name="password" autocomplete="current-password" required>'
        '<button type="submit">Sign in</button></form>'
        '<p><a href="/">Start again</a></p>'
    ))


def account_page() -> str:
    return page("Signed in – Demo", (
        '<h1>Account</h1><p id="who">Signed in</p><p><a href="/signout">Sign out</a></p>'
    ), banner="Signed in")


# --- hostile pages ------------------------------------------------------------------------------------

def hostile_many_fields() -> str:
    fields = "".join(
        f'<label for="f{n}">Field {n}</label><input type="text" id="f{n}" name="field{n}">'
        for n in range(1, 501)
    )
    return page("Many fields – Demo", (
        '<h1>Many fields</h1><form method="post" action="/hostile/many-fields">' + fields +
        '<label for="password">Password</label>'
        '<input type="password" id="password" name="password" autocomplete="current-password">'
        '<button type="submit">Submit</button></form>'
    ))


def hostile_labels() -> str:
    # Raw ESC and BEL, an RTL override, and a NUL as a character reference (parsed as U+FFFD).
    password_label = "Pass\x1b[31mword\x07 \u202edrowssaP&#0; (reset)\x1b[0m"
    email_label = "E-mail " + "A" * 1_048_576 + " address for this very long label"
    filler = ("This page carries a lot of text. " * 31_776)[:1_048_576]
    return page("Hostile labels – Demo", (
        "<h1>Hostile labels</h1>"
        '<form method="post" action="/hostile/labels">'
        f'<label for="password">{password_label}</label>'
        '<input type="password" id="password" name="password" autocomplete="current-password">'
        f'<label for="email">{email_label}</label>'
        '<input type="email" id="email" name="email" autocomplete="username">'
        '<button type="submit">Sign in</button></form>'
        f'<p id="filler">{filler}</p>'
    ))


RERENDER_SCRIPT = """
(function () {
  var form = document.getElementById('rerender');
  // Replace the password field with a fresh element (same id, name and label). The value and focus of
  // the field that is in the page carry over, so typing works; a value written to a stale reference
  // to a replaced element is lost.
  function replace() {
    var old = document.getElementById('password');
    var fresh = document.createElement('input');
    fresh.type = 'password'; fresh.id = 'password'; fresh.name = 'password';
    fresh.autocomplete = 'current-password'; fresh.required = true;
    fresh.value = old.value;
    var focused = document.activeElement === old;
    var start = old.selectionStart, end = old.selectionEnd;
    old.replaceWith(fresh);
    if (focused) { fresh.focus(); try { fresh.setSelectionRange(start, end); } catch (e) {} }
    window.rerenders = (window.rerenders || 0) + 1;
  }
  form.addEventListener('input', function (e) { if (e.target && e.target.id === 'password') replace(); });
  var t0 = Date.now();
  var timer = setInterval(function () {
    if (Date.now() - t0 > 10000) { clearInterval(timer); return; }
    replace();
  }, 50);
})();
"""


def hostile_rerender() -> str:
    return page("Re-rendered field – Demo", (
        "<h1>Sign in</h1>"
        '<form id="rerender" method="post" action="/hostile/rerender">'
        '<label for="password">Password</label>'
        '<input type="password" id="password" name="password" autocomplete="current-password" required>'
        '<button type="submit">Sign in</button></form>'
    ), RERENDER_SCRIPT)


CANVAS_SCRIPT = """
(function () {
  var c = document.getElementById('pane'), g = c.getContext('2d');
  g.fillStyle = '#fff'; g.fillRect(0, 0, c.width, c.height);
  g.fillStyle = '#111'; g.font = 'bold 22px sans-serif'; g.fillText('Password', 10, 30);
  g.strokeStyle = '#8a94a3'; g.lineWidth = 2; g.strokeRect(10, 45, 520, 50);
  g.font = '28px sans-serif'; g.fillText('\\u2022\\u2022\\u2022\\u2022\\u2022\\u2022\\u2022\\u2022', 22, 80);
  g.fillStyle = '#1a64d6'; g.fillRect(10, 115, 140, 48);
  g.fillStyle = '#fff'; g.font = '22px sans-serif'; g.fillText('Sign in', 40, 146);
})();
"""


def hostile_canvas() -> str:
    return page("Canvas – Demo", (
        '<h1>Sign in</h1><canvas id="pane" width="560" height="180"></canvas>'
    ), CANVAS_SCRIPT)


def hostile_navigate(port: int, after_ms: int) -> str:
    script = (
        f"setTimeout(function () {{ location = \"http://\" + location.hostname + \":\" + {port:d} + \"/\"; }},"
        f" {after_ms:d});"
    )
    return page("Sign in – Demo", (
        "<h1>Sign in</h1>"
        '<form method="post" action="/hostile/navigate">'
        '<label for="password">Password</label>'
        '<input type="password" id="password" name="password" autocomplete="current-password" required>'
        '<button type="submit">Sign in</button></form>'
    ), script)


FAKE = "https://bank.example"


def hostile_fake_origin() -> str:
    body = (
        f"<h1>Sign in to {FAKE}</h1>"
        f"<p>You are on {FAKE}. Only enter your password on {FAKE}.</p>"
        '<form method="post" action="/hostile/fake-origin">'
        f'<input type="hidden" name="origin" value="{FAKE}">'
        f'<label for="password">Password for {FAKE}</label>'
        '<input type="password" id="password" name="password" autocomplete="current-password" required>'
        '<button type="submit">Sign in</button></form>'
        f'<p>Secured by {FAKE}</p>'
    )
    text = page(f"Sign in to {FAKE}", body)
    head_extra = f'<meta property="og:url" content="{FAKE}/"><link rel="canonical" href="{FAKE}/signin">'
    return text.replace("</title>", "</title>" + head_extra, 1)


# Forms that send their values somewhere they should not go, or that the browser's validation stops.
# ``{other}`` is the origin of the page's host on the port of ``?to=`` (8081 by default).
CREDENTIALS = ('<label for="email">E-mail address</label>'
               '<input type="email" id="email" name="email" autocomplete="username">'
               '<label for="password">Password</label>'
               '<input type="password" id="password" name="password" autocomplete="current-password">')
HOLD_FORM = ('<form method="post" action="/hostile/hold">'
             '<label for="email">E-mail address</label><input type="email" id="email" name="email" '
             'autocomplete="username" style="background:#ff00ff;color:#000">'
             '<label for="code">Verification code</label><input type="text" id="code" name="code" '
             'autocomplete="one-time-code" style="background:#00ffff;color:#000">'
             '<label for="password">Password</label>'
             '<input type="password" id="password" name="password" autocomplete="current-password">'
             '<button>Sign in</button></form>')
# The same fields slotted into a shadow root whose style (an inner context: its important declarations win over
# the page's own, inline ones included) draws them unmasked; markup only, no script.
UNMASK_FORM = ('<form method="post" action="/hostile/hold"><div><template shadowrootmode="open"><style>'
               '::slotted(input) {{ -webkit-text-security: none !important; }}</style><slot></slot></template>'
               + HOLD_FORM[len('<form method="post" action="/hostile/hold">'):-len('</form>')] + '</div></form>')
# Every 20 ms: each field's style attribute written anew (as a framework re-rendering its props would).
RESTYLE_SCRIPT = ("<script>setInterval(function () {{ document.querySelectorAll('#email, #code').forEach(function (el) "
                  "{{ el.setAttribute('style', el.id === 'email' ? 'background:#ff00ff;color:#000' : "
                  "'background:#00ffff;color:#000'); }}); }}, 20);</script>")
# Every 20 ms: each field replaced by a fresh element with the same attributes and the value.
REBUILD_SCRIPT = ("<script>setInterval(function () {{ document.querySelectorAll('#email, #code').forEach(function (old) "
                  "{{ var el = document.createElement('input'); el.type = old.type; el.id = old.id; el.name = old.name; "
                  "el.autocomplete = old.autocomplete; el.setAttribute('style', old.id === 'email' ? "
                  "'background:#ff00ff;color:#000' : 'background:#00ffff;color:#000'); el.value = old.value; "
                  "old.replaceWith(el); }}); }}, 20);</script>")
SUBMIT = '<button>Sign in</button></form>'
FORMS = {
    "post": '<form method="post" action="/hostile/done">' + CREDENTIALS + '<button>Sign in</button></form>',
    "get": '<form method="get" action="/hostile/welcome">' + CREDENTIALS + '<button>Sign in</button></form>',
    "dialog": '<form method="dialog">' + CREDENTIALS + '<button>Sign in</button></form>',
    "formmethod-get": ('<form method="post" action="/hostile/done">' + CREDENTIALS +
                       '<button formmethod="get" formaction="/hostile/welcome">Sign in</button></form>'),
    "formless": CREDENTIALS + '<button type="button">Sign in</button>',
    "cross-action": '<form method="post" action="{other}/hostile/steal">' + CREDENTIALS + '<button>Sign in</button></form>',
    "cross-formaction": ('<form method="post" action="/hostile/done">' + CREDENTIALS +
                         '<button formaction="{other}/hostile/steal">Sign in</button></form>'),
    "base-href": ('<base href="{other}/hostile/"><form method="post" action="steal">' + CREDENTIALS +
                  '<button>Sign in</button></form>'),
    "javascript-action": ('<form method="post" action="javascript:void(0)">' + CREDENTIALS +
                          '<button>Sign in</button></form>'),
    "late-action": ('<form id="late" method="post" action="/hostile/done">' + CREDENTIALS +
                    '<button>Sign in</button></form><script>document.getElementById("late").addEventListener('
                    '"input", function () {{ this.action = "{other}/hostile/steal"; }});</script>'),
    "invalid-email": ('<form method="post" action="/hostile/done">'
                      '<label for="email">E-mail address</label>'
                      '<input type="email" id="email" name="email" autocomplete="username" required>'
                      '<label for="password">Password</label>'
                      '<input type="password" id="password" name="password" autocomplete="current-password" required>'
                      '<button>Sign in</button></form>'),
    "pattern": ('<form method="post" action="/hostile/done"><label for="code">Verification code</label>'
                '<input type="text" id="code" name="code" autocomplete="one-time-code" pattern="[0-9]{{6}}" required>'
                '<button>Sign in</button></form>'),
    "terms": ('<form method="post" action="/hostile/done">' + CREDENTIALS +
              '<input type="checkbox" id="terms" name="terms" required><label for="terms">I accept the terms</label>'
              '<button>Sign in</button></form>'),
    "minlength": ('<form method="post" action="/hostile/done"><label for="password">Password</label>'
                  '<input type="password" id="password" name="password" autocomplete="current-password" minlength="40">'
                  '<button>Sign in</button></form>'),
    "novalidate": ('<form method="post" action="/hostile/done" novalidate>'
                   '<label for="email">E-mail address</label>'
                   '<input type="email" id="email" name="email" autocomplete="username" required>'
                   '<button>Sign in</button></form>'),
    "other-owner": ('<form method="post" action="/hostile/done">' + CREDENTIALS +
                    '<button form="elsewhere">Sign in</button></form>'
                    '<form id="elsewhere" method="get" action="{other}/hostile/steal"></form>'),
    "redirect-307": '<form method="post" action="/hostile/redirect/307?to={other}">' + CREDENTIALS + SUBMIT,
    "redirect-308": '<form method="post" action="/hostile/redirect/308?to={other}">' + CREDENTIALS + SUBMIT,
    "redirect-chain": '<form method="post" action="/hostile/redirect/307/308?to={other}">' + CREDENTIALS + SUBMIT,
    "redirect-303": '<form method="post" action="/hostile/redirect/303?to={other}">' + CREDENTIALS + SUBMIT,
    "hold": HOLD_FORM,
    "hold-restyle": HOLD_FORM + RESTYLE_SCRIPT,
    "hold-rerender": HOLD_FORM + REBUILD_SCRIPT,
    "hold-unmask": UNMASK_FORM,
}
"""``GET /hostile/form/NAME``: a sign-in form whose values would go by GET or elsewhere than the page's
origin (``get``, ``dialog``, ``formmethod-get``, ``formless``, ``cross-action``, ``cross-formaction``,
``base-href``, ``javascript-action``, ``late-action``: the action moves to the other origin at the first
input), one the browser's validation stops or not (``invalid-email``, ``pattern``, ``terms``,
``minlength``, ``novalidate``), a plain one (``post``), one whose only button belongs to another form
(``other-owner``: a ``form=`` attribute; the form itself is submitted), and ``hold``: its POST waits for
``GET /hostile/release`` (``held`` in ``/stats`` counts the waiting ones), so the page stays with the
values in its fields (the e-mail field magenta, the code field cyan) as long as a test needs;
``hold-restyle`` writes the fields' style attributes anew every 20 ms, ``hold-rerender`` replaces the
fields with fresh ones holding their values every 20 ms, ``hold-unmask`` slots them into a shadow root whose
style draws their text unmasked (``::slotted(input)``, important). ``redirect-307``, ``redirect-308``,
``redirect-chain`` (a 307 on the page's origin, then a 308) and ``redirect-303`` post to the page's origin,
which answers with those redirects to the other origin's ``/hostile/steal`` (:data:`REDIRECTS`)."""
REDIRECTS = (301, 302, 303, 307, 308)
"""``POST /hostile/redirect/CODE[/CODE...]?to=ORIGIN``: answered with the first redirect status, to the
same path with the rest of the codes, or after the last to ``ORIGIN/hostile/steal`` (``ORIGIN``:
``http://host:port`` on the request's own host, another port; anything else is 400)."""


def hostile_form(name: str, other: str) -> str:
    return page("Sign in – Demo", "<h1>Sign in</h1>" + FORMS[name].format(other=other))


def host_name(header: str | None) -> str | None:
    """The host name of a ``Host`` header (no port), when it is a plain DNS name or IPv4 address."""
    name = (header or "").rsplit(":", 1)[0] if (header or "").count(":") <= 1 else ""
    ok = 0 < len(name) <= 253 and name.isascii() and all(c.isalnum() or c in ".-" for c in name)
    return name if ok else None


# Static pages, built once.
STATIC = {
    "/hostile/many-fields": hostile_many_fields().encode("utf-8"),
    "/hostile/labels": hostile_labels().encode("utf-8"),
    "/hostile/rerender": hostile_rerender().encode("utf-8"),
    "/hostile/canvas": hostile_canvas().encode("utf-8"),
    "/hostile/fake-origin": hostile_fake_origin().encode("utf-8"),
}


def bounded_int(text: str | None, low: int, high: int) -> int | None:
    """``text`` as an integer in ``low..high`` (plain decimal digits only), else None."""
    if text is None or not text.isascii() or not text.isdigit() or len(text) > 6:
        return None
    value = int(text)
    return value if low <= value <= high else None


# --- HTTP ---------------------------------------------------------------------------------------------

class BadRequest(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


def safe_path(raw: str | None) -> str:
    """A request path for the log: no query or fragment, printable ASCII, at most 200 characters."""
    path = (raw or "-").split("?", 1)[0].split("#", 1)[0]
    return "".join(ch if " " < ch < "\x7f" else "?" for ch in path[:200]) or "-"


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"  # one request a connection: no idle keep-alive connection to the gateway
    server_version = "SigninDemo/1"
    sys_version = ""
    timeout = REQUEST_TIMEOUT_S

    # Logging: method, path without query, status. Never arguments, bodies or error details.
    def log_request(self, code="-", size="-") -> None:
        status = code.value if isinstance(code, HTTPStatus) else code
        sys.stderr.write(f"{self.command or '-'} {safe_path(getattr(self, 'path', None))} {status}\n")

    def log_error(self, format, *args) -> None:  # noqa: A002 (the base class's name)
        pass  # the status line is logged by log_request; error details may quote the request

    def log_message(self, format, *args) -> None:  # noqa: A002
        pass

    def send_error(self, code, message=None, explain=None) -> None:
        # The default message for a malformed request quotes it; send only the standard phrase.
        super().send_error(code)

    # --- helpers -------------------------------------------------------------------------------------

    def cookies(self) -> dict[str, str]:
        jar: dict[str, str] = {}
        for header in self.headers.get_all("Cookie") or []:
            for part in header.split(";"):
                name, sep, value = part.strip().partition("=")
                if sep and name not in jar:
                    jar[name] = value.strip()
        return jar

    def send(self, status: int, body: bytes, content_type: str, cookies: list[str] = (),
             location: str | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Referrer-Policy", "no-referrer")
        if location:
            self.send_header("Location", location)
        for cookie in cookies:
            self.send_header("Set-Cookie", cookie)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def send_html(self, text: str, status: int = 200, cookies: list[str] = ()) -> None:
        self.send(status, text.encode("utf-8"), "text/html; charset=utf-8", cookies)

    def send_json(self, value, status: int = 200) -> None:
        self.send(status, json.dumps(value).encode("utf-8"), "application/json")

    def redirect(self, location: str, cookies: list[str] = ()) -> None:
        self.send(303, b"", "text/html; charset=utf-8", cookies, location)

    def bounce(self, codes: str, query: str) -> None:
        """Answer ``POST /hostile/redirect/CODES?to=ORIGIN`` (:data:`REDIRECTS`)."""
        first, _, rest = codes.partition("/")
        params = parse_qs(query, max_num_fields=20) if len(query) < 300 else {}
        to = (params.get("to") or [""])[0]
        scheme, _, host_port = to.partition("://")
        host, _, port = host_port.rpartition(":")
        ok = (scheme == "http" and host_name(host_port) == host == host_name(self.headers.get("Host"))
              and bounded_int(port, 1, 65535) is not None
              and bounded_int(first, 300, 399) in REDIRECTS and all(bounded_int(c, 300, 399) in REDIRECTS
                                                                    for c in rest.split("/") if rest))
        if not ok:
            return self.send_html(page("Bad request – Demo", "<h1>Bad request</h1>"), 400)
        location = f"/hostile/redirect/{rest}?{query}" if rest else f"{to}/hostile/steal"
        self.send(int(first), b"", "text/html; charset=utf-8", location=location)

    def not_found(self) -> None:
        self.send_html(page("Not found – Demo", "<h1>Not found</h1>"), 404)

    @staticmethod
    def cookie(name: str, value: str) -> str:
        return f"{name}={value}; HttpOnly; SameSite=Lax; Path=/"

    @staticmethod
    def expired(name: str) -> str:
        return f"{name}=; HttpOnly; SameSite=Lax; Path=/; Max-Age=0"

    def content_length(self) -> int:
        if self.headers.get("Transfer-Encoding"):
            raise BadRequest(411)  # chunked bodies are not supported; browsers send a length
        raw = self.headers.get("Content-Length")
        if raw is None:
            return 0
        raw = raw.strip()
        if not raw.isascii() or not raw.isdigit() or len(raw) > 18:
            raise BadRequest(400)
        return int(raw)

    def handle_expect_100(self) -> bool:
        try:
            too_large = self.content_length() > MAX_BODY
        except BadRequest:
            too_large = False  # do_POST answers it
        if too_large:
            self.close_connection = True
            self.send_html(page("Too large – Demo", "<h1>Request too large</h1>"), 413)
            return False
        return super().handle_expect_100()

    def refuse_large(self, length: int) -> None:
        self.close_connection = True
        self.send_html(page("Too large – Demo", "<h1>Request too large</h1>"), 413)
        self.wfile.flush()
        # Drop what the client is sending, so closing does not reset the connection before it has
        # read the answer.
        left = min(length, DRAIN_LIMIT)
        try:
            self.connection.settimeout(2)
            while left > 0:
                chunk = self.rfile.read1(min(left, 65536))
                if not chunk:
                    break
                left -= len(chunk)
        except OSError:
            pass

    def read_form(self, length: int) -> dict[str, list[str]]:
        body = self.rfile.read(length) if length else b""
        if len(body) != length:
            self.close_connection = True
            raise BadRequest(400)
        content_type = (self.headers.get("Content-Type") or "").split(";", 1)[0].strip().lower()
        if body and content_type not in ("", "application/x-www-form-urlencoded"):
            raise BadRequest(415)
        try:
            return parse_qs(body.decode("utf-8", errors="replace"), keep_blank_values=True,
                            max_num_fields=MAX_FIELDS)
        except ValueError:
            raise BadRequest(400) from None

    # --- dispatch ------------------------------------------------------------------------------------

    def do_GET(self) -> None:
        path, _, query = self.path.partition("?")
        cookies = self.cookies()
        sid, pre_token = cookies.get("sid"), cookies.get("pre")
        session = STATE.session(sid)
        if path == "/":
            if session:
                return self.redirect("/account")
            return self.send_html(method_page())
        if path == "/email":
            if not STATE.get_pre(pre_token):
                return self.redirect("/")
            return self.send_html(email_page())
        if path in ("/code", "/password"):
            pre = STATE.get_pre(pre_token)
            if not pre:
                return self.redirect("/")
            if not pre["email"]:
                return self.redirect("/email")
            if path != step_for(pre["method"]):
                return self.redirect(step_for(pre["method"]))
            return self.send_html(code_page() if path == "/code" else password_page())
        if path == "/account":
            if not session:
                return self.redirect("/")
            return self.send_html(account_page())
        if path == "/session":
            if session:
                return self.send_json({"signed_in": True, "account": ACCOUNT_NAME, "method": session["method"]})
            return self.send_json({"signed_in": False})
        if path == "/signout":
            STATE.sign_out(sid, pre_token)
            return self.redirect("/", [self.expired("sid"), self.expired("pre")])
        if path == "/stats":
            return self.send_json(STATE.stats())
        if path == "/hostile/navigate":
            params = parse_qs(query, max_num_fields=20) if len(query) < 200 else {}
            port = bounded_int((params.get("to") or [None])[0], 1, 65535)
            after_ms = bounded_int((params.get("after_ms") or ["1000"])[0], 0, 60000)
            if port is None or after_ms is None:
                return self.send_html(page("Bad request – Demo", "<h1>Bad request</h1>"), 400)
            return self.send_html(hostile_navigate(port, after_ms))
        if path.startswith("/hostile/form/") and path[len("/hostile/form/"):] in FORMS:
            params = parse_qs(query, max_num_fields=20) if len(query) < 200 else {}
            port = bounded_int((params.get("to") or ["8081"])[0], 1, 65535)
            host = host_name(self.headers.get("Host"))
            if port is None or host is None:
                return self.send_html(page("Bad request – Demo", "<h1>Bad request</h1>"), 400)
            return self.send_html(hostile_form(path[len("/hostile/form/"):], f"http://{host}:{port}"))
        if path == "/hostile/release":
            STATE.release()
            return self.send_json({"released": True})
        if path in SINKS:
            STATE.count_sink(path)
            return self.send_html(page("Done – Demo", "<h1>Done</h1>"))
        if path in STATIC:
            return self.send(200, STATIC[path], "text/html; charset=utf-8")
        return self.not_found()

    def do_POST(self) -> None:
        path = self.path.partition("?")[0]
        STATE.count_post(path)
        try:
            length = self.content_length()
            if length > MAX_BODY:
                return self.refuse_large(length)
            form = self.read_form(length)
        except BadRequest as e:
            self.close_connection = self.close_connection or e.status in (400, 411)
            return self.send_html(page("Bad request – Demo", "<h1>Bad request</h1>"), e.status)

        def field(name: str) -> str:
            return (form.get(name) or [""])[0]

        cookies = self.cookies()
        pre_token = cookies.get("pre")
        if path == "/method":
            method = field("method")
            if method not in METHODS:
                return self.send_html(method_page("Choose one of the ways to sign in."), 400)
            token = STATE.start(method, pre_token)
            return self.redirect("/email", [self.cookie("pre", token)])
        if path == "/email":
            pre = STATE.get_pre(pre_token)
            if not pre:
                return self.redirect("/")
            email = field("email").strip()
            if not email:
                return self.send_html(email_page("Enter your e-mail address."), 400)
            STATE.set_email(pre_token, email)
            return self.redirect(step_for(pre["method"]))
        if path in ("/code", "/password"):
            pre = STATE.get_pre(pre_token)
            if not pre:
                return self.redirect("/")
            if not pre["email"]:
                return self.redirect("/email")
            if path != step_for(pre["method"]):
                return self.redirect(step_for(pre["method"]))
            secret = field("code" if path == "/code" else "password")
            if path == "/code":
                secret = secret.strip()
            if not check_secret(pre["method"], pre["email"], secret):
                return self.send_html(code_page(RETRY) if path == "/code" else password_page(RETRY))
            sid = STATE.sign_in(pre_token, ACCOUNT_EMAIL, pre["method"])
            return self.redirect("/account", [self.cookie("sid", sid), self.expired("pre")])
        if path == "/hostile/rerender":
            return self.send_json({"got_password": any(v for v in form.get("password", []))})
        if path.startswith("/hostile/redirect/"):
            return self.bounce(path[len("/hostile/redirect/"):], self.path.partition("?")[2])
        if path in SINKS:
            STATE.count_sink(path)
            if path == "/hostile/hold":
                STATE.hold_request()
            return self.send_html(page("Done – Demo", "<h1>Done</h1>"))
        if path.startswith("/hostile/"):
            return self.send_json({"received": True, "fields": sum(1 for vs in form.values() for v in vs if v)})
        return self.not_found()


def step_for(method: str) -> str:
    return "/code" if method == "email_code" else "/password"


class Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 64

    def handle_error(self, request, client_address) -> None:
        # The default prints a traceback whose message may quote request data: print the type only.
        sys.stderr.write(f"error: {sys.exc_info()[0].__name__} while handling a request\n")


# --- main ---------------------------------------------------------------------------------------------

def load_config(argv: list[str]) -> dict:
    if len(argv) > 1:
        raise SystemExit("usage: site.py ['{\"http\": [8080, 8081], \"bind\": \"0.0.0.0\", \"ready_file\": null}']")
    config = dict(DEFAULTS)
    if argv:
        given = json.loads(argv[0])
        if not isinstance(given, dict):
            raise SystemExit("site.py: the argument must be a JSON object")
        unknown = set(given) - set(DEFAULTS)
        if unknown:
            raise SystemExit(f"site.py: unknown keys {sorted(unknown)}")
        config.update(given)
    ports = config["http"]
    if (not isinstance(ports, list) or not ports
            or not all(isinstance(p, int) and not isinstance(p, bool) and 0 <= p <= 65535 for p in ports)):
        raise SystemExit("site.py: \"http\" must be a non-empty list of ports 0..65535")
    if not isinstance(config["bind"], str) or not config["bind"]:
        raise SystemExit("site.py: \"bind\" must be an address")
    if config["ready_file"] is not None and not isinstance(config["ready_file"], str):
        raise SystemExit("site.py: \"ready_file\" must be a path or null")
    return config


def write_atomically(path: str, text: str) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".ready-")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def main(argv: list[str]) -> int:
    config = load_config(argv)
    # Blocked in every thread (the server threads inherit the mask) and taken by sigwait below.
    stop_signals = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, stop_signals)
    servers = [Server((config["bind"], port), Handler) for port in config["http"]]
    threads = [threading.Thread(target=s.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
               for s in servers]
    for t in threads:
        t.start()
    ready = json.dumps({"ready": True, "ports": [s.server_address[1] for s in servers]})
    if config["ready_file"]:
        write_atomically(config["ready_file"], ready + "\n")
    print(ready, flush=True)
    try:
        signal.sigwait(stop_signals)
    finally:
        stoppers = [threading.Thread(target=s.shutdown) for s in servers]  # in parallel: each polls
        for t in stoppers:
            t.start()
        for t in stoppers:
            t.join()
        for s in servers:
            s.server_close()
        if config["ready_file"]:
            try:
                os.unlink(config["ready_file"])
            except OSError:
                pass
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
