"""The server's state in one SQLite file: sessions, their events and their items.

``runs/agents.db`` by default, journal in WAL mode, one writer: the serving process holds an exclusive
``flock`` on ``<db>.lock`` for its whole life (a second server on the same file is refused,
:class:`StoreBusy`), and every statement goes through one connection under one lock, so events are
numbered in the order they happened.

Tables (JSON columns hold the API's own shapes, strings already escaped where they came from the
model, a page or the guest):

* ``sessions``: ``id``, ``created_at`` (unix s), ``status``, ``deleted`` (0/1), ``owner``
  (``host:pid`` of the server that ran it), ``backend``, ``sandbox_id``, ``data`` (the session's
  settings: agent, environment, metadata, error, task);
* ``events``: ``seq`` (one counter for every session: the SSE ``id`` is ``evt_<seq>``),
  ``session_id``, ``type``, ``data`` (the event without ``event_id``);
* ``items``: ``seq``, ``id`` (unique per session), ``session_id``, ``data`` (the item, rewritten
  when the item changes: an in-progress call completed).
"""

from __future__ import annotations

import fcntl
import json
import os
import secrets
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
  id TEXT PRIMARY KEY, created_at INTEGER NOT NULL, status TEXT NOT NULL, deleted INTEGER NOT NULL DEFAULT 0,
  owner TEXT NOT NULL, backend TEXT NOT NULL, sandbox_id TEXT, data TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS events (
  seq INTEGER PRIMARY KEY AUTOINCREMENT, session_id TEXT NOT NULL, type TEXT NOT NULL, data TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS events_by_session ON events (session_id, seq);
CREATE TABLE IF NOT EXISTS items (
  seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL, session_id TEXT NOT NULL, data TEXT NOT NULL,
  UNIQUE (session_id, id));
"""


class StoreError(RuntimeError):
    """The database cannot be served from (its message says why and what to do)."""


class StoreBusy(StoreError):
    """Another process serves from this database (it holds ``<db>.lock``)."""


def event_id(seq: int) -> str:
    """The public id of the event numbered ``seq``: ``evt_`` and the number (the SSE ``id``)."""
    return f"evt_{seq}"


def event_seq(text: str) -> int | None:
    """The number in an event id (``evt_123`` -> 123); None for anything else."""
    if not isinstance(text, str) or not text.startswith("evt_") or len(text) > 24:
        return None
    digits = text[4:]
    if not (digits.isascii() and digits.isdigit()) or len(digits) > 18:  # SQLite's integers end at 2**63 - 1
        return None
    return int(digits)


class Store:
    """The database at ``path`` (created with its folder when missing). Raises :class:`StoreBusy`
    when another process holds it. Thread-safe: one connection, one lock."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock_file = open(str(self.path) + ".lock", "a+")  # noqa: SIM115 - held for the store's life
        try:
            fcntl.flock(self._lock_file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock_file.close()
            raise StoreBusy(f"{self.path} is in use by another server (its lock {self.path}.lock is held)") from None
        self._lock = threading.Lock()
        try:
            self._db = sqlite3.connect(str(self.path), check_same_thread=False, isolation_level=None, timeout=10)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.executescript(SCHEMA)
            self._db.execute("SELECT count(*) FROM sessions").fetchone()
        except sqlite3.DatabaseError as exc:
            fcntl.flock(self._lock_file.fileno(), fcntl.LOCK_UN)
            self._lock_file.close()
            raise StoreError(f"{self.path} is not a usable database ({exc}); move it away to start with an "
                             "empty one") from None

    def close(self) -> None:
        """Close the connection and release the lock."""
        with self._lock:
            self._db.close()
        fcntl.flock(self._lock_file.fileno(), fcntl.LOCK_UN)
        self._lock_file.close()

    # -- sessions ------------------------------------------------------------------------------------
    def add_session(self, session_id: str, data: dict[str, Any], *, owner: str, backend: str) -> None:
        with self._lock:
            self._db.execute("INSERT INTO sessions (id, created_at, status, owner, backend, data) VALUES (?,?,?,?,?,?)",
                             (session_id, int(data["created_at"]), "idle", owner, backend, json.dumps(data)))

    def update_session(self, session_id: str, *, status: str | None = None, data: dict[str, Any] | None = None,
                       sandbox_id: str | None = None, deleted: bool | None = None) -> None:
        sets, args = [], []
        for column, value in (("status", status), ("sandbox_id", sandbox_id),
                              ("data", None if data is None else json.dumps(data)),
                              ("deleted", None if deleted is None else int(deleted))):
            if value is not None:
                sets.append(f"{column} = ?")
                args.append(value)
        if sets:
            with self._lock:
                self._db.execute(f"UPDATE sessions SET {', '.join(sets)} WHERE id = ?", (*args, session_id))

    def session(self, session_id: str) -> dict[str, Any] | None:
        """``{"id", "created_at", "status", "deleted", "owner", "backend", "sandbox_id", "data"}`` or None."""
        with self._lock:
            row = self._db.execute("SELECT id, created_at, status, deleted, owner, backend, sandbox_id, data "
                                   "FROM sessions WHERE id = ?", (session_id,)).fetchone()
        return None if row is None else _session_row(row)

    def sessions(self, *, include_deleted: bool = False) -> list[dict[str, Any]]:
        """Every session, oldest first."""
        where = "" if include_deleted else "WHERE deleted = 0"
        with self._lock:
            rows = self._db.execute("SELECT id, created_at, status, deleted, owner, backend, sandbox_id, data "
                                    f"FROM sessions {where} ORDER BY rowid").fetchall()
        return [row for row in map(_session_row, rows) if row is not None]

    # -- events --------------------------------------------------------------------------------------
    def add_event(self, session_id: str, event: dict[str, Any]) -> int:
        """Store ``event`` (no ``event_id``: it is ``evt_<seq>``); returns its ``seq``."""
        with self._lock:
            cursor = self._db.execute("INSERT INTO events (session_id, type, data) VALUES (?,?,?)",
                                      (session_id, event["type"], json.dumps(event)))
            return int(cursor.lastrowid)

    def events_after(self, session_id: str, seq: int, limit: int = 500) -> list[tuple[int, dict[str, Any]]]:
        """The session's events numbered above ``seq``, in order, at most ``limit``."""
        with self._lock:
            rows = self._db.execute("SELECT seq, data FROM events WHERE session_id = ? AND seq > ? ORDER BY seq "
                                    "LIMIT ?", (session_id, seq, limit)).fetchall()
        return [(int(s), event) for s, event in ((s, _object(d)) for s, d in rows) if event is not None]

    def event_session(self, seq: int) -> str | None:
        """The session the event ``seq`` belongs to, or None."""
        with self._lock:
            row = self._db.execute("SELECT session_id FROM events WHERE seq = ?", (seq,)).fetchone()
        return None if row is None else row[0]

    def last_seq(self, session_id: str) -> int:
        """The number of the session's latest event (0 when it has none)."""
        with self._lock:
            row = self._db.execute("SELECT max(seq) FROM events WHERE session_id = ?", (session_id,)).fetchone()
        return int(row[0] or 0)

    # -- items ---------------------------------------------------------------------------------------
    def put_item(self, session_id: str, item: dict[str, Any]) -> None:
        """Add the item, or rewrite it in place (same ``id``: its position in the list is kept)."""
        with self._lock:
            self._db.execute("INSERT INTO items (id, session_id, data) VALUES (?,?,?) "
                             "ON CONFLICT (session_id, id) DO UPDATE SET data = excluded.data",
                             (item["id"], session_id, json.dumps(item)))

    def items(self, session_id: str, *, after: str | None, limit: int, order: str) -> tuple[list[dict[str, Any]], bool]:
        """One page of the session's items: ``(items, has_more)``, ``order`` asc | desc, starting after the
        item ``after`` (KeyError when the session has no such item)."""
        op, direction = (">", "ASC") if order == "asc" else ("<", "DESC")
        with self._lock:
            start = None
            if after is not None:
                row = self._db.execute("SELECT seq FROM items WHERE session_id = ? AND id = ?",
                                       (session_id, after)).fetchone()
                if row is None:
                    raise KeyError(after)
                start = row[0]
            where = "session_id = ?" + (f" AND seq {op} ?" if start is not None else "")
            args: tuple[Any, ...] = (session_id,) + ((start,) if start is not None else ())
            rows = self._db.execute(f"SELECT data FROM items WHERE {where} ORDER BY seq {direction} LIMIT ?",
                                    (*args, limit + 1)).fetchall()
        data = [item for item in (_object(r[0]) for r in rows) if item is not None]
        return data[:limit], len(data) > limit


def _object(text: Any) -> dict[str, Any] | None:
    """A stored JSON object, or None when the row does not hold one (a damaged row is passed over, so
    one bad row never makes the rest unreadable)."""
    try:
        value = json.loads(text)
    except (TypeError, ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def _session_row(row: tuple) -> dict[str, Any] | None:
    keys = ("id", "created_at", "status", "deleted", "owner", "backend", "sandbox_id", "data")
    out = dict(zip(keys, row))
    out["deleted"] = bool(out["deleted"])
    out["data"] = _object(out["data"])
    return out if out["data"] is not None else None


_INSTANCE = secrets.token_hex(8)


def owner_label() -> str:
    """``host:pid:instance`` of this server process: who runs a session, so a later server knows a dead
    one's sessions. The random instance part tells two servers apart that had the same pid (a server
    restarted as pid 1 of a container or another pid namespace)."""
    return f"{os.uname().nodename}:{os.getpid()}:{_INSTANCE}"


def now() -> int:
    """Unix time in whole seconds (the API's timestamps)."""
    return int(time.time())
