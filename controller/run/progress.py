"""Run progress on the console: one line per run-record entry, printed as the run goes.

:class:`RunPrinter` is the run record's listener (``RunRecord(..., on_entry=printer)``): everything
the console shows about a run's steps comes from the entries written to ``record.jsonl``, so the
console never shows what the record does not hold -- typed text in particular is only ever a length
(``type <12 chars>``). Coordinates are the model's (model px), as the model sent them.

Lines (one each): the sandbox start with its time; each model response (step number, short response
id, token usage); each computer_call with its actions summarised and its pending safety checks; a
failed or cancelled action; each approval decision and each ``--approve-safety-check`` opt-in; the
network decisions, deduplicated by (decision, origin, reason) with a count; each check with what was
observed; each offline script turn's screen expectations (met, after how many inserted waits, or the
one given up on with what was observed). The verdict and the record path are in the summary table
that follows.

Strings from the model, the guest or the gateway are printed literally (never console markup) with
control characters escaped, and shortened to :data:`SHORT` characters (:func:`controller.text.clean`).

:func:`make_console` gives a console that does not wrap mid-word when output is piped.
"""

from __future__ import annotations

import os
from typing import Any

from rich.console import Console

from controller.text import SHORT, clean

__all__ = ["PIPE_WIDTH", "SHORT", "RunPrinter", "clean", "make_console"]

PIPE_WIDTH = 200
"""Console width (columns) when the output is not a terminal and ``COLUMNS`` is not set."""


def make_console(*, stderr: bool = False) -> Console:
    """A rich console for the CLI: ``soft_wrap`` (long lines are not broken mid-word) and, when the
    output is not a terminal, :data:`PIPE_WIDTH` columns for tables instead of rich's default 80
    (``COLUMNS`` still wins when set)."""
    console = Console(stderr=stderr, soft_wrap=True)
    if not console.is_terminal and not os.environ.get("COLUMNS"):
        console.width = PIPE_WIDTH
    return console


def _point(data: dict[str, Any], x: str = "x", y: str = "y") -> str:
    return f"({clean(data.get(x), 12)},{clean(data.get(y), 12)})"


def _as_point(p: Any) -> dict[str, Any]:
    """A drag path point, ``{"x","y"}`` or ``[x, y]``, as a dict (empty when neither)."""
    if isinstance(p, dict):
        return p
    if isinstance(p, (list, tuple)) and len(p) == 2:
        return {"x": p[0], "y": p[1]}
    return {}


def summarize_action(action: Any) -> str:
    """A short summary of one record action (already redacted: ``type`` carries ``text_length``).

    ``click (640,250) left``, ``double_click (10,20)``, ``type <12 chars>``, ``keypress ctrl+c``,
    ``scroll (640,400) 0,-300``, ``move (5,6)``, ``drag (1,2)->(30,40) 3 points``, ``wait``,
    ``screenshot``. Coordinates in model px. Never shows typed text, even if handed an unredacted
    ``type`` action.
    """
    if not isinstance(action, dict):
        return clean(type(action).__name__, 20)
    kind = clean(action.get("type"), 20)
    if kind == "type":
        n = action.get("text_length")
        if n is None and isinstance(action.get("text"), str):
            n = len(action["text"])
        return f"type <{n if isinstance(n, int) else '?'} chars>"
    if kind in ("click", "double_click", "move"):
        line = f"{kind} {_point(action)}"
        button = action.get("button")
        return f"{line} {clean(button, 12)}" if kind == "click" and button else line
    if kind == "scroll":
        return f"scroll {_point(action)} {clean(action.get('scroll_x'), 8)},{clean(action.get('scroll_y'), 8)}"
    if kind == "keypress":
        keys = action.get("keys")
        return "keypress " + ("+".join(clean(k, 20) for k in keys) if isinstance(keys, list) else "?")
    if kind == "drag":
        path = action.get("path") if isinstance(action.get("path"), list) else []
        points = [_as_point(p) for p in path]
        if not points:
            return "drag (no path)"
        return f"drag {_point(points[0])}->{_point(points[-1])} {len(points)} points"
    return kind


def _usage(usage: Any) -> str:
    if not isinstance(usage, dict):
        return "usage not reported"
    return f"{usage.get('total_tokens')} tokens (in {usage.get('input_tokens')}, out {usage.get('output_tokens')})"


def _short_id(value: Any, limit: int = 16) -> str:
    text = clean(value, 200)
    return text if len(text) <= limit else text[:limit - 1] + "…"


def describe_check(check: dict[str, Any]) -> str:
    """``pass file /home/sandbox/x text: observed 'abc'`` or ``FAIL file /x text: expected 'a', file
    missing`` (a check with nothing observed shows why: ``file missing``, ``database missing``, the
    detail)."""
    mark = "pass" if check.get("passed") else "FAIL"
    head = f"{mark} {clean(check.get('kind'), 10)} {clean(check.get('target'), 120)} {clean(check.get('rule'), 80)}"
    observed = observed_text(check)
    if check.get("passed"):
        return f"{head}: observed {observed}"
    return f"{head}: expected {clean(repr(check.get('expected')))}, {observed if check.get('observed') is None else 'observed ' + observed}"


def observed_text(check: dict[str, Any]) -> str:
    """What a check observed, short: the value's repr, or why there is none (``file missing``)."""
    if check.get("observed") is None:
        detail = check.get("detail") or "nothing observed"
        return {"file does not exist": "file missing", "database does not exist": "database missing"}.get(
            detail, clean(detail))
    return clean(repr(check.get("observed")))


def expectation_text(entry: dict[str, Any], limit: int = 300) -> str:
    """An ``expectation`` record entry (or a summary's unmet detail) as one printable line:
    ``turn 3: 2 expectations met after 2 waits (1.4s)`` or ``turn 5: deadline of 30s passed: expect[0]
    not_color #ffffff ...; observed 0.0% ...`` (regions in model px; control characters escaped, cut
    to ``limit`` characters)."""
    turn = clean(entry.get("turn"), 12)
    if entry.get("met") is True:
        waits = entry.get("waits") or 0
        count = len(entry.get("expected") or [])
        after = f" after {waits} wait{'s' if waits != 1 else ''} ({entry.get('waited_s')}s)" if waits else ""
        retries = entry.get("retries") or 0
        redone = f", the step redone {retries} time{'s' if retries != 1 else ''} (expect_retry)" if retries else ""
        return clean(f"turn {turn}: {count} expectation{'s' if count != 1 else ''} met{after}{redone}", limit)
    unmet = [u for u in entry.get("unmet") or [] if isinstance(u, dict)]
    first = unmet[0] if unmet else {}
    more = f" (and {len(unmet) - 1} more)" if len(unmet) > 1 else ""
    return clean(f"turn {turn}: {entry.get('reason')}: expect[{first.get('index')}] {first.get('expected')}; "
                 f"observed {first.get('observed')}{more}", limit)


class RunPrinter:
    """Listener for :class:`controller.run.record.RunRecord`: prints each entry as one line.

    ``console``: where lines go. Network entries are held and printed deduplicated when the next
    other entry (or :meth:`flush`) comes. Never raises: a line that cannot be printed is skipped.
    """

    def __init__(self, console: Console) -> None:
        self.console = console
        self.steps = 0
        self._network: dict[tuple[str, str, str], int] = {}

    def line(self, text: str, style: str | None = None) -> None:
        """Print one line literally (no markup, no highlighting)."""
        self.console.print(text, markup=False, highlight=False, style=style)

    def __call__(self, entry: dict[str, Any]) -> None:
        try:
            kind = entry.get("type")
            if kind != "network":
                self.flush()
            handler = getattr(self, f"_on_{kind}", None)
            if handler is not None:
                handler(entry)
        except Exception:  # noqa: BLE001 - the console must never break the run or its record
            pass

    def flush(self) -> None:
        """Print the held network decisions: ``network deny http://x:80 not-allowlisted (x3)``."""
        held, self._network = self._network, {}
        for (decision, origin, reason), count in held.items():
            times = f" (x{count})" if count > 1 else ""
            self.line(f"network {decision} {origin} {reason}{times}", style="red" if decision != "allow" else None)

    def _on_network_log(self, e: dict[str, Any]) -> None:
        if e.get("complete") is not True:
            self.line(f"network decisions incomplete: the gateway's log could not be read "
                      f"({clean(e.get('error'), 200)})", style="red")

    def _on_run_started(self, e: dict[str, Any]) -> None:
        took = e.get("sandbox_start_s")
        took_text = f" in {took:.1f}s" if isinstance(took, (int, float)) else ""
        if e.get("sandbox") is None:
            self.line(f"sandbox did not start{took_text}", style="red")
            return
        image = clean(e.get("image") or "?", 200)[:19]  # sha256: and 12 hex digits
        self.line(f"sandbox {clean(e.get('sandbox'), 40)} started{took_text} (image {image})")

    def _on_model_response(self, e: dict[str, Any]) -> None:
        status = e.get("http_status") or 200
        if status >= 400:
            err = e.get("error") if isinstance(e.get("error"), dict) else {}
            self.line(f"model request failed: HTTP {status} {clean(err.get('code') or '', 40)} "
                      f"{clean(err.get('message') or '')}".rstrip(), style="red")
            return
        self.steps += 1
        self.line(f"step {self.steps} {_short_id(e.get('response_id'))} {_usage(e.get('usage'))}")

    def _on_computer_call(self, e: dict[str, Any]) -> None:
        actions = e.get("actions") if isinstance(e.get("actions"), list) else []
        text = "; ".join(summarize_action(a) for a in actions) or "(no actions)"
        checks = [c for c in e.get("pending_checks") or [] if isinstance(c, dict)]
        if checks:
            text += f" [safety checks: {', '.join(clean(c.get('code') or '(no code)', 40) for c in checks)}]"
        self.line(f"  call {_short_id(e.get('call_id'), 20)}: {text}")  # 20: whole call_0001_wait_001

    def _on_action(self, e: dict[str, Any]) -> None:
        if e.get("error"):
            self.line(f"  action {clean(e.get('action'), 20)} failed: {clean(e.get('error'), 200)}", style="red")

    def _on_approval(self, e: dict[str, Any]) -> None:
        decision, by = clean(e.get("decision"), 20), clean(e.get("by"), 20)
        style = "green" if decision == "approved" else "red"
        if e.get("what") == "opt-in":
            codes = ", ".join(clean(c, 40) for c in e.get("codes") or [])
            self.line(f"opt-in: safety checks with code {codes} are approved unattended (--approve-safety-check)")
        elif e.get("what") == "safety_check":
            codes = ", ".join(clean(c or "(no code)", 40) for c in e.get("codes") or []) or "(none)"
            self.line(f"  approval: safety check {codes} on {_short_id(e.get('call_id'))} {decision} ({by})",
                      style=style)
        else:
            self.line(f"  approval: action {clean(e.get('action') or '?', 80)} {decision} ({by})", style=style)

    def _on_network(self, e: dict[str, Any]) -> None:
        key = (clean(e.get("decision"), 10), clean(e.get("origin"), 120), clean(e.get("reason") or "", 120))
        self._network[key] = self._network.get(key, 0) + 1

    def _on_expectation(self, e: dict[str, Any]) -> None:
        if e.get("met") is True:
            self.line(f"  screen: {expectation_text(e)}")
        else:
            self.line(f"  screen expectation unmet: {expectation_text(e)}", style="red")

    def _on_check(self, e: dict[str, Any]) -> None:
        self.line(f"check {describe_check(e)}", style="green" if e.get("passed") else "red")
