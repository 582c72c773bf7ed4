"""The console's streams, images and data from another local page, in a real browser (Debian's chromium
through Playwright) that holds the console's session cookie: a page served by another program on
another 127.0.0.1 port (the same site, so the browser sends the SameSite=Strict cookie along) embeds
the live screen (JPEG and MJPEG), a recorded screenshot, the console's script and style sheet, a run
page in a frame, opens the event stream and the run page's WebSocket and fetches the run's state and
approvals. The console
refuses each of them (403 ``cross_site``, nothing streamed, each refusal logged), while the person's own
page, and the person following a link from that page to the console, still work."""

from __future__ import annotations

import io
import json
import logging
from urllib.parse import urlsplit

from PIL import Image

from tests.console.conftest import LIVE_ID, until

PROBES = ("screen_jpg", "screen_mjpeg", "shot", "script", "style", "events", "socket", "state", "approvals",
          "opaque")
"""What the other page tries (each reports into ``window.results``)."""


def _png(width: int, height: int) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (width, height), (200, 60, 40)).save(out, "PNG")
    return out.getvalue()


def _attack_page(base: str) -> str:
    """The other program's page: every way a page can make the browser GET the console's data."""
    run = f"{base}/runs/{LIVE_ID}"
    urls = {"screen_jpg": f"{run}/screen.jpg", "screen_mjpeg": f"{run}/screen.mjpeg?fps=5",
            "shot": f"{run}/shots/shot-0001.png", "script": f"{base}/static/console.js",
            "style": f"{base}/static/console.css", "events": f"{run}/events", "state": f"{run}/state",
            "approvals": f"{run}/approvals", "opaque": f"{run}/state", "frame": run,
            "socket": "ws" + f"{run}/live".removeprefix("http")}
    return f"""<!doctype html><title>elsewhere</title>
<body>
<iframe src="{urls['frame']}"></iframe>
<script>
const urls = {json.dumps(urls)};
window.results = {{}};
const report = (name, what) => {{ if (!(name in window.results)) window.results[name] = what; }};
for (const name of ["screen_jpg", "screen_mjpeg", "shot"]) {{
  const img = new Image();
  img.onload = () => report(name, "loaded " + img.naturalWidth + "x" + img.naturalHeight);
  img.onerror = () => report(name, "error");
  img.src = urls[name];
  document.body.appendChild(img);
}}
const script = document.createElement("script");
script.onload = () => report("script", "loaded");
script.onerror = () => report("script", "error");
script.src = urls.script;
document.body.appendChild(script);
const style = document.createElement("link");
style.rel = "stylesheet";
style.onload = () => report("style", "loaded");
style.onerror = () => report("style", "error");
style.href = urls.style;
document.head.appendChild(style);
const events = new EventSource(urls.events, {{withCredentials: true}});
events.onopen = () => report("events", "open");
events.onmessage = () => report("events", "message");
events.onerror = () => {{ report("events", "error"); events.close(); }};
const socket = new WebSocket(urls.socket);
socket.onopen = () => report("socket", "open");
socket.onmessage = () => report("socket", "message");
socket.onerror = () => report("socket", "error");
for (const name of ["state", "approvals"]) {{
  fetch(urls[name], {{credentials: "include"}})
    .then(r => r.text().then(t => report(name, "read " + r.status + " " + t)), () => report(name, "blocked"));
}}
fetch(urls.opaque, {{credentials: "include", mode: "no-cors"}}).then(r => report("opaque", "sent " + r.type),
                                                                    () => report("opaque", "blocked"));
</script>
<a id="open" href="{run}">the run</a>
</body>"""


def test_another_local_page_gets_no_stream_image_or_data_of_the_console(
        browser, console, live_desktop, other_site, caplog):
    from playwright.sync_api import expect

    caplog.set_level(logging.INFO, logger="controller.console")
    live, _runner = live_desktop
    (live.record_dir / "shot-0001.png").write_bytes(_png(64, 40))
    origin, pages, _seen = other_site
    context = browser.new_context()
    person = context.new_page()
    person.goto(console.url)  # the person logs in: the browser holds the console's cookie from now on
    assert person.url == console.base + "/"
    # the person's own page: the live screen and the event stream work (same origin)
    person.goto(f"{console.base}/runs/{LIVE_ID}", wait_until="domcontentloaded")  # a stream: no load event
    expect(person.locator("#conn")).to_have_text("live")
    person.wait_for_function("() => document.getElementById('screen-img').naturalWidth > 0")

    answers: list = []
    context.on("response", lambda r: answers.append(r) if r.url.startswith(console.base) else None)
    failed: list = []
    context.on("requestfailed", lambda r: failed.append((r.url, r.failure)) if r.url.startswith(console.base) else None)
    pages["/attack"] = _attack_page(console.base)
    attacker = context.new_page()
    attacker.goto(origin + "/attack", wait_until="domcontentloaded")
    attacker.wait_for_function(f"() => {json.dumps(list(PROBES))}.every(name => name in window.results)")
    results = attacker.evaluate("window.results")
    # nothing loaded, opened or read
    for name in ("screen_jpg", "screen_mjpeg", "shot", "script", "style", "events", "socket"):
        assert results[name] == "error", (name, results)
    for name in ("state", "approvals"):
        assert results[name] == "blocked", (name, results)

    # what the console answered each of them: 403, never the data, CORP same-origin; a request the
    # browser sends in CORS mode names the other page's Origin (bad_origin), the others say their
    # Sec-Fetch-Site: same-site (cross_site)
    run = f"/runs/{LIVE_ID}"
    expected = {(f"{run}/screen.jpg", "cross_site"), (f"{run}/screen.mjpeg", "cross_site"),
                (f"{run}/shots/shot-0001.png", "cross_site"), ("/static/console.js", "cross_site"),
                ("/static/console.css", "cross_site"), (run, "cross_site"), (f"{run}/state", "cross_site"),
                (f"{run}/events", "bad_origin"), (f"{run}/state", "bad_origin"), (f"{run}/approvals", "bad_origin"),
                (f"{run}/live", "bad_origin")}

    def refused() -> set[tuple[str, str]]:
        found = set()
        for record in caplog.records:
            parts = record.getMessage().split(" ")  # refused GET|WEBSOCKET <path>: 403 <code>
            if record.name == "controller.console" and parts[0] == "refused" and parts[3] == "403":
                found.add((parts[2].rstrip(":"), parts[4]))
        return found

    until(lambda: expected <= refused(), what="the console to refuse every cross-site request")
    # the browser's view: it hands the other page none of the answers; those it fetched without CORS it
    # blocks for their Cross-Origin-Resource-Policy, the one document (the frame) is a 403
    not_cors = {console.auth.base + path for path in (f"{run}/screen.jpg", f"{run}/screen.mjpeg",
                                                     f"{run}/shots/shot-0001.png", "/static/console.js",
                                                     "/static/console.css", f"{run}/state")}
    until(lambda: not_cors <= {urlsplit(url).path for url, why in list(failed)
                               if why == "net::ERR_BLOCKED_BY_RESPONSE.NotSameOrigin"},
          what="the browser to block every answer for its Cross-Origin-Resource-Policy")
    theirs = [answer for answer in answers if answer.frame.page == attacker]
    assert theirs, answers
    for answer in theirs:
        assert answer.status == 403, (answer.url, answer.status)
        assert answer.headers.get("cross-origin-resource-policy") == "same-origin", answer.url

    # a window that page opens on the console shows the person the run, and the page keeps no handle
    # on it (Cross-Origin-Opener-Policy: the console's window is in a group of its own)
    with context.expect_page() as opened:
        attacker.evaluate(f"window.popup = window.open({json.dumps(console.base + run)})")
    popup = opened.value
    expect(popup.locator("#conn")).to_have_text("live")
    attacker.wait_for_function("() => window.popup.closed")
    popup.close()

    # a link on that page to the console is a navigation the person makes: the page opens and shows
    # the run as the person's own tab does
    attacker.click("#open")
    expect(attacker.locator("#conn")).to_have_text("live")
    assert attacker.url == f"{console.base}/runs/{LIVE_ID}"
    attacker.wait_for_function("() => document.getElementById('screen-img').naturalWidth > 0")
    context.close()
