"""The run record (contract): ``runs/<run-id>/record.jsonl`` plus screenshots beside it.

One JSON object a line, each with ``ts`` (UTC ISO-8601) and ``type`` among ``run_started``,
``model_response``, ``computer_call``, ``approval``, ``action``, ``screenshot``, ``network``,
``check``, ``expectation`` (offline runs: a script turn's screen expectations met, or given up on),
``run_finished``. Typed text never enters the record: ``type`` actions are stored with
``text_length`` only, and nothing here ever sees the API key.

:func:`summarize` reads a record back into the numbers of the summary table (and the checks'
detail). A listener (``on_entry``, e.g. :class:`controller.run.progress.RunPrinter`) sees each entry as
it is written: the console's progress lines come from the record.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import secrets
import threading
from pathlib import Path
from typing import Any, Callable, Iterable

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from controller.run.progress import expectation_text, observed_text
from controller.text import clean

RECORD_TYPES = {
    "run_started", "model_response", "computer_call", "approval", "action", "screenshot", "network",
    "network_log", "check", "expectation", "run_finished",
}
RUN_STATUSES = {"passed", "failed", "cancelled", "error"}


def redact_action(action: dict[str, Any]) -> dict[str, Any]:
    """The action with typed text replaced by its length (``{"type":"type","text_length":N}``)."""
    if action.get("type") == "type":
        text = action.get("text")
        return {"type": "type", "text_length": len(text) if isinstance(text, str) else None}
    return dict(action)


def new_run_id(task_name: str) -> str:
    """``YYYYmmdd-HHMMSS-<task>-<4 hex>`` (UTC)."""
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%d-%H%M%S")
    safe = "".join(c if c.isalnum() or c in "-_" else "-" for c in task_name)[:40]
    return f"{stamp}-{safe}-{secrets.token_hex(2)}"


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds")


class RunRecord:
    """Appends entries to ``<runs_dir>/<run_id>/record.jsonl`` (line-buffered, thread-safe).

    ``write(type, **fields)`` adds one entry; ``save_screenshot`` stores the image beside the record
    and adds a ``screenshot`` entry; ``finish`` adds ``run_finished`` once. ``on_entry`` (optional)
    is called with each entry after it is written (outside the lock; its exceptions are ignored).
    """

    def __init__(self, runs_dir: str | Path, run_id: str,
                 on_entry: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.run_id = run_id
        self.dir = Path(runs_dir) / run_id
        self.dir.mkdir(parents=True, exist_ok=False)
        self.path = self.dir / "record.jsonl"
        self._file = self.path.open("a", encoding="utf-8", buffering=1)
        self._lock = threading.Lock()
        self._shots = 0
        self.started = False
        self.finished: dict[str, Any] | None = None
        self.on_entry = on_entry

    def write(self, type: str, **fields: Any) -> dict[str, Any]:
        """Append one entry; raises ValueError for a type outside the contract."""
        if type not in RECORD_TYPES:
            raise ValueError(f"unknown record type {type!r}")
        entry = {"ts": _now(), "type": type, **fields}
        line = json.dumps(entry, ensure_ascii=False, default=str)
        with self._lock:
            if self._file.closed:
                raise ValueError("record is closed")
            self._file.write(line + "\n")
        if self.on_entry is not None:
            try:
                self.on_entry(entry)
            except Exception:  # noqa: BLE001 - showing an entry must not break the record
                pass
        return entry

    def save_screenshot(self, data: bytes, mime: str, *, image_size: tuple[int, int], frame: Any,
                        screen_size: tuple[int, int] | None = None, reencoded: bool = False,
                        call_id: str | None = None) -> dict[str, Any]:
        """Store the image as ``shot-NNNN.png|jpg`` and add a ``screenshot`` entry (sha256, sizes, frame)."""
        with self._lock:
            self._shots += 1
            number = self._shots
        ext = "png" if mime == "image/png" else "jpg"
        name = f"shot-{number:04d}.{ext}"
        (self.dir / name).write_bytes(data)
        frame_list = [frame.x, frame.y, frame.w, frame.h] if hasattr(frame, "x") else list(frame)
        return self.write(
            "screenshot", file=name, sha256=hashlib.sha256(data).hexdigest(), mime=mime,
            image_size=list(image_size), frame=frame_list,
            screen_size=list(screen_size) if screen_size else None, reencoded=reencoded, call_id=call_id,
        )

    def finish(self, status: str, reason: str = "", **fields: Any) -> dict[str, Any]:
        """Add the single ``run_finished`` entry (status: passed | failed | cancelled | error)."""
        if status not in RUN_STATUSES:
            raise ValueError(f"unknown run status {status!r}")
        if self.finished is not None:
            return self.finished
        self.finished = self.write("run_finished", status=status, reason=reason, **fields)
        return self.finished

    def close(self) -> None:
        with self._lock:
            if not self._file.closed:
                self._file.close()

    def __enter__(self) -> "RunRecord":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


MAX_RECORD_BYTES = 256 * 1024 * 1024
"""Largest record file :func:`read_record` reads (a run writes a few hundred KiB)."""


def read_record(path: str | Path) -> list[dict[str, Any]]:
    """All entries of a record file (``record.jsonl`` or its run directory).

    Raises OSError when unreadable, not a regular file or over :data:`MAX_RECORD_BYTES`, and ValueError
    naming the line when a line is not a JSON object (or is nested too deeply to parse).
    """
    path = Path(path)
    if path.is_dir():
        path = path / "record.jsonl"
    if not path.is_file():
        raise OSError(f"{path}: not a regular file")
    if path.stat().st_size > MAX_RECORD_BYTES:
        raise OSError(f"{path}: larger than {MAX_RECORD_BYTES} bytes")
    entries = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
        except (json.JSONDecodeError, RecursionError) as exc:
            raise ValueError(f"{path}:{number}: not JSON: {exc}") from None
        if not isinstance(entry, dict):
            raise ValueError(f"{path}:{number}: an entry must be a JSON object")
        entries.append(entry)
    return entries


def _parse_ts(ts: str) -> _dt.datetime:
    return _dt.datetime.fromisoformat(ts)


CHECK_FIELDS = ("kind", "target", "rule", "expected", "observed", "passed", "detail")
"""The fields of each check in :func:`summarize`'s ``checks`` (``detail`` only when the check has one)."""


def summarize(entries: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """The summary of a record (``report --json`` prints it).

    Counts: ``steps`` (model responses), ``actions`` / ``actions_failed`` (input actions: every driver
    call except the SDK's screenshot actions), ``screenshot_actions`` / ``screenshot_actions_failed``
    (the SDK's screenshot calls after each computer_call), ``screenshots`` (images sent, the first
    included), ``approvals_approved`` / ``approvals_denied`` (decisions on safety checks and actions),
    ``approvals_opt_in`` (the codes opted in with ``--approve-safety-check``: not decisions),
    ``network_allowed`` / ``network_denied`` (and ``network_log_complete``: the gateway's decision log
    was read in full at teardown), ``checks_passed`` / ``checks_total``; ``usage``; the
    verdict (``status``, ``reason``); ``checks``: one object per check with :data:`CHECK_FIELDS` (why a
    run failed); ``expectations_met`` / ``expectations_unmet`` (script turns whose screen expectations
    held / were given up on), ``expectation_waits`` (the ``wait`` calls the scripted model inserted for
    them) and ``expectations_unmet_detail`` (per given-up turn: ``turn``, ``reason`` and its ``unmet``
    list with ``expected`` and ``observed``); wall time in seconds (the whole run, sandbox start and
    teardown included, when ``run_finished`` carries ``wall_s``) and the phase ``timings``.
    """
    entries = list(entries)
    by = lambda t: [e for e in entries if e.get("type") == t]  # noqa: E731
    actions = by("action")
    inputs = [a for a in actions if a.get("action") != "screenshot"]
    shot_actions = [a for a in actions if a.get("action") == "screenshot"]
    approvals = by("approval")
    decisions = [a for a in approvals if a.get("what") != "opt-in"]
    opt_ins = [code for a in approvals if a.get("what") == "opt-in" for code in (a.get("codes") or [])]
    network = by("network")
    checks = by("check")
    expectations = by("expectation")
    finished = by("run_finished")
    started = by("run_started")
    responses = [r for r in by("model_response") if (r.get("http_status") or 200) < 400]
    usage_missing = sum(1 for r in responses if not r.get("usage"))
    totals = {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0}
    for r in responses:
        for k in totals:
            totals[k] += int((r.get("usage") or {}).get(k) or 0)
    wall = finished[-1].get("wall_s") if finished else None
    if wall is None and started and finished:
        wall = (_parse_ts(finished[-1]["ts"]) - _parse_ts(started[0]["ts"])).total_seconds()
    return {
        "task": (started[0].get("task") or {}).get("name") if started else None,
        "mode": started[0].get("mode") if started else None,
        "steps": len(responses),
        "computer_calls": len(by("computer_call")),
        "actions": len(inputs),
        "actions_failed": len([a for a in inputs if a.get("error")]),
        "screenshot_actions": len(shot_actions),
        "screenshot_actions_failed": len([a for a in shot_actions if a.get("error")]),
        "screenshots": len(by("screenshot")),
        "approvals_approved": len([a for a in decisions if a.get("decision") == "approved"]),
        "approvals_denied": len([a for a in decisions if a.get("decision") == "denied"]),
        "approvals_opt_in": opt_ins,
        "network_log_complete": all(n.get("complete") is True for n in by("network_log")) and bool(by("network_log")),
        "network_allowed": len([n for n in network if n.get("decision") == "allow"]),
        "network_denied": len([n for n in network if n.get("decision") != "allow"]),
        "checks_passed": len([c for c in checks if c.get("passed")]),
        "checks_total": len(checks),
        "checks": [{k: c.get(k) for k in CHECK_FIELDS if k != "detail" or c.get("detail") is not None}
                   for c in checks],
        "expectations_met": len([e for e in expectations if e.get("met") is True]),
        "expectations_unmet": len([e for e in expectations if e.get("met") is not True]),
        "expectation_waits": sum(int(e.get("waits") or 0) for e in expectations),
        "expectations_unmet_detail": [{"turn": e.get("turn"), "reason": e.get("reason"),
                                       "unmet": e.get("unmet") or []}
                                      for e in expectations if e.get("met") is not True],
        "usage": {**totals, "complete": usage_missing == 0, "missing": usage_missing},
        "status": finished[-1].get("status") if finished else "unfinished",
        "reason": finished[-1].get("reason") if finished else "",
        "wall_s": wall,
        "timings": finished[-1].get("timings") if finished else None,
    }


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def summary_table(entries: Iterable[dict[str, Any]], record_path: str | Path | None = None) -> Table:
    """The summary table printed at the end of a run (and by ``desktop-sandbox report``)."""
    entries = list(entries)
    s = summarize(entries)
    # Names, reasons and observed values come from tasks, models and the guest: shown literally (no
    # markup), control characters escaped and cut (a guest value may be megabytes long).
    def shown(value: Any, limit: int = 300) -> str:
        return escape(clean(value, limit))

    table = Table(title=shown(f"run {s['task'] or ''} ({s['mode'] or '?'})", 200), show_header=False)
    table.add_column("what", style="bold", overflow="fold")
    table.add_column("value", overflow="fold")
    table.add_row("steps (model responses)", str(s["steps"]))
    shots = _count(s["screenshot_actions"], "screenshot action")
    if s["screenshot_actions_failed"]:
        shots += f" ({s['screenshot_actions_failed']} failed)"
    table.add_row("actions", f"{_count(s['actions'], 'input action')} ({s['actions_failed']} failed), not counting "
                             f"{shots}; {_count(s['screenshots'], 'screenshot')} sent")
    approvals = f"{s['approvals_approved']} approved, {s['approvals_denied']} denied"
    if s["approvals_opt_in"]:
        approvals += "; opt-in: --approve-safety-check " + ", ".join(str(c) for c in s["approvals_opt_in"])
    table.add_row("approvals", shown(approvals))
    table.add_row("network decisions", f"{s['network_allowed']} allowed, {s['network_denied']} denied")
    u = s["usage"]
    usage = f"{u['total_tokens']} tokens (in {u['input_tokens']}, out {u['output_tokens']})"
    if not u["complete"]:
        usage += f" - incomplete: {u['missing']} response(s) without usage"
    table.add_row("usage", usage)
    for c in s["checks"]:
        mark = "[green]pass[/]" if c.get("passed") else "[red]FAIL[/]"
        detail = f"{c.get('rule')}"
        if not c.get("passed"):
            observed = observed_text(c) if c.get("observed") is None else f"observed {c.get('observed')!r}"
            detail += f": expected {c.get('expected')!r}, {observed}"
        # a short label keeps the value column wide: paths and the record path stay on one line
        table.add_row("check", f"{mark} {shown(c.get('kind'), 20)} {shown(c.get('target'))} {shown(detail, 800)}")
    if s["checks_total"] == 0 and s["status"] in ("cancelled", "error"):
        table.add_row("checks", f"not run ({shown(s['status'], 20)})")
    else:
        table.add_row("checks", f"{s['checks_passed']}/{s['checks_total']} passed")
    if s["expectations_met"] or s["expectations_unmet"]:
        table.add_row("screen expectations",
                      f"{_count(s['expectations_met'], 'turn')} met, {s['expectations_unmet']} unmet "
                      f"({_count(s['expectation_waits'], 'wait')} inserted)")
        for failure in s["expectations_unmet_detail"]:
            table.add_row("expectation", f"[red]unmet[/] {escape(expectation_text(failure, limit=400))}")
    verdict = s["status"]
    color = {"passed": "green", "failed": "red", "cancelled": "yellow", "error": "red"}.get(verdict, "white")
    reason = f" ({shown(s['reason'], 800)})" if s["reason"] else ""
    table.add_row("verdict", f"[{color}]{shown(verdict, 20)}[/]{reason}")
    if s["wall_s"] is not None:
        t = f"{s['wall_s']:.1f} s"
        if s["timings"]:
            t += " (" + ", ".join(f"{k} {v:.1f}s" for k, v in s["timings"].items()) + ")"
        table.add_row("time", shown(t))
    if record_path:
        table.add_row("record", shown(record_path, 500))
    return table


def print_summary(entries: Iterable[dict[str, Any]], record_path: str | Path | None = None,
                  console: Console | None = None) -> None:
    (console or Console()).print(summary_table(entries, record_path))
