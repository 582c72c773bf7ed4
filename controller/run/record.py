"""The run record (contract): ``runs/<run-id>/record.jsonl`` plus screenshots beside it.

One JSON object a line, each a :mod:`controller.run.entries` model (the entry types, the format
version and how ``ts`` orders lines are described there). Typed text never enters the record:
``type`` actions are stored with ``text_length`` only, and nothing here ever sees the API key.

:class:`RunRecord` writes entries; :func:`read_entries` reads a record back as entry models (refusing,
with the file and line, a line that is not an entry or a record in a newer format);
:func:`summarize` turns entries into the numbers of the summary table (and the checks' detail). A
listener (``on_entry``, e.g. :class:`controller.run.progress.RunPrinter`) sees each entry as it is
written: the console's progress lines come from the record.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import secrets
import threading
from pathlib import Path
from typing import Any, Iterable

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from controller.run.entries import (
    ENTRY_TYPES, FORMAT, REPLAY_RUNNER, Action, Approval, BrowserCall, Check, EntryError, Expectation,
    ModelResponse, Network, NetworkLog, RunFinished, RunStarted, Screenshot, SignIn, Video, WebRecording, as_entry,
    entry_format,
)
from controller.offline.call_ids import SCRIPT_CALL
from controller.run.bus import EntryWritten, RunBus
from controller.run.progress import (
    COLD_REASONS, Fitted, Kept, check_parts, expectation_text, fitted, print_fitted, video_text, web_text,
)
from controller import json_semantics
from controller.validation import read_input_file
from controller.text import clean

RECORD_TYPES = set(ENTRY_TYPES)

_LINE_BREAKS = {0x85: "\\u0085", 0x2028: "\\u2028", 0x2029: "\\u2029"}
"""The line breaks ``json.dumps(..., ensure_ascii=False)`` leaves raw in a string (it escapes only
those below U+0020), written as JSON escapes so that every tool sees one entry a line."""
RUN_STATUSES = {"passed", "failed", "cancelled", "error"}


def redact_action(action: dict[str, Any]) -> dict[str, Any]:
    """The action with typed text replaced by its length (``{"type":"type","text_length":N}``)."""
    if action.get("type") == "type":
        text = action.get("text")
        return {"type": "type", "text_length": len(text) if isinstance(text, str) else None}
    return dict(action)


def recorded_action(action: dict[str, Any], typed_text: bool) -> dict[str, Any]:
    """An action as the record keeps it: :func:`redact_action`, plus the exact ``text`` beside its length
    when the run records typed text (``run_started.typed_text``: what ``replay`` types again)."""
    shown = redact_action(action)
    if typed_text and action.get("type") == "type" and isinstance(action.get("text"), str):
        shown["text"] = action["text"]
    return shown


def new_run_id(task_name: str) -> str:
    """``YYYYmmdd-HHMMSS-<task>-<4 hex>`` (UTC)."""
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%d-%H%M%S")
    safe = "".join(c if c.isalnum() or c in "-_" else "-" for c in task_name)[:40]
    return f"{stamp}-{safe}-{secrets.token_hex(2)}"


class RunRecord:
    """Appends entries to ``<runs_dir>/<run_id>/record.jsonl`` (line-buffered, thread-safe).

    ``write(entry)`` adds one entry model (stamping its ``ts``: the time is taken and the line written
    under one lock, and never goes back, so ``ts`` is non-decreasing line after line);
    ``save_screenshot`` stores the image beside the record and adds a ``screenshot`` entry; ``finish``
    adds ``run_finished`` once. Each entry, once written, is published on ``bus`` (the run's
    :class:`controller.run.bus.RunBus`; a bus of its own when none is given) as an
    :class:`~controller.run.bus.EntryWritten` -- a screenshot's with its image -- outside the lock.
    """

    def __init__(self, runs_dir: str | Path, run_id: str, bus: RunBus | None = None) -> None:
        self.run_id = run_id
        self.dir = Path(runs_dir) / run_id
        self.dir.mkdir(parents=True, exist_ok=False)
        self.path = self.dir / "record.jsonl"
        self._file = self.path.open("a", encoding="utf-8", buffering=1)
        self._lock = threading.Lock()
        self._shots = 0
        self._last: _dt.datetime | None = None
        self.started = False
        self.finished: RunFinished | None = None
        self.bus = bus if bus is not None else RunBus()

    def write(self, entry: Any, /, **fields: Any) -> Any:
        """Append one entry model and return it as written (with ``ts``). ``write("check", **fields)``
        builds the model from a type and fields first (ValueError when they are not a valid entry)."""
        if isinstance(entry, str):
            entry = as_entry({"type": entry, **fields})
        elif fields or entry.__class__ not in ENTRY_TYPES.values():
            raise TypeError("write takes an entry model, or a type and its fields")
        return self._write(entry)

    def _write(self, entry: Any, image: bytes | None = None, mime: str | None = None) -> Any:
        with self.bus.lock:  # taken first: the bus publishes entries in the order of their lines
            with self._lock:
                if self._file.closed:
                    raise ValueError("record is closed")
                now = _dt.datetime.now(_dt.timezone.utc)
                if self._last is not None and now < self._last:
                    now = self._last
                self._last = now
                entry = entry.model_copy(update={"ts": now.isoformat(timespec="milliseconds")})
                line = json.dumps(entry.as_json(), ensure_ascii=False).translate(_LINE_BREAKS) + "\n"
                # a lone surrogate (a model's text may hold one) cannot be UTF-8: written as its JSON escape
                self._file.write(line.encode("utf-8", "backslashreplace").decode("utf-8"))
            self.bus.publish(EntryWritten(entry, image, mime))  # subscribers never break the record
            return entry

    def save_image(self, data: bytes, mime: str) -> str:
        """Store an image a person is shown but the model is not (the screen an approval is asked again
        on) as the next ``shot-NNNN.png|jpg``, without a ``screenshot`` entry; returns its file name."""
        with self._lock:
            self._shots += 1
            number = self._shots
        name = f"shot-{number:04d}.{'png' if mime == 'image/png' else 'jpg'}"
        (self.dir / name).write_bytes(data)
        return name

    def save_screenshot(self, data: bytes, mime: str, *, image_size: tuple[int, int], frame: Any,
                        screen_size: tuple[int, int] | None = None, reencoded: bool = False,
                        call_id: str | None = None, waited_for_origin_ms: float | None = None,
                        redacted: Any = None) -> Screenshot:
        """Store the image as ``shot-NNNN.png|jpg`` and add a ``screenshot`` entry (sha256, sizes, frame,
        ``waited_for_origin_ms``, ``redacted``: see :class:`controller.run.entries.Screenshot`)."""
        with self._lock:
            self._shots += 1
            number = self._shots
        ext = "png" if mime == "image/png" else "jpg"
        name = f"shot-{number:04d}.{ext}"
        (self.dir / name).write_bytes(data)
        frame_list = [frame.x, frame.y, frame.w, frame.h] if hasattr(frame, "x") else list(frame)
        return self._write(Screenshot(
            file=name, sha256=hashlib.sha256(data).hexdigest(), mime=mime, image_size=tuple(image_size),
            frame=tuple(frame_list), screen_size=tuple(screen_size) if screen_size else None, reencoded=reencoded,
            call_id=call_id, waited_for_origin_ms=waited_for_origin_ms,
            redacted=[tuple(b) for b in redacted] if redacted else None,
        ), data, mime)

    def finish(self, status: str, reason: str = "", **fields: Any) -> RunFinished:
        """Add the single ``run_finished`` entry (status: passed | failed | cancelled | error; ``fields``:
        those of :class:`controller.run.entries.RunFinished`)."""
        if status not in RUN_STATUSES:
            raise ValueError(f"unknown run status {status!r}")
        if self.finished is not None:
            return self.finished
        self.finished = self.write(RunFinished(status=status, reason=reason, **fields))
        return self.finished

    def close(self) -> None:
        with self._lock:
            if not self._file.closed:
                self._file.close()

    def __enter__(self) -> "RunRecord":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


MAX_RECORD_BYTES = 64 * 1024 * 1024
"""Largest record file :func:`read_entries` reads (a run writes a few hundred KiB)."""
MAX_RECORD_ENTRIES = 200_000
"""Most entries :func:`read_entries` reads from one record (a run writes a few hundred; its network lines
are at most :data:`controller.run.recording.MAX_DECISIONS`): a record of many tiny lines is refused
before it costs a reader more than a few hundred MiB."""


def _split_lines(text: str) -> Iterable[tuple[int, str]]:
    """``(number, line)`` of each line of ``text`` (1-based), split at ``"\\n"`` only (str.splitlines
    would also split at a U+2028 or U+0085 inside a string), one at a time."""
    start, number = 0, 1
    while start <= len(text):
        end = text.find("\n", start)
        if end < 0:
            end = len(text)
        yield number, text[start:end]
        start, number = end + 1, number + 1


def _lines(path: str | Path) -> tuple[Path, list[tuple[int, Any]]]:
    """The record file and its non-blank lines parsed as JSON, with their line numbers (1-based). A line
    that is no JSON object, or one past :data:`MAX_RECORD_ENTRIES`, is refused as it is met (ValueError
    naming the line), so a hostile record costs a reader little more than its bytes."""
    path = Path(path)
    if path.is_dir():
        path = path / "record.jsonl"
    if not path.exists():
        raise OSError(f"{path}: no such file (give a run directory, runs/<id>, or its record.jsonl)")
    try:
        text = read_input_file(path, MAX_RECORD_BYTES)
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    parsed = []
    for number, line in _split_lines(text):
        if not line.strip():
            continue
        if len(parsed) >= MAX_RECORD_ENTRIES:
            raise ValueError(f"{path}:{number}: more than {MAX_RECORD_ENTRIES} entries: not a record this "
                             "desktop-sandbox writes")
        try:
            data = json_semantics.loads(line)
        except (ValueError, RecursionError) as exc:  # JSONDecodeError, and the hooks' refusals
            raise ValueError(f"{path}:{number}: not JSON: {' '.join(str(exc).split())[:200]}") from None
        if not isinstance(data, dict):
            raise ValueError(f"{path}:{number}: an entry must be a JSON object, not {type(data).__name__}")
        parsed.append((number, data))
    return path, parsed


def read_entries(path: str | Path) -> list[Any]:
    """The entries of a record file (``record.jsonl`` or its run directory), as entry models: the one
    reader of a record (a JSON object, where one is needed, is ``entry.as_json()``).

    Raises OSError when unreadable, not a regular file or over :data:`MAX_RECORD_BYTES`, and ValueError
    naming the file and line (``path:line: ...``) when a line is not JSON (or is nested too deeply to
    parse), is not a valid entry (its type, field and problem named), has no ``ts``, or belongs to a
    record in a format newer than :data:`controller.run.entries.FORMAT` (checked on every line before
    any is validated).
    """
    path, parsed = _lines(path)
    for number, data in parsed:
        declared = entry_format(data)
        if declared is not None and declared > FORMAT:
            raise ValueError(f"{path}:{number}: record format {declared} is newer than this desktop-sandbox reads "
                             f"(format {FORMAT}); read it with a newer version")
    entries = []
    for number, data in parsed:
        try:
            entry = as_entry(data)
        except EntryError as exc:
            raise ValueError(f"{path}:{number}: {exc}") from None
        if entry.ts is None:
            raise ValueError(f"{path}:{number}: {entry.type} entry without ts")
        entries.append(entry)
    return entries


def _parse_ts(ts: str) -> _dt.datetime:
    return _dt.datetime.fromisoformat(ts)


CHECK_FIELDS = ("kind", "target", "rule", "expected", "observed", "passed", "detail")
"""The fields of each check in :func:`summarize`'s ``checks`` (``detail`` only when the check has one)."""


def summarize(entries: Iterable[Any]) -> dict[str, Any]:
    """The summary of a record (``report --json`` prints it). ``entries``: entry models, or JSON
    objects (validated as entries; ValueError when one is not).

    Counts: ``steps`` (the record's steps, :func:`controller.model.steps.steps`, whose model response
    was answered: the opening and failed requests not counted), ``computer_calls``, ``actions`` /
    ``actions_failed`` (input actions: every driver call except the SDK's screenshot actions),
    ``screenshot_actions`` / ``screenshot_actions_failed`` (the SDK's screenshot calls after each
    computer_call), ``browser_calls`` / ``browser_calls_failed``
    (calls of the SDK's browser tools, ``browser_call`` lines, and those not ``ok``), ``screenshots``
    (images sent, the first included, a browser ``screenshot`` or ``zoom`` too), ``approvals_approved`` / ``approvals_denied`` (decisions on safety checks and actions),
    ``approvals_opt_in`` (the codes opted in with ``--approve-safety-check``: not decisions),
    ``network_allowed`` / ``network_denied`` (and ``network_log_complete``: the gateway's decision log
    was read in full at teardown), ``checks_passed`` / ``checks_total``; ``usage``; the
    verdict (``status``, ``reason``); ``checks``: one object per check with :data:`CHECK_FIELDS` (why a
    run failed); ``expectations_met`` / ``expectations_unmet`` (script turns whose screen expectations
    held / were given up on), ``expectation_waits`` (the ``wait`` calls the scripted model inserted for
    them) and ``expectations_unmet_detail`` (per given-up turn: ``turn``, ``reason`` and its ``unmet``
    list with ``expected`` and ``observed``); wall time in seconds (the whole run, sandbox start and
    teardown included, when ``run_finished`` carries ``wall_s``) and the phase ``timings``. ``runner``:
    ``run_started``'s; a replay's record (``replay``, ``desktop-sandbox replay``) also has ``replay``:
    ``steps`` (the recorded calls it sent again), ``performed`` (those whose actions ran), ``matched`` /
    ``diverged`` (the recorded screens that came / did not come: one a replayed turn that expected one,
    the closing turn's too). ``video``: the run's ``video`` entry
    (its JSON; None when the run recorded none). ``web``: the run's ``web_recording`` entry (its JSON: mode
    ``record`` or ``serve``, responses kept or served, missing, skipped by reason, bytes; None when the run
    neither recorded nor served web origins).
    """
    from controller.model.steps import steps

    entries = [as_entry(e) for e in entries]
    by = lambda cls: [e for e in entries if isinstance(e, cls)]  # noqa: E731
    record_steps = steps(entries)
    actions: list[Action] = by(Action)
    inputs = [a for a in actions if a.action != "screenshot"]
    shot_actions = [a for a in actions if a.action == "screenshot"]
    approvals: list[Approval] = by(Approval)
    decisions = [a for a in approvals if a.what != "opt-in"]
    opt_ins = [code for a in approvals if a.what == "opt-in" for code in a.codes]
    network: list[Network] = by(Network)
    network_logs: list[NetworkLog] = by(NetworkLog)
    checks: list[Check] = by(Check)
    expectations: list[Expectation] = by(Expectation)
    finished: list[RunFinished] = by(RunFinished)
    started: list[RunStarted] = by(RunStarted)
    browser: list[BrowserCall] = by(BrowserCall)
    videos: list[Video] = by(Video)
    webs: list[WebRecording] = by(WebRecording)
    responses: list[ModelResponse] = [step.response for step in record_steps if step.ok]
    usage_missing = sum(1 for r in responses if r.usage is None)
    totals = {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0}
    for r in responses:
        for k in totals:
            totals[k] += (getattr(r.usage, k) if r.usage else None) or 0
    last = finished[-1] if finished else None
    wall = last.wall_s if last else None
    if wall is None and started and last and started[0].ts and last.ts:
        wall = (_parse_ts(last.ts) - _parse_ts(started[0].ts)).total_seconds()
    unmet = [e for e in expectations if not e.met]
    runner = started[0].runner if started else None
    replayed = None
    if runner == REPLAY_RUNNER:
        sent = {c.call_id for step in record_steps for c in step.calls if SCRIPT_CALL.match(c.call_id or "")}
        performed = {a.call_id for step in record_steps for a in step.actions if a.action != "screenshot"}
        replayed = {"steps": len(sent), "performed": len(sent & performed),
                    "matched": len([e for e in expectations if e.met]), "diverged": len(unmet)}
    return {
        "task": started[0].task.name if started else None,
        "mode": started[0].mode if started else None,
        "runner": runner,
        "replay": replayed,
        "claim": started[0].claim if started else None,
        "steps": len(responses),
        "computer_calls": sum(len(step.calls) for step in record_steps),
        "actions": len(inputs),
        "actions_failed": len([a for a in inputs if a.error]),
        "screenshot_actions": len(shot_actions),
        "screenshot_actions_failed": len([a for a in shot_actions if a.error]),
        "browser_calls": len(browser),
        "browser_calls_failed": len([b for b in browser if not b.ok]),
        "screenshots": len(by(Screenshot)),
        "approvals_approved": len([a for a in decisions if a.decision == "approved"]),
        "approvals_denied": len([a for a in decisions if a.decision == "denied"]),
        "approvals_opt_in": opt_ins,
        "network_log_complete": bool(network_logs) and all(n.complete for n in network_logs),
        "network_allowed": len([n for n in network if n.decision == "allow"]),
        "network_denied": len([n for n in network if n.decision != "allow"]),
        "checks_passed": len([c for c in checks if c.passed]),
        "checks_total": len(checks),
        "checks": [_check_fields(c) for c in checks],
        "sign_ins": [{k: getattr(e, k) for k in ("step", "origin", "method", "submitted", "outcome", "by", "detail")}
                     for e in by(SignIn)],
        "expectations_met": len(expectations) - len(unmet),
        "expectations_unmet": len(unmet),
        "expectation_waits": sum(e.waits for e in expectations),
        "expectations_unmet_detail": [{"turn": e.turn, "reason": e.reason,
                                       "unmet": [u.model_dump(mode="json", fallback=str) for u in e.unmet]}
                                      for e in unmet],
        "usage": {**totals, "complete": usage_missing == 0, "missing": usage_missing},
        "status": last.status if last else "unfinished",
        "reason": last.reason if last else "",
        "wall_s": wall,
        "timings": last.timings if last else None,
        "video": videos[-1].as_json() if videos else None,
        "web": webs[-1].as_json() if webs else None,
    }


def _check_fields(check: Check) -> dict[str, Any]:
    data = check.as_json()
    return {k: data[k] for k in CHECK_FIELDS if k != "detail" or check.detail is not None}


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def summary_table(entries: Iterable[Any], record_path: str | Path | None = None) -> Table:
    """The summary table printed at the end of a run (and by ``desktop-sandbox report``); ``entries``
    as :func:`summarize` takes them. Every cell is rendered here, without emoji codes, so the table
    reads the same on any console.

    Each row is one line however narrow the console: a value too long for it (a check's SQL, a task
    name, a reason) is shortened with an ellipsis, and a check's line gives way part by part (target,
    rule, what was observed: :func:`controller.run.progress.fitted`). Only the record path folds onto
    more lines, to stay whole. ``report --json`` and the HTML report show every value whole."""
    entries = [as_entry(e) for e in entries]
    s = summarize(entries)
    # Names, reasons and observed values come from tasks, models and the guest: shown literally (no
    # markup), control characters escaped and cut (a guest value may be megabytes long).
    def shown(value: Any, limit: int = 300) -> str:
        return escape(clean(value, limit))

    replayed = s["replay"]  # a replay's record: no model took part, so no model figures
    what = f"replay of {s['task'] or ''}" if replayed else f"run {s['task'] or ''} ({s['mode'] or '?'})"
    title = Text.from_markup(shown(what, 200), style="table.title", emoji=False)
    title.no_wrap, title.overflow = True, "ellipsis"
    table = Table(title=title, show_header=False, title_justify="default")
    table.add_column("what", style="bold", no_wrap=True)
    table.add_column("value")

    def row(what: str, value: str | Fitted, whole: bool = False) -> None:
        cell = Text.from_markup(value, emoji=False) if isinstance(value, str) else value
        if isinstance(cell, Text):
            cell.no_wrap, cell.overflow = (False, "fold") if whole else (True, "ellipsis")
        table.add_row(Text.from_markup(what, emoji=False), cell)

    claim = s["claim"] or {}
    if claim.get("source") == "pool":
        row("sandbox", shown(f"claimed from the warm pool in {claim.get('claim_s', 0):.2f}s"))
    elif claim:
        row("sandbox", shown(f"cold start: {COLD_REASONS.get(str(claim.get('reason')), 'the warm pool gave none')}"))
    if replayed:
        row("steps replayed", f"{_count(replayed['steps'], 'recorded call')} sent again, {replayed['performed']} "
                              f"performed; recorded screens (one a turn, the closing one too): {replayed['matched']} "
                              f"matched, {replayed['diverged']} diverged", whole=True)
    else:
        row("steps", _count(s["steps"], "model response"))
    shots = _count(s["screenshot_actions"], "screenshot action")
    if s["screenshot_actions_failed"]:
        shots += f" ({s['screenshot_actions_failed']} failed)"
    row("actions", f"{_count(s['actions'], 'input action')} ({s['actions_failed']} failed) and {shots}")
    row("screenshots", f"{s['screenshots']} sent")
    if s["browser_calls"]:
        row("browser calls", f"{_count(s['browser_calls'], 'call')} of the browser tools "
                             f"({s['browser_calls_failed']} failed)")
    approvals = f"{s['approvals_approved']} approved, {s['approvals_denied']} denied"
    if s["approvals_opt_in"]:
        approvals += "; opt-in: --approve-safety-check " + ", ".join(str(c) for c in s["approvals_opt_in"])
    row("approvals", shown(approvals))
    row("network decisions", f"{s['network_allowed']} allowed, {s['network_denied']} denied")
    if s["sign_ins"]:
        outcomes: dict[str, int] = {}
        for sign_in in s["sign_ins"]:
            outcomes[sign_in["outcome"]] = outcomes.get(sign_in["outcome"], 0) + 1
        row("sign-in", shown(f"{_count(len(s['sign_ins']), 'request')} at "
                             f"{', '.join(sorted({i['origin'] for i in s['sign_ins']}))}: "
                             + ", ".join(f"{n} {outcome}" for outcome, n in outcomes.items())))
    u = s["usage"]
    usage = f"{u['total_tokens']} tokens (in {u['input_tokens']}, out {u['output_tokens']})"
    if not u["complete"]:
        usage += f" - incomplete: {u['missing']} response(s) without usage"
    if not replayed:
        row("usage", usage)
    for c in (e for e in entries if isinstance(e, Check)):
        mark = Text("pass", style="green") if c.passed else Text("FAIL", style="red")
        _, target, rule, outcome = check_parts(c, limit=300)
        # a short label keeps the value column wide; the parts give way widest first (fitted)
        row("check", fitted(mark, f" {clean(c.kind, 20)} ", target, rule, Kept("" if c.passed else outcome)))
    if s["checks_total"] == 0 and s["status"] in ("cancelled", "error"):
        row("checks", f"not run ({shown(s['status'], 20)})")
    else:
        row("checks", f"{s['checks_passed']}/{s['checks_total']} passed")
    if (s["expectations_met"] or s["expectations_unmet"]) and not replayed:
        row("expectations",
            f"{_count(s['expectations_met'], 'turn')} met, {s['expectations_unmet']} unmet "
            f"({_count(s['expectation_waits'], 'wait')} inserted)")
    for failure in (e for e in entries if isinstance(e, Expectation) and not e.met):
        row("expectation", f"[red]unmet[/] {escape(expectation_text(failure, limit=400))}")
    verdict = s["status"]
    color = {"passed": "green", "failed": "red", "cancelled": "yellow", "error": "red"}.get(verdict, "white")
    reason = f" ({shown(s['reason'], 800)})" if s["reason"] else ""
    row("verdict", f"[{color}]{shown(verdict, 20)}[/]{reason}")
    if s["wall_s"] is not None:
        row("time", f"{s['wall_s']:.1f} s")
    if s["timings"]:
        row("phases", shown(", ".join(f"{k} {v:.1f}s" for k, v in s["timings"].items())))
    if s["video"] is not None:
        row("video", shown(video_text(s["video"]), 400))
    if s["web"] is not None:
        row(f"web ({shown(s['web'].get('mode'), 20)})", shown(web_text(s["web"]), 800))
    if record_path:
        row("record", shown(record_path, 500), whole=True)
    return table


def print_summary(entries: Iterable[Any], record_path: str | Path | None = None,
                  console: Console | None = None) -> None:
    """Print :func:`summary_table` to ``console`` (a new one on stdout, without emoji codes, when None)
    in at most :data:`controller.run.progress.WIDTH` columns."""
    print_fitted(console or Console(emoji=False), summary_table(entries, record_path))
