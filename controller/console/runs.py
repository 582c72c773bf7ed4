"""Runs as the console finds them: run ids in URLs, the runs list, recorded screenshots.

* a **run id** in a URL is ``[A-Za-z0-9._-]{1,200}``, not ``.`` or ``..``, and names a direct child
  directory of the runs directory (symlinks leading elsewhere refused) -- or a run registered live;
* the **runs list** (:class:`RunIndex`): every child directory holding ``record.jsonl``, read with
  :func:`controller.run.record.read_entries` (its first entry gives the task and the start time, its
  last the verdict: ``run_finished``'s status, else ``running``); a record that fails to read is
  listed as ``unreadable`` with why. Newest first; at most :data:`MAX_LISTED` (the most recently
  written records). Parsed records are cached by size and modification time;
* a **screenshot** name is ``shot-NNNN.png`` or ``shot-NNNN.jpg`` (ASCII digits), a regular file (no
  symlink) directly in the run's directory, served as ``image/png`` / ``image/jpeg``.
"""

from __future__ import annotations

import datetime as _dt
import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from controller.run.entries import RunFinished, RunStarted
from controller.run.record import read_entries
from controller.run.shots import shot_type
from controller.text import clean

RUN_ID = re.compile(r"[A-Za-z0-9._-]{1,200}")
MAX_LISTED = 300
"""Most runs the list shows (the most recently written records)."""


def valid_run_id(run_id: str) -> bool:
    """Whether ``run_id`` may name a run at all (charset, length, not ``.`` / ``..``)."""
    return bool(RUN_ID.fullmatch(run_id)) and run_id not in (".", "..")


def run_dir(runs_dir: Path, run_id: str) -> Path | None:
    """The directory of a recorded run: ``runs_dir/run_id`` when ``run_id`` is valid and that is a
    real directory directly inside ``runs_dir`` (after resolving links); else None."""
    if not valid_run_id(run_id):
        return None
    path = runs_dir / run_id
    try:
        if path.is_symlink() or not path.is_dir() or path.resolve().parent != runs_dir.resolve():
            return None
    except OSError:
        return None
    return path


def shot_file(directory: Path, name: str) -> tuple[Path, str] | None:
    """``(path, content type)`` of a recorded screenshot ``name`` in ``directory``, or None when the
    name is not ``shot-NNNN.png|jpg`` or no such regular file is there."""
    content_type = shot_type(name)
    if content_type is None:
        return None
    path = directory / name
    try:
        if path.is_symlink() or not path.is_file():
            return None
    except OSError:
        return None
    return path, content_type


@dataclass(frozen=True)
class RunRow:
    """One line of the runs list. ``verdict``: passed | failed | cancelled | error | running |
    unreadable (or a live run's state); ``started``: UTC ISO-8601 or None; ``error``: why unreadable."""

    id: str
    task: str
    started: str | None
    verdict: str
    live: bool = False
    error: str | None = None
    sort_key: float = 0.0


def _timestamp(ts: str | None, fallback: float) -> float:
    try:
        return _dt.datetime.fromisoformat(ts).timestamp() if ts else fallback
    except ValueError:
        return fallback


def read_row(run_id: str, record: Path, mtime: float) -> RunRow:
    """The list row of one record (``unreadable`` with the reason when it fails to read)."""
    try:
        entries = read_entries(record)
    except (OSError, ValueError) as exc:
        return RunRow(run_id, "", None, "unreadable", error=clean(exc, 300), sort_key=mtime)
    first = entries[0] if entries else None
    last = entries[-1] if entries else None
    task = clean(first.task.name or "", 200) if isinstance(first, RunStarted) else ""
    started = first.ts if first is not None else None
    verdict = last.status if isinstance(last, RunFinished) else "running"
    return RunRow(run_id, task, started, verdict, sort_key=_timestamp(started, mtime))


class RunIndex:
    """The runs list of one runs directory, with parsed records cached (see the module docstring)."""

    def __init__(self, runs_dir: Path) -> None:
        self.runs_dir = Path(runs_dir)
        self._cache: dict[str, tuple[tuple[int, int], RunRow]] = {}
        self._lock = threading.Lock()

    def recorded(self, skip: frozenset[str] = frozenset()) -> list[RunRow]:
        """Rows of the recorded runs but those in ``skip``, newest first."""
        found: list[tuple[float, str, Path, tuple[int, int]]] = []
        try:
            children = list(os.scandir(self.runs_dir))
        except OSError:
            return []
        for child in children:
            if child.name in skip or not valid_run_id(child.name) or child.is_symlink() or not child.is_dir():
                continue
            record = Path(child.path) / "record.jsonl"
            try:
                stat = record.stat()
            except OSError:
                continue
            found.append((stat.st_mtime, child.name, record, (stat.st_size, stat.st_mtime_ns)))
        found.sort(reverse=True)
        rows = []
        for mtime, run_id, record, key in found[:MAX_LISTED]:
            with self._lock:
                cached = self._cache.get(run_id)
            if cached is None or cached[0] != key:
                cached = (key, read_row(run_id, record, mtime))
                with self._lock:
                    self._cache[run_id] = cached
            rows.append(cached[1])
        rows.sort(key=lambda r: r.sort_key, reverse=True)
        return rows

    def rows(self, live_runs: dict[str, Any]) -> list[RunRow]:
        """Live runs first (newest registered first), then the recorded ones (without those live)."""
        live_rows = []
        for live in reversed(list(live_runs.values())):
            info = live.describe()
            verdict = (info["status"] or "finished") if info["state"] == "finished" else info["state"]
            live_rows.append(RunRow(live.run_id, info["task"], None, verdict, live=True))
        return live_rows + self.recorded(frozenset(live_runs))
