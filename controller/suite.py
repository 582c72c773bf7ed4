"""run-suite: many task runs on one host, at most N at once, each in a fresh sandbox, with a report.

``desktop-sandbox run-suite PATH... [--parallel N] [--repeat K]`` plans every task file given (or every
``*.toml`` under a folder given) ``K`` times and runs the plan with at most ``N`` runs at once. Each run
**is** the ``run-task`` command (``python -m controller.cli run-task TASK --runs-dir DIR ...``) in a
process of its own, supervised by one thread of a pool of ``N``: the same code path as ``run-task``
(fresh sandbox, SDK loop, verification, teardown, its own ``runs/<run-id>/`` record), including its
signal handling, which Python runs in a process's main thread only. A run that fails, crashes or is
killed changes nothing in another: they share no interpreter, no sandbox, no record.

Output: ``runs/suite-<stamp>-<hex>/`` holds each run's terminal output (``logs/<task>-<k>.log``) and
``index.json`` (the suite's report, :func:`build_report`: every run with its record folder, status,
times and steps), rewritten as runs start and end; ``--json FILE`` and ``--junit FILE`` write the same
report as JSON and as JUnit XML (:func:`junit_xml`). A run's status is the one its record ends with
(``passed``, ``failed``, ``error``, ``cancelled``); ``not_started`` when the suite was cancelled first;
``error`` when no complete record exists (the process died before or while it wrote one).

Cancellation (SIGINT, SIGTERM, SIGHUP to the suite): no run is started any more, and each signal is
passed on to every run still going (they run in sessions of their own, so a terminal's Ctrl-C reaches
them only this way, once): ``run-task`` then cancels as it does on its own -- the sandbox is removed,
the record finished ``cancelled``. The suite waits for every run to end, writes its report and exits
130. A run over ``--run-timeout`` gets SIGTERM the same way (then, :data:`KILL_GRACE_S` later, SIGKILL:
the next sandbox start on this host reaps what a killed run left, ``controller.sandbox.owner``).

Exit status of the command: 0 only if every run passed; 130 when cancelled; 1 otherwise.

Over 400 lines: the plan, the scheduler with its signal handling and live display, and the report it
builds (JSON, JUnit, tables) are one unit: the report's fields are what the scheduler records.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import queue
import re
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from rich.console import Console, Group
from rich.live import Live
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from controller.model.errors import DesktopSandboxError
from controller.text import clean

REPORT_FORMAT = 1
"""Format of the suite report (``index.json``, ``--json``)."""

STATUSES = ("passed", "failed", "error", "cancelled", "not_started")
"""A finished run's status in the report (the first four as ``run-task``'s record ends)."""

KILL_GRACE_S = 120.0
"""Seconds a run has to tear down after the suite's SIGTERM for ``--run-timeout`` before SIGKILL."""

POLL_S = 0.2
"""How often the suite's main thread looks at noted signals and redraws the display (seconds)."""

EXIT_PASSED, EXIT_FAILED, EXIT_CANCELLED = 0, 1, 130


class SuiteError(DesktopSandboxError, ValueError):
    """Bad input to a suite (no task files, an unreadable path): a one-line message."""


@dataclass(frozen=True)
class PlannedRun:
    """One run of the plan: the ``repeat``-th (1-based) of task ``task_name`` from ``task_file``;
    ``index`` its place in the plan (0-based), ``key`` a file-name-safe ``<task>-<repeat>``."""

    index: int
    task_name: str
    task_file: Path
    repeat: int

    @property
    def key(self) -> str:
        safe = re.sub(r"[^A-Za-z0-9_-]", "-", self.task_name)[:40] or "task"
        return f"{self.index + 1:03d}-{safe}-{self.repeat}"

    @property
    def label(self) -> str:
        return f"{self.task_name} #{self.repeat}"


@dataclass
class RunResult:
    """What became of one planned run.

    ``status``: one of :data:`STATUSES` once ended (``queued`` / ``running`` before); ``reason``: why,
    one line. ``record_dir``: its ``runs/<run-id>`` folder (None when it wrote none); ``log``: its
    terminal output; ``pid``: its process (sandboxes carry ``desktop-sandbox.owner=<host>:<pid>``);
    ``exit_code``: the process's (``-N``: killed by signal N). Seconds: ``wall_s`` (the record's, sandbox
    start and teardown included; else the process's lifetime), ``sandbox_start_s``; ``steps``: model
    responses; ``checks_passed`` / ``checks_total``; ``started_at`` / ``ended_at``: UTC ISO times.
    """

    planned: PlannedRun
    status: str = "queued"
    reason: str = ""
    record_dir: Path | None = None
    log: Path | None = None
    pid: int | None = None
    exit_code: int | None = None
    wall_s: float | None = None
    sandbox_start_s: float | None = None
    steps: int | None = None
    checks_passed: int | None = None
    checks_total: int | None = None
    started_at: str | None = None
    ended_at: str | None = None
    timed_out: bool = False
    t0: float | None = field(default=None, repr=False)
    """``time.monotonic()`` when its process started (for the display; not in the report)."""


@dataclass
class SuiteOptions:
    """How to run a suite. ``parallel``: most runs at once (>= 1); ``runs_dir``: where the records and
    the suite's folder go; ``backend`` / ``image`` / ``live`` / ``model``: passed to each ``run-task``
    (None: its default); ``run_timeout_s``: seconds one run may take before it is cancelled (SIGTERM);
    ``video``: each run records its video (``run-task --video``);
    ``cli``: the command line of ``desktop-sandbox`` (argv prefix; default this interpreter with ``-m
    controller.cli``); ``env``: extra environment variables."""

    parallel: int = 1
    runs_dir: Path = Path("runs")
    backend: str | None = None
    image: str | None = None
    live: bool | None = None
    model: str | None = None
    run_timeout_s: float = 900.0
    video: bool = False
    cli: list[str] = field(default_factory=lambda: [sys.executable, "-m", "controller.cli"])
    env: dict[str, str] = field(default_factory=dict)


def find_task_files(paths: Iterable[str | Path]) -> list[Path]:
    """The task files named by ``paths``: a file as given, a folder as every ``*.toml`` under it (sorted);
    each file once (the same file named twice, in another spelling too, counts once: its first place and
    spelling are kept). Raises SuiteError when a path does not exist or nothing is found."""
    found: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            inside = sorted(p for p in path.rglob("*.toml") if p.is_file())
            if not inside:
                raise SuiteError(f"{path}: no *.toml task files under it")
            found += inside
        elif path.is_file():
            found.append(path)
        else:
            raise SuiteError(f"{path}: no such file or folder")
    seen: dict[Path, Path] = {}
    for p in found:
        seen.setdefault(p.resolve(), p)
    unique = list(seen.values())
    if not unique:
        raise SuiteError("no task files given")
    return unique


def plan_runs(tasks: Sequence[tuple[str, Path]], repeat: int) -> list[PlannedRun]:
    """``repeat`` runs of each ``(name, file)``, repeat-major (every task's first run, then every
    task's second, ...), so the first results cover every task. Raises ValueError when ``repeat < 1``."""
    if repeat < 1:
        raise ValueError("repeat must be at least 1")
    plan = []
    for k in range(1, repeat + 1):
        for name, path in tasks:
            plan.append(PlannedRun(index=len(plan), task_name=name, task_file=Path(path), repeat=k))
    return plan


def run_command(planned: PlannedRun, options: SuiteOptions) -> list[str]:
    """The ``run-task`` command line of one run (argv, no shell)."""
    argv = [*options.cli, "run-task", str(planned.task_file),
            "--runs-dir", str(options.runs_dir)]
    if options.backend:
        argv += ["--backend", options.backend]
    if options.image:
        argv += ["--image", options.image]
    if options.live is not None:
        argv.append("--live" if options.live else "--offline")
    if options.model:
        argv += ["--model", options.model]
    if options.video:
        argv.append("--video")
    return argv


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds")


def new_suite_id() -> str:
    """``suite-YYYYmmdd-HHMMSS-<4 hex>`` (UTC); also the suite folder's name under the runs folder."""
    return f"suite-{_dt.datetime.now(_dt.timezone.utc).strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"


# -- one run's outcome, from its record ---------------------------------------------------------------

_STARTED_LINE = re.compile(r"^run-task .* -> (?P<dir>.+)$")


def record_dir_from_log(log: Path) -> Path | None:
    """The record folder ``run-task`` named on its first line (``run-task NAME (MODE) -> DIR``), or None."""
    try:
        with log.open("r", encoding="utf-8", errors="replace") as fh:
            for _ in range(50):
                line = fh.readline()
                if not line:
                    return None
                match = _STARTED_LINE.match(line.rstrip("\n"))
                if match:
                    return Path(match.group("dir"))
    except OSError:
        return None
    return None


def outcome_from_record(result: RunResult) -> None:
    """Fill ``result``'s status, reason, times, steps and checks from its record (``result.record_dir``).
    A missing, unreadable or unfinished record makes it ``error`` with the process's exit status."""
    from controller.run.record import read_entries, summarize

    how = _exit_text(result.exit_code)
    if result.record_dir is None:
        result.status, result.reason = "error", f"no run record ({how})"
        return
    try:
        summary = summarize(read_entries(result.record_dir))
    except (OSError, ValueError) as exc:
        result.status, result.reason = "error", f"run record unreadable ({how}): {clean(exc, 300)}"
        return
    result.steps = summary.get("steps")
    result.checks_passed, result.checks_total = summary.get("checks_passed"), summary.get("checks_total")
    if summary.get("wall_s") is not None:
        result.wall_s = round(float(summary["wall_s"]), 3)
    timings = summary.get("timings") or {}
    if timings.get("sandbox_start") is not None:
        result.sandbox_start_s = float(timings["sandbox_start"])
    status = summary.get("status")
    if status not in STATUSES:
        result.status, result.reason = "error", f"run record unfinished ({how})"
        return
    result.status, result.reason = status, clean(summary.get("reason") or "", 500)
    if result.timed_out:
        result.status = "error"
        result.reason = f"timed out (--run-timeout); the run ended {status}: {result.reason}"


def _exit_text(code: int | None) -> str:
    if code is None:
        return "process not ended"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"


# -- the report: JSON, JUnit, tables ------------------------------------------------------------------

def _median(values: Iterable[float | int | None]) -> float | None:
    present = [v for v in values if v is not None]
    return round(float(statistics.median(present)), 3) if present else None


def run_json(result: RunResult) -> dict[str, Any]:
    """One run as the report lists it (paths as strings, times in seconds)."""
    p = result.planned
    return {
        "task": p.task_name, "file": str(p.task_file), "repeat": p.repeat, "status": result.status,
        "reason": result.reason, "record_dir": str(result.record_dir) if result.record_dir else None,
        "log": str(result.log) if result.log else None, "pid": result.pid, "exit_code": result.exit_code,
        "wall_s": result.wall_s, "sandbox_start_s": result.sandbox_start_s, "steps": result.steps,
        "checks_passed": result.checks_passed, "checks_total": result.checks_total,
        "started_at": result.started_at, "ended_at": result.ended_at,
    }


def build_report(results: Sequence[RunResult], *, suite_id: str, started_at: str, wall_s: float | None,
                 parallel: int, repeat: int, backend: str | None, cancelled: bool = False,
                 host: str | None = None) -> dict[str, Any]:
    """The suite's report (``index.json``, ``--json``), a JSON-ready dict.

    Top level: ``format`` (:data:`REPORT_FORMAT`), ``suite_id``, ``host``, ``started_at`` (UTC ISO),
    ``wall_s`` (seconds, None while it runs), ``parallel``, ``repeat``, ``backend``, ``cancelled``,
    ``status`` (``passed`` only when every run passed; ``cancelled``; else ``failed``), ``counts``
    (runs per status, ``total``), ``tasks`` (per task, in plan order: ``task``, ``file``, ``runs``,
    ``passed``, ``statuses`` (count per status), ``median_wall_s``, ``median_steps``,
    ``median_sandbox_start_s``) and ``runs`` (:func:`run_json` each, in plan order).
    """
    counts = {s: 0 for s in STATUSES}
    for r in results:
        counts[r.status] = counts.get(r.status, 0) + 1
    counts["total"] = len(results)
    tasks: dict[tuple[str, str], list[RunResult]] = {}
    for r in results:
        tasks.setdefault((r.planned.task_name, str(r.planned.task_file)), []).append(r)
    per_task = []
    for (name, path), runs in tasks.items():
        statuses: dict[str, int] = {}
        for r in runs:
            statuses[r.status] = statuses.get(r.status, 0) + 1
        ended = [r for r in runs if r.status in STATUSES and r.status != "not_started"]
        per_task.append({
            "task": name, "file": path, "runs": len(runs), "passed": statuses.get("passed", 0),
            "statuses": statuses, "median_wall_s": _median(r.wall_s for r in ended),
            "median_steps": _median(r.steps for r in ended),
            "median_sandbox_start_s": _median(r.sandbox_start_s for r in ended),
        })
    all_passed = bool(results) and counts["passed"] == len(results)
    return {
        "format": REPORT_FORMAT, "suite_id": suite_id, "host": host or socket.gethostname(),
        "started_at": started_at, "wall_s": wall_s, "parallel": parallel, "repeat": repeat, "backend": backend,
        "cancelled": cancelled,
        "status": "passed" if all_passed and not cancelled else ("cancelled" if cancelled else "failed"),
        "counts": counts, "tasks": per_task, "runs": [run_json(r) for r in results],
    }


def exit_status(report: dict[str, Any]) -> int:
    """0 when every run passed, 130 when the suite was cancelled, else 1."""
    if report.get("cancelled"):
        return EXIT_CANCELLED
    return EXIT_PASSED if report.get("status") == "passed" else EXIT_FAILED


def _seconds(value: float | None) -> str:
    return f"{(value or 0.0):.3f}"


def _or_dash(value: Any) -> str:
    """``value`` as text, ``-`` for a value a run never reached (None)."""
    return "-" if value is None else str(value)


def junit_xml(report: dict[str, Any]) -> bytes:
    """The report as JUnit XML (UTF-8 bytes with an XML declaration), as CI servers read it.

    ``<testsuites>`` (name ``desktop-sandbox run-suite``, totals) holds one ``<testsuite>`` per task
    (``name`` the task's, ``tests``, ``failures``, ``errors``, ``skipped``, ``time`` the sum of its runs'
    seconds, ``timestamp``, ``hostname``, a ``file`` property) with one ``<testcase>`` per run (``classname``
    ``desktop-sandbox.<task>``, ``name`` ``<task> #<k>``, ``file``, ``time``). A run that ``failed`` has a
    ``<failure>``, one that ended ``error`` or ``cancelled`` an ``<error>`` (``type`` its status), one never
    started (``not_started``) a ``<skipped>``; each carries ``message`` (the reason) and its text. The
    record folder and the log are in ``<system-out>``. Every string is escaped by ElementTree and made
    printable first (:func:`controller.text.clean`): XML 1.0 cannot carry most control characters.
    """
    kinds = {"failed": "failure", "error": "error", "cancelled": "error", "not_started": "skipped"}
    runs = report.get("runs", [])
    by_task: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for run in runs:
        by_task.setdefault((run["task"], run["file"]), []).append(run)

    def count(items: list[dict[str, Any]], kind: str) -> int:
        return sum(1 for r in items if kinds.get(r["status"]) == kind)

    root = ET.Element("testsuites", {
        "name": "desktop-sandbox run-suite", "tests": str(len(runs)), "failures": str(count(runs, "failure")),
        "errors": str(count(runs, "error")), "skipped": str(count(runs, "skipped")),
        "time": _seconds(report.get("wall_s")),
    })
    stamp = str(report.get("started_at") or _now())[:19]  # JUnit's timestamp: ISO 8601 without zone
    for (name, path), items in by_task.items():
        suite = ET.SubElement(root, "testsuite", {
            "name": clean(name, 200), "tests": str(len(items)), "failures": str(count(items, "failure")),
            "errors": str(count(items, "error")), "skipped": str(count(items, "skipped")),
            "time": _seconds(sum(r["wall_s"] or 0.0 for r in items)), "timestamp": stamp,
            "hostname": clean(report.get("host") or "", 200),
        })
        props = ET.SubElement(suite, "properties")
        ET.SubElement(props, "property", {"name": "file", "value": clean(path, 1000)})
        ET.SubElement(props, "property", {"name": "suite_id", "value": clean(report.get("suite_id", ""), 200)})
        for run in items:
            case = ET.SubElement(suite, "testcase", {
                "classname": f"desktop-sandbox.{clean(name, 200)}", "name": clean(f"{name} #{run['repeat']}", 240),
                "file": clean(path, 1000), "time": _seconds(run["wall_s"]),
            })
            kind = kinds.get(run["status"])
            if kind is not None:
                element = ET.SubElement(case, kind, {"message": clean(run["reason"] or run["status"], 1000),
                                                     **({"type": run["status"]} if kind != "skipped" else {})})
                if kind != "skipped":
                    element.text = clean(f"{run['status']}: {run['reason']}", 4000)
            out = [f"record: {run['record_dir']}" if run["record_dir"] else "record: none",
                   f"log: {run['log']}" if run["log"] else "log: none",
                   f"steps: {_or_dash(run['steps'])}",
                   f"checks: {_or_dash(run['checks_passed'])}/{_or_dash(run['checks_total'])}"]
            ET.SubElement(case, "system-out").text = clean(" | ".join(out), 4000)
    ET.indent(root)
    return ET.tostring(root, encoding="utf-8", xml_declaration=True) + b"\n"


def _fmt_s(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}s"


def _fmt_n(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


def task_table(report: dict[str, Any]) -> Table:
    """Per task: passes/runs, the other statuses, median wall time, steps and sandbox start."""
    table = Table(title="run-suite", title_justify="left")
    for name, justify in (("task", "left"), ("passed", "right"), ("other", "left"), ("median time", "right"),
                          ("median steps", "right"), ("median start", "right"), ("file", "left")):
        table.add_column(name, justify=justify, overflow="fold")  # type: ignore[arg-type]
    for t in report["tasks"]:
        other = ", ".join(f"{n} {s}" for s, n in t["statuses"].items() if s != "passed" and n)
        style = "green" if t["passed"] == t["runs"] else "red"
        table.add_row(escape(clean(t["task"], 60)), f"[{style}]{t['passed']}/{t['runs']}[/]", escape(other) or "-",
                      _fmt_s(t["median_wall_s"]), _fmt_n(t["median_steps"]), _fmt_s(t["median_sandbox_start_s"]),
                      escape(clean(t["file"], 200)))
    return table


def summary_line(report: dict[str, Any]) -> str:
    """``4 of 4 runs passed in 52.3s (at most 2 at once); 1 failed, ...`` (plain text)."""
    counts = report["counts"]
    rest = ", ".join(f"{counts[s]} {s.replace('_', ' ')}" for s in STATUSES if s != "passed" and counts.get(s))
    head = (f"{counts['passed']} of {counts['total']} runs passed in {_fmt_s(report.get('wall_s'))} "
            f"(at most {report['parallel']} at once)")
    return head + (f"; {rest}" if rest else "") + ("; cancelled" if report.get("cancelled") else "")


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file and a rename (readers never see half)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.partial")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def report_json(report: dict[str, Any]) -> bytes:
    """The report as indented JSON (UTF-8 bytes, newline-terminated)."""
    return (json.dumps(report, indent=2, allow_nan=False) + "\n").encode("utf-8")


# -- running the plan ---------------------------------------------------------------------------------

class _Progress:
    """What the live display shows of a running run: its record's step count (read incrementally)."""

    def __init__(self) -> None:
        self.offset = 0
        self.steps = 0
        self.phase = "starting"


class SuiteRunner:
    """Runs a plan (:func:`plan_runs`): at most ``options.parallel`` ``run-task`` processes at once, each
    supervised by a worker thread; the main thread handles signals and the display.

    ``run()`` returns the report (:func:`build_report`) once every run has ended or was given up
    (cancelled before it started). ``cancel(signum)`` cancels from code as a signal would. Never raises
    for a run that went wrong: its result says so.
    """

    def __init__(self, plan: Sequence[PlannedRun], options: SuiteOptions, *, repeat: int = 1,
                 console: Console | None = None, suite_id: str | None = None) -> None:
        self.plan = list(plan)
        self.options = options
        self.repeat = repeat
        self.console = console or Console(stderr=True)
        self.suite_id = suite_id or new_suite_id()
        self.suite_dir = options.runs_dir / self.suite_id
        self.results = [RunResult(planned=p) for p in self.plan]
        self.started_at = _now()
        self._t0 = time.monotonic()
        self._lock = threading.Lock()
        self._noted: list[int] = []  # signals, appended by the handler (no lock: it may interrupt a holder)
        self._forwarded: dict[int, int] = {}  # plan index -> how many noted signals it has been sent
        self._procs: dict[int, subprocess.Popen[bytes]] = {}
        self._progress: dict[int, _Progress] = {}
        self._queue: queue.SimpleQueue[int] = queue.SimpleQueue()
        self._done = threading.Event()
        self.wall_s: float | None = None

    # -- public -----------------------------------------------------------------------------------------

    @property
    def index_path(self) -> Path:
        """``<runs>/<suite id>/index.json``: the report, rewritten as runs start and end."""
        return self.suite_dir / "index.json"

    @property
    def cancelled(self) -> bool:
        return bool(self._noted)

    def cancel(self, signum: int = signal.SIGINT) -> None:
        """Cancel the suite as the signal ``signum`` would (safe from a signal handler: it only notes)."""
        self._noted.append(signum)

    def report(self) -> dict[str, Any]:
        """The report as it stands (:func:`build_report`)."""
        with self._lock:
            results = [RunResult(**vars(r)) for r in self.results]
        return build_report(results, suite_id=self.suite_id, started_at=self.started_at, wall_s=self.wall_s,
                            parallel=self.options.parallel, repeat=self.repeat, backend=self.options.backend,
                            cancelled=self.cancelled)

    def run(self) -> dict[str, Any]:
        """Run the plan; returns the final report (also written to :attr:`index_path`)."""
        (self.suite_dir / "logs").mkdir(parents=True, exist_ok=True)
        self._save()
        for i in range(len(self.plan)):
            self._queue.put(i)
        workers = [threading.Thread(target=self._worker, name=f"suite-worker-{n}", daemon=True)
                   for n in range(max(1, min(self.options.parallel, len(self.plan))))]
        with self._signals():
            for w in workers:
                w.start()
            self._supervise(workers)
        self.wall_s = round(time.monotonic() - self._t0, 3)
        report = self.report()
        write_atomic(self.index_path, report_json(report))
        return report

    # -- main thread ------------------------------------------------------------------------------------

    def _signals(self) -> Any:
        """SIGINT, SIGTERM and SIGHUP only noted (:meth:`cancel`) while the suite runs (main thread only)."""
        import contextlib

        @contextlib.contextmanager
        def installed() -> Any:
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            previous = {s: signal.signal(s, lambda signum, _f: self.cancel(signum))
                        for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
            try:
                yield
            finally:
                for s, h in previous.items():
                    signal.signal(s, h)

        return installed()

    def _supervise(self, workers: list[threading.Thread]) -> None:
        announced = 0
        live = Live(self._render(), console=self.console, refresh_per_second=4, transient=False) \
            if self.console.is_terminal else None
        if live is not None:
            live.start()
        try:
            while any(w.is_alive() for w in workers):
                if len(self._noted) > announced:
                    announced = self._on_signals(announced)
                self._forward()
                if live is not None:
                    live.update(self._render())
                self._done.wait(POLL_S)  # poll interval: a signal handler only appends to a list
                self._done.clear()
            self._forward()
        finally:
            if live is not None:
                live.update(self._render())
                live.stop()

    def _on_signals(self, announced: int) -> int:
        name = signal.Signals(self._noted[announced]).name
        with self._lock:
            going = len(self._procs)
            waiting = sum(1 for r in self.results if r.status == "queued")
        if announced == 0:
            self._say(f"{name}: cancelling the suite: {going} run(s) stop and remove their sandboxes, "
                      f"{waiting} not started")
        else:
            self._say(f"{name}: passed on to the {going} run(s) still tearing down")
        return len(self._noted)

    def _forward(self) -> None:
        """Send every noted signal not yet sent to each run still going."""
        with self._lock:
            total = len(self._noted)
            for index, proc in self._procs.items():
                for signum in self._noted[self._forwarded.get(index, 0):total]:
                    try:
                        proc.send_signal(signum)
                    except OSError:  # already gone
                        pass
                self._forwarded[index] = total

    def _say(self, text: str, style: str = "yellow") -> None:
        self.console.print(clean(text, 500), style=style, markup=False, emoji=False, highlight=False)

    def _render(self) -> Any:
        """The live display: one line per run going, and the counts so far."""
        with self._lock:
            running = [(r, self._progress.get(r.planned.index)) for r in self.results if r.status == "running"]
            done = [r for r in self.results if r.status in STATUSES]
            queued = sum(1 for r in self.results if r.status == "queued")
        for r, prog in running:
            if prog is not None:
                self._update_progress(r, prog)
        table = Table(box=None, show_header=True, pad_edge=False)
        for col in ("run", "phase", "steps", "time", "record"):
            table.add_column(col, overflow="ellipsis", no_wrap=True)
        now = time.monotonic()
        for r, prog in running:
            since = r.t0 or now
            table.add_row(escape(clean(r.planned.label, 50)), escape(prog.phase if prog else "starting"),
                          str(prog.steps if prog else 0), f"{now - since:.0f}s",
                          escape(clean(r.record_dir.name if r.record_dir else "-", 60)))
        passed = sum(1 for r in done if r.status == "passed")
        # A Text, not a markup string: the live area is printed beside lines shown with markup off, and a
        # string renderable takes that console's setting.
        head = Text.assemble((self.suite_id, "bold"), f": {len(done)} of {len(self.results)} done, {passed} passed, "
                             f"{len(running)} running, {queued} queued (at most {self.options.parallel} at once)")
        if self.cancelled:
            head.append(" cancelling", "yellow")
        return Group(head, table) if running else Group(head)

    def _update_progress(self, result: RunResult, prog: _Progress) -> None:
        """Read what the record gained since the last look: the step count and the last phase."""
        if result.record_dir is None and result.log is not None:
            found = record_dir_from_log(result.log)
            if found is not None:
                with self._lock:
                    result.record_dir = found
        if result.record_dir is None:
            return
        try:
            with (result.record_dir / "record.jsonl").open("rb") as fh:
                fh.seek(prog.offset)
                data = fh.read()
        except OSError:
            return
        end = data.rfind(b"\n") + 1
        prog.offset += end
        for line in data[:end].splitlines():
            try:
                kind = json.loads(line).get("type")
            except (ValueError, AttributeError):
                continue
            if kind == "model_response":
                prog.steps += 1
                prog.phase = "model loop"
            elif kind == "run_started":
                prog.phase = "launching apps"
            elif kind == "check":
                prog.phase = "verifying"
            elif kind in ("network_log", "run_finished"):
                prog.phase = "tearing down" if kind == "network_log" else "finished"

    # -- workers ----------------------------------------------------------------------------------------

    def _worker(self) -> None:
        while True:
            try:
                index = self._queue.get_nowait()
            except queue.Empty:
                return
            result = self.results[index]
            try:
                self._run_one(result)
            except BaseException as exc:  # noqa: BLE001 - one run's trouble is its own, never the suite's
                with self._lock:
                    result.status, result.reason = "error", clean(f"suite could not run it: {type(exc).__name__}: "
                                                                  f"{exc}", 500)
                    result.ended_at = result.ended_at or _now()
            finally:
                with self._lock:
                    self._procs.pop(index, None)
                    self._progress.pop(index, None)
                self._save()
                self._announce(result)
                self._done.set()

    def _run_one(self, result: RunResult) -> None:
        planned = result.planned
        log = self.suite_dir / "logs" / f"{planned.key}.log"
        out = self.suite_dir / "logs" / f"{planned.key}.out"
        env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "FORCE_COLOR", "TERMINAL_WIDTH")}
        env.update(self.options.env, PYTHONUNBUFFERED="1")
        with self._lock:
            if self._noted:
                result.status, result.reason = "not_started", "the suite was cancelled before this run started"
                return
            with log.open("wb") as err_fh, out.open("wb") as out_fh:
                proc = subprocess.Popen(run_command(planned, self.options), stdin=subprocess.DEVNULL, stdout=out_fh,
                                        stderr=err_fh, env=env, start_new_session=True)
            self._procs[planned.index] = proc
            self._progress[planned.index] = _Progress()
            result.status, result.log, result.pid, result.started_at = "running", log, proc.pid, _now()
            result.t0 = time.monotonic()
        self._save()
        self._say(f"started {planned.label} (pid {proc.pid})", style="dim")
        try:
            code = proc.wait(timeout=self.options.run_timeout_s)
        except subprocess.TimeoutExpired:
            result.timed_out = True
            self._say(f"{planned.label}: over --run-timeout {self.options.run_timeout_s:g}s: cancelling it")
            proc.send_signal(signal.SIGTERM)
            try:
                code = proc.wait(timeout=KILL_GRACE_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                code = proc.wait()
        finished = time.monotonic() - (result.t0 or time.monotonic())
        record = _record_from_stdout(out) or record_dir_from_log(log)
        with self._lock:
            result.exit_code, result.ended_at = code, _now()
            result.record_dir = record
            result.wall_s = round(finished, 3)
        outcome_from_record(result)

    def _announce(self, result: RunResult) -> None:
        style = {"passed": "green", "failed": "red", "error": "red"}.get(result.status, "yellow")
        if result.status == "not_started":
            return
        where = f" -> {result.record_dir}" if result.record_dir else ""
        steps = f", {result.steps} steps" if result.steps is not None else ""
        self._say(f"{result.status} {result.planned.label} in {_fmt_s(result.wall_s)}{steps}{where}"
                  + (f" ({result.reason})" if result.status != "passed" and result.reason else ""), style=style)

    def _save(self) -> None:
        try:
            write_atomic(self.index_path, report_json(self.report()))
        except OSError as exc:
            self._say(f"cannot write {self.index_path}: {exc.strerror or exc}", style="red")


def _record_from_stdout(out: Path) -> Path | None:
    """The record folder from ``run-task``'s stdout (its last line: ``runs/<id>/record.jsonl``)."""
    try:
        lines = [line for line in out.read_text(encoding="utf-8", errors="replace").splitlines() if line.strip()]
    except OSError:
        return None
    if not lines or not lines[-1].endswith("record.jsonl"):
        return None
    return Path(lines[-1]).parent


def run_suite(plan: Sequence[PlannedRun], options: SuiteOptions, *, repeat: int = 1,
              console: Console | None = None,
              on_start: Callable[[SuiteRunner], None] | None = None) -> tuple[SuiteRunner, dict[str, Any]]:
    """Run ``plan`` (:class:`SuiteRunner`); ``on_start(runner)`` is called before the first run starts.
    Returns the runner and its final report."""
    runner = SuiteRunner(plan, options, repeat=repeat, console=console)
    if on_start is not None:
        on_start(runner)
    return runner, runner.run()
