"""A small site of features and hostile pages for the browser tests (the agent's browser tools in
tests/guest/test_browser_tools.py, the browser driver conformance suite in tests/browser_conformance),
served on loopback by the tests themselves (stdlib ``http.server``): :func:`serve` starts it on two
origins (127.0.0.1 and 127.0.0.2, ephemeral ports) and returns ``(base, other, stop)``.

Pages write what happened to them into ``window.events`` (their own world) and into the ``#log``
element's text, so a test can read it through the agent's own reads or the page's world. The pages the
conformance suite drives (``/tall``, ``/quads``, ``/pointer``, ``/dialogs``) show everything it checks
as page text, so any driver's ``get_page_text`` or ``wait_for`` can see it.

Hostile pages: ``/go/KIND?to=URL`` (:data:`GO_KINDS`) takes the browser to ``URL`` in one way each (a
redirect, a meta refresh, a link, a script, a form, a new tab, a frame, subresources), for the URL rule's
tests; ``/swap?when=WHEN`` (:data:`SWAP_WHEN`) puts a "Buy" button (a form submit) over the "Cancel"
button at the moment ``WHEN`` names, for the input gate's; ``/steal-focus`` moves the keyboard focus from
its "Search" field to its "Message" field whenever the first has it (a timer, and once its text is selected). :func:`serve_secret` is a guest-local service
no task opens, counting what reaches it.
"""

from __future__ import annotations

import html
import http.server
import json
import threading
from typing import Any, Callable
from urllib.parse import parse_qs, urlsplit

LOG_JS = """<pre id=log></pre><script>
window.events = [];
function note(s) { window.events.push(s); document.getElementById('log').textContent += s + '\\n'; }
</script>"""

FORM = """<!doctype html><html><head><title>Form page</title>
<style>#cover { position: fixed; left: 0; top: 0; width: 200px; height: 40px; background: #eee; z-index: 9 }
#under { position: fixed; left: 10px; top: 10px } body { margin-top: 60px }</style></head><body>
<button id=under onclick="note('under clicked')">Under</button><div id=cover>cover</div>
<h1>Feature form</h1>
<form id=f onsubmit="event.preventDefault(); note('submitted ' + document.getElementById('name').value)">
<label>Full name <input id=name value="Ada"></label>
<label>E-mail <input id=mail type=email placeholder="you@example.test"></label>
<label>Password <input id=pw type=password value="secret-value"></label>
<input id=card autocomplete="cc-number" aria-label="Card number" value="4111111111111111">
<textarea id=notes aria-label="Notes">first</textarea>
<label>Colour <select id=colour onchange="note('colour ' + this.value)"><option value=r>Red</option>
<option value=g selected>Green</option><option value=b>Blue</option></select></label>
<label>Extras <select id=extras multiple size=3 onchange="note('extras ' + [...this.selectedOptions].map(o => o.value).join(','))">
<option value=x>Extra X</option><option value=y selected>Extra Y</option><option value=z>Extra Z</option></select></label>
<label><input type=checkbox id=agree onchange="note('agree ' + this.checked)"> I agree</label>
<label><input type=radio name=size value=s id=small onchange="note('size s')"> Small</label>
<label><input type=radio name=size value=l id=large checked onchange="note('size l')"> Large</label>
<label>Volume <input type=range id=vol min=0 max=10 value=3></label>
<input type=file aria-label="Upload">
<input type=hidden id=secret value=hidden-value>
<button type=submit>Send form</button>
<button type=button id=off disabled onclick="note('off clicked')">Disabled button</button>
<button type=button id=ghost style="display:none">Ghost button</button>
</form>
<div contenteditable=true id=editor aria-label="Editor">editable text</div>
<p><a href="/other">Other page</a> <a href="/popup" target=_blank id=blank>Open blank</a>
<button onclick="window.open('/popup?via=open')">Open window</button>
<a href="/download" id=dl>Get file</a></p>
<div id=host></div>
<iframe id=same src="/frame" width=300 height=80></iframe>
<iframe id=cross src="{OTHER}/frame" width=300 height=80></iframe>
<script>
const root = document.getElementById('host').attachShadow({mode: 'open'});
root.innerHTML = '<button id=shadowbtn>Shadow button</button><input aria-label="Shadow field">';
root.getElementById('shadowbtn').addEventListener('click', () => note('shadow clicked'));
document.addEventListener('keydown', e => note('keydown ' + e.key + (e.isTrusted ? '' : ' untrusted')));
document.addEventListener('click', e => { if (e.target.id === 'agree') note('agree click trusted ' + e.isTrusted); });
</script>""" + LOG_JS + "</body></html>"

FRAME = """<!doctype html><body style="margin:0"><button id=inner onclick="parent.note ? parent.note('frame clicked') : 0">
Frame button</button><p>Inside the frame</p></body>"""

XY = """<!doctype html><html><head><title>Pointer page</title><style>html, body { margin: 0; height: 100%; overflow: hidden; }
h1 { margin: 0; }
#pad { position: fixed; inset: 0; }</style></head><body><h1>Pointer page</h1><div id=pad></div><script>
window.events = [];
for (const t of ['click', 'dblclick', 'mousedown', 'mouseup', 'contextmenu', 'auxclick'])
  document.addEventListener(t, e => { e.preventDefault(); events.push([t, e.clientX, e.clientY, e.button, e.detail, e.shiftKey, e.ctrlKey]); });
document.addEventListener('mousemove', e => events.push(['mousemove', e.clientX, e.clientY, e.buttons]));
document.addEventListener('keydown', e => events.push(['keydown', e.key, e.repeat, performance.now()]));
document.addEventListener('keyup', e => events.push(['keyup', e.key, performance.now()]));
</script></body></html>"""

TALL = ("<!doctype html><html><head><title>Tall page</title><style>body { margin: 0 }</style></head><body>"
        "<div style='height: 1000px; width: 4000px; background: rgb(0,0,255)'></div>"
        "<div style='height: 4000px; background: rgb(255,0,0)'></div>"
        "<button onmouseover=\"note('hovered')\" onclick=\"note('bottom clicked')\">Bottom button</button>" + LOG_JS +
        """<script>
const seen = new Set();
addEventListener('scroll', () => {
  for (const [axis, at] of [['x', 300], ['y', 700], ['y', 1000], ['y', 4000]]) {
    const now = axis === 'x' ? scrollX : scrollY;
    if (now >= at && !seen.has(axis + at)) { seen.add(axis + at); note(axis + ' reached ' + at); }
  }
  if (scrollY === 0 && seen.has('y700') && !seen.has('top')) { seen.add('top'); note('back at top'); }
});
</script></body></html>""")
"""Blue above document y = 1000 px, red below, 4000 px wide and 5000 px tall; notes ``x reached 300``,
``y reached 700`` / ``1000`` / ``4000`` (scroll offsets, CSS px) and ``back at top`` as the page
scrolls, ``hovered`` and ``bottom clicked`` from the bottom button."""

QUADS = ("<!doctype html><html><head><title>Quadrants</title><style>html, body { margin: 0; height: 100%; "
         "overflow: hidden } div { position: fixed; width: 50vw; height: 50vh }</style></head><body>"
         "<div style='left: 0; top: 0; background: rgb(0,0,255)'></div>"
         "<div style='left: 50vw; top: 0; background: rgb(255,0,0)'></div>"
         "<div style='left: 0; top: 50vh; background: rgb(0,160,0)'></div>"
         "<div style='left: 50vw; top: 50vh; background: rgb(255,255,0)'></div></body></html>")
"""The viewport in four quadrants: blue top left, red top right, green bottom left, yellow bottom right."""

POINTER = """<!doctype html><html><head><title>Pointer log</title><style>
html, body { margin: 0; height: 100%; overflow: hidden } #pad { position: fixed; inset: 0 }
#out { position: fixed; right: 0; bottom: 0; margin: 0; font: 11px monospace; max-height: 40%; overflow: hidden;
       pointer-events: none }</style></head><body><div id=pad></div><pre id=out></pre><script>
const lines = [], down = {};
function log(s) { lines.push('[' + s + ']'); if (lines.length > 200) lines.shift(); document.getElementById('out').textContent = lines.join('\\n'); }
const mods = e => (e.shiftKey ? ' shift' : '') + (e.ctrlKey ? ' ctrl' : '') + (e.altKey ? ' alt' : '');
for (const t of ['click', 'contextmenu', 'mousedown', 'mouseup'])
  document.addEventListener(t, e => { e.preventDefault(); log(t + ' ' + e.clientX + ' ' + e.clientY + ' b' + e.button + ' d' + e.detail + mods(e)); });
document.addEventListener('mousemove', e => log((e.buttons & 1 ? 'drag ' : 'move ') + e.clientX + ' ' + e.clientY));
document.addEventListener('keydown', e => { if (!e.repeat && !(e.code in down)) { down[e.code] = performance.now(); log('keydown ' + e.code); } });
document.addEventListener('keyup', e => { const t = down[e.code]; delete down[e.code];
  log('keyup ' + e.code + (t === undefined ? '' : ' held ' + Math.round(performance.now() - t))); });
</script></body></html>"""
"""A pad over the whole viewport that logs, as page text, one ``[...]`` line per event: ``[click X Y bB dD
shift ctrl alt]`` (also ``contextmenu``, ``mousedown``, ``mouseup``; X, Y viewport CSS px, B the button, D
the click count, the modifiers held), ``[move X Y]`` / ``[drag X Y]`` (left button down), ``[keydown
CODE]`` (first press only) and ``[keyup CODE held MS]`` (ms since that press)."""

DIALOGS = ("<!doctype html><title>Dialogs</title><h1>Dialogs</h1>"
           "<button onclick=\"note('alert returned ' + alert('hello'))\">Alert me</button>"
           "<button onclick=\"note('confirm returned ' + confirm('sure?'))\">Confirm me</button>"
           "<button onclick=\"note('prompt returned ' + prompt('name?', 'default'))\">Prompt me</button>" + LOG_JS)
"""Buttons that open an alert, a confirm and a prompt, and note what the dialog returned
(``alert returned undefined``, ``confirm returned false``, ``prompt returned null`` when dismissed)."""

SWAP = """<!doctype html><html><head><title>Swap</title><style>
.slot { position: absolute; left: 20px; top: 80px; width: 160px; height: 40px; margin: 0; border: 0; padding: 0 }
#cancel { z-index: 2 } #buy { z-index: 1 } #frame { display: none; z-index: 5 }
.box { position: absolute; left: 20px; top: 160px; width: 20px; height: 20px; margin: 0 } #keep { z-index: 2 }
</style></head><body><h1>Order</h1>
<form action="/other" method=get><button class=slot id=buy type=submit>Buy</button></form>
<button class=slot id=cancel type=button>Cancel</button>
<iframe class=slot id=frame src="/frame"></iframe>
<input type=checkbox class=box id=danger aria-label=Danger><input type=checkbox class=box id=keep aria-label=Keep>
""" + LOG_JS + """<script>
const when = new URLSearchParams(location.search).get('when');
const buy = document.getElementById('buy'), cancel = document.getElementById('cancel');
const danger = document.getElementById('danger'), keep = document.getElementById('keep');
for (const t of ['pointerover', 'mouseover', 'pointermove', 'mousemove', 'pointerdown', 'mousedown', 'pointerup',
                 'mouseup', 'click']) {
  buy.addEventListener(t, () => note('buy ' + t));
  danger.addEventListener(t, () => note('danger ' + t));
}
if (new URLSearchParams(location.search).get('hog'))  // the page's own listeners first, where it can
  for (const t of ['pointerdown', 'mousedown', 'pointerup', 'mouseup', 'click'])
    window.addEventListener(t, e => { if (e.target === buy) e.stopImmediatePropagation(); }, true);
cancel.addEventListener('click', () => note('cancel click'));
keep.addEventListener('click', () => note('keep click'));
window.note = note;
function swap() { buy.style.zIndex = 3; danger.style.zIndex = 3; }
function flip() {
  const up = buy.style.zIndex !== '3';
  buy.style.zIndex = up ? 3 : 1; danger.style.zIndex = up ? 3 : 1;
}
if (when === 'timer') setInterval(flip, 1);
else if (when === 'frame')
  cancel.addEventListener('pointermove', () => { document.getElementById('frame').style.display = 'block'; });
else if (when) { cancel.addEventListener(when, swap); keep.addEventListener(when, swap); }
</script></body></html>"""
"""``/swap?when=WHEN``: "Cancel" (a plain button) over "Buy" (the submit button of a form to ``/other``),
the checkbox "Keep" over "Danger"; when ``WHEN`` happens (an event on "Cancel" or "Keep": ``pointerover``,
``pointermove``, ``mousedown``...) "Buy" and "Danger" come on top; ``timer`` flips them every
millisecond; ``frame`` shows a same-origin frame (``/frame``, a button in it) over "Cancel" on pointermove.
With ``hog=1`` the page's own capture listeners on the window stop every press, release and click of
"Buy" from going further (its default action still comes) -- they are first there unless the agent's
gate came before the page's scripts.
Every event "Buy" or "Danger" gets is noted (``buy click``...), as are ``cancel click`` and
``keep click``."""
SWAP_WHEN = ("pointerrawupdate", "pointerover", "mouseover", "pointermove", "mousemove", "pointerdown", "mousedown",
             "pointerup", "mouseup", "frame")
"""The events of the named element on which ``/swap`` moves another element under the point."""

GO_KINDS = ("redirect301", "redirect302", "redirect307", "meta", "link", "script", "form-get", "form-post",
            "blank", "open", "frame", "subresources")
"""How ``/go/KIND?to=URL`` takes the browser to ``URL``: an HTTP redirect (``redirect307`` is a form's
POST redirected with its body), a meta refresh, a link, ``location =`` from a script, a form submitted
with GET or POST, a ``target=_blank`` link, ``window.open``, an iframe, or subresources (an image, a
script, a stylesheet, a no-cors ``fetch``: the page then notes ``subresources done``). Where a click
starts it, the page's one button or link is labelled "Go"."""


def _go(kind: str, to: str) -> str:
    attr, js = html.escape(to, quote=True), json.dumps(to).replace("<", "\\u003c")
    body = {
        "meta": f'<meta http-equiv=refresh content="0; url={attr}"><p>Moving on</p>',
        "link": f'<a href="{attr}">Go</a>',
        "script": f"<p>Moving on</p><script>setTimeout(() => {{ location = {js}; }}, 0)</script>",
        "form-get": f'<form method=get action="{attr}"><input name=q value=x><button>Go</button></form>',
        "form-post": f'<form method=post action="{attr}"><input name=q value=x><button>Go</button></form>',
        "redirect307": (f'<form method=post action="/go/redirect307?to={attr}"><input name=q value=x>'
                        "<button>Go</button></form>"),
        "blank": f'<a target=_blank href="{attr}">Go</a>',
        "open": f"<button onclick='window.open({html.escape(js, quote=True)})'>Go</button>",
        "frame": f'<p>Framed below</p><iframe id=framed src="{attr}" width=400 height=100></iframe>',
        "subresources": (f'<img src="{attr}img"><link rel=stylesheet href="{attr}css"><script src="{attr}js"></script>'
                         f"<script>fetch({js} + 'fetch', {{mode: 'no-cors'}}).catch(() => 0).finally(() => "
                         "{ document.body.insertAdjacentHTML('beforeend', '<p>subresources done</p>'); });</script>"),
    }[kind]
    return f"<!doctype html><title>Go {kind}</title><h1>Go {kind}</h1>{body}"


PAGES: dict[str, str] = {
    "/form": FORM,
    "/frame": FRAME,
    "/xy": XY,
    "/tall": TALL,
    "/quads": QUADS,
    "/pointer": POINTER,
    "/dialogs": DIALOGS,
    "/other": "<!doctype html><title>Other</title><p>The other page</p>",
    "/popup": "<!doctype html><title>Popup</title><p>A popup page</p>",
    "/steal-focus": ("<!doctype html><title>Steal focus</title><label>Search <input id=q></label>"
                     "<label>Message <input id=o></label><script>const q = document.getElementById('q');"
                     "const steal = () => { if (document.activeElement === q) document.getElementById('o').focus(); };"
                     "q.addEventListener('select', steal); setInterval(steal, 1);</script>"),
    "/later": "<!doctype html><title>Later</title><p id=p>waiting</p><script>"
              "setTimeout(() => document.getElementById('p').textContent = 'Ready   now', 300)</script>",
    "/scroll": ("<!doctype html><title>Tall</title><div style='height:5000px;width:4000px'>top</div>"
                "<button onmouseover=\"note('hovered')\">Bottom button</button>" + LOG_JS),
    "/bands": "<!doctype html><title>Bands</title><style>body { margin: 0 } div { height: 1000px }</style>"
              "<div style='background: rgb(0,0,255)'></div><div style='background: rgb(255,0,0)'></div>",
    "/alerts": "<!doctype html><title>Alerts</title><script>for (let i = 0; ; i++) { alert(i); confirm(i); prompt(i); }"
               "</script>",
    "/unload": "<!doctype html><title>Stay</title><script>addEventListener('beforeunload', e => "
               "{ e.preventDefault(); e.returnValue = 'stay'; });</script><p>stay here</p>",
    "/many": "<!doctype html><title>Many</title>" + "".join(f"<button>Button {i}</button>" for i in range(10_000)),
    "/rewrite": "<!doctype html><title>Rewrite</title><div id=r></div><script>let n = 0;"
                "function redo() { const d = document.getElementById('r'); d.innerHTML = '';"
                "for (let i = 0; i < 50; i++) { const b = document.createElement('button'); b.textContent = 'B' + n + '-' + i; d.append(b); }"
                "n++; document.title = 'Rewrite ' + n; }"
                "redo(); setInterval(redo, 1); new MutationObserver(() => { if (n % 7 === 0) redo(); })"
                ".observe(document.body, {childList: true, subtree: true});</script>",
    "/title": "<!doctype html><title>x</title><script>document.title = 'Bell\\x07 esc\\x1b[31m rtl\\u202e end';"
              "</script><p>title page</p>",
    "/longtitle": "<!doctype html><title>x</title><script>document.title = '\\u00e9'.repeat(700);</script>",
    "/private": "<!doctype html><title>Private</title><script>window.__dsTools = 'page'; </script>"
                "<input aria-label='Code' autocomplete='one-time-code' value='123456'>",
    "/secrets": ("<!doctype html><title>Secrets</title><form>"
                 "<label>Passphrase <input name=password value=pw-by-name></label>"
                 "<label>Current <input autocomplete=current-password value=pw-by-hint></label>"
                 "<label>New password <input id=np value=pw-by-label></label>"
                 "<label>Passcode <input name=passcode type=tel value=pc-by-name></label>"
                 "<label>Sign-in code <input name=otp value=otp-by-name></label>"
                 "<label>Verification <textarea name=verification>code-in-textarea</textarea></label>"
                 "<label>Nickname <input name=nick value=shown-value></label></form>"),
    "/fields": ("<!doctype html><title>Fields</title>" + LOG_JS +
                "<label>Fixed <input id=fixed readonly value=keep></label>"
                "<label>Amount <input id=amount type=number></label>"
                "<label>Plain <input id=plain value=same></label>"
                "<div role=textbox tabindex=0 aria-label=Fake id=fake>role text</div>"),
    "/swap": SWAP,
    "/delay": "<!doctype html><title>Delay</title><button id=b onclick=\"setTimeout(() => document.body.insertAdjacentHTML('beforeend', '<p>appeared</p>'), 200)\">Go</button>",
}


def _huge() -> bytes:
    chunk = "<p>" + "word " * 10_000 + "</p>"  # 50 000 characters
    return ("<!doctype html><title>Huge</title>" + chunk * 1000).encode()


def serve_secret() -> tuple[int, list[str], Callable[[], None]]:
    """A guest-local service no task opens: every GET or POST on 127.0.0.1 (an ephemeral port) answers
    the page "Secret" (``secret loopback page``) and appends its path to ``hits``. Returns ``(port,
    hits, stop)``."""
    hits: list[str] = []

    class Secret(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *_: Any) -> None:
            pass

        def do_GET(self) -> None:
            hits.append(self.path)
            body = b"<!doctype html><title>Secret</title><p>secret loopback page</p>"
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_POST = do_GET

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Secret)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()

    def stop() -> None:
        server.shutdown()
        server.server_close()
    return server.server_address[1], hits, stop


def serve() -> tuple[str, str, Callable[[], None]]:
    """Start the site on 127.0.0.1 and 127.0.0.2; returns ``(base, other, stop)``."""
    huge = _huge()
    stop_slow = threading.Event()
    origins: dict[str, str] = {}

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *_: Any) -> None:
            pass

        def _send(self, body: bytes, ctype: str = "text/html; charset=utf-8", **headers: str) -> None:
            self.send_response(200)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            for name, value in headers.items():
                self.send_header(name.replace("_", "-"), value)
            self.end_headers()
            self.wfile.write(body)

        def _endless(self, head: bytes) -> None:
            """A page whose body (``head`` first) never ends: open until the site stops."""
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", "1000000")
            self.end_headers()
            self.wfile.write(b"<!doctype html>" + head + b" " * 2000)
            self.wfile.flush()
            stop_slow.wait(120)

        def _redirect(self, status: int, to: str) -> None:
            self.send_response(status)
            self.send_header("Location", to)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            self.rfile.read(min(length, 1 << 16))
            parts = urlsplit(self.path)
            if parts.path == "/go/redirect307":
                return self._redirect(307, parse_qs(parts.query).get("to", [""])[0])
            self.send_error(404)

        def do_GET(self) -> None:
            path = self.path.split("?")[0]
            if path.startswith("/go/"):
                kind, to = path[4:], parse_qs(urlsplit(self.path).query).get("to", [""])[0]
                if kind in ("redirect301", "redirect302"):
                    return self._redirect(int(kind[-3:]), to)
                if kind in GO_KINDS:
                    return self._send(_go(kind, to).encode())
            if path == "/huge":
                return self._send(huge)
            if path == "/download":
                return self._send(b"file body", "application/octet-stream",
                                  Content_Disposition='attachment; filename="f.bin"')
            if path == "/slow":  # never finishes loading: the body stays open until the site stops
                return self._endless(b"<title>Slow</title><p>Still loading page</p>")
            if path == "/late":  # its headers come 2 s late (a slow server), then a body that never ends
                stop_slow.wait(2.0)
                return self._endless(b"<title>Late</title><p>Late page</p>")
            page = PAGES.get(path)
            if page is None:
                self.send_error(404)
                return
            self._send(page.replace("{OTHER}", origins["other"]).encode())

    servers = [http.server.ThreadingHTTPServer((host, 0), Handler) for host in ("127.0.0.1", "127.0.0.2")]
    for server in servers:
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
    base, other = (f"http://{s.server_address[0]}:{s.server_address[1]}" for s in servers)
    origins["other"] = other

    def stop() -> None:
        stop_slow.set()
        for server in servers:
            server.shutdown()
            server.server_close()
    return base, other, stop
