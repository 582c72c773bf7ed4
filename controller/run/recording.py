"""What a run writes to its record while it goes: the SDK's and the driver's events as entry models
(:class:`RecordingHooks`) and the gateway's network decisions, copied in as they appear
(:class:`DecisionTail`).

Network decisions reach the record in time order with the actions: after every model response and
every driver call the hooks ask a background reader for the lines the gateway's decision log gained
since (so the action path never waits on the gateway), which writes each decision not yet recorded,
when it is read; at teardown :meth:`DecisionTail.finish` reads the whole log once more, writes what is still
missing, and adds the ``network_log`` entry saying whether every line of the log is in the record.
A decision is identified by its line number in the gateway's log (the log is append-only, one
decision a line), so none is written twice and none is skipped. A decision on a connection held for an
origin request carries the request's id (:attr:`DecisionTail.requests` collects them, for the
teardown's reconciliation with the ``approval`` lines, :func:`controller.run.origins.reconcile_approvals`).
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from pathlib import Path
from typing import Any, Callable

import httpx
from pydantic import ValidationError

from controller.gateway.policy import Decision
from controller.run.approvals import Decision as ApprovalDecision
from controller.run.driver import SandboxDriver, SentScreenshot, driver_actions
from controller.run.entries import (
    MAX_MODEL_TEXT, Action, Approval, BrowserCall, BrowserResult, ComputerCall, Expectation, ModelResponse, Network,
    NetworkLog, RunStarted, TaskRef, Usage, browser_arguments, problem,
)
from controller.run.model_client import RequestUsage, UsageMeter
from controller.run.record import RunRecord, recorded_action
from controller.run.tasks import Task
from controller.text import clean, clean_lines

MAX_DECISIONS_PER_READ = 1000
"""Most decisions one read during the run copies into the record (the rest wait for the next read)."""

MAX_DECISIONS = 100_000
"""Most decisions a run records; a log with more is recorded up to here and marked incomplete."""

FIELD_CHARS = {"origin": 500, "reason": 300, "via": 20, "at": 40}
"""Longest text (characters, after escaping) kept of each field of a decision: the origin is the raw
target when the gateway could not parse it, so a guest chooses it."""


def _text(value: Any) -> str | None:
    """A string field from the model's JSON: strings kept, anything else as its JSON text (cut)."""
    if value is None or isinstance(value, str):
        return value
    return clean(json.dumps(value, default=str), 200)


REQUEST_ID = re.compile(r"oreq_[A-Za-z0-9_-]{1,128}")
"""An origin request id as the gateway's log names it (anything else is not kept)."""


def network_entry(item: Any, seq: int) -> Network | str:
    """The ``network`` entry for line ``seq`` (1-based) of the gateway's log, parsed as ``item``; or
    why that line is not a decision (a short text). Text fields are escaped and cut
    (:data:`FIELD_CHARS`). ``request_id`` (an origin request id, :data:`REQUEST_ID`) and ``held_ms``
    (a number >= 0) are kept when the line has them and they are well formed; other fields a newer
    gateway adds are ignored."""
    if not isinstance(item, dict):
        return f"line {seq}: not a JSON object"
    try:
        d = Decision.model_validate({k: v for k, v in item.items() if k in Decision.model_fields})
    except ValidationError as exc:
        return clean(f"line {seq}: {problem(exc)}", 200)
    rid, held = item.get("request_id"), item.get("held_ms")
    return Network(seq=seq, origin=clean(d.origin, FIELD_CHARS["origin"]), decision=d.decision,
                   reason=clean(d.reason, FIELD_CHARS["reason"]),
                   via=clean(d.via, FIELD_CHARS["via"]) if d.via is not None else None,
                   at=clean(d.ts, FIELD_CHARS["at"]),
                   request_id=rid if isinstance(rid, str) and REQUEST_ID.fullmatch(rid) else None,
                   held_ms=float(held) if isinstance(held, (int, float)) and not isinstance(held, bool)
                   and 0 <= held < 1e12 else None)


def model_text(body: Any) -> str | None:
    """The words of a ``/responses`` body: the ``output_text`` parts of its ``message`` items, joined by
    blank lines, escaped (:func:`controller.text.clean`, which keeps line breaks) and cut to
    :data:`controller.run.entries.MAX_MODEL_TEXT`; None when there are none."""
    parts: list[str] = []
    for item in (body.get("output") or []) if isinstance(body, dict) else []:
        if isinstance(item, dict) and item.get("type") == "message" and isinstance(item.get("content"), list):
            parts.extend(c["text"] for c in item["content"]
                         if isinstance(c, dict) and c.get("type") == "output_text" and isinstance(c.get("text"), str))
    return clean_lines("\n\n".join(parts), MAX_MODEL_TEXT) if parts else None


class DecisionTail:
    """Copies the gateway's decisions into ``record`` as they appear.

    ``read(start, max_lines)``: lines ``start``.. (0-based) of the gateway's decision log, at most
    ``max_lines``, one item per complete line (the parsed JSON value, or the text of a line that is not
    JSON): :meth:`controller.sandbox.Sandbox.decisions_since`. :meth:`poll` records the lines after the
    last one handled (at most :data:`MAX_DECISIONS_PER_READ`) and never raises. :meth:`start` runs
    the reads on a background thread instead, so :meth:`poke` (after each model response and driver
    call) never waits for the gateway: pokes that arrive during a read make one more read after it.
    :meth:`finish` stops that thread, reads to the end of the log, records what is still missing and
    writes the ``network_log`` entry. Thread-safe.

    An action in flight: :meth:`hold` (as the driver sends it) keeps what is read meanwhile out of the
    record until :meth:`release` (once its ``action`` line is written), so that every decision the
    gateway made during an action is written after that action's line, however late a read poked
    before it ran (contract 4). What was held is written in log order, before anything read later.
    """

    def __init__(self, record: RunRecord, read: Callable[[int, int], list[Any]]) -> None:
        self.record = record
        self.read = read
        self.consumed = 0
        """Lines of the gateway's log handled so far (recorded, or counted in ``invalid``)."""
        self.invalid: list[str] = []
        self.requests: dict[str, dict[str, Any]] = {}
        """Origin request ids the log named (``network`` entries' ``request_id``) -> the last such
        line's ``origin`` and ``reason``: what :func:`controller.run.origins.reconcile_approvals` checks."""
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failure: str | None = None
        self._gate = threading.Lock()  # held while entries are written or kept back; never during a read
        self._held = False
        self._finishing = False  # no hold from now on: finish() writes every entry it reads
        self._kept: list[Network] = []

    def hold(self) -> None:
        """An action is about to be sent: keep the entries read from now on until :meth:`release`
        (none once :meth:`finish` began)."""
        with self._gate:
            self._held = not self._finishing

    def release(self) -> None:
        """The action's line is written: write what was kept back, in log order, and stop holding."""
        with self._gate:
            kept, self._kept, self._held = self._kept, [], False
            for entry in kept:
                self.record.write(entry)

    def _write(self, entries: list[Network]) -> None:
        """One read's entries, all kept back or all written: a hold that comes while they are written
        does not split them (they were all logged before the action it is for was sent)."""
        with self._gate:
            if self._held:
                self._kept.extend(entries)
            else:
                for entry in entries:
                    self.record.write(entry)

    def _take(self, lines: Any) -> int:
        if not isinstance(lines, list):
            self._failure = f"the decision log read gave a {type(lines).__name__}, not a list of lines"
            return 0
        room = max(0, MAX_DECISIONS - self.consumed)
        entries: list[Network] = []
        for seq, item in enumerate(lines[:room], self.consumed + 1):
            entry = network_entry(item, seq)
            if isinstance(entry, str):
                self.invalid.append(entry)
            else:
                entries.append(entry)
                if entry.request_id is not None:
                    self.requests[entry.request_id] = {"origin": entry.origin, "reason": entry.reason}
        self._write(entries)
        self.consumed += min(len(lines), room)
        return min(len(lines), room)

    def poll(self) -> int:
        """Record the decisions logged since the last read; returns how many lines were handled (0
        also when the log could not be read: :meth:`finish` reads again and reports)."""
        with self._lock:
            try:
                lines = self.read(self.consumed, MAX_DECISIONS_PER_READ)
            except Exception:  # noqa: BLE001 - the run goes on; finish() reads again and reports
                return 0
            return self._take(lines)

    def start(self) -> "DecisionTail":
        """Read on a background thread from now on (see the class docstring); returns self."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="decision-tail", daemon=True)
            self._thread.start()
        return self

    def poke(self) -> None:
        """Ask for a read: at once on the background thread when started, else in this thread."""
        if self._thread is None:
            self.poll()
        else:
            self._wake.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait()
            self._wake.clear()
            if not self._stop.is_set():
                self.poll()

    def finish(self, join_timeout: float = 60.0) -> NetworkLog:
        """Stop the background reads, read to the end of the log, record every decision not yet
        recorded, and write ``network_log``: ``complete`` only when every line of the log is in the
        record. ``join_timeout``: seconds to wait for a read in flight."""
        if self._thread is not None:
            self._stop.set()
            self._wake.set()
            self._thread.join(join_timeout)
        with self._gate:
            self._finishing = True
        self.release()  # an action cut short by the run's end wrote no line; what it kept goes now
        with self._lock:
            errors: list[str] = []
            if self._thread is not None and self._thread.is_alive():
                errors.append(f"a read of the gateway's log did not end in {join_timeout:g}s")
            while not errors and self.consumed < MAX_DECISIONS:
                try:
                    lines = self.read(self.consumed, MAX_DECISIONS_PER_READ)
                except Exception as exc:  # noqa: BLE001 - teardown goes on; the record keeps the failure
                    errors.append(f"cannot read the gateway's log: {clean(exc, 300)}")
                    break
                if not self._take(lines):
                    break
            if self._failure:
                errors.append(self._failure)
            if self.consumed >= MAX_DECISIONS:
                try:
                    more = bool(self.read(self.consumed, 1))
                except Exception:  # noqa: BLE001 - counted as more: the record is capped either way
                    more = True
                if more:
                    errors.append(f"more than {MAX_DECISIONS} decisions: only the first {MAX_DECISIONS} "
                                  "are recorded")
            if self.invalid:
                errors.append(f"{len(self.invalid)} lines are not decisions ({self.invalid[0]})")
            return self.record.write(NetworkLog(complete=not errors, decisions=self.consumed,
                                                error=clean("; ".join(errors), 500) if errors else None))


def decision_reader(sandbox: Any) -> Callable[[int, int], list[Any]]:
    """The ``read`` of a :class:`DecisionTail` for ``sandbox``: its ``decisions_since`` (every backend
    has one), else lines sliced from its ``decision_log()`` (a sandbox made of parts, in tests)."""
    since = getattr(sandbox, "decisions_since", None)
    if callable(since):
        return lambda start, max_lines: since(start, max_lines)
    return lambda start, max_lines: list(sandbox.decision_log()[start:start + max_lines])


class RecordingHooks:
    """Bridges SDK/driver events to the run record (model responses, calls, actions, screenshots,
    approvals), reading new network decisions (``network``, a :class:`DecisionTail`) after each model
    response and each driver call."""

    def __init__(self, record: RunRecord, driver: SandboxDriver, network: DecisionTail | None = None) -> None:
        self.record = record
        self.driver = driver
        self.network = network
        self.current_call: str | None = None
        self.action_count = 0
        self.last_screenshot: str | None = None
        """File name of the last screenshot sent to the model (what an approval was asked on)."""
        self.waited_for_origin_ms: float | None = None
        """Milliseconds the next screenshot waited for origin requests (set before it is taken, then
        written on its ``screenshot`` line)."""
        self.browser: Any = None
        """The run's :class:`controller.run.browser_driver.GuestBrowserDriver` when the model has the
        browser tools: each browser call's ``browser_call`` line takes its outcome from it."""
        self.steps = 0
        """Model responses answered so far (the ``step`` of a ``browser_call``)."""
        self.typed_text = False
        """Keep typed text in ``computer_call`` lines beside its length (``[record] typed_text``,
        ``--record-typed-text``: what ``desktop-sandbox replay`` types again)."""
        self._browser_calls: dict[str, tuple[str, Any]] = {}  # call_id -> (member, arguments as sent)

    def _poll(self) -> None:
        """No action is in flight (a model response, an action's or a browser call's line is written):
        what the tail held back goes to the record, and a read is asked for."""
        if self.network is not None:
            self.network.release()
            self.network.poke()

    def on_request(self, usage: RequestUsage, body: Any) -> None:
        """One ``/responses`` answer (``body``: its parsed JSON, None when it was not JSON)."""
        if usage.status >= 400:
            err = body.get("error") if isinstance(body, dict) else None
            self.record.write(ModelResponse(response_id=None, http_status=usage.status, error=err, usage=None))
            self._poll()
            return
        tokens = None
        if usage.total_tokens is not None:
            tokens = Usage(input_tokens=usage.input_tokens, output_tokens=usage.output_tokens,
                           total_tokens=usage.total_tokens)
        self.record.write(ModelResponse(response_id=_text(usage.response_id), http_status=usage.status, usage=tokens,
                                        text=model_text(body)))
        self.steps += 1
        planned: list[int] = []
        for item in (body.get("output") or []) if isinstance(body, dict) else []:
            if isinstance(item, dict) and item.get("type") == "function_call":
                self._note_browser_call(item)
            if not isinstance(item, dict) or item.get("type") != "computer_call":
                continue
            listed = item.get("actions") is not None
            actions = item.get("actions") if listed else [item.get("action")]
            planned.append(driver_actions(actions if isinstance(actions, list) else [actions]))
            checks = item.get("pending_safety_checks")
            self.current_call = _text(item.get("call_id"))
            self.record.write(ComputerCall(
                call_id=self.current_call, form="actions" if listed else "action",
                actions=[recorded_action(a, self.typed_text) if isinstance(a, dict) else a
                         for a in (actions if isinstance(actions, list) else [actions])],
                pending_checks=checks if isinstance(checks, list) else [],
            ))
        plan = getattr(self.driver, "plan_calls", None)
        if plan is not None:
            plan(planned)
        self._poll()

    def _note_browser_call(self, item: dict[str, Any]) -> None:
        """Keep a ``browser_*`` function call's member and arguments (as the model sent them) by its
        call id, for its ``browser_call`` line."""
        name, call_id = item.get("name"), item.get("call_id")
        if not (isinstance(name, str) and name.startswith("browser_") and isinstance(call_id, str)):
            return
        try:
            arguments = json.loads(item.get("arguments") or "")
        except (TypeError, ValueError, RecursionError):
            arguments = None
        if len(self._browser_calls) >= MAX_BROWSER_CALLS_KEPT:
            self._browser_calls.pop(next(iter(self._browser_calls)))
        self._browser_calls[call_id] = (name[len("browser_"):], arguments if isinstance(arguments, dict) else None)

    def on_diagnostic(self, event: dict[str, Any]) -> None:
        """The SDK's diagnostics: each driver call becomes an ``action`` entry, each browser call that
        ended (ran, failed, or was refused before it ran) a ``browser_call`` entry."""
        if event.get("api") == "browser":
            self._on_browser(event)
            return
        if event.get("stage") != "action":
            return
        reason = event.get("reason")
        error = None
        if reason == "driver_failed":
            error = self.driver.last_error or "driver failed"
        elif reason == "cancelled":
            error = "cancelled"
        if event.get("member") != "screenshot":
            self.action_count += 1
        self.record.write(Action(call_id=_text(event.get("call_id")), action=_text(event.get("member")),
                                 duration_ms=round(float(event.get("duration_ms") or 0.0), 2), error=_text(error)))
        self._poll()

    def _on_browser(self, event: dict[str, Any]) -> None:
        stage, reason = event.get("stage"), event.get("reason")
        if (stage, reason) not in BROWSER_ENDS:
            return
        call_id = _text(event.get("call_id"))
        member = _text(event.get("member"))
        noted = self._browser_calls.pop(call_id, None) if isinstance(call_id, str) else None
        driver = self.browser
        outcome = getattr(driver, "last", None)
        if driver is not None:
            driver.last = None  # each outcome is written once
        member = member or (noted[0] if noted else None)
        if stage != "action" or outcome is None or outcome.member != member:
            outcome = None  # nothing reached the agent (or list_tabs, which the SDK answers itself)
        arguments = noted[1] if noted and noted[1] is not None else (outcome.arguments if outcome else None)
        if reason == "completed":
            error = None
        elif reason == "cancelled":
            error = "cancelled"
        elif stage == "arguments":
            error = ("the SDK refused the call's arguments" if member else "not an enabled browser tool")
        elif stage == "approval" and reason == "refused":
            refused = getattr(driver, "refused_url", None) if member in ("navigate", "new_tab") else None
            error = f"navigation refused: {refused}" if refused else "not approved"
        elif stage == "approval":
            error = "the approval failed"
        else:
            error = (outcome.error if outcome is not None else None) or "driver failed"
        shot = None
        if outcome is not None and outcome.image is not None:
            image = outcome.image
            saved = self.record.save_screenshot(image.data, image.mime, image_size=image.size, frame=image.frame,
                                                call_id=call_id, redacted=image.redacted)
            shot = self.last_screenshot = saved.file
        kept = _bounded(browser_arguments(member or "", arguments)) if isinstance(arguments, dict) else None
        tab = kept.get("tab_id") if kept else None
        ms = outcome.ms if outcome is not None and outcome.ms is not None else event.get("duration_ms")
        self.record.write(BrowserCall(
            step=self.steps or None, call_id=call_id, member=member, arguments=kept, ok=error is None,
            error=clean(error, 300) if error else None,
            result=BrowserResult(**outcome.result) if outcome is not None and outcome.result else None,
            tab_id=clean(tab, 128) if isinstance(tab, str) else None,
            target=_box(outcome.target) if outcome is not None else None,
            viewport=_box(outcome.viewport) if outcome is not None else None, screenshot=shot,
            ms=round(float(ms), 2) if isinstance(ms, (int, float)) and ms >= 0 else None))
        self._poll()

    def on_screenshot(self, shot: SentScreenshot) -> None:
        """An image sent to the model: stored beside the record."""
        waited, self.waited_for_origin_ms = self.waited_for_origin_ms, None
        entry = self.record.save_screenshot(shot.data, shot.mime, image_size=shot.image_size, frame=shot.frame,
                                            screen_size=shot.screen_size, reencoded=shot.reencoded,
                                            call_id=self.current_call, waited_for_origin_ms=waited,
                                            redacted=shot.redacted)
        self.last_screenshot = entry.file

    def on_decision(self, decision: ApprovalDecision) -> None:
        """An approval decision (safety check, action or origin request)."""
        self.record.write(Approval(**decision.as_record()))


BROWSER_ENDS = frozenset({("action", "completed"), ("action", "driver_failed"), ("action", "cancelled"),
                          ("arguments", "invalid_input"), ("approval", "refused"), ("approval", "policy_failed"),
                          ("approval", "cancelled")})
"""The SDK's browser diagnostics (stage, reason) that end a call: each is one ``browser_call`` line."""

MAX_BROWSER_CALLS_KEPT = 1000
"""Most browser calls of the model's responses kept by call id until their end is recorded."""

MAX_ARGUMENT_CHARS = 2048
"""Longest string of a browser call's arguments the record keeps (characters, escaped and cut)."""


def _bounded(value: Any, depth: int = 0) -> Any:
    """A model-sent JSON value with every string escaped and cut (:data:`MAX_ARGUMENT_CHARS`), lists
    and objects cut to 200 items, nesting to 4 levels."""
    if isinstance(value, str):
        return clean(value, MAX_ARGUMENT_CHARS)
    if isinstance(value, dict):
        if depth >= 4:
            return None
        return {clean(k, 64): _bounded(v, depth + 1) for k, v in list(value.items())[:200]}
    if isinstance(value, list):
        return None if depth >= 4 else [_bounded(v, depth + 1) for v in value[:200]]
    if isinstance(value, float) and value != value:
        return None
    return value


def _box(value: Any) -> dict[str, float] | None:
    """A ``{x, y, width, height}`` box of finite numbers, or None."""
    if not isinstance(value, dict):
        return None
    try:
        box = {k: float(value[k]) for k in ("x", "y", "width", "height")}
    except (KeyError, TypeError, ValueError):
        return None
    return box if all(abs(v) < 1e9 for v in box.values()) else None


def run_started_entry(task: Task, sandbox: Any, *, mode: str, model: str, legacy: bool, max_steps: int,
                      script: Path | None, sandbox_start_s: float | None, runner: str = "sdk",
                      typed_text: bool = False) -> RunStarted:
    """The ``run_started`` entry of ``task`` on ``sandbox`` (None: it did not start): the task file's
    sha256, the sandbox's id, image and ``time_scale``, the task's policy and screen settings, how
    approvals are bound to the screen and whether typed text is recorded."""
    digest = hashlib.sha256(task.source.read_bytes()).hexdigest() if task.source and task.source.is_file() else None
    return RunStarted(
        task=TaskRef(name=task.name, source=str(task.source) if task.source else None, sha256=digest),
        mode=mode, model=model, legacy=legacy, image=getattr(sandbox, "image_id", None),
        sandbox=getattr(sandbox, "id", None), time_scale=getattr(sandbox, "time_scale", 1.0),
        policy=task.network.model_dump(mode="json"), max_steps=max_steps, screen=task.screen.model_dump(mode="json"),
        model_view=task.model.model_dump(mode="json"), script=str(script) if script else None,
        sandbox_start_s=sandbox_start_s, runner=runner,
        screen_binding=(rule.model_dump() if (rule := task.approvals.rule()) is not None else None),
        typed_text=typed_text, claim=getattr(sandbox, "provenance", None),
    )


def expectation_recorder(record: RunRecord) -> Callable[[dict[str, Any]], None]:
    """The scripted model's ``on_expectation``: each resolved turn becomes an ``expectation`` entry."""
    return lambda entry: record.write(Expectation(**entry))


class BodyMeter(UsageMeter):
    """UsageMeter that also hands the parsed body to the recorder (``sink(usage, body)``)."""

    def __init__(self, sink: Callable[[RequestUsage, Any], None],
                 exchange: Callable[[bytes, Any], None] | None = None) -> None:
        super().__init__()
        self._sink = sink
        self._exchange = exchange  # (request body, parsed answer): the conversation's tail

    def hook(self, response: httpx.Response) -> None:  # noqa: D102
        before = len(self.requests)
        super().hook(response)
        if len(self.requests) > before:
            try:
                body = json.loads(response.content)
            except ValueError:
                body = None
            self._sink(self.requests[-1], body)
            if self._exchange is not None:
                self._exchange(response.request.content, body)
