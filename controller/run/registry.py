"""The approval registry: every pending human decision of a run, in one place.

A request is one question a person must answer before the run goes on: a computer_call's pending
safety checks (``kind="safety_check"``) or one action under ``--confirm-actions`` / ``--step``
(``kind="action"``). The terminal prompt and the web console are two views of the same registry:

* **first answer wins** -- under one lock, the first valid answer (terminal, console, the deadline, a
  cancellation) decides the request; every view is told at once (:meth:`ApprovalRegistry.subscribe`);
* **answer semantics** (after the hosted sessions' approval endpoints, ``004``): a valid answer to a
  pending request is accepted (HTTP 202); the same answer again is accepted again and changes nothing;
  a different answer to a decided request, or any answer to a withdrawn one, is a conflict (409, code
  ``already_decided`` / ``withdrawn``); an unknown id is 404 ``unknown_request``; an answer that is not
  ``approve`` / ``deny`` is 400 ``invalid_answer`` (:class:`AnswerRefused` carries status and code);
* **deadline** (``--approval-timeout``): a request still pending at its deadline is denied, ``by="timeout"``;
* **cancellation** withdraws every pending request (:meth:`ApprovalRegistry.withdraw_all`): nothing of
  it runs, and a withdrawn request never turns into an approval.

Only an ``approve`` answer from a person (terminal or console) ever approves: the SDK callback returns
exactly ``True`` for :attr:`Request.approved` and ``False`` for everything else (S1/S2 of the
computer-use contract). Decided requests stay in the registry for the run's life, so a late answer
gets 409 and not 404.

Text in a request (the question, check codes and messages, action descriptions) comes from the model:
it is escaped with :func:`controller.text.clean` before it is stored, so every view shows it as text.
Threads: the SDK loop waits in :meth:`ApprovalRegistry.wait` on its own thread; views answer from
theirs. Subscribers are called outside the lock and must not block.
"""

from __future__ import annotations

import datetime as _dt
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Literal

from controller.text import clean

Kind = Literal["safety_check", "action"]
State = Literal["pending", "approved", "denied", "withdrawn"]
ANSWERS = {"approve": "approved", "deny": "denied"}
"""Answers a view may give, and the state each one decides."""

POLL_S = 0.1
"""How often a waiting SDK callback looks at its ``cancelled`` flag (seconds)."""


def _now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds")


class AnswerRefused(Exception):
    """An answer the registry did not take: ``status`` (HTTP: 400, 404, 409), ``code``
    (``invalid_answer``, ``unknown_request``, ``already_decided``, ``withdrawn``) and ``message``."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message

    def as_json(self) -> dict[str, Any]:
        """``{"error": {"code": ..., "message": ...}}``, the console's error body."""
        return {"error": {"code": self.code, "message": self.message}}


@dataclass
class Request:
    """One question to a person.

    ``id``: ``req_`` and 128 random bits (urlsafe); ``kind``: safety_check | action; ``question``: one
    line (escaped); ``call_id``; ``checks``: ``[{id, code, message}]`` (escaped); ``actions``: one
    line per action of the call (escaped; typed text in full: a request is a question to a person, as the
    terminal prompt is, and it never enters the record); ``screenshot``: the
    record's file name of the screenshot the model had when it asked (None before the first);
    ``created_at`` / ``decided_at``: UTC ISO-8601; ``deadline_s``: seconds from creation to the
    automatic deny (None: no deadline); ``state``: pending | approved | denied | withdrawn; ``by``:
    who decided (terminal | console | timeout | no-approver | cancel); ``reason``: why, for a
    withdrawal or an automatic deny.
    """

    id: str
    kind: Kind
    question: str
    call_id: str | None = None
    checks: list[dict[str, str]] = field(default_factory=list)
    actions: list[str] = field(default_factory=list)
    screenshot: str | None = None
    created_at: str = field(default_factory=_now_iso)
    deadline_s: float | None = None
    state: State = "pending"
    by: str | None = None
    reason: str | None = None
    decided_at: str | None = None
    latency_ms: float | None = None
    _created: float = field(default_factory=time.monotonic, repr=False)
    _decided: threading.Event = field(default_factory=threading.Event, repr=False)

    @property
    def pending(self) -> bool:
        return self.state == "pending"

    @property
    def approved(self) -> bool:
        """True only for an explicit approval by a person."""
        return self.state == "approved"

    @property
    def deadline_mono(self) -> float | None:
        return None if self.deadline_s is None else self._created + self.deadline_s

    def seconds_left(self) -> float | None:
        """Seconds until the automatic deny (never below 0), or None without a deadline."""
        deadline = self.deadline_mono
        return None if deadline is None else max(0.0, deadline - time.monotonic())

    def as_json(self) -> dict[str, Any]:
        """The request as the console shows it (every string already escaped)."""
        return {
            "id": self.id, "kind": self.kind, "question": self.question, "call_id": self.call_id,
            "checks": self.checks, "actions": self.actions, "screenshot": self.screenshot,
            "created_at": self.created_at, "deadline_s": self.deadline_s,
            "seconds_left": None if not self.pending else self.seconds_left(),
            "state": self.state, "by": self.by, "reason": self.reason, "decided_at": self.decided_at,
            "latency_ms": self.latency_ms,
        }


Listener = Callable[[Request], None]


class ApprovalRegistry:
    """The run's human decisions (see the module docstring).

    ``timeout_s``: seconds a request waits before it is denied (``--approval-timeout``; None: no
    deadline). ``views``: names of the views that can answer besides the terminal (``console``);
    with none and no terminal a request is denied at once (``by="no-approver"``).
    """

    def __init__(self, timeout_s: float | None = 300.0) -> None:
        if timeout_s is not None and not timeout_s > 0:
            raise ValueError("approval timeout must be a positive number of seconds")
        self.timeout_s = timeout_s
        self.views: set[str] = set()
        self._lock = threading.Lock()
        self._requests: dict[str, Request] = {}
        self._listeners: list[Listener] = []
        self.version = 0
        self.closed: str | None = None
        """Why the registry takes no more questions (:meth:`close`), or None while it does."""

    # -- views -----------------------------------------------------------------------------------
    def subscribe(self, listener: Listener) -> Callable[[], None]:
        """Call ``listener(request)`` on every change (opened, decided, withdrawn); returns the
        unsubscribe function. Listeners run on the thread that made the change and must not block."""
        with self._lock:
            self._listeners.append(listener)

        def unsubscribe() -> None:
            with self._lock:
                if listener in self._listeners:
                    self._listeners.remove(listener)

        return unsubscribe

    def _publish(self, request: Request) -> None:
        with self._lock:
            listeners = list(self._listeners)
        for listener in listeners:
            try:
                listener(request)
            except Exception:  # noqa: BLE001 - a broken view never decides or blocks anything
                pass

    # -- requests --------------------------------------------------------------------------------
    def open(self, kind: Kind, question: str, *, call_id: str | None = None,
             checks: Iterable[dict[str, Any]] = (), actions: Iterable[str] = (),
             screenshot: str | None = None) -> Request:
        """Add a pending request (text escaped here) and tell the views; returns it."""
        request = Request(
            id="req_" + secrets.token_urlsafe(16), kind=kind, question=clean(question, 1000),
            call_id=None if call_id is None else clean(call_id, 200),
            checks=[{k: clean(c.get(k) or "", 1000 if k == "message" else 200) for k in ("id", "code", "message")}
                    for c in checks],
            actions=[clean(a, 1000) for a in actions], screenshot=screenshot, deadline_s=self.timeout_s,
        )
        with self._lock:
            self._requests[request.id] = request
            self.version += 1
            closed = self.closed
        if closed is not None:  # asked after the run was cancelled or ended: withdrawn at once
            self.withdraw(request, closed)
        self._publish(request)
        return request

    def get(self, request_id: str) -> Request:
        """The request with this id; :class:`AnswerRefused` 404 ``unknown_request`` when there is none."""
        with self._lock:
            request = self._requests.get(request_id)
        if request is None:
            raise AnswerRefused(404, "unknown_request", "no approval request with this id in this run")
        return request

    def pending(self) -> list[Request]:
        """Pending requests, oldest first."""
        with self._lock:
            return [r for r in self._requests.values() if r.pending]

    def all(self) -> list[Request]:
        """Every request of the run, oldest first."""
        with self._lock:
            return list(self._requests.values())

    def snapshot(self) -> dict[str, Any]:
        """``{"version": n, "pending": [request...]}`` for a view that (re)connects."""
        with self._lock:
            version = self.version
            pending = [r for r in self._requests.values() if r.pending]
        return {"version": version, "pending": [r.as_json() for r in pending]}

    def _decide(self, request: Request, state: State, by: str, reason: str | None = None) -> bool:
        """Decide ``request`` if it is still pending (under the lock); True when this call decided it."""
        with self._lock:
            if not request.pending:
                return False
            request.state, request.by, request.reason = state, by, reason
            request.decided_at = _now_iso()
            request.latency_ms = round((time.monotonic() - request._created) * 1000, 1)
            self.version += 1
        request._decided.set()
        self._publish(request)
        return True

    def answer(self, request_id: str, answer: Any, *, by: str) -> Request:
        """A person's answer (``approve`` | ``deny``) from the view ``by``. Returns the request (its
        state says what it is now). Raises :class:`AnswerRefused`: 400 for another answer, 404 for an
        unknown id, 409 when it was decided otherwise or withdrawn. The same answer to a request
        already decided that way is accepted and changes nothing."""
        if not isinstance(answer, str) or answer not in ANSWERS:
            raise AnswerRefused(400, "invalid_answer", "the answer must be \"approve\" or \"deny\"")
        request = self.get(request_id)
        state = ANSWERS[answer]
        if self._decide(request, state, by):
            return request
        if request.state == state:
            return request  # an identical resend: accepted, nothing changes
        if request.state == "withdrawn":
            raise AnswerRefused(409, "withdrawn", f"the request was withdrawn ({request.reason or 'cancelled'})")
        raise AnswerRefused(409, "already_decided",
                            f"the request was already {request.state} (by {request.by})")

    def deny(self, request: Request, *, by: str, reason: str) -> bool:
        """Deny without a person (``by``: timeout | no-approver); False when it was already decided."""
        return self._decide(request, "denied", by, reason)

    def withdraw(self, request: Request, reason: str) -> bool:
        """Withdraw one pending request (nothing of it runs); False when it was already decided."""
        return self._decide(request, "withdrawn", "cancel", reason)

    def withdraw_all(self, reason: str = "run cancelled") -> list[Request]:
        """Withdraw every pending request; returns those withdrawn."""
        return [r for r in self.pending() if self.withdraw(r, reason)]

    def close(self, reason: str, then: Callable[[], None] | None = None) -> list[Request]:
        """Take no more questions: every pending request is withdrawn, and one opened later is
        withdrawn at once. ``then`` (the run's cancellation flag) runs under the same lock as the
        withdrawal, so no answer can land between the two: a request is either decided before, or
        withdrawn. Returns the requests withdrawn."""
        withdrawn: list[Request] = []
        with self._lock:
            self.closed = self.closed or reason
            if then is not None:
                then()
            for request in self._requests.values():
                if request.pending:
                    request.state, request.by, request.reason = "withdrawn", "cancel", reason
                    request.decided_at = _now_iso()
                    request.latency_ms = round((time.monotonic() - request._created) * 1000, 1)
                    withdrawn.append(request)
            if withdrawn:
                self.version += 1
        for request in withdrawn:
            request._decided.set()
            self._publish(request)
        return withdrawn

    def wait(self, request: Request, cancelled: Callable[[], bool] | None = None) -> Request:
        """Block until ``request`` is decided: by an answer, its deadline (denied, ``by="timeout"``) or
        ``cancelled()`` turning true (withdrawn). Polls ``cancelled`` every :data:`POLL_S` seconds."""
        while request.pending:
            if cancelled is not None and cancelled():
                self.withdraw(request, "run cancelled")
                break
            left = request.seconds_left()
            if left is not None and left <= 0:
                self.deny(request, by="timeout",
                          reason=f"no answer within {request.deadline_s:g}s (--approval-timeout)")
                break
            request._decided.wait(POLL_S if left is None else min(POLL_S, left))
        return request
