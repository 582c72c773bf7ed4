"""Approvals: pending safety checks and the before_action policy, asked through the approval registry.

Rules (from the SDK's computer-use contract):
- a computer_call with pending safety checks runs only after an explicit yes; the SDK treats only
  exactly ``True`` as approval, and a denial means none of that call's actions run and nothing is
  acknowledged;
- every question is a request in the run's :class:`controller.run.registry.ApprovalRegistry`; the
  terminal prompt and the web console are two views of it and the first answer wins (the terminal
  says "answered in the console" and stops asking); the deadline (``--approval-timeout``) denies;
  cancellation withdraws the request and nothing of it runs;
- without a terminal and without a console, the answer is no, with a clear message -- never an
  automatic yes; with a console and no terminal, the request waits for the console until its deadline;
- ``--approve-safety-check CODE`` is the explicit opt-in for unattended runs: a call is approved
  without asking only when every one of its checks has an opted-in code, and that is logged;
- before_action is off by default; ``--confirm-actions type,keypress`` asks before those action
  types, step mode asks before every action.
- typed text is shown only in a question to a person; unattended output (opt-in approvals, denials
  for lack of a terminal) and the record show its length instead;
- origin requests (the gateway holds a guest connection to an origin until it is answered; mirrored
  into the registry by :mod:`controller.run.origins`) arrive on another thread at any time:
  :class:`OriginPrompter` asks approve / deny / cancel on the terminal, one prompt at a time with the
  loop's own (the terminal's prompt lock), and gives up the prompt as soon as another view answered
  or the gateway decided; without a terminal nothing asks and the gateway's timeout denies.

Each kind of question (safety check, action, origin request) is named on the terminal by its label in
:data:`controller.model.requests.REQUEST_KINDS`; before a prompt the terminal shows that label and the
request's id (the one the console and the Agents API show).

Every decision is reported through ``on_decision`` (the run record's ``approval`` entries: who
answered -- terminal, console, timeout, opt-in, no-approver, cancel --, the request id and how long it
took). Text that comes from the model (call ids, check codes and messages, keys) is printed literally,
never as console markup or ``:emoji:`` codes, with control and format characters escaped
(:func:`controller.text.clean`).
"""

from __future__ import annotations

import os
import select
import termios
import sys
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from rich.console import Console
from rich.markup import escape

from controller.model.requests import ACTION, ORIGIN_ACCESS, SAFETY_CHECK, request_kind
from controller.run.registry import AnswerRefused, ApprovalRegistry, Request, RequestWorker
from controller.text import clean
from wire.actions import describe

# An approver answers a question with the raw text the person typed (or None: cannot ask / no answer).
Asker = Callable[[str], "str | None"]

YES = {"y", "yes"}

POLL_S = 0.1
"""How often the terminal prompt looks whether another view answered (seconds)."""


class _PromptAwareFile:
    """The terminal console's output stream while a prompt may be waiting for a line: text another
    thread prints then (a record line, a decision) goes on lines of its own below the prompt, and the
    prompt is shown again after it, so neither is written into the other. Everything else is the
    stream's own (``isatty``, ``fileno``, ``encoding``...)."""

    def __init__(self, inner: Any, asker: "TerminalAsker") -> None:
        self._inner, self._asker = inner, asker
        self._lock = threading.Lock()

    def write(self, text: str) -> int:
        with self._lock:
            shown, owner = self._asker._shown, self._asker._owner
            if shown is None or owner == threading.get_ident() or not text:
                return self._inner.write(text)
            self._inner.write("\n" + text + ("" if text.endswith("\n") else "\n") + shown)
            self._inner.flush()
            return len(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class TerminalAsker:
    """Asks on the controlling terminal (``console`` prints the question literally: no markup, no
    emoji codes). ``asker(question)`` waits for a line; :meth:`ask_until` also stops, returning None,
    as soon as ``done()`` is true (another view answered, the deadline passed, the run was cancelled),
    so the terminal never keeps a line that was meant for a question already decided.

    Questions come from two threads (the loop's safety checks and confirmations, the gateway's origin
    requests): :attr:`lock` serialises them, so one question and its answer line are printed and read
    whole before the next one starts (:meth:`ask_until` holds it). What other threads print through
    ``console`` while a question waits goes below it, and the question is shown again
    (``console.file`` is wrapped for that)."""

    def __init__(self, console: Console, stream: Any = None) -> None:
        self.console = console
        self.stream = stream or sys.stdin
        self.lock = threading.RLock()
        self._shown: str | None = None  # the question waiting for a line, as printed
        self._owner: int | None = None  # the thread asking it
        if not isinstance(console.file, _PromptAwareFile):
            console.file = _PromptAwareFile(console.file, self)

    def __call__(self, question: str) -> str | None:
        return self.ask_until(question, lambda: False)

    def ask_until(self, question: str, done: Callable[[], bool], *, hint: str = "[y/N]",
                  lines: Iterable[str] = (), secret: bool = False) -> str | None:
        """The line typed (without its newline), or None on end of input or when ``done()``.
        ``lines``: printed (literally) before the question, under the same lock; ``hint``: what
        follows the question; ``secret``: the terminal does not echo what is typed (a sign-in value)."""
        with self.lock:
            for text in lines:
                self.console.print(text, markup=False, emoji=False, highlight=False)
            prompt = f"{question} {hint} " if hint else f"{question} "
            # Echo off before the prompt shows (as getpass does): a value typed as soon as the question
            # is on the screen is never echoed.
            restore = _echo_off(self.stream) if secret else None
            try:
                self.console.print(prompt, end="", markup=False, emoji=False, highlight=False)
                self.console.file.flush()
                self._shown, self._owner = prompt, threading.get_ident()
                while True:
                    if done():
                        self._shown = None
                        self.console.print("", markup=False)
                        return None
                    ready, _, _ = select.select([self.stream], [], [], POLL_S)
                    if ready:
                        line = self.stream.readline()
                        return None if line == "" else line.rstrip("\r\n")
            finally:
                self._shown = self._owner = None
                if restore is not None:
                    restore()
                    self.console.print("", markup=False)


def _echo_off(stream: Any) -> Callable[[], None] | None:
    """Turn the terminal's echo off for ``stream`` when it is a terminal; returns what restores it."""
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):
        return None
    if not os.isatty(fd):
        return None
    old = termios.tcgetattr(fd)
    new = termios.tcgetattr(fd)
    new[3] &= ~termios.ECHO
    termios.tcsetattr(fd, termios.TCSANOW, new)
    return lambda: termios.tcsetattr(fd, termios.TCSANOW, old)


def terminal_asker(console: Console | None = None) -> TerminalAsker | None:
    """A :class:`TerminalAsker` on stdin, or None when stdin is not a terminal."""
    if not sys.stdin.isatty():
        return None
    return TerminalAsker(console or Console(stderr=True, emoji=False))


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
    """One approval decision: ``what`` (safety_check | action | origin_access), ``decision`` (approved |
    denied | withdrawn; for an origin request also cancelled | timeout), ``by`` (terminal | console |
    timeout | opt-in | no-approver | cancel | command line | gateway | gateway_log), ``request_id``
    (the registry's; None for an opt-in), ``latency_ms`` (asked to decided), ``origin`` (an origin
    request's), plus details for the record."""

    what: str
    decision: str
    by: str
    call_id: str | None = None
    codes: list[str] = field(default_factory=list)
    check_ids: list[str] = field(default_factory=list)
    action: str | None = None
    message: str | None = None
    request_id: str | None = None
    latency_ms: float | None = None
    screenshot: str | None = None
    origin: str | None = None

    def as_record(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v not in (None, [])}


class _Asking:
    """What both callbacks share: the registry, the terminal, the views, and asking one request."""

    def __init__(self, *, asker: Asker | None, console: Console | None = None,
                 on_decision: Callable[[Decision], None] | None = None, registry: ApprovalRegistry | None = None,
                 screenshot: Callable[[], str | None] | None = None) -> None:
        self.asker = asker
        self.console = console or Console(stderr=True, emoji=False)
        self.on_decision = on_decision
        self.registry = registry or ApprovalRegistry()
        self.screenshot = screenshot

    @property
    def anyone(self) -> bool:
        """Whether a person can be asked at all (a terminal, or a view such as the console)."""
        return self.asker is not None or bool(self.registry.views)

    def _emit(self, decision: Decision) -> None:
        if self.on_decision is not None:
            self.on_decision(decision)

    def ask(self, request: Request, question: str, cancelled: Callable[[], bool] | None) -> Request:
        """Ask on the terminal (if any) while every view may answer; wait for the decision. Before the
        ``question [y/N]`` prompt the terminal shows ``  (<label>, request <id>)``: the label of the
        request's kind (:data:`controller.model.requests.REQUEST_KINDS`) and the id the console and the
        Agents API show."""
        registry = self.registry
        done = (lambda: not request.pending or (cancelled is not None and cancelled())
                or request.seconds_left() == 0)
        if not request.pending:
            pass  # decided as it opened (an answerer of the run's, a closed registry): nobody is asked
        elif self.asker is not None:
            lines = [f"  ({request_kind(request.kind).label}, request {clean(request.id, 140)})"]
            if registry.views:
                lines.append("  (the console can answer too: the first answer counts)")
            ask_until = getattr(self.asker, "ask_until", None)
            if ask_until is not None:
                answer = ask_until(question, done, lines=lines)
            else:
                for line in lines:
                    _say(self.console, line)
                answer = self.asker(question)
            if request.pending and (answer is not None or not (registry.views or done())):
                approved = answer is not None and answer.strip().lower() in YES
                try:
                    registry.answer(request.id, "approve" if approved else "deny", by="terminal")
                except AnswerRefused:
                    pass  # decided elsewhere in the meantime: that answer counts
        elif request.pending:
            left = request.seconds_left()
            _say(self.console, "  waiting for an answer in the console" +
                 (f" (denied if none within {left:.0f}s: --approval-timeout)" if left is not None else ""))
        registry.wait(request, cancelled)
        if request.by not in ("terminal", None):
            _say(self.console, f"  {'answered in the console' if request.by == 'console' else request.by}: "
                               f"{request.state}{f' ({clean(request.reason, 200)})' if request.reason else ''}")
        return request

    def open(self, kind: str, question: str, **fields: Any) -> Request:
        """Open a pending request of ``kind`` (a name in :data:`controller.model.requests.REQUEST_KINDS`;
        :class:`controller.model.errors.UnknownKind` otherwise) with the model's last screenshot."""
        shot = self.screenshot() if self.screenshot is not None else None
        return self.registry.open(kind, question, screenshot=shot, **fields)

    def open_and_ask(self, kind: str, question: str, cancelled: Callable[[], bool] | None = None,
                     **fields: Any) -> Request:
        """Open a request of ``kind`` (:meth:`open`; ``fields``: ``call_id``, ``checks``, ``actions``) and
        :meth:`ask` it: the request, decided. A question of any kind in the table is asked this way."""
        request = self.open(kind, question, **fields)
        return self.ask(request, question, cancelled)


class SafetyCheckApprover(_Asking):
    """``approve_safety_checks`` callback for ``ComputerToolset.run``.

    ``asker``: asks a person on the terminal (None: no terminal); ``auto_codes``: safety-check codes
    opted in for unattended approval; ``console``: where checks are shown; ``on_decision``: gets each
    :class:`Decision`; ``registry``: the run's approval registry (a private one when None);
    ``screenshot``: gives the record's file name of the screenshot the model last saw. Returns
    exactly True only on an explicit approval by a person or a full opt-in match.
    """

    def __init__(self, *, auto_codes: Iterable[str] = (), **asking: Any) -> None:
        super().__init__(**asking)  # asker (required), console, on_decision, registry, screenshot
        self.auto_codes = set(auto_codes)

    def __call__(self, call: Any, cancelled: Callable[[], bool] | None = None) -> bool:
        checks = list(call.pending_safety_checks or [])
        codes = [c.code or "" for c in checks]
        ids = [c.id for c in checks]
        label = request_kind(SAFETY_CHECK).label
        _say(self.console, f"[bold yellow]{escape(label.capitalize())}[/] on computer_call "
                           f"{escape(clean(call.call_id, 80))}:", markup=True)
        for check in checks:
            # Codes, ids and messages come from the model: escaped, so none can hide or rewrite what
            # the person is asked to approve.
            _say(self.console, f"  - code={clean(check.code, 80)} id={clean(check.id, 80)}: "
                               f"{clean(check.message or '(no message)', 500)}")
        _say(self.console, "  actions of this call:")
        # A check without a code is never covered by an opt-in: there is nothing the person opted in to.
        opted_in = bool(checks) and all(c.code and c.code in self.auto_codes for c in checks)
        # Typed text is shown only to a person who is asked; unattended output may end up in logs.
        redact = opted_in or not self.anyone
        actions = _actions_of(call)
        for action in actions:
            _say(self.console, f"    {describe_action(action, redact=redact)}")
        base = dict(what=SAFETY_CHECK, call_id=call.call_id, codes=codes, check_ids=ids)
        if opted_in:
            shown = ",".join(clean(c, 80) for c in sorted(set(codes)))
            _say(self.console, f"  approved by opt-in (--approve-safety-check {shown})")
            self._emit(Decision(decision="approved", by="opt-in", **base))
            return True
        request = self.open(SAFETY_CHECK, "Approve these safety checks and run the call's actions?",
                            call_id=call.call_id,
                            checks=[{"id": c.id, "code": c.code, "message": c.message} for c in checks],
                            actions=[describe_action(a) for a in actions])
        if not self.anyone and request.pending:
            msg = ("denied: no terminal to ask and no approver; pass --approve-safety-check CODE "
                   "to approve these codes for an unattended run")
            _say(self.console, f"  [red]{msg}[/]", markup=True)
            self.registry.deny(request, by="no-approver", reason=msg)
            self._emit(Decision(decision="denied", by="no-approver", message=msg, request_id=request.id,
                                latency_ms=request.latency_ms, screenshot=request.screenshot, **base))
            return False
        self.ask(request, "Approve these safety checks and run the call's actions?", cancelled)
        self._emit(Decision(decision=request.state, by=request.by or "terminal", message=request.reason,
                            request_id=request.id, latency_ms=request.latency_ms,
                            screenshot=request.screenshot, **base))
        return True if request.approved else False


class ActionGate(_Asking):
    """``before_action`` callback: asks before action types in ``confirm`` (or all, in step mode).

    Actions not covered are allowed without asking (and not logged, to keep the record small).
    With nobody to ask, a covered action is denied with a clear message. ``registry``,
    ``screenshot``: as for :class:`SafetyCheckApprover`.
    """

    def __init__(self, *, confirm: Iterable[str] = (), step: bool = False, **asking: Any) -> None:
        super().__init__(**asking)  # as SafetyCheckApprover's
        self.confirm = set(confirm)
        self.step = step

    @property
    def active(self) -> bool:
        """Whether the gate asks about anything at all (otherwise the runner passes no callback)."""
        return self.step or bool(self.confirm)

    def asks(self, kind: str) -> bool:
        """Whether the gate asks before an action of type ``kind`` (``screenshot`` included: the SDK
        passes a call's closing screenshot through the gate too)."""
        return self.step or kind in self.confirm

    def __call__(self, action: Any, cancelled: Callable[[], bool] | None = None) -> bool:
        kind = action.get("type") if isinstance(action, dict) else action.type
        if not self.asks(kind):
            return True
        text = describe_action(action)
        logged = describe_action(action, redact=True)
        if not self.anyone:
            msg = "denied: confirmation required but there is no terminal to ask"
            _say(self.console, f"[red]{escape(logged)}: {msg}[/]", markup=True)
            self._emit(Decision(what=ACTION, decision="denied", by="no-approver", action=logged, message=msg))
            return False
        request = self.open_and_ask(ACTION, f"Run {text}?", cancelled, actions=[text])
        self._emit(Decision(what=ACTION, decision=request.state, by=request.by or "terminal", action=logged,
                            message=request.reason, request_id=request.id, latency_ms=request.latency_ms,
                            screenshot=request.screenshot))
        return True if request.approved else False


ORIGIN_ANSWERS = {"a": "approve", "approve": "approve", "y": "approve", "yes": "approve",
                  "c": "cancel", "cancel": "cancel"}
"""What a person may type at an origin prompt, and the answer each is; anything else is ``deny``."""


class OriginPrompter:
    """Asks about origin requests on the terminal as they come (``asker``: the run's
    :class:`TerminalAsker`), one at a time on a thread of its own, under the terminal's prompt lock.

    For each pending ``origin_access`` request it prints the origin and the gateway's reason (both
    escaped) and asks ``[a]pprove / [d]eny / [c]ancel``: ``a``/``approve`` (also ``y``/``yes``)
    approves, ``c``/``cancel`` cancels (the held connections are refused; the next attempt asks
    again), anything else -- an empty line too -- denies (remembered by the gateway for the sandbox's
    life). The prompt is given up as soon as the request is decided elsewhere (the console, the
    gateway's timeout, the run's end), with one line saying how. ``skip(request)``: requests not to
    ask about (answered unattended by ``--approve-origin``). ``registry.answer`` forwards the answer
    to the gateway; a refusal (the gateway decided first) is printed."""

    def __init__(self, asker: TerminalAsker, registry: ApprovalRegistry, *, console: Console | None = None,
                 skip: Callable[[Request], bool] | None = None) -> None:
        self.asker = asker
        self.registry = registry
        self.console = console or asker.console
        self.skip = skip
        self._worker: RequestWorker | None = None
        self._stopped = threading.Event()

    def start(self) -> "OriginPrompter":
        """Start asking (the requests opened from now on); returns self."""
        if self._worker is None:
            self._worker = RequestWorker(self.registry, ORIGIN_ACCESS, self._take, name="origin-prompts")
            self._stopped = self._worker.stopped
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop asking: a prompt on the terminal is given up; waits up to ``timeout_s`` for the one under way."""
        self._stopped.set()
        if self._worker is not None:
            self._worker.stop(timeout_s)

    def _take(self, request: Request) -> None:
        if not (self.skip is not None and self.skip(request)):
            self.ask(request)

    def ask(self, request: Request) -> str | None:
        """Ask about one origin request on the terminal; returns the answer given (approve | deny |
        cancel), or None when none was (decided elsewhere, the end of input, the prompter stopped)."""
        if not request.pending:
            return None
        done = lambda: not request.pending or self._stopped.is_set()  # noqa: E731
        label = request_kind(ORIGIN_ACCESS).label.capitalize()
        lines = [f"{label}: the guest asks to connect to {clean(request.origin or '?', 300)}",
                 f"  reason: {clean(request.origin_reason or '(none given)', 500)}"]
        left = request.seconds_left()
        if left is not None:
            lines.append(f"  the gateway refuses it if nobody answers within {left:.0f}s")
        if self.registry.views:
            lines.append("  (the console can answer too: the first answer counts)")
        line = self.asker.ask_until("Approve, deny or cancel?", done, hint="[a/c/D]", lines=lines)
        if line is None or not request.pending:
            if not request.pending:
                how = {"console": "answered in the console", "timeout": "the gateway's deadline passed",
                       "cancel": "withdrawn"}.get(request.by or "", clean(request.by or "decided", 40))
                _say(self.console, f"  origin {clean(request.origin or '?', 300)}: {how}: {request.state}")
            return None
        answer = ORIGIN_ANSWERS.get(line.strip().lower(), "deny")
        try:
            self.registry.answer(request.id, answer, by="terminal")
        except AnswerRefused as refused:
            _say(self.console, f"  not taken: {clean(refused.message, 300)} ({refused.code}): {request.state}")
            return None
        _say(self.console, f"  origin {clean(request.origin or '?', 300)}: {request.state}")
        return answer
