"""The server's state in one SQLite file: sessions, their events and their items.

``runs/agents.db`` by default, journal in WAL mode, one writer: the serving process holds an exclusive
``flock`` on ``<db>.lock`` for its whole life (a second server on the same file is refused,
:class:`StoreBusy`, naming the holder the lock file records), and every statement goes through one
connection under one lock, so events are numbered in the order they happened.

Files: the database, SQLite's ``-wal`` and ``-shm`` beside it and the lock file are mode 0600 whatever
the umask (the database is made 0600 before SQLite opens it, and SQLite gives its own files the
database's mode; files an older server left with wider modes are narrowed). Each is opened without
following a symlink and must be a regular file of the server's user, in a folder that only that user
may write (:func:`private_folder_problem`): otherwise :class:`StoreError` says which and why, so nobody
else can read the sessions, replace the files or hold the lock.

Tables (JSON columns hold the API's own shapes, strings already escaped where they came from the
model, a page or the guest):

* ``sessions``: ``id``, ``created_at`` (unix s), ``status``, ``deleted`` (0/1), ``owner``
  (``host:pid`` of the server that ran it), ``backend``, ``sandbox_id``, ``data`` (the session's
  settings: agent, environment, metadata, error, task);
* ``events``: ``seq`` (one counter for every session: the SSE ``id`` is ``evt_<seq>``),
  ``session_id``, ``type``, ``data`` (the event without ``event_id``);
* ``items``: ``seq``, ``id`` (unique per session), ``session_id``, ``data`` (the item, rewritten
  when the item changes: an in-progress call completed);
* ``meta``: ``key``, ``value``: ``store_id``, 16 random hex digits made with the database
  (:attr:`Store.store_id`: the label that ties a sandbox to this database).
"""

from __future__ import annotations

import fcntl
import grp
import json
import os
import pwd
import secrets
import sqlite3
import stat
import threading
import time
from pathlib import Path
from typing import Any

from controller.model.errors import DesktopSandboxError
from controller.text import clean

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
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""
FILE_MODE = 0o600
"""Mode of the database, its ``-wal`` and ``-shm`` files and its lock file."""
SQLITE_SIDE_FILES = ("-wal", "-shm")
"""Suffixes of the files SQLite keeps beside the database in WAL mode."""
LOCK_HOLDER_MAX = 256
"""Most bytes read from the lock file for the holder's name."""


class StoreError(DesktopSandboxError, RuntimeError):
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


def private_group(gid: int) -> bool:
    """Whether group ``gid`` is this user's alone: no other user has it as a member or as the primary
    group (a user private group: a umask of 002 makes folders writable by it)."""
    uid = os.geteuid()
    try:
        me = pwd.getpwuid(uid).pw_name
        members = grp.getgrgid(gid).gr_mem
    except KeyError:
        return False
    return all(m == me for m in members) and all(e.pw_gid != gid or e.pw_uid == uid for e in pwd.getpwall())


def private_folder_problem(folder: Path) -> str | None:
    """Why ``folder`` is not one only this server's user may write (another user owns it, others may
    write it, or a group that is not the user's private one may), or None when it is. Raises OSError
    when it cannot be looked at."""
    st = os.stat(folder)
    if st.st_uid != os.geteuid():
        return f"its folder {folder} belongs to uid {st.st_uid}, not to this server's user (uid {os.geteuid()})"
    if st.st_mode & stat.S_IWOTH:
        return f"others may write its folder {folder} (mode {stat.S_IMODE(st.st_mode):o}): chmod o-w it"
    if st.st_mode & stat.S_IWGRP and not private_group(st.st_gid):
        return (f"group {st.st_gid} may write its folder {folder} (mode {stat.S_IMODE(st.st_mode):o}): "
                "chmod g-w it")
    return None


def open_private(path: Path, *, create: bool) -> int | None:
    """An ``O_RDWR`` descriptor of ``path``: a regular file of this user, not reached through a
    symlink, made :data:`FILE_MODE` (created so when ``create``, narrowed when an older file is wider).
    None when it does not exist and ``create`` is false. Raises :class:`StoreError` naming the file
    and what is wrong with it."""
    flags = os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY | (os.O_CREAT if create else 0)
    try:
        fd = os.open(path, flags, FILE_MODE)
    except FileNotFoundError:
        if create:
            raise StoreError(f"cannot create {path}: its folder is missing") from None
        return None
    except OSError as exc:
        if os.path.islink(path):
            raise StoreError(f"{path} is a symbolic link: the server opens its files only where they are") from None
        raise StoreError(f"cannot open {path}: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise StoreError(f"{path} is not a regular file")
        if st.st_uid != os.geteuid():
            raise StoreError(f"{path} belongs to uid {st.st_uid}, not to this server's user (uid {os.geteuid()}): "
                             "move it away")
        if stat.S_IMODE(st.st_mode) != FILE_MODE:
            os.fchmod(fd, FILE_MODE)
    except BaseException:
        os.close(fd)
        raise
    return fd


class Store:
    """The database at ``path`` (created with its folder, 0755, when missing; files as in the module
    docstring). Raises :class:`StoreBusy` when another process holds it, :class:`StoreError` for files
    or a folder others could read, replace or lock, or a damaged database. Thread-safe: one
    connection, one lock."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
        try:
            problem = private_folder_problem(self.path.parent)
        except OSError as exc:
            raise StoreError(f"cannot look at the folder of {self.path}: {exc.strerror or exc}") from None
        if problem:
            raise StoreError(f"{self.path} cannot be served from: {problem}")
        lock_path = Path(str(self.path) + ".lock")
        lock_fd = open_private(lock_path, create=True)
        assert lock_fd is not None
        self._lock_fd = lock_fd
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(lock_fd)
            os.close(lock_fd)
            raise StoreBusy(f"{self.path} is in use by another server{f' ({holder})' if holder else ''}: its "
                            f"lock {lock_path} is held; stop that server or use another --runs-dir / --db") from None
        try:
            os.ftruncate(lock_fd, 0)
            os.pwrite(lock_fd, f"{owner_label()}\n".encode(), 0)
            for fd in (open_private(self.path, create=True),
                       *(open_private(Path(str(self.path) + suffix), create=False) for suffix in SQLITE_SIDE_FILES)):
                if fd is not None:
                    os.close(fd)
        except BaseException:
            self._release_lock()
            raise
        self._lock = threading.Lock()
        try:
            self._db = sqlite3.connect(str(self.path), check_same_thread=False, isolation_level=None, timeout=10)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.executescript(SCHEMA)
            self._db.execute("SELECT count(*) FROM sessions").fetchone()
            self._db.execute("INSERT OR IGNORE INTO meta (key, value) VALUES ('store_id', ?)", (secrets.token_hex(8),))
            self.store_id: str = str(self._db.execute("SELECT value FROM meta WHERE key = 'store_id'").fetchone()[0])
            """This database's id (16 hex digits, kept in it): every session's sandbox carries it as a label."""
        except sqlite3.DatabaseError as exc:
            self._release_lock()
            raise StoreError(f"{self.path} is not a usable database ({exc}); move it away to start with an "
                             "empty one") from None

    def _release_lock(self) -> None:
        fd, self._lock_fd = self._lock_fd, -1
        if fd >= 0:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def close(self) -> None:
        """Close the connection and release the lock."""
        with self._lock:
            self._db.close()
        self._release_lock()

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


def _read_holder(fd: int) -> str:
    """The holder a lock file names (``host:pid``, escaped), or ``""``."""
    try:
        text = os.pread(fd, LOCK_HOLDER_MAX, 0).decode("utf-8", "replace").strip()
    except OSError:
        return ""
    host, _, rest = text.partition(":")
    pid = rest.partition(":")[0]
    return clean(f"{host}:{pid}", 120) if host and pid.isdigit() else ""


_INSTANCE = secrets.token_hex(8)


def owner_label() -> str:
    """``host:pid:instance`` of this server process: who runs a session, so a later server knows a dead
    one's sessions. The random instance part tells two servers apart that had the same pid (a server
    restarted as pid 1 of a container or another pid namespace)."""
    return f"{os.uname().nodename}:{os.getpid()}:{_INSTANCE}"


def now() -> int:
    """Unix time in whole seconds (the API's timestamps)."""
    return int(time.time())
