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

:func:`make_console` gives a console that does not wrap mid-word when output is piped and never
turns ``:name:`` codes into emoji.
"""

from __future__ import annotations

import json
import os
from typing import Any

from rich.console import Console

from controller.run.entries import (
    Action, Approval, BrowserCall, Check, ComputerCall, Expectation, HumanAction, ModelResponse, Network, NetworkLog,
    RunStarted, Takeover, UnmetExpectation, Usage, as_entry, SignIn)
from controller.text import SHORT, clean
from wire.actions import describe

__all__ = ["PIPE_WIDTH", "SHORT", "RunPrinter", "clean", "make_console"]

PIPE_WIDTH = 200
"""Console width (columns) when the output is not a terminal and ``COLUMNS`` is not set."""


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
    detail)."""
    mark = "pass" if check.passed else "FAIL"
    head = f"{mark} {clean(check.kind, 10)} {clean(check.target, 120)} {clean(check.rule, 80)}"
    observed = observed_text(check)
    if check.passed:
        return f"{head}: observed {observed}"
    return f"{head}: expected {clean(repr(check.expected))}, {observed if check.observed is None else 'observed ' + observed}"


def observed_text(check: Check) -> str:
    """What a check observed, short: the value's repr, or why there is none (``file missing``)."""
    if check.observed is None:
        detail = check.detail or "nothing observed"
        return {"file does not exist": "file missing", "database does not exist": "database missing"}.get(
            detail, clean(detail))
    return clean(repr(check.observed))


def sign_in_text(d: dict[str, Any]) -> str:
    """One line for a ``sign_in`` entry (as JSON): ``sign-in at ORIGIN, form N: method M, email: submitted
    (console)``, every piece escaped (the progress lines and the HTML report)."""
    given = [f"method {clean(str(d['method']), 40)}"] if d.get("method") else []
    given += [clean(str(i), 40) for i in d.get("submitted") or []]
    return (f"sign-in at {clean(str(d.get('origin')), 200)}, form {clean(str(d.get('step')), 10)}: "
            f"{', '.join(given) or 'nothing given'}: {clean(str(d.get('outcome')), 40)}"
            + (f" ({clean(str(d['by']), 20)})" if d.get("by") else "")
            + (f": {clean(str(d['detail']), 200)}" if d.get("detail") else ""))


def browser_call_text(d: dict[str, Any]) -> str:
    """One line for a ``browser_call`` entry (as JSON): ``browser click target=e12: ok (35 ms)``,
    ``browser type <12 chars> target=e3: ok``, ``browser read_page filter=all: read 1200 chars, 14
    elements (omitted: private) (80 ms)``, ``browser navigate url=...: FAILED: navigation refused: ...``;
    every piece escaped and cut (the progress lines and the HTML report). Typed text is never shown."""
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
    text = " ".join(parts)
    result = d.get("result") if isinstance(d.get("result"), dict) else {}
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
    return text


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

    ``console``: where lines go. Network entries are held and printed deduplicated when the next
    other entry (or :meth:`flush`) comes. Never raises: an entry that cannot be printed is skipped.
    """

    def __init__(self, console: Console) -> None:
        self.console = console
        self.steps = 0
        self._network: dict[tuple[str, str, str], int] = {}

    def line(self, text: str, style: str | None = None) -> None:
        """Print one line literally (no markup, no emoji codes, no highlighting)."""
        self.console.print(text, markup=False, emoji=False, highlight=False, style=style)

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
                    self.line(f"check {describe_check(entry)}", style="green" if entry.passed else "red")
                case BrowserCall():
                    self.line(f"  {browser_call_text(entry.as_json())}", style=None if entry.ok else "red")
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
            self.line(f"network {decision} {origin} {reason}{times}", style="red" if decision != "allow" else None)

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
        self.line(f"sandbox {clean(e.sandbox, 40)} started{took_text} (image {image}{emulated})")

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
        if checks:
            text += f" [safety checks: {', '.join(clean(c.get('code') or '(no code)', 40) for c in checks)}]"
        self.line(f"  call {_short_id(e.call_id, 20)}: {text}")  # 20: whole call_0001_wait_001

    def _on_approval(self, e: Approval) -> None:
        decision, by = clean(e.decision, 20), clean(e.by, 20)
        style = "green" if decision == "approved" else "red"
        if e.what == "opt-in" and e.origin:
            self.line(f"opt-in: origin requests for {clean(e.origin, 300)} are approved unattended (--approve-origin)")
        elif e.what == "opt-in":
            codes = ", ".join(clean(c, 40) for c in e.codes)
            self.line(f"opt-in: safety checks with code {codes} are approved unattended (--approve-safety-check)")
        elif e.what == "origin_access":
            self.line(f"  origin request {clean(e.origin or '?', 300)}: {decision} ({by})", style=style)
        elif e.what == "safety_check":
            codes = ", ".join(clean(c or "(no code)", 40) for c in e.codes) or "(none)"
            self.line(f"  approval: safety check {codes} on {_short_id(e.call_id)} {decision} ({by})",
                      style=style)
        else:
            self.line(f"  approval: action {clean(e.action or '?', 80)} {decision} ({by})", style=style)
        if e.latency_ms is not None and e.by in ("terminal", "console"):
            self.line(f"    answered in {e.latency_ms / 1000:.1f}s")
