"""Approvals: pending safety checks and the before_action policy.

Rules (from the SDK's computer-use contract):
- a computer_call with pending safety checks runs only after an explicit yes; the SDK treats only
  exactly ``True`` as approval, and a denial means none of that call's actions run and nothing is
  acknowledged;
- without a terminal and without an approver, the answer is no, with a clear message -- never an
  automatic yes;
- ``--approve-safety-check CODE`` is the explicit opt-in for unattended runs: a call is approved
  without asking only when every one of its checks has an opted-in code, and that is logged;
- before_action is off by default; ``--confirm-actions type,keypress`` asks before those action
  types, step mode asks before every action.
- typed text is shown only in a question to a person; unattended output (opt-in approvals, denials
  for lack of a terminal) and the record show its length instead.

Every decision is reported through ``on_decision`` (the run record's ``approval`` entries). Text that
comes from the model (call ids, check codes and messages, keys) is printed literally, never as
console markup or ``:emoji:`` codes, with control and format characters escaped
(:func:`controller.text.clean`).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from rich.console import Console
from rich.markup import escape

from controller.text import clean
from wire.actions import describe

# An approver answers a question with the raw text the person typed (or None: cannot ask).
Asker = Callable[[str], "str | None"]

YES = {"y", "yes"}


def terminal_asker(console: Console | None = None) -> Asker | None:
    """An asker reading from the controlling terminal, or None when stdin is not a terminal. The
    question is printed literally (no markup, no emoji codes)."""
    if not sys.stdin.isatty():
        return None
    out = console or Console(stderr=True, emoji=False)

    def ask(question: str) -> str | None:
        try:
            return out.input(f"{question} [y/N] ", markup=False, emoji=False)
        except EOFError:
            return None

    return ask


def describe_action(action: Any, *, redact: bool = False) -> str:
    """One line describing an action (an SDK action or its dict; model px for coordinates):
    :func:`wire.actions.describe` with values escaped by :func:`controller.text.clean`. ``redact``
    shows typed text as its length (``type <7 chars>``); without it the text is shown quoted
    (``type 'hunter2'``)."""
    return describe(action, clean=clean, redact=redact)


def _say(console: Console, text: str, *, markup: bool = False) -> None:
    """Print one line: literally, or as console markup when ``markup`` (then every value in it is
    passed through ``rich.markup.escape``); never with emoji codes or highlighting."""
    console.print(text, markup=markup, emoji=False, highlight=False)


def _actions_of(call: Any) -> list[Any]:
    if getattr(call, "actions", None):
        return list(call.actions)
    if getattr(call, "action", None) is not None:
        return [call.action]
    return []


@dataclass
class Decision:
    """One approval decision: ``what`` (safety_check | action), ``decision`` (approved | denied),
    ``by`` (terminal | opt-in | approver | no-approver | policy), plus details for the record."""

    what: str
    decision: str
    by: str
    call_id: str | None = None
    codes: list[str] = field(default_factory=list)
    check_ids: list[str] = field(default_factory=list)
    action: str | None = None
    message: str | None = None

    def as_record(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v not in (None, [])}


class SafetyCheckApprover:
    """``approve_safety_checks`` callback for ``ComputerToolset.run``.

    ``asker``: asks a person (None: nobody to ask); ``auto_codes``: safety-check codes opted in for
    unattended approval; ``console``: where checks are shown; ``on_decision``: gets each
    :class:`Decision`. Returns exactly True only on an explicit yes or a full opt-in match.
    """

    def __init__(
        self,
        *,
        asker: Asker | None,
        auto_codes: Iterable[str] = (),
        console: Console | None = None,
        on_decision: Callable[[Decision], None] | None = None,
    ) -> None:
        self.asker = asker
        self.auto_codes = set(auto_codes)
        self.console = console or Console(stderr=True, emoji=False)
        self.on_decision = on_decision

    def _emit(self, decision: Decision) -> None:
        if self.on_decision is not None:
            self.on_decision(decision)

    def __call__(self, call: Any) -> bool:
        checks = list(call.pending_safety_checks or [])
        codes = [c.code or "" for c in checks]
        ids = [c.id for c in checks]
        _say(self.console, f"[bold yellow]Safety check[/] on computer_call {escape(clean(call.call_id, 80))}:",
             markup=True)
        for check in checks:
            # Codes, ids and messages come from the model: escaped, so none can hide or rewrite what
            # the person is asked to approve.
            _say(self.console, f"  - code={clean(check.code, 80)} id={clean(check.id, 80)}: "
                               f"{clean(check.message or '(no message)', 500)}")
        _say(self.console, "  actions of this call:")
        # A check without a code is never covered by an opt-in: there is nothing the person opted in to.
        opted_in = bool(checks) and all(c.code and c.code in self.auto_codes for c in checks)
        # Typed text is shown only to a person who is asked; unattended output may end up in logs.
        redact = opted_in or self.asker is None
        for action in _actions_of(call):
            _say(self.console, f"    {describe_action(action, redact=redact)}")
        base = dict(what="safety_check", call_id=call.call_id, codes=codes, check_ids=ids)
        if opted_in:
            shown = ",".join(clean(c, 80) for c in sorted(set(codes)))
            _say(self.console, f"  approved by opt-in (--approve-safety-check {shown})")
            self._emit(Decision(decision="approved", by="opt-in", **base))
            return True
        if self.asker is None:
            msg = ("denied: no terminal to ask and no approver; pass --approve-safety-check CODE "
                   "to approve these codes for an unattended run")
            _say(self.console, f"  [red]{msg}[/]", markup=True)
            self._emit(Decision(decision="denied", by="no-approver", message=msg, **base))
            return False
        answer = self.asker("Approve these safety checks and run the call's actions?")
        approved = answer is not None and answer.strip().lower() in YES
        self._emit(Decision(decision="approved" if approved else "denied", by="terminal",
                            message=None if answer is None else f"answer {answer.strip()!r}", **base))
        return True if approved else False


class ActionGate:
    """``before_action`` callback: asks before action types in ``confirm`` (or all, in step mode).

    Actions not covered are allowed without asking (and not logged, to keep the record small).
    With nobody to ask, a covered action is denied with a clear message.
    """

    def __init__(
        self,
        *,
        confirm: Iterable[str] = (),
        step: bool = False,
        asker: Asker | None,
        console: Console | None = None,
        on_decision: Callable[[Decision], None] | None = None,
    ) -> None:
        self.confirm = set(confirm)
        self.step = step
        self.asker = asker
        self.console = console or Console(stderr=True, emoji=False)
        self.on_decision = on_decision

    @property
    def active(self) -> bool:
        """Whether the gate asks about anything at all (otherwise the runner passes no callback)."""
        return self.step or bool(self.confirm)

    def __call__(self, action: Any) -> bool:
        kind = action.get("type") if isinstance(action, dict) else action.type
        if not (self.step or kind in self.confirm):
            return True
        text = describe_action(action)
        logged = describe_action(action, redact=True)
        if self.asker is None:
            msg = "denied: confirmation required but there is no terminal to ask"
            _say(self.console, f"[red]{escape(logged)}: {msg}[/]", markup=True)
            if self.on_decision:
                self.on_decision(Decision(what="action", decision="denied", by="no-approver", action=logged,
                                          message=msg))
            return False
        answer = self.asker(f"Run {text}?")
        approved = answer is not None and answer.strip().lower() in YES
        if self.on_decision:
            self.on_decision(Decision(what="action", decision="approved" if approved else "denied", by="terminal",
                                      action=logged))
        return True if approved else False
