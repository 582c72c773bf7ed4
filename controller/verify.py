"""Verification: after the loop, read the guest's own state through the agent's files API and
compare it with the task's checks. Never from the model's transcript.

- file checks: ``exact`` (bytes equal), ``text`` (equal after removing trailing whitespace),
  ``regex`` (Python ``re.search`` on the UTF-8 text), ``json`` (parsed values equal);
- sqlite checks: the database and its ``-wal``/``-shm`` files are copied through the files API to
  a temporary directory, opened read-only, the query is run (``bind_files`` texts bound to its
  ``?`` parameters) and the rows are compared exactly.

Each result records the rule, the expected value and what was observed (bytes in hex when they
differ). A missing file or an unreadable database is a failed check, not an exception.
"""

from __future__ import annotations

import json
import re
import sqlite3
import tempfile
from pathlib import Path, PurePosixPath
from typing import Any, Callable, Protocol

from controller.tasks import FileCheck, SqliteCheck

MAX_OBSERVED_CHARS = 2000
MAX_HEX_BYTES = 256


class FileReader(Protocol):
    """The part of the agent client verification uses: ``read_file(path) -> bytes``."""

    def read_file(self, path: str) -> bytes: ...


class GuestFileMissing(FileNotFoundError):
    """The guest has no such file (the agent answered 404)."""


def guest_path(path: str, home: str) -> str:
    """Expand a leading ``~`` to the guest user's home; the result must be absolute (POSIX)."""
    if path == "~" or path.startswith("~/"):
        path = home.rstrip("/") + path[1:]
    if not PurePosixPath(path).is_absolute():
        raise ValueError(f"guest path must be absolute or start with ~/: {path!r}")
    return path


def _read(reader: FileReader, path: str) -> bytes:
    try:
        return reader.read_file(path)
    except Exception as exc:  # the agent client's AgentError carries the HTTP status
        if getattr(exc, "status", None) == 404 or getattr(exc, "status_code", None) == 404:
            raise GuestFileMissing(path) from exc
        raise


def _hex(data: bytes) -> str:
    return data[:MAX_HEX_BYTES].hex() + ("..." if len(data) > MAX_HEX_BYTES else "")


def _shown(data: bytes) -> str:
    text = data.decode("utf-8", errors="replace")
    return text if len(text) <= MAX_OBSERVED_CHARS else text[:MAX_OBSERVED_CHARS] + "..."


def check_file(check: FileCheck, reader: FileReader, home: str) -> dict[str, Any]:
    """Run one file check; returns the ``check`` record fields (kind, target, rule, expected,
    observed, passed and, when bytes differ, observed_hex/expected_hex)."""
    path = guest_path(check.path, home)
    result: dict[str, Any] = {"kind": "file", "target": path, "rule": check.match, "expected": check.value}
    try:
        data = _read(reader, path)
    except GuestFileMissing:
        return {**result, "observed": None, "passed": False, "detail": "file does not exist"}
    except Exception as exc:
        return {**result, "observed": None, "passed": False, "detail": f"cannot read: {exc}"}
    text = data.decode("utf-8", errors="replace")
    passed: bool
    detail = None
    if check.match == "exact":
        expected = str(check.value).encode("utf-8")
        passed = data == expected
        if not passed:
            result["expected_hex"] = _hex(expected)
    elif check.match == "text":
        passed = text.rstrip() == str(check.value).rstrip()
    elif check.match == "regex":
        try:
            passed = re.search(str(check.value), text) is not None
        except re.error as exc:
            passed, detail = False, f"invalid regex: {exc}"
    else:  # json
        expected_value = json.loads(check.value) if isinstance(check.value, str) else check.value
        try:
            passed = json.loads(text) == expected_value
        except json.JSONDecodeError as exc:
            passed, detail = False, f"not JSON: {exc}"
        result["expected"] = expected_value
    result.update(observed=_shown(data), passed=passed)
    if not passed:
        result["observed_hex"] = _hex(data)
    if detail:
        result["detail"] = detail
    return result


def _normalize(rows: Any) -> list[list[Any]]:
    out = []
    for row in rows:
        out.append([v.hex() if isinstance(v, bytes) else v for v in row])
    return out


def check_sqlite(check: SqliteCheck, reader: FileReader, home: str) -> dict[str, Any]:
    """Run one sqlite check on a read-only copy of the guest database (with -wal/-shm)."""
    path = guest_path(check.path, home)
    result: dict[str, Any] = {"kind": "sqlite", "target": path, "rule": f"rows of: {check.query}",
                              "expected": check.rows}
    params: list[str] = []
    bound: dict[str, str | None] = {}
    for file in check.bind_files:
        fpath = guest_path(file, home)
        try:
            value = _read(reader, fpath).decode("utf-8", errors="replace").rstrip()
        except GuestFileMissing:
            bound[fpath] = None
            return {**result, "bound": bound, "observed": None, "passed": False,
                    "detail": f"bound file {fpath} does not exist"}
        bound[fpath] = value
        params.append(value)
    if bound:
        result["bound"] = bound
    with tempfile.TemporaryDirectory(prefix="verify-sqlite-") as tmp:
        local = Path(tmp) / PurePosixPath(path).name
        try:
            local.write_bytes(_read(reader, path))
        except GuestFileMissing:
            return {**result, "observed": None, "passed": False, "detail": "database does not exist"}
        copied = ["db"]
        for suffix in ("-wal", "-shm"):
            try:
                Path(str(local) + suffix).write_bytes(_read(reader, path + suffix))
                copied.append(suffix)
            except GuestFileMissing:
                pass
        result["copied"] = copied
        try:
            conn = sqlite3.connect(f"file:{local}?mode=ro", uri=True)
            try:
                rows = _normalize(conn.execute(check.query, params).fetchall())
            finally:
                conn.close()
        except sqlite3.Error as exc:
            return {**result, "observed": None, "passed": False, "detail": f"sqlite error: {exc}"}
    expected = _normalize(check.rows)
    return {**result, "observed": rows[:50], "passed": rows == expected}


def run_checks(checks: list[Any], reader: FileReader, *, home: str = "/home/sandbox",
               on_result: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """Run every check in order; each result goes to ``on_result`` (the record) and the list."""
    results = []
    for check in checks:
        result = check_file(check, reader, home) if check.kind == "file" else check_sqlite(check, reader, home)
        results.append(result)
        if on_result is not None:
            on_result(result)
    return results
