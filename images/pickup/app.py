"""Pickup desk: the demo web app served inside the guest on 127.0.0.1:8080.

A form (name, date, time window, items) books a pickup and issues a confirmation number
``PU-NNNNNN``. Records live in SQLite (WAL mode) at ``$PICKUP_DATA_DIR/pickup.db``, default
``~/.local/share/pickup/pickup.db`` of the user running it.

The layout is fixed (absolute positions, no scrolling) for a 1280x800 kiosk browser window, so a
scripted run can rely on coordinates: see ``LAYOUT``. The confirmation number is shown large with
``user-select: all``, so a double-click selects the whole number (into the X PRIMARY selection).

When a page has loaded and painted, it posts to ``/api/seen`` and the app touches
``page-loaded`` next to the database: the controller waits for that file before a run starts.

Started by the image's supervisor (``images/session/pickup.py``) as
``python -m uvicorn app:app --host 127.0.0.1 --port 8080 --app-dir images/pickup``.
"""

from __future__ import annotations

import html
import os
import re
import secrets
import sqlite3
import threading
from datetime import date
from pathlib import Path

from urllib.parse import parse_qs

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse

WINDOWS = ("09:00-12:00", "12:00-15:00", "15:00-18:00")

# Page coordinates (CSS px == screen px in a 1280x800 kiosk window) of what a script clicks.
LAYOUT = {
    "name": (640, 250),
    "date": (640, 330),
    "window": {w: (530 + 180 * i, 412) for i, w in enumerate(WINDOWS)},
    "items": (640, 490),
    "book": (640, 580),
    "confirmation": (640, 330),
}


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
html, body { margin: 0; width: 1280px; height: 800px; overflow: hidden; background: #f4f1ea;
  font-family: 'DejaVu Sans', sans-serif; color: #222; }
#top { position: absolute; left: 0; top: 0; width: 1280px; height: 110px; background: #23395d; color: #fff; }
#top h1 { position: absolute; left: 60px; top: 22px; margin: 0; font-size: 44px; }
#top p { position: absolute; left: 700px; top: 40px; margin: 0; font-size: 22px; }
label.f { position: absolute; left: 100px; width: 320px; font-size: 24px; text-align: right; }
input.t { position: absolute; left: 440px; width: 400px; height: 50px; font-size: 24px; padding: 0 12px;
  border: 2px solid #888; border-radius: 6px; background: #fff; }
.win { position: absolute; top: 390px; width: 170px; height: 44px; font-size: 20px; }
.win input { width: 22px; height: 22px; vertical-align: middle; margin: 0 6px 0 0; }
#book { position: absolute; left: 540px; top: 550px; width: 200px; height: 60px; font-size: 26px;
  background: #2f7d32; color: #fff; border: 0; border-radius: 8px; }
#err { position: absolute; left: 200px; top: 640px; width: 880px; font-size: 22px; color: #b00020; }
#done { position: absolute; left: 340px; top: 180px; width: 600px; font-size: 28px; text-align: center; }
#conf { position: absolute; left: 390px; top: 280px; width: 500px; height: 100px; line-height: 100px;
  font: bold 56px 'DejaVu Sans Mono', monospace; line-height: 94px; text-align: center; background: #fff;
  border: 3px solid #23395d; border-radius: 10px; user-select: all; -moz-user-select: all; }
#details { position: absolute; left: 340px; top: 420px; width: 600px; font-size: 22px; text-align: center; }
#again { position: absolute; left: 540px; top: 560px; width: 200px; font-size: 22px; text-align: center; }
"""

SEEN = """<script>
window.addEventListener('load', () => requestAnimationFrame(() => requestAnimationFrame(() =>
  fetch('/api/seen', {method: 'POST'}))));
</script>"""


def page(body: str, title: str = "Pickup desk") -> HTMLResponse:
    return HTMLResponse(
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{STYLE}</style></head><body>"
        f"<div id='top'><h1>Pickup desk</h1><p>Book a parcel pickup</p></div>{body}{SEEN}</body></html>"
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
<form method='post' action='/book' autocomplete='off'>
  <label class='f' style='top:237px' for='name'>Name</label>
  <input class='t' style='top:225px' id='name' name='name' value='{v.get("name", "")}'>
  <label class='f' style='top:317px' for='date'>Date</label>
  <input class='t' style='top:305px' id='date' name='date' placeholder='YYYY-MM-DD' value='{v.get("date", "")}'>
  <label class='f' style='top:398px'>Time window</label>
  {radios}
  <label class='f' style='top:477px' for='items'>Items</label>
  <input class='t' style='top:465px' id='items' name='items' value='{v.get("items", "")}'>
  <button id='book' type='submit'>Book</button>
</form>
<div id='err'>{html.escape(error)}</div>"""
    return page(body)


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
def index() -> HTMLResponse:
    return form()


@app.post("/book", response_model=None)
async def book(request: Request) -> HTMLResponse | RedirectResponse:
    # application/x-www-form-urlencoded, parsed with the stdlib (no multipart dependency).
    fields = parse_qs((await request.body()).decode("utf-8", errors="replace"), keep_blank_values=True)
    name, day, time_window, items = (fields.get(k, [""])[0] for k in ("name", "date", "time_window", "items"))
    return _book(name, day, time_window, items)


def _book(name: str, date: str, time_window: str, items: str) -> HTMLResponse | RedirectResponse:
    error = validate(name, date, time_window, items)
    if error:
        return form(error, {"name": name, "date": date, "time_window": time_window, "items": items})
    with _lock:
        conn = connect()
        try:
            while True:
                confirmation = f"PU-{secrets.randbelow(900000) + 100000}"
                try:
                    with conn:
                        conn.execute(
                            "INSERT INTO pickups (confirmation, name, date, time_window, items) VALUES (?,?,?,?,?)",
                            (confirmation, name.strip(), date.strip(), time_window, items.strip()),
                        )
                    break
                except sqlite3.IntegrityError:
                    continue
        finally:
            conn.close()
    return RedirectResponse(f"/pickups/{confirmation}", status_code=303)


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
    conf, name, day, window, items = (html.escape(x) for x in row)
    body = f"""
<div id='done'>Pickup booked. Your confirmation number:</div>
<div id='conf'>{conf}</div>
<div id='details'>{name} &middot; {day} &middot; {window}<br>{items}</div>
<div id='again'><a href='/'>Book another</a></div>"""
    return page(body, title=f"Pickup {conf}")


@app.post("/api/seen")
def seen() -> JSONResponse:
    marker = data_dir() / "page-loaded"
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.touch()
    return JSONResponse({"status": "ok"})


@app.get("/livez")
def livez() -> dict[str, str]:
    return {"status": "ok"}
