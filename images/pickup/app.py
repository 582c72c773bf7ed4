"""Pickup desk: the demo web app served inside the guest on 127.0.0.1:8080.

A form (name, date, time window, items) books a pickup and issues a confirmation number
``PU-NNNNNN``. Records live in SQLite (WAL mode) at ``$PICKUP_DATA_DIR/pickup.db``, default
``~/.local/share/pickup/pickup.db`` of the user running it.

The layout is fixed (absolute positions, no scrolling) for the guest desktop's browser window (the
top of the 1280x800 screen, above the terminal strip; see ``VIEWPORT``, ``CHROME_PX``), so a scripted
run can rely on coordinates: see ``LAYOUT``. Booking happens in the page (``POST /api/book``) with a
moving progress bar until the confirmation replaces it, so the screen does not rest while a booking
is in flight: a client that waits for the screen to settle sees the result. The confirmation number is shown large with ``user-select: all``, so one click selects the
whole number (into the X PRIMARY selection) and the page then shows it white on blue.

When a page has loaded and painted, it posts to ``/api/seen`` and the app touches
``page-loaded`` next to the database: the controller waits for that file before a run starts.

Started by the image's supervisor (``images/session/pickup.py``) as
``python -m uvicorn app:app --host 127.0.0.1 --port 8080 --app-dir images/pickup``.
"""

from __future__ import annotations

import asyncio
import html
import os
import re
import hashlib
import sqlite3
import threading
from datetime import date
from pathlib import Path

from urllib.parse import parse_qs

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse

WINDOWS = ("09:00-12:00", "12:00-15:00", "15:00-18:00")

# The page is laid out for the guest's fixed desktop (images/openbox/rc.xml): on the 1280x800 screen
# the browser window covers x 0..1279, y 0..579 and its tab strip and navigation bar take the top
# CHROME_PX, so the page's viewport is VIEWPORT (CSS px == screen px at 100 % zoom) with its origin at
# screen (0, CHROME_PX). The terminal strip below (y 580..799) is left to the terminal.
VIEWPORT = (1280, 494)
CHROME_PX = 86  # firefox-esr (Debian bookworm), default theme and density, no notification bars

# Page coordinates (CSS px, viewport origin) of what a script clicks; on screen, y + CHROME_PX.
LAYOUT = {
    "name": (640, 108),
    "date": (640, 166),
    "window": {w: (530 + 180 * i, 222) for i, w in enumerate(WINDOWS)},
    "items": (640, 276),
    "book": (640, 342),
    "confirmation": (640, 175),
}


def on_screen(point: tuple[int, int]) -> tuple[int, int]:
    """Screen px (1280x800 guest desktop) of a page point from ``LAYOUT``."""
    return point[0], point[1] + CHROME_PX


#: Seconds each in-page booking request takes (``$PICKUP_BOOK_DELAY_S``, default 0): a slow server,
#: to show that a client waiting for the screen to settle still sees the booking's result.
BOOK_DELAY_S = float(os.environ.get("PICKUP_BOOK_DELAY_S") or 0)


def data_dir() -> Path:
    """Where the database lives: ``$PICKUP_DATA_DIR`` or ``~/.local/share/pickup``."""
    return Path(os.environ.get("PICKUP_DATA_DIR") or Path.home() / ".local/share/pickup")


_lock = threading.Lock()


def connect() -> sqlite3.Connection:
    """Open (and create if needed) the database in WAL mode."""
    directory = data_dir()
    directory.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(directory / "pickup.db")
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(
        """CREATE TABLE IF NOT EXISTS pickups (
               id INTEGER PRIMARY KEY,
               confirmation TEXT NOT NULL UNIQUE,
               name TEXT NOT NULL,
               date TEXT NOT NULL,
               time_window TEXT NOT NULL,
               items TEXT NOT NULL,
               created_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ','now'))
           )"""
    )
    return conn


STYLE = """
* { box-sizing: border-box; }
html, body { margin: 0; width: 1280px; height: 494px; overflow: hidden; background: #f4f1ea;
  font-family: 'DejaVu Sans', sans-serif; color: #222; }
#top { position: absolute; left: 0; top: 0; width: 1280px; height: 64px; background: #23395d; color: #fff; }
#top h1 { position: absolute; left: 40px; top: 11px; margin: 0; font-size: 34px; }
#top p { position: absolute; left: 700px; top: 20px; margin: 0; font-size: 20px; }
label.f { position: absolute; left: 100px; width: 320px; font-size: 22px; text-align: right; }
input.t { position: absolute; left: 440px; width: 400px; height: 44px; font-size: 22px; padding: 0 12px;
  border: 2px solid #888; border-radius: 6px; background: #fff; }
input.t:focus { border-color: #1d5fd1; outline: 3px solid #9bbcf0; }
.win { position: absolute; top: 204px; width: 170px; height: 36px; font-size: 19px; }
.win input { width: 22px; height: 22px; vertical-align: middle; margin: 0 6px 0 0; }
#book { position: absolute; left: 540px; top: 316px; width: 200px; height: 52px; font-size: 24px;
  background: #2f7d32; color: #fff; border: 0; border-radius: 8px; }
#err { position: absolute; left: 200px; top: 384px; width: 880px; font-size: 20px; color: #b00020; text-align: center; }
#busy { display: none; position: absolute; left: 440px; top: 384px; width: 400px; height: 40px;
  font-size: 18px; text-align: center; }
#busy div { height: 8px; margin-top: 6px; border-radius: 4px; background-size: 40px 8px;
  background-image: repeating-linear-gradient(90deg, #23395d 0 20px, #c9d3e3 20px 40px);
  animation: busy 0.4s linear infinite; }
@keyframes busy { from { background-position: 0 0; } to { background-position: 40px 0; } }
body.busy #busy { display: block; }
body.busy #err { display: none; }
#done { position: absolute; left: 340px; top: 84px; width: 600px; font-size: 26px; text-align: center; }
#conf { position: absolute; left: 390px; top: 130px; width: 500px; height: 90px;
  font: bold 52px 'DejaVu Sans Mono', monospace; line-height: 84px; text-align: center; background: #fff;
  border: 3px solid #23395d; border-radius: 10px; user-select: all; -moz-user-select: all; }
#conf.selected { background: #1d5fd1; border-color: #1d5fd1; color: #fff; }
#details { position: absolute; left: 340px; top: 240px; width: 600px; font-size: 20px; text-align: center; }
#again { position: absolute; left: 540px; top: 320px; width: 200px; font-size: 20px; text-align: center; }
"""

SEEN = """<script>
window.addEventListener('load', () => requestAnimationFrame(() => requestAnimationFrame(() =>
  fetch('/api/seen', {method: 'POST'}))));
</script>"""

# The confirmation number turns white on blue while the selection holds exactly that number, so a
# screenshot shows plainly that it is selected. (It is ``user-select: all``: one click selects it all,
# and a click inside a selection clears it, so a double-click ends with nothing selected.)
SELECTED = """<script>
document.addEventListener('selectionchange', () => {
  const conf = document.getElementById('conf');
  if (conf) conf.classList.toggle('selected', document.getSelection().toString().trim() === conf.textContent.trim());
});
</script>"""

# Booking without a page load: from the submit until the result is in the page, the progress bar in
# #busy moves (so the screen keeps changing), and the result replaces it in the same frame. A client
# that waits for the screen to settle after the Return that books therefore sees the confirmation (or
# the error), never the form while the booking is in flight, however long the booking takes. Without
# script the form posts to /book as usual.
BOOK_SCRIPT = """<script>
const form = document.getElementById('book-form');
form.addEventListener('submit', async (event) => {
  event.preventDefault();
  if (document.body.classList.contains('busy')) return;
  document.body.classList.add('busy');
  let data;
  try {
    const resp = await fetch('/api/book', {method: 'POST', body: new URLSearchParams(new FormData(form))});
    data = await resp.json();
  } catch (e) {
    data = {error: {code: 'unreachable', message: 'The booking could not be sent. Try again.'}};
  }
  if (data.error) {
    document.getElementById('err').textContent = data.error.message;
  } else {
    document.getElementById('main').innerHTML = data.html;
    document.title = data.title;
    history.replaceState(null, '', data.url);
  }
  document.body.classList.remove('busy');
});
</script>"""


def page(body: str, title: str = "Pickup desk", script: str = "") -> HTMLResponse:
    return HTMLResponse(
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{STYLE}</style></head><body>"
        f"<div id='top'><h1>Pickup desk</h1><p>Book a parcel pickup</p></div>"
        f"<div id='main'>{body}</div>{script}{SELECTED}{SEEN}</body></html>"
    )


def form(error: str = "", values: dict[str, str] | None = None) -> HTMLResponse:
    v = {k: html.escape(x, quote=True) for k, x in (values or {}).items()}
    radios = "".join(
        f"<label class='win' style='left:{LAYOUT['window'][w][0] - 85}px'>"
        f"<input type='radio' name='time_window' value='{w}'{' checked' if v.get('time_window') == w else ''}>"
        f"{w}</label>"
        for w in WINDOWS
    )
    body = f"""
<form id='book-form' method='post' action='/book' autocomplete='off'>
  <label class='f' style='top:95px' for='name'>Name</label>
  <input class='t' style='top:86px' id='name' name='name' value='{v.get("name", "")}' autofocus>
  <label class='f' style='top:153px' for='date'>Date</label>
  <input class='t' style='top:144px' id='date' name='date' placeholder='YYYY-MM-DD' value='{v.get("date", "")}'>
  <label class='f' style='top:208px'>Time window</label>
  {radios}
  <label class='f' style='top:263px' for='items'>Items</label>
  <input class='t' style='top:254px' id='items' name='items' value='{v.get("items", "")}'>
  <button id='book' type='submit'>Book</button>
</form>
<div id='busy'>Booking&hellip;<div></div></div>
<div id='err'>{html.escape(error)}</div>"""
    return page(body, script=BOOK_SCRIPT)


def confirmation_html(row: tuple[str, str, str, str, str]) -> str:
    """The confirmation view's markup for a ``(confirmation, name, date, time_window, items)`` row."""
    conf, name, day, window, items = (html.escape(x) for x in row)
    return f"""
<div id='done'>Pickup booked. Your confirmation number:</div>
<div id='conf'>{conf}</div>
<div id='details'>{name} &middot; {day} &middot; {window}<br>{items}</div>
<div id='again'><a href='/'>Book another</a></div>"""


def validate(name: str, day: str, window: str, items: str) -> str:
    """An error message for bad input, or '' when the booking is valid."""
    if not name.strip():
        return "Name is required."
    if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", day.strip()):
        return "Date must be YYYY-MM-DD."
    try:
        date.fromisoformat(day.strip())
    except ValueError:
        return "Date is not a valid calendar date."
    if window not in WINDOWS:
        return "Choose a time window."
    if not items.strip():
        return "Items are required."
    return ""


app = FastAPI(title="Pickup desk", openapi_url=None, docs_url=None, redoc_url=None)


@app.on_event("startup")
def _startup() -> None:
    with _lock:
        connect().close()
    (data_dir() / "page-loaded").unlink(missing_ok=True)


@app.get("/", response_class=HTMLResponse)
def index(shift: int = 0) -> HTMLResponse:
    """The booking form; ``?shift=N`` (0-200) draws the form N px lower than ``LAYOUT`` says: a changed
    page, for a replay that must notice its recorded clicks no longer land where they did."""
    page_ = form()
    if 0 < shift <= 200:
        page_ = HTMLResponse(page_.body.decode("utf-8").replace(
            "</head>", f"<style>#book-form {{ transform: translateY({shift}px); }}</style></head>", 1))
    return page_


async def _fields(request: Request) -> tuple[str, str, str, str]:
    """name, date, time_window, items of an application/x-www-form-urlencoded body (stdlib parser,
    no multipart dependency); missing fields are ''."""
    fields = parse_qs((await request.body()).decode("utf-8", errors="replace"), keep_blank_values=True)
    name, day, time_window, items = (fields.get(k, [""])[0] for k in ("name", "date", "time_window", "items"))
    return name, day, time_window, items


@app.post("/book", response_model=None)
async def book(request: Request) -> HTMLResponse | RedirectResponse:
    """The form's plain POST (without script): the form again with the error, or 303 to the booking."""
    name, day, time_window, items = await _fields(request)
    error = validate(name, day, time_window, items)
    if error:
        return form(error, {"name": name, "date": day, "time_window": time_window, "items": items})
    return RedirectResponse(f"/pickups/{_insert(name, day, time_window, items)}", status_code=303)


@app.post("/api/book")
async def api_book(request: Request) -> JSONResponse:
    """The page's booking request (form-encoded fields). 200 ``{"confirmation", "url", "title", "html"}``
    (``html``: the confirmation view); 400 ``{"error": {"code": "invalid_booking", "message"}}``."""
    name, day, time_window, items = await _fields(request)
    if BOOK_DELAY_S:
        await asyncio.sleep(BOOK_DELAY_S)
    error = validate(name, day, time_window, items)
    if error:
        return JSONResponse({"error": {"code": "invalid_booking", "message": error}}, status_code=400)
    confirmation = _insert(name, day, time_window, items)
    row = (confirmation, name.strip(), day.strip(), time_window, items.strip())
    return JSONResponse({"confirmation": confirmation, "url": f"/pickups/{confirmation}",
                         "title": f"Pickup {confirmation}", "html": confirmation_html(row)})


def confirmation_number(name: str, day: str, time_window: str, items: str, attempt: int) -> str:
    """``PU-NNNNNN`` for a booking: derived from its details and how many bookings came before it (and
    ``attempt``, on a collision), so the same bookings on a fresh desk get the same numbers -- a
    recorded run replays onto the same screens (``desktop-sandbox replay``) -- and different ones
    different numbers."""
    digest = hashlib.sha256(f"{attempt}\x00{name}\x00{day}\x00{time_window}\x00{items}".encode()).digest()
    return f"PU-{int.from_bytes(digest[:8], 'big') % 900000 + 100000}"


def _insert(name: str, day: str, time_window: str, items: str) -> str:
    """Store a validated booking under a unique confirmation number (:func:`confirmation_number`);
    returns it."""
    with _lock:
        conn = connect()
        try:
            before = conn.execute("SELECT count(*) FROM pickups").fetchone()[0]
            attempt = before
            while True:
                confirmation = confirmation_number(name.strip(), day.strip(), time_window, items.strip(), attempt)
                attempt += 1
                try:
                    with conn:
                        conn.execute(
                            "INSERT INTO pickups (confirmation, name, date, time_window, items) VALUES (?,?,?,?,?)",
                            (confirmation, name.strip(), day.strip(), time_window, items.strip()),
                        )
                    return confirmation
                except sqlite3.IntegrityError:
                    continue
        finally:
            conn.close()


@app.get("/pickups/{confirmation}", response_class=HTMLResponse)
def show(confirmation: str) -> HTMLResponse:
    with _lock:
        conn = connect()
        try:
            row = conn.execute(
                "SELECT confirmation, name, date, time_window, items FROM pickups WHERE confirmation = ?",
                (confirmation,),
            ).fetchone()
        finally:
            conn.close()
    if row is None:
        return HTMLResponse(page("<div id='done'>No such pickup.</div>").body, status_code=404)
    return page(confirmation_html(row), title=f"Pickup {html.escape(row[0])}")


@app.post("/api/seen")
def seen() -> JSONResponse:
    marker = data_dir() / "page-loaded"
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.touch()
    return JSONResponse({"status": "ok"})


@app.get("/livez")
def livez() -> dict[str, str]:
    return {"status": "ok"}


# -- /pay: a page that moves its button on request (approvals bound to the screen) -------------------
# A "Pay €10" button at a fixed place (PAY_LAYOUT); the page polls /api/pay/state every ~100 ms and,
# once the state says "moved" (POST /api/pay/move, e.g. from a test with `docker exec`), moves the
# button PAY_MOVE_PX lower PAY_MOVE_DELAY_MS later: the screen a person approved a click on is no longer
# the screen the click would land on. A click on the button pays: POST /api/pay adds a row to the
# `payments` table of the app's database (what a task check reads) and the page shows the receipt.
# `/pay?clock=1` also shows a clock in the bottom right corner, redrawn every 200 ms: a screen that is
# never still, though nothing changes where the button is. Every mouse press on the page is logged
# (POST /api/pay/click, read back with GET /api/pay/clicks), so a test can tell "nothing was clicked"
# from "a click landed beside the button". The state lives in the app's process (one guest, one page):
# `moved` stays set until the app restarts.

PAY_LAYOUT = {
    "button": (640, 228),  # the button's centre, page px (on screen: y + CHROME_PX)
    "button_box": (560, 200, 160, 56),  # x, y, w, h, page px, before the move
    "receipt": (340, 410, 600, 30),  # where the receipt text shows once paid
    "clock": (1060, 444, 200, 40),  # the clock with ?clock=1
}
PAY_MOVE_PX = 120
"""How far (page px, downwards) the button moves once the state says ``moved``."""
PAY_MOVE_DELAY_MS = 300
"""Milliseconds between the page seeing ``moved`` and the button moving."""
PAY_AMOUNT_CENTS = 1000

_pay_state = {"moved": False}

PAY_STYLE = f"""<style>
#pay {{ position: absolute; left: {PAY_LAYOUT['button_box'][0]}px; top: {PAY_LAYOUT['button_box'][1]}px;
  width: {PAY_LAYOUT['button_box'][2]}px; height: {PAY_LAYOUT['button_box'][3]}px; font-size: 24px;
  background: #2f7d32; color: #fff; border: 0; border-radius: 8px; }}
#pay.moved {{ top: {PAY_LAYOUT['button_box'][1] + PAY_MOVE_PX}px; }}
#pay-note {{ position: absolute; left: 340px; top: 110px; width: 600px; font-size: 22px; text-align: center; }}
#receipt {{ position: absolute; left: {PAY_LAYOUT['receipt'][0]}px; top: {PAY_LAYOUT['receipt'][1]}px;
  width: {PAY_LAYOUT['receipt'][2]}px; height: {PAY_LAYOUT['receipt'][3]}px; font-size: 22px;
  text-align: center; color: #23395d; }}
#clock {{ position: absolute; left: {PAY_LAYOUT['clock'][0]}px; top: {PAY_LAYOUT['clock'][1]}px;
  width: {PAY_LAYOUT['clock'][2]}px; height: {PAY_LAYOUT['clock'][3]}px;
  font: bold 24px 'DejaVu Sans Mono', monospace; line-height: 40px; text-align: center;
  background: #fff; border: 2px solid #23395d; border-radius: 6px; }}
</style>"""

# Polls the state every ~100 ms until it says moved, then moves the button PAY_MOVE_DELAY_MS later;
# the button's click pays (one request at a time) and shows the receipt; the clock, when there is one,
# shows the time to a tenth of a second, redrawn every 200 ms.
PAY_SCRIPT = f"""<script>
const pay = document.getElementById('pay');
async function pollPayState() {{
  try {{
    const state = await (await fetch('/api/pay/state', {{cache: 'no-store'}})).json();
    if (state.moved) {{ setTimeout(() => pay.classList.add('moved'), {PAY_MOVE_DELAY_MS}); return; }}
  }} catch (e) {{}}
  setTimeout(pollPayState, 100);
}}
pollPayState();
document.addEventListener('mousedown', (event) => {{
  fetch('/api/pay/click', {{method: 'POST', headers: {{'Content-Type': 'application/json'}},
    body: JSON.stringify({{x: Math.round(event.clientX), y: Math.round(event.clientY), on_button: event.target === pay}})}});
}});
let paying = false;
pay.addEventListener('click', async () => {{
  if (paying) return;
  paying = true;
  try {{
    const data = await (await fetch('/api/pay', {{method: 'POST'}})).json();
    document.getElementById('receipt').textContent = 'Paid \\u20ac10.00 \\u00b7 receipt ' + data.receipt;
  }} finally {{ paying = false; }}
}});
const clock = document.getElementById('clock');
if (clock) {{
  const tick = () => {{
    const now = new Date();
    clock.textContent = now.toTimeString().slice(0, 8) + '.' + Math.floor(now.getMilliseconds() / 100);
  }};
  tick();
  setInterval(tick, 200);
}}
</script>"""


def connect_payments() -> sqlite3.Connection:
    """The database (:func:`connect`) with the payment page's tables: ``payments`` (``id``,
    ``amount_cents``, ``receipt`` ``PAY-NNNNNN`` from the row's id, ``created_at`` UTC ISO) and
    ``page_clicks`` (``x``, ``y`` viewport CSS px of each mouse press on the page, ``on_button`` 0/1,
    ``created_at``)."""
    conn = connect()
    conn.execute(
        """CREATE TABLE IF NOT EXISTS page_clicks (
               id INTEGER PRIMARY KEY,
               x INTEGER NOT NULL,
               y INTEGER NOT NULL,
               on_button INTEGER NOT NULL,
               created_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ','now'))
           )"""
    )
    conn.execute(
        """CREATE TABLE IF NOT EXISTS payments (
               id INTEGER PRIMARY KEY,
               amount_cents INTEGER NOT NULL,
               receipt TEXT,
               created_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ','now'))
           )"""
    )
    return conn


@app.get("/pay", response_class=HTMLResponse)
def pay_page(clock: int = 0) -> HTMLResponse:
    """The payment page (the comment above ``PAY_LAYOUT``); ``?clock=1`` adds the clock. Creates the
    ``payments`` table, so a check finds it empty (not missing) when nothing was paid."""
    with _lock:
        connect_payments().close()
    clock_html = "<div id='clock'></div>" if clock == 1 else ""
    body = (f"<div id='pay-note'>Order #1042 &middot; total &euro;10.00</div>"
            f"<button id='pay' type='button'>Pay &euro;10</button><div id='receipt'></div>{clock_html}")
    return page(body, title="Pay", script=PAY_STYLE + PAY_SCRIPT)


@app.get("/api/pay/state")
def pay_state() -> JSONResponse:
    """``{"moved": bool}``: whether the page is to move its button (``POST /api/pay/move``)."""
    return JSONResponse({"moved": _pay_state["moved"]}, headers={"Cache-Control": "no-store"})


@app.post("/api/pay/move")
def pay_move() -> JSONResponse:
    """Tell the page to move its button (it sees it within ~100 ms, moves it 300 ms later):
    ``{"moved": true}``."""
    _pay_state["moved"] = True
    return JSONResponse({"moved": True})


@app.post("/api/pay")
def pay() -> JSONResponse:
    """Record one payment of €10: ``{"receipt": "PAY-NNNNNN", "amount_cents": 1000}``."""
    with _lock:
        conn = connect_payments()
        try:
            with conn:
                row_id = conn.execute("INSERT INTO payments (amount_cents) VALUES (?)", (PAY_AMOUNT_CENTS,)).lastrowid
                receipt = f"PAY-{row_id:06d}"
                conn.execute("UPDATE payments SET receipt = ? WHERE id = ?", (receipt, row_id))
        finally:
            conn.close()
    return JSONResponse({"receipt": receipt, "amount_cents": PAY_AMOUNT_CENTS})


@app.post("/api/pay/click")
async def pay_click(request: Request) -> JSONResponse:
    """Log one mouse press on the payment page: body ``{"x", "y", "on_button"}`` (viewport CSS px,
    bool); ``{"logged": true}``, or 400 ``{"error": {"code": "invalid_click", "message"}}``."""
    try:
        data = await request.json()
        x, y, on_button = int(data["x"]), int(data["y"]), bool(data["on_button"])
    except (ValueError, TypeError, KeyError):
        return JSONResponse({"error": {"code": "invalid_click", "message": "expected {x, y, on_button}"}},
                            status_code=400)
    with _lock:
        conn = connect_payments()
        try:
            with conn:
                conn.execute("INSERT INTO page_clicks (x, y, on_button) VALUES (?, ?, ?)", (x, y, int(on_button)))
        finally:
            conn.close()
    return JSONResponse({"logged": True})


@app.get("/api/pay/clicks")
def pay_clicks() -> JSONResponse:
    """The payment page's state for a test: ``{"clicks": [{"x", "y", "on_button"}...], "payments": N,
    "moved": bool}`` (clicks in viewport CSS px, in order)."""
    with _lock:
        conn = connect_payments()
        try:
            clicks = conn.execute("SELECT x, y, on_button FROM page_clicks ORDER BY id").fetchall()
            payments = conn.execute("SELECT count(*) FROM payments").fetchone()[0]
        finally:
            conn.close()
    return JSONResponse({"clicks": [{"x": x, "y": y, "on_button": bool(b)} for x, y, b in clicks],
                         "payments": payments, "moved": _pay_state["moved"]})
