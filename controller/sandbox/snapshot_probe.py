"""The state proof's measurements, one program for both sides of a snapshot: run inside the guest (its
source passed to the guest's Python with ``-c``, its request as one JSON argument; standard library only,
no import of the project) to measure a live or restored guest, and imported on the host to measure a
files snapshot's tar archives the same way (:mod:`controller.sandbox.snapshot`).

What it measures, each bounded:

* a tree (a directory of the guest, or a tar archive of one): every regular file and symlink under it,
  by path relative to the tree, in sorted order, at most ``max_files`` entries (then ``truncated``); a
  regular file as ``{"size": bytes, "sha256": hex}``, its hash left out (``null``) once the hashed bytes
  would pass ``max_bytes`` or the file alone ``file_max`` bytes; a symlink as ``{"link": target}``.
  Directories, sockets, fifos and devices are not listed, nor any entry named in :data:`VOLATILE_NAMES`
  (at any depth).
* files by absolute path: ``{"size", "sha256"}``, ``null`` for a missing file, ``{"error": why}`` for
  one that is not a regular file, cannot be read or is over ``file_max`` bytes.
* SQLite databases by absolute path: the app records, ``{"tables": {name: {"rows": N, "sha256": hex}}}``
  (a table's hash is the hash of its rows' sorted hashes: independent of row order and of how the
  pages are laid out or checkpointed), read from a private copy of the database and its ``-wal`` and
  ``-shm`` opened read-only with SQLite's defences for untrusted files, within ``sqlite_seconds``;
  ``null`` when there is no database, ``{"error": why}`` when it cannot be read.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sqlite3
import stat
import sys
import tempfile
import time

VOLATILE_NAMES = (".Xauthority", "SingletonLock", "SingletonSocket", "SingletonCookie")
"""Names never snapshotted, restored or listed: the session's X cookie (written anew at every start) and
chromium's profile locks (naming a host and a pid of the session that wrote them)."""

_CHUNK = 1 << 20


def _hash_stream(read, limit):  # noqa: ANN001, ANN202 - read(n) -> bytes
    """(size, sha256 hex) of what ``read`` yields, or (size, None) once more than ``limit`` bytes came."""
    digest = hashlib.sha256()
    size = 0
    while True:
        chunk = read(_CHUNK)
        if not chunk:
            return size, digest.hexdigest()
        size += len(chunk)
        if size > limit:
            return size, None
        digest.update(chunk)


def listing(entries, max_files, max_bytes, file_max):  # noqa: ANN001, ANN201
    """The tree record of ``entries``: ``(relpath, kind, size, payload)`` tuples, ``kind`` ``file``
    (``payload``: a function opening the file's bytes as a binary stream) or ``link`` (``payload``: the
    target), in any order. See the module doc for the caps."""
    files = {}
    hashed = 0
    truncated = False
    for rel, kind, size, payload in sorted(entries, key=lambda e: e[0]):
        if any(part in VOLATILE_NAMES for part in rel.split("/")):
            continue
        if len(files) >= max_files:
            truncated = True
            break
        if kind == "link":
            files[rel] = {"link": payload}
            continue
        if size > file_max or hashed + size > max_bytes:
            files[rel] = {"size": size, "sha256": None}
            continue
        try:
            with payload() as stream:
                got, digest = _hash_stream(stream.read, min(file_max, max_bytes - hashed))
        except OSError as exc:
            files[rel] = {"error": f"cannot read: {exc.strerror or exc}"}
            continue
        hashed += got if digest is not None else 0
        files[rel] = {"size": got, "sha256": digest}
    return {"files": files, "truncated": truncated, "hashed_bytes": hashed}


def _walk(root):  # noqa: ANN001, ANN202
    """``listing`` entries of the directory ``root`` (symlinks not followed)."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in VOLATILE_NAMES]
        for name in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, root).replace(os.sep, "/")
            try:
                st = os.lstat(path)
            except OSError:
                continue
            if stat.S_ISLNK(st.st_mode):
                out.append((rel, "link", 0, os.readlink(path)))
            elif stat.S_ISREG(st.st_mode):
                out.append((rel, "file", st.st_size, lambda p=path: open(p, "rb")))
    return out


def hash_file(path, file_max):  # noqa: ANN001, ANN201
    """One file's record: ``{"size", "sha256"}``, None when it does not exist, ``{"error"}`` otherwise."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return {"error": f"cannot stat: {exc.strerror or exc}"}
    if not stat.S_ISREG(st.st_mode):
        return {"error": "not a regular file"}
    try:
        with open(path, "rb") as stream:
            size, digest = _hash_stream(stream.read, file_max)
    except OSError as exc:
        return {"error": f"cannot read: {exc.strerror or exc}"}
    if digest is None:
        return {"error": f"larger than {file_max} bytes"}
    return {"size": size, "sha256": digest}


_READ_ACTIONS = (sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION)


def _read_only(action, _a, _b, db_name, _t):  # noqa: ANN001, ANN202
    if action not in _READ_ACTIONS or (action == sqlite3.SQLITE_READ and db_name not in (None, "main")):
        return sqlite3.SQLITE_DENY
    return sqlite3.SQLITE_OK


def _cell(value):  # noqa: ANN001, ANN202
    if isinstance(value, bytes):
        return {"blob": value.hex()}
    if isinstance(value, float) and value != value:
        return {"real": "nan"}
    return value


def sqlite_records(db_copy, seconds):  # noqa: ANN001, ANN201
    """The app records of the database at ``db_copy`` (a private copy: it may be changed by opening it)
    within ``seconds``: ``{"tables": {...}}`` or ``{"error": why}``."""
    deadline = time.monotonic() + seconds
    try:
        conn = sqlite3.connect(f"file:{db_copy}?mode=ro", uri=True)
    except sqlite3.Error as exc:
        return {"error": f"sqlite: {exc}"}
    try:
        for pragma in ("trusted_schema = OFF", "cell_size_check = ON", "mmap_size = 0"):
            conn.execute(f"PRAGMA {pragma}")
        conn.set_authorizer(_read_only)
        conn.set_progress_handler(lambda: int(time.monotonic() > deadline), 1000)
        names = sorted(r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'"))
        tables = {}
        for name in names:
            quoted = '"' + str(name).replace('"', '""') + '"'
            rows = sorted(hashlib.sha256(json.dumps([_cell(v) for v in row], sort_keys=True).encode()).hexdigest()
                          for row in conn.execute(f"SELECT * FROM {quoted}"))
            tables[str(name)] = {"rows": len(rows), "sha256": hashlib.sha256("\n".join(rows).encode()).hexdigest()}
        return {"tables": tables}
    except sqlite3.Error as exc:
        if time.monotonic() > deadline:
            return {"error": f"stopped at the time limit ({seconds:g} s)"}
        return {"error": f"sqlite: {exc}"}
    finally:
        conn.close()


def copy_database(read, db_path, into, file_max):  # noqa: ANN001, ANN201
    """Copy the database ``db_path`` and its ``-wal``/``-shm`` into the directory ``into`` through
    ``read(path) -> bytes | None`` (None: no such file); returns the copy's path, None when there is no
    database. Raises ValueError when a file is over ``file_max`` bytes."""
    target = os.path.join(into, "db")
    for suffix in ("", "-wal", "-shm"):
        data = read(db_path + suffix)
        if data is None:
            if not suffix:
                return None
            continue
        if len(data) > file_max:
            raise ValueError(f"{db_path + suffix} is larger than {file_max} bytes")
        with open(target + suffix, "wb") as out:
            out.write(data)
    return target


def _read_guest_file(file_max):  # noqa: ANN001, ANN202
    def read(path):  # noqa: ANN001, ANN202
        try:
            with open(path, "rb") as stream:
                return stream.read(file_max + 1)
        except FileNotFoundError:
            return None
    return read


def probe(request):  # noqa: ANN001, ANN201
    """Measure this machine: ``request`` ``{"roots": [dir], "files": [path], "sqlite": [path],
    "max_files", "max_bytes", "file_max", "sqlite_seconds"}`` -> ``{"roots": {dir: tree},
    "files": {path: record}, "sqlite": {path: records}}``."""
    caps = (int(request["max_files"]), int(request["max_bytes"]), int(request["file_max"]))
    out = {"roots": {}, "files": {}, "sqlite": {}}
    for root in request.get("roots", []):
        out["roots"][root] = listing(_walk(root), *caps) if os.path.isdir(root) else None
    for path in request.get("files", []):
        out["files"][path] = hash_file(path, caps[2])
    for path in request.get("sqlite", []):
        tmp = tempfile.mkdtemp(prefix="snapshot-proof-")
        try:
            copy = copy_database(_read_guest_file(caps[2]), path, tmp, caps[2])
            out["sqlite"][path] = None if copy is None else sqlite_records(copy, float(request["sqlite_seconds"]))
        except (OSError, ValueError) as exc:
            out["sqlite"][path] = {"error": str(exc)}
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def main():  # noqa: ANN201
    """In the guest: ``python -c SOURCE REQUEST_JSON``; the answer as one JSON line on stdout."""
    sys.stdout.write(json.dumps(probe(json.loads(sys.argv[1])), sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
