"""Run progress on the console: one line per run-record entry, printed as the run goes.

:class:`RunPrinter` is the run record's listener (``RunRecord(..., on_entry=printer)``): everything
the console shows about a run's steps comes from the entries written to ``record.jsonl``, so the
console never shows what the record does not hold -- typed text in particular is only ever a length
(``type <12 chars>``). Coordinates are the model's (model px), as the model sent them.

Lines (one each): the sandbox start with its time; each model response (step number, short response
id, token usage); each computer_call with its actions summarised and its pending safety checks; a
failed or cancelled action; each browser call (:func:`browser_call_text`: the member, its arguments with
typed text as a length, and what it returned or why it failed); each approval decision and each
``--approve-safety-check`` opt-in; the
network decisions, deduplicated by (decision, origin, reason) with a count; each check with what was
observed; each offline script turn's screen expectations (met, after how many inserted waits, or the
one given up on with what was observed). The verdict and the record path are in the summary table
that follows.

Strings from the model, the guest or the gateway are printed literally (never console markup, never
``:emoji:`` codes) with control characters escaped, and shortened to :data:`SHORT` characters
(:func:`controller.text.clean`).

Each line fits :data:`WIDTH` columns (or the console's width when that is less): a line is a row of
parts (:func:`fitted`), and when it is too wide its longest parts (a SQL query, an origin, a path) are
shortened with an ellipsis first, so what follows them (what a check observed, a decision) stays in
view. The record keeps every value whole.

:func:`make_console` gives a console that does not wrap mid-word when output is piped and never
turns ``:name:`` codes into emoji.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from rich.console import Console, ConsoleOptions, RenderableType, RenderResult
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from controller.run.entries import (
    Action, Approval, BrowserCall, Check, ComputerCall, Expectation, HumanAction, ModelResponse, Network, NetworkLog,
    PolicySwap, Redaction, RunStarted, Takeover, UnmetExpectation, Usage, Video, WebRecording, as_entry, SignIn)
from controller.model.requests import ORIGIN_ACCESS, SAFETY_CHECK, request_kind
from controller.redaction import REASONS
from controller.sandbox.pool import COLD_REASONS
from controller.text import SHORT, clean
from wire.actions import describe

__all__ = ["PIPE_WIDTH", "SHORT", "WIDTH", "Fitted", "Kept", "RunPrinter", "clean", "fitted", "make_console",
           "print_fitted"]

PIPE_WIDTH = 200
"""Console width (columns) when the output is not a terminal and ``COLUMNS`` is not set."""

WIDTH = 100
"""Most columns a line of a run's output takes: its progress lines and its summary table (also
``desktop-sandbox report``'s). Longer values are shortened with an ellipsis; ``report --json``, the
HTML report and the record hold them whole."""


def policy_text(policy: dict) -> str:
    """``mode allowlist, 2 allowed origin(s)`` / ``mode ask, 1 allowed, asks for 3 pattern(s)``."""
    mode = clean(policy.get("mode"), 20)
    allow = len(policy.get("allow") or [])
    text = f"mode {mode}" + (f", {allow} allowed origin(s)" if mode != "deny-all" else "")
    if mode == "ask":
        text += f", asks for {len(policy.get('ask') or [])} pattern(s)"
    return text


@dataclass(frozen=True)
class Kept:
    """A part of a :func:`fitted` line that is not shortened to make room for the others (what a check
    observed, after its long rule): it takes what they leave, at least ``max_width`` columns, and
    leaves them at least half the line."""

    text: str | Text
    max_width: int = 40


class Fitted:
    """One line of parts (:func:`fitted`), laid out for the width it is given."""

    def __init__(self, parts: tuple[str | Text | Kept, ...], style: str | None) -> None:
        self.parts, self.style = parts, style

    def grid(self, width: int) -> Table:
        """The line as a rich grid for ``width`` columns: a :class:`Kept` part may take what the other
        parts leave of it, keeping them at least half the line (or what they need, when less)."""
        cells = [(part, cell) for part, cell in ((part, self._cell(part)) for part in self.parts) if cell.plain]
        others = sum(cell.cell_len for part, cell in cells if not isinstance(part, Kept))
        grid = Table.grid()
        for part, _ in cells:
            if isinstance(part, Kept):
                grid.add_column(no_wrap=True, max_width=max(part.max_width, width - min(others, width // 2)))
            else:
                grid.add_column()
        grid.add_row(*(cell for _, cell in cells))
        return grid

    def _cell(self, part: str | Text | Kept) -> Text:
        text = part.text if isinstance(part, Kept) else part
        cell = text.copy() if isinstance(text, Text) else Text(text, style=self.style or "")
        cell.no_wrap, cell.overflow = True, "ellipsis"
        return cell

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield self.grid(options.max_width)

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        return Measurement.get(console, options, self.grid(options.max_width))


def fitted(*parts: str | Text | Kept, style: str | None = None) -> Fitted:
    """One line made of ``parts`` side by side (strings are shown literally: no markup, no emoji codes;
    empty ones are left out), as a rich grid: where the line is given fewer columns than it needs, the
    widest parts give way first, each shortened with an ellipsis (rich's column collapse), never
    wrapped; a :class:`Kept` part gives way only to its own limit. ``style`` applies to the string
    parts."""
    return Fitted(parts, style)


def fit_width(console: Console) -> int:
    """The columns a run's output may take on ``console``: :data:`WIDTH`, or less on a narrower console."""
    return min(console.width, WIDTH)


def print_fitted(console: Console, renderable: RenderableType) -> None:
    """Print ``renderable`` (a :func:`fitted` line, a summary table) in :func:`fit_width` columns."""
    console.print(renderable, width=fit_width(console))


def make_console(*, stderr: bool = False) -> Console:
    """A rich console for the CLI: ``soft_wrap`` (long lines are not broken mid-word), no emoji codes
    (``:warning:`` in a page title stays text) and, when the output is not a terminal,
    :data:`PIPE_WIDTH` columns for tables instead of rich's default 80 (``COLUMNS`` still wins when
    set)."""
    console = Console(stderr=stderr, soft_wrap=True, emoji=False)
    if not console.is_terminal and not os.environ.get("COLUMNS"):
        console.width = PIPE_WIDTH
    return console


def summarize_action(action: Any) -> str:
    """A short summary of one record action (already redacted: ``type`` carries ``text_length``):
    :func:`wire.actions.describe` with typed text redacted and values escaped by
    :func:`controller.text.clean`.

    ``click (640,250) left``, ``double_click (10,20)``, ``type <12 chars>``, ``keypress ctrl+c``,
    ``scroll (640,400) 0,-300``, ``move (5,6)``, ``drag (1,2)->(30,40) 3 points``, ``wait``,
    ``screenshot``. Coordinates in model px. Never shows typed text, even if handed an unredacted
    ``type`` action.
    """
    return describe(action, clean=clean, redact=True)


def _usage(usage: Usage | None) -> str:
    if usage is None:
        return "usage not reported"
    return f"{usage.total_tokens} tokens (in {usage.input_tokens}, out {usage.output_tokens})"


def _short_id(value: Any, limit: int = 16) -> str:
    text = clean(value, 200)
    return text if len(text) <= limit else text[:limit - 1] + "…"


def describe_check(check: Check) -> str:
    """``pass file /home/sandbox/x text: observed 'abc'`` or ``FAIL file /x text: expected 'a', file
    missing`` (a check with nothing observed shows why: ``file missing``, ``database missing``, the
    detail): :func:`check_parts` joined."""
    return "".join(check_parts(check))


def check_parts(check: Check, limit: int = SHORT) -> list[str]:
    """A check's line in parts (:func:`fitted`, the last one :class:`Kept`): ``pass file ``, the target,
    `` text`` (the rule) and ``: observed 'abc'`` (or ``: expected 'a', file missing``); values cut at
    ``limit`` characters (the target and the rule at no fewer than 120 and 80)."""
    mark = "pass" if check.passed else "FAIL"
    observed = observed_text(check, limit)
    if check.passed:
        outcome = f": observed {observed}"
    else:
        outcome = (f": expected {clean(repr(check.expected), limit)}, "
                   f"{observed if check.observed is None else 'observed ' + observed}")
    return [f"{mark} {clean(check.kind, 10)} ", clean(check.target, max(limit, 120)),
            f" {clean(check.rule, max(limit, 80))}", outcome]


def observed_text(check: Check, limit: int = SHORT) -> str:
    """What a check observed, short: the value's repr, or why there is none (``file missing``)."""
    if check.observed is None:
        detail = check.detail or "nothing observed"
        return {"file does not exist": "file missing", "database does not exist": "database missing"}.get(
            detail, clean(detail, limit))
    return clean(repr(check.observed), limit)


def sign_in_text(d: dict[str, Any]) -> str:
    """One line for a ``sign_in`` entry (as JSON): ``sign-in at ORIGIN, form N: method M, email: submitted
    (console)``, every piece escaped (the progress lines and the HTML report)."""
    given = [f"method {clean(str(d['method']), 40)}"] if d.get("method") else []
    given += [clean(str(i), 40) for i in d.get("submitted") or []]
    return (f"sign-in at {clean(str(d.get('origin')), 200)}, form {clean(str(d.get('step')), 10)}: "
            f"{', '.join(given) or 'nothing given'}: {clean(str(d.get('outcome')), 40)}"
            + (f" ({clean(str(d['by']), 20)})" if d.get("by") else "")
            + (f": {clean(str(d['detail']), 200)}" if d.get("detail") else ""))


def redaction_text(d: dict[str, Any]) -> str:
    """One line for a ``redaction`` entry (as JSON): ``kept out of every picture: the whole screen: the agent
    was filling a sign-in form (...)`` or ``...: the region 10,20 640x480: a person typed ...``, escaped (the
    progress lines and the HTML report)."""
    box = d.get("box")
    where = ("the whole screen" if box is None else
             "the region " + clean(f"{box[0]},{box[1]} {box[2]}x{box[3]}" if isinstance(box, (list, tuple))
                                   and len(box) == 4 else str(box), 40))
    return (f"kept out of every picture: {where}: {clean(REASONS.get(str(d.get('why')), str(d.get('why'))), 120)}"
            + (" (held since before this run)" if d.get("held_before") else ""))


def web_text(d: dict[str, Any]) -> str:
    """One line for a ``web_recording`` entry (as JSON), escaped, its counts first and its folder last (a
    line cut to the console's width loses the path, not the numbers): ``kept 3 responses of 1 origin(s)
    (12 KiB); not kept: tunnel 2, too_large 1; in web/`` or ``served 3 answers, denied 1 not in it (holds 2
    responses, 12 KiB); from DIR``; a recording not read back whole says ``incomplete: WHY`` before its
    folder."""
    skipped = ", ".join(f"{clean(str(k), 20)} {v}" for k, v in sorted((d.get("skipped") or {}).items()))
    size = d.get("bytes") or 0
    size_text = f"{size} B" if size < 1024 else f"{size / 1024:.0f} KiB"
    if d.get("mode") == "serve":
        text = (f"served {d.get('served') or 0} answers, denied {d.get('missing') or 0} not in it "
                f"(holds {d.get('responses', 0)} responses, {size_text})")
        where = f"from {clean(str(d['source']), 300)}" if d.get("source") else ""
    else:
        text = (f"kept {d.get('responses', 0)} responses of {len(d.get('origins') or [])} origin(s) ({size_text})"
                + (f"; not kept: {skipped}" if skipped else ""))
        where = f"in {clean(str(d['dir']), 300)}/" if d.get("dir") else ""
    incomplete = f"; incomplete: {clean(str(d.get('error')), 200)}" if not d.get("complete", True) else ""
    return f"{text}{incomplete}" + (f"; {where}" if where else "")


def video_text(d: dict[str, Any]) -> str:
    """One line for a ``video`` entry (as JSON): ``run.webm: 34 frames, 17.0 s, 1280x800, 412 KiB (2 dropped:
    the encoder was behind)`` or ``none: WHY``, escaped (the progress lines and the summary)."""
    if not d.get("file"):
        return f"none: {clean(str(d.get('error') or 'not recorded'), 200)}"
    size = d.get("size") or ("?", "?")
    more = []
    if d.get("dropped"):
        more.append(f"{d['dropped']} dropped: the encoder was behind")
    if d.get("limit"):
        more.append(f"stopped at its {clean(str(d['limit']), 20)} limit, {d.get('cut', 0)} frames cut")
    if d.get("error"):
        more.append(clean(str(d["error"]), 200))
    kib = (d.get("bytes") or 0) / 1024
    return (f"{clean(str(d['file']), 40)}: {d.get('frames', 0)} frames, {float(d.get('duration_s') or 0):.1f} s, "
            f"{size[0]}x{size[1]}, {kib:.0f} KiB" + (f" ({'; '.join(more)})" if more else ""))


def browser_call_text(d: dict[str, Any]) -> str:
    """One line for a ``browser_call`` entry (as JSON): ``browser click target=e12: ok (35 ms)``,
    ``browser type <12 chars> target=e3: ok``, ``browser read_page filter=all: read 1200 chars, 14
    elements (omitted: private) (80 ms)``, ``browser navigate url=...: FAILED: navigation refused: ...``;
    every piece escaped and cut (the progress lines and the HTML report). Typed text is never shown.
    :func:`browser_call_parts` joined."""
    return "".join(browser_call_parts(d))


def browser_call_parts(d: dict[str, Any]) -> tuple[str, str]:
    """:func:`browser_call_text` in two parts (:func:`fitted`): the call with its arguments, and what
    came of it (``: ok (35 ms)``)."""
    args = d.get("arguments") if isinstance(d.get("arguments"), dict) else {}
    parts = [f"browser {clean(str(d.get('member')), 40)}"]
    for name, value in list(args.items())[:12]:
        if value is None:
            continue
        if name == "text_length":
            parts.append(f"<{clean(str(value), 12)} chars>")
            continue
        shown = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
        parts.append(f"{clean(name, 40)}={clean(shown, 120)}")
    call = " ".join(parts)
    result = d.get("result") if isinstance(d.get("result"), dict) else {}
    text = ""
    if not d.get("ok"):
        text += f": FAILED: {clean(str(d.get('error') or 'failed'), 200)}"
    elif result.get("kind") == "read":
        omitted = ", ".join(clean(str(o), 40) for o in result.get("omitted") or [])
        text += (f": read {clean(str(result.get('text_length')), 12)} chars, {clean(str(result.get('elements')), 12)} "
                 f"elements" + (f" (omitted: {omitted})" if omitted else ""))
    elif result.get("kind") == "text":
        text += f": {clean(str(result.get('text_length')), 12)} chars"
    elif d.get("screenshot"):
        text += f": image {clean(str(d['screenshot']), 40)}"
    else:
        text += ": ok"
    ms = d.get("ms")
    if isinstance(ms, (int, float)) and not isinstance(ms, bool):
        text += f" ({ms:.0f} ms)"
    return call, text


def expectation_text(entry: Expectation, limit: int = 300) -> str:
    """An ``expectation`` record entry as one printable line: ``turn 3: 2 expectations met after 2
    waits (1.4s)`` or ``turn 5: deadline of 30s passed: expect[0] not_color #ffffff ...; observed 0.0%
    ...`` (regions in model px; control characters escaped, cut to ``limit`` characters)."""
    turn = clean(entry.turn, 12)
    if entry.met:
        waits = entry.waits
        count = len(entry.expected or [])
        after = f" after {waits} wait{'s' if waits != 1 else ''} ({entry.waited_s}s)" if waits else ""
        retries = entry.retries or 0
        redone = f", the step redone {retries} time{'s' if retries != 1 else ''} (expect_retry)" if retries else ""
        return clean(f"turn {turn}: {count} expectation{'s' if count != 1 else ''} met{after}{redone}", limit)
    first = entry.unmet[0] if entry.unmet else UnmetExpectation()
    more = f" (and {len(entry.unmet) - 1} more)" if len(entry.unmet) > 1 else ""
    return clean(f"turn {turn}: {entry.reason}: expect[{first.index}] {first.expected}; "
                 f"observed {first.observed}{more}", limit)


class RunPrinter:
    """Listener for :class:`controller.run.record.RunRecord`: prints each entry (an entry model, or a
    JSON object validated as one) as one line.

    ``console``: where lines go, each fitted to :func:`fit_width` columns. Network entries are held and
    printed deduplicated when the next other entry (or :meth:`flush`) comes. Never raises: an entry that
    cannot be printed is skipped.
    """

    def __init__(self, console: Console) -> None:
        self.console = console
        self.steps = 0
        self._network: dict[tuple[str, str, str], int] = {}

    def line(self, *parts: str | Kept, style: str | None = None) -> None:
        """Print one line of ``parts`` literally (no markup, no emoji codes, no highlighting), fitted to
        the console (:func:`fitted`: the widest parts are shortened first)."""
        print_fitted(self.console, fitted(*parts, style=style))

    def __call__(self, entry: Any) -> None:
        try:
            entry = as_entry(entry)
            if not isinstance(entry, Network):
                self.flush()
            match entry:
                case Network():
                    key = (clean(entry.decision, 10), clean(entry.origin, 120), clean(entry.reason or "", 120))
                    self._network[key] = self._network.get(key, 0) + 1
                case NetworkLog():
                    self._on_network_log(entry)
                case RunStarted():
                    self._on_run_started(entry)
                case ModelResponse():
                    self._on_model_response(entry)
                case ComputerCall():
                    self._on_computer_call(entry)
                case Action() if entry.error:
                    self.line(f"  action {clean(entry.action, 20)} failed: {clean(entry.error, 200)}", style="red")
                case Approval():
                    self._on_approval(entry)
                case HumanAction():
                    self.line(f"  person ({clean(entry.by, 20)}): {clean(entry.action, 120)}", style="cyan")
                case Takeover():
                    self.line("control: a person took over the desktop; the model waits" if entry.control == "human"
                              else "control: handed back to the model", style="cyan")
                case Expectation() if entry.met:
                    self.line(f"  screen: {expectation_text(entry)}")
                case Expectation():
                    self.line(f"  screen expectation unmet: {expectation_text(entry)}", style="red")
                case Check():
                    *head, outcome = check_parts(entry)
                    self.line("check ", *head, Kept(outcome), style="green" if entry.passed else "red")
                case BrowserCall():
                    self.line("  ", *browser_call_parts(entry.as_json()), style=None if entry.ok else "red")
                case PolicySwap():
                    self.line(f"network policy set at {entry.why}: {policy_text(entry.policy)}"
                              + (f"; {entry.closed} connection(s) closed" if entry.closed else ""))
                case Redaction():
                    self.line(f"  {redaction_text(entry.as_json())}", style="cyan")
                case Video():
                    self.line(f"video {video_text(entry.as_json())}", style=None if entry.file else "yellow")
                case WebRecording():
                    self.line(f"web {web_text(entry.as_json())}", style=None if entry.complete else "yellow")
                case SignIn():
                    self.line(f"  {sign_in_text(entry.as_json())}",
                              style="green" if entry.outcome == "submitted" else "yellow")
        except Exception:  # noqa: BLE001 - the console must never break the run or its record
            pass

    def flush(self) -> None:
        """Print the held network decisions: ``network deny http://x:80 not-allowlisted (x3)``."""
        held, self._network = self._network, {}
        for (decision, origin, reason), count in held.items():
            times = f" (x{count})" if count > 1 else ""
            self.line(f"network {decision} ", origin, f" {reason}", times, style="red" if decision != "allow" else None)

    def _on_network_log(self, e: NetworkLog) -> None:
        if not e.complete:
            self.line(f"network decisions incomplete: the gateway's log could not be read in full "
                      f"({clean(e.error, 200)})", style="red")

    def _on_run_started(self, e: RunStarted) -> None:
        took = e.sandbox_start_s
        took_text = f" in {took:.1f}s" if took is not None else ""
        if e.sandbox is None:
            self.line(f"sandbox did not start{took_text}", style="red")
            return
        image = clean(e.image or "?", 200)[:19]  # sha256: and 12 hex digits
        emulated = f"; under emulation: deadlines x{e.time_scale:g}" if (e.time_scale or 1.0) > 1.0 else ""
        claim = e.claim or {}
        if claim.get("source") == "pool":
            self.line(f"sandbox {clean(e.sandbox, 40)} claimed from the warm pool in {claim.get('claim_s', 0):.2f}s "
                      f"(image {image}{emulated})")
            return
        cold = f"; cold start: {COLD_REASONS.get(str(claim.get('reason')), 'the warm pool gave none')}" if claim else ""
        self.line(f"sandbox {clean(e.sandbox, 40)} started{took_text} (image {image}{emulated}{cold})")

    def _on_model_response(self, e: ModelResponse) -> None:
        status = e.http_status or 200
        if status >= 400:
            err = e.error if isinstance(e.error, dict) else {}
            self.line(f"model request failed: HTTP {status} {clean(err.get('code') or '', 40)} "
                      f"{clean(err.get('message') or '')}".rstrip(), style="red")
            return
        self.steps += 1
        self.line(f"step {self.steps} {_short_id(e.response_id)} {_usage(e.usage)}")
        if e.text:
            self.line(f"  model: {clean(e.text, 300)}")

    def _on_computer_call(self, e: ComputerCall) -> None:
        text = "; ".join(summarize_action(a) for a in e.actions) or "(no actions)"
        checks = [c for c in e.pending_checks if isinstance(c, dict)]
        codes = ", ".join(clean(c.get("code") or "(no code)", 40) for c in checks)
        codes = f" [safety checks: {codes}]" if checks else ""
        self.line(f"  call {_short_id(e.call_id, 20)}: ", text, codes)  # 20: whole call_0001_wait_001

    def _on_approval(self, e: Approval) -> None:
        decision, by = clean(e.decision, 20), clean(e.by, 20)
        style = "green" if decision == "approved" else "red"
        if e.what == "opt-in" and e.origin:
            self.line("opt-in: origin requests for ", clean(e.origin, 300),
                      " are approved unattended (--approve-origin)")
        elif e.what == "opt-in":
            codes = ", ".join(clean(c, 40) for c in e.codes)
            self.line(f"opt-in: safety checks with code {codes} are approved unattended (--approve-safety-check)")
        else:
            label = request_kind(e.what).label  # the kind's name on the terminal (REQUEST_KINDS)
            if e.what == ORIGIN_ACCESS:
                self.line(f"  {label} ", clean(e.origin or '?', 300), f": {decision} ({by})", style=style)
            elif e.what == SAFETY_CHECK:
                codes = ", ".join(clean(c or "(no code)", 40) for c in e.codes) or "(none)"
                self.line(f"  approval: {label} ", codes, f" on {_short_id(e.call_id)} {decision} ({by})",
                          style=style)
            else:  # an action (or another kind of the table): what it was about
                self.line(f"  approval: {label} ", clean(e.action or e.request_id or '?', 80), f" {decision} ({by})",
                          style=style)
        if e.latency_ms is not None and e.by in ("terminal", "console"):
            self.line(f"    answered in {e.latency_ms / 1000:.1f}s")
