"""The approval registry: every pending human decision of a run, in one place.

A request is one question a person must answer before the run goes on: a computer_call's pending
safety checks (``kind="safety_check"``) or one action under ``--confirm-actions`` / ``--step``
(``kind="action"``) -- or a question the gateway asks: a connection of the guest's to an origin in
the task's ``ask`` tier, held at the gateway until it is answered (``kind="origin_access"``,
mirrored here by :class:`controller.run.origins.GatewayWatcher`, :meth:`ApprovalRegistry.mirror`).
The terminal prompt and the web console are two views of the same registry:

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

Origin requests (``origin_access``) differ in three ways. Their id is the gateway's (``oreq_...``),
the same end to end. ``cancel`` is a third valid answer (it refuses the held connections without
remembering a deny; for any other kind ``cancel`` is 400 ``invalid_answer``). And the gateway owns
them: an answer is forwarded to the gateway first, synchronously, and the entry is decided only once
the gateway took it (its refusals pass through: a request the gateway had already timed out becomes
``expired`` and the answer gets 409 ``expired``); their deadline is the gateway's ``deadline_at`` and
the registry never decides them at it -- the gateway's timeout does, and the watcher reports it
(:meth:`ApprovalRegistry.resolve`).

Only an ``approve`` answer from a person (terminal or console) ever approves: the SDK callback returns
exactly ``True`` for :attr:`Request.approved` and ``False`` for everything else (S1/S2 of the
computer-use contract). Decided requests stay in the registry for the run's life, so a late answer
gets 409 and not 404.

Kinds: what each kind answers, its label, its Agents API shape and the fields only it has are
:data:`controller.model.requests.REQUEST_KINDS`; a request of a kind outside that table is refused
when it is opened (:class:`controller.model.errors.UnknownKind`, naming it), never given a default.

Text in a request (the question, check codes and messages, action descriptions) comes from the model:
it is escaped with :func:`controller.text.clean` before it is stored, so every view shows it as text.
Threads: the SDK loop waits in :meth:`ApprovalRegistry.wait` on its own thread; views answer from
theirs. Subscribers are called outside the lock and must not block.
"""

from __future__ import annotations

import datetime as _dt
import re
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Literal

from controller.model import requests as _kinds
from controller.model.errors import DesktopSandboxError
from controller.model.requests import request_kind
from controller.text import clean

from controller.run.bus import ApprovalChanged, RunBus, of_kind

Kind = str
"""A request's kind: a name in :data:`controller.model.requests.REQUEST_KINDS` (checked by
:meth:`ApprovalRegistry.open`; :func:`controller.model.requests.request_kind` gives its entry)."""
State = Literal["pending", "approved", "denied", "cancelled", "expired", "withdrawn", "submitted"]
ANSWERS = {"approve": "approved", "deny": "denied", "cancel": "cancelled"}
"""Decision words a view may give, and the state each one decides; which of them a request takes is its
kind's ``answers`` (:data:`controller.model.requests.REQUEST_KINDS`: ``cancel`` for origin requests)."""

ORIGIN = _kinds.ORIGIN_ACCESS
"""The kind of a question the gateway asks (see the module docstring)."""

SIGN_IN = _kinds.SIGN_IN
"""The kind of a sign-in request (:meth:`ApprovalRegistry.open_signin`, docs/ARCHITECTURE.md contract 8)."""

Forward = Callable[[str, str], None]
"""How an answer reaches the owner of an origin request: ``forward(answer, by)`` returns once the
gateway took it (and may have decided the entry from the gateway's own state meanwhile, through
:meth:`ApprovalRegistry.resolve`); raises :class:`AnswerRefused` when it did not."""

POLL_S = 0.1
"""How often a waiting SDK callback looks at its ``cancelled`` flag (seconds)."""


def _now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds")


ORIGIN_ID = re.compile(r"oreq_[A-Za-z0-9_-]{1,128}")
"""An origin request's id as the gateway makes it: ``oreq_`` and up to 128 URL-safe characters."""
_DECIDED = ("approved", "denied", "cancelled", "expired", "withdrawn", "submitted")


def parse_time(text: Any) -> _dt.datetime:
    """An ISO-8601 time with its offset, as UTC; ValueError otherwise (a naive time included)."""
    if not isinstance(text, str) or len(text) > 64:
        raise ValueError("a time must be an ISO-8601 string")
    when = _dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    if when.utcoffset() is None:
        raise ValueError("a time without a time zone")
    return when.astimezone(_dt.timezone.utc)


class AnswerRefused(DesktopSandboxError):
    """An answer the registry did not take: ``status`` (HTTP: 400, 404, 409; 502 when the gateway
    could not be asked about an origin request), ``code`` (``invalid_answer``, ``unknown_request``,
    ``already_decided``, ``withdrawn``, ``expired``, ``gateway_unavailable``) and ``message``."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message

    def as_json(self) -> dict[str, Any]:
        """``{"error": {"code": ..., "message": ...}}``, the console's error body."""
        return {"error": {"code": self.code, "message": self.message}}


@dataclass
class Request:
    """One question to a person.

    ``id``: ``req_`` and 128 random bits (urlsafe), or the gateway's ``oreq_...`` for an origin
    request; ``kind``: a name in :data:`controller.model.requests.REQUEST_KINDS` (safety_check | action
    | origin_access | browser_authentication); ``question``: one
    line (escaped); ``call_id``; ``checks``: ``[{id, code, message}]`` (escaped); ``actions``: one
    line per action of the call (escaped; typed text in full: a request is a question to a person, as the
    terminal prompt is, and it never enters the record); ``screenshot``: the
    record's file name of the screenshot the model had when it asked (None before the first);
    ``created_at`` / ``decided_at``: UTC ISO-8601; ``deadline_s``: seconds from creation to the
    automatic deny (None: no deadline); ``state``: pending | approved | denied | cancelled | expired |
    withdrawn; ``by``: who decided (terminal | console | command line | timeout | no-approver |
    cancel | gateway); ``reason``: why, for a withdrawal or an automatic deny.

    Origin requests (``kind="origin_access"``) also have ``origin`` (``scheme://host[:port]``, as the
    gateway wrote it, escaped), ``origin_reason`` (the gateway's reason text, escaped), ``via``
    (``CONNECT`` | ``http``), ``held`` (connections held for it when mirrored) and ``deadline_at``
    (the gateway's deadline, UTC ISO-8601): ``deadline_s`` is then the seconds from the gateway's
    ``created_at`` to it, and ``latency_ms`` counts from ``created_at`` too.
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
    origin: str | None = None
    origin_reason: str | None = None
    via: str | None = None
    held: int | None = None
    deadline_at: str | None = None
    credential_origin: str | None = None
    fields: list[dict[str, Any]] = field(default_factory=list)
    options: list[dict[str, Any]] = field(default_factory=list)
    selected_option: str | None = None
    submitted_fields: list[str] = field(default_factory=list)
    _values: list[tuple[str, str]] | None = field(default=None, repr=False)
    _created: float = field(default_factory=time.monotonic, repr=False)
    _decided: threading.Event = field(default_factory=threading.Event, repr=False)
    _forward: Forward | None = field(default=None, repr=False)
    _answering: threading.Lock = field(default_factory=threading.Lock, repr=False)

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
        """The request as the console shows it (every string already escaped): its fields, the kind's
        ``label`` and ``answers`` (:data:`controller.model.requests.REQUEST_KINDS`: what the console's
        card says and which buttons it has), and the fields only its kind has for that kind only (a
        sign-in request's ``credential_origin``, ``fields``, ``options``, ``selected_option``,
        ``submitted_fields``). :class:`controller.model.errors.UnknownKind` for a kind outside the table."""
        kind = request_kind(self.kind)
        return {
            "id": self.id, "kind": self.kind, "label": kind.label, "answers": list(kind.answers),
            "question": self.question, "call_id": self.call_id,
            "checks": self.checks, "actions": self.actions, "screenshot": self.screenshot,
            "created_at": self.created_at, "deadline_s": self.deadline_s,
            "seconds_left": None if not self.pending else self.seconds_left(),
            "state": self.state, "by": self.by, "reason": self.reason, "decided_at": self.decided_at,
            "latency_ms": self.latency_ms, "origin": self.origin, "origin_reason": self.origin_reason,
            "via": self.via, "held": self.held, "deadline_at": self.deadline_at,
            **{name: getattr(self, name) for name in kind.fields},
        }


Listener = Callable[[Request], None]


class ApprovalRegistry:
    """The run's human decisions (see the module docstring).

    ``timeout_s``: seconds a request waits before it is denied (``--approval-timeout``; None: no
    deadline). ``views``: names of the views that can answer besides the terminal (``console``);
    with none and no terminal a request is denied at once (``by="no-approver"``).
    """

    def __init__(self, timeout_s: float | None = 300.0, bus: RunBus | None = None) -> None:
        if timeout_s is not None and not timeout_s > 0:
            raise ValueError("approval timeout must be a positive number of seconds")
        self.timeout_s = timeout_s
        self.views: set[str] = set()
        self._lock = threading.Lock()
        self._requests: dict[str, Request] = {}
        self.bus = bus if bus is not None else RunBus()
        """Where each change is published (:class:`~controller.run.bus.ApprovalChanged`): the run's bus."""
        self.version = 0
        self.closed: str | None = None
        """Why the registry takes no more questions (:meth:`close`), or None while it does."""

    # -- views -----------------------------------------------------------------------------------
    def subscribe(self, listener: Listener) -> Callable[[], None]:
        """Call ``listener(request)`` on every change (opened, decided, withdrawn), on the thread that
        made the change (an inline subscriber of :attr:`bus`: it must not block); returns the
        unsubscribe function. A listener that waits (a prompt) subscribes to :attr:`bus` queued instead."""
        subscription = self.bus.subscribe(lambda published: listener(published.event.request), inline=True,
                                          name="registry-listener", accepts=of_kind(ApprovalChanged))
        return subscription.close

    def _publish(self, request: Request) -> None:
        changed = {"id": request.id, "kind": request.kind, "state": request.state, "by": request.by,
                   "origin": request.origin}
        self.bus.publish(ApprovalChanged(request, self.snapshot(), changed))

    # -- requests --------------------------------------------------------------------------------
    def open(self, kind: Kind, question: str, *, call_id: str | None = None,
             checks: Iterable[dict[str, Any]] = (), actions: Iterable[str] = (),
             screenshot: str | None = None) -> Request:
        """Add a pending request (text escaped here) and tell the views; returns it. ``kind``: a name in
        :data:`controller.model.requests.REQUEST_KINDS`; any other is
        :class:`controller.model.errors.UnknownKind` (a ValueError naming it), and nothing is added."""
        request_kind(kind)
        request = Request(
            id="req_" + secrets.token_urlsafe(16), kind=kind, question=clean(question, 1000),
            call_id=None if call_id is None else clean(call_id, 200),
            checks=[{k: clean(c.get(k) or "", 1000 if k == "message" else 200) for k in ("id", "code", "message")}
                    for c in checks],
            actions=[clean(a, 1000) for a in actions], screenshot=screenshot, deadline_s=self.timeout_s,
        )
        return self._add(request)[0]

    def _add(self, request: Request, *, once: bool = False) -> tuple[Request, bool]:
        """Register a new pending request and tell the views; one asked after the run was cancelled or
        ended is withdrawn at once. ``once``: a request with this id already known is returned as it is,
        nothing added. Returns the request and whether it was added."""
        with self.bus.lock:  # the bus first, then ours: the changes and their events in one order
            with self._lock:
                known = self._requests.get(request.id) if once else None
                if known is not None:
                    return known, False
                self._requests[request.id] = request
                self.version += 1
                closed = self.closed
            if closed is not None:
                self.withdraw(request, closed)
            self._publish(request)
            return request, True

    def open_signin(self, reason: str, *, credential_origin: str, fields: Iterable[dict[str, Any]],
                    options: Iterable[dict[str, Any]], screenshot: str | None = None) -> Request:
        """Add a pending sign-in request (``browser_authentication``): ``fields`` / ``options`` as
        :class:`wire.browser.SignInForm` dumps them (labels escaped here), ``credential_origin`` from the
        browser. Returns it; it is answered with :meth:`answer_signin`."""
        request = Request(
            id="req_" + secrets.token_urlsafe(16), kind=SIGN_IN, question=clean(reason, 1000),
            credential_origin=clean(credential_origin, 300), screenshot=screenshot, deadline_s=self.timeout_s,
            fields=[{"id": clean(f["id"], 80), "label": clean(f.get("label", ""), 200),
                     "type": clean(f.get("type") or "text", 20), "required": bool(f.get("required")),
                     "kind": clean(f.get("kind") or "", 20) or None} for f in fields],
            options=[{"id": clean(o["id"], 80), "label": clean(o.get("label", ""), 200),
                      "field_ids": [clean(i, 80) for i in o.get("field_ids", [])]} for o in options],
        )
        return self._add(request)[0]

    def answer_signin(self, request_id: str, response: Any, *, by: str) -> Request:
        """A person's answer to a sign-in request: ``{"action": "cancel"}`` or ``{"action": "submit",
        "fields": [{"field_id", "value"}], "selected_option"?}`` (the hosted sessions' rules, ``004``:
        with options, ``selected_option`` is one of them and only its ``field_ids`` may be given; without,
        it is absent and at least one field is given when the request has fields; every required active
        field non-empty; limits of :mod:`wire.browser`). Returns the request. Raises
        :class:`AnswerRefused` as :meth:`answer` does (400 ``invalid_answer`` naming the rule, never a
        value; 409 when decided otherwise). A resent submit to a submitted request is 409: values are
        taken once."""
        request = self.get(request_id)
        if request.kind != SIGN_IN:
            answers = " or ".join(f'"{a}"' for a in request_kind(request.kind).answers)
            raise AnswerRefused(400, "invalid_answer", f"this request is not a sign-in request: answer {answers}")
        action = response.get("action") if isinstance(response, dict) else None
        if action == "cancel":
            if self._decide(request, "cancelled", by) or request.state == "cancelled":
                return request
            raise self._refusal(request)
        if action != "submit":
            raise AnswerRefused(400, "invalid_answer", "a sign-in answer is {\"action\": \"submit\", \"fields\": [...]} "
                                "or {\"action\": \"cancel\"}")
        values, option = _check_signin_submit(request, response)

        def keep() -> None:  # under the deciding lock: a losing answer leaves nothing behind
            request._values, request.selected_option = values, option
            request.submitted_fields = [field_id for field_id, _ in values]
        if self._decide(request, "submitted", by, keep=keep):
            return request
        raise self._refusal(request)

    def take_values(self, request: Request) -> list[tuple[str, str]]:
        """The submitted ``(field_id, value)`` pairs of a submitted sign-in request, once: the registry
        drops its reference (a second call returns ``[]``)."""
        with self._lock:
            values, request._values = request._values or [], None
        return values

    @staticmethod
    def _refusal(request: Request) -> AnswerRefused:
        if request.state == "withdrawn":
            return AnswerRefused(409, "withdrawn", f"the request was withdrawn ({request.reason or 'cancelled'})")
        return AnswerRefused(409, "already_decided", f"the request was already {request.state} (by {request.by})")

    def mirror(self, request_id: str, *, origin: str, reason: str, via: str | None = None,
               held: int | None = None, created_at: str | None = None, deadline_at: str | None = None,
               forward: Forward | None = None) -> tuple[Request, bool]:
        """Mirror the gateway's origin request ``request_id`` (``oreq_`` and up to 128 URL-safe
        characters) as a pending ``origin_access`` request with that same id; returns it and whether
        it is new (an id seen before returns the request as it is: a replayed or repeated event adds
        nothing). ``origin`` / ``reason``: the gateway's text (escaped here); ``created_at`` /
        ``deadline_at``: the gateway's times (UTC ISO-8601; latency counts from ``created_at``, the
        deadline is ``deadline_at``); ``forward``: how answers reach the gateway (:data:`Forward`).
        Raises ValueError for an id of another form or unparseable times."""
        if not isinstance(request_id, str) or not ORIGIN_ID.fullmatch(request_id):
            raise ValueError("an origin request id must be oreq_ and up to 128 URL-safe characters")
        now_wall, now_mono = _dt.datetime.now(_dt.timezone.utc), time.monotonic()
        created = parse_time(created_at) if created_at is not None else now_wall
        age = max(0.0, (now_wall - created).total_seconds()) if created is not None else 0.0
        deadline = parse_time(deadline_at) if deadline_at is not None else None
        request = Request(
            id=request_id, kind=ORIGIN, question=clean(f"Let the guest connect to {origin}?", 1000),
            origin=clean(origin, 300), origin_reason=clean(reason or "", 500), via=clean(via, 20) if via else None,
            held=held if isinstance(held, int) and not isinstance(held, bool) else None,
            created_at=created.isoformat(timespec="milliseconds") if created else _now_iso(),
            deadline_at=deadline.isoformat(timespec="milliseconds") if deadline else None,
            deadline_s=None if deadline is None else max(0.0, round((deadline - created).total_seconds(), 3)),
            _created=now_mono - age, _forward=forward,
        )
        return self._add(request, once=True)

    def resolve(self, request_id: str, state: State, *, by: str, reason: str | None = None) -> bool:
        """Decide a pending request from what its owner (the gateway) says: ``state`` approved |
        denied | cancelled | expired | withdrawn, ``by`` who decided there. False when the id is
        unknown or the request was already decided (the first decision stands)."""
        if state == "pending" or state not in _DECIDED:
            raise ValueError(f"not a decided state: {state!r}")
        with self._lock:
            request = self._requests.get(request_id)
        if request is None:
            return False
        return self._decide(request, state, clean(by, 40), None if reason is None else clean(reason, 300))

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

    def _decide(self, request: Request, state: State, by: str, reason: str | None = None, *,
                keep: Callable[[], None] | None = None) -> bool:
        """Decide ``request`` if it is still pending (under the lock; ``keep`` runs there too, before the
        decision, to store what comes with it); True when this call decided it."""
        with self.bus.lock:  # the bus first, then ours: the changes and their events in one order
            with self._lock:
                if not request.pending:
                    return False
                if keep is not None:
                    keep()
                request.state, request.by, request.reason = state, by, reason
                request.decided_at = _now_iso()
                request.latency_ms = round((time.monotonic() - request._created) * 1000, 1)
                self.version += 1
            request._decided.set()
            self._publish(request)
            return True

    def answer(self, request_id: str, answer: Any, *, by: str) -> Request:
        """A person's answer (``approve`` | ``deny``; for an origin request also ``cancel``) from the
        view ``by``. Returns the request (its state says what it is now). Raises
        :class:`AnswerRefused`: 400 for another answer, 404 for an unknown id, 409 when it was decided
        otherwise (``already_decided``), withdrawn or expired; for an origin request also what the
        gateway refused (passed through) and 502 ``gateway_unavailable``. The same answer to a request
        already decided that way is accepted and changes nothing. An origin request is decided here
        only after the gateway took the answer (:data:`Forward`); answers to one request are
        forwarded one at a time."""
        if not isinstance(answer, str) or answer not in ANSWERS:
            raise AnswerRefused(400, "invalid_answer", "the answer must be \"approve\" or \"deny\""
                                " (or \"cancel\" for an origin request)")
        request = self.get(request_id)
        kind = request_kind(request.kind)
        if kind.form:
            raise AnswerRefused(400, "invalid_answer", f"this {kind.label} is answered with submit (and its fields) "
                                "or cancel")
        if answer not in kind.answers:
            raise AnswerRefused(400, "invalid_answer", f"\"{answer}\" does not answer this {kind.label}: answer "
                                + " or ".join(f'"{a}"' for a in kind.answers))
        state = ANSWERS[answer]
        with request._answering:  # the gateway hears one answer at a time; the first one it takes counts
            if request.pending and request._forward is not None:
                request._forward(answer, by)  # raises AnswerRefused when the gateway did not take it
            if self._decide(request, state, by):
                return request
        if request.state == state:
            return request  # an identical resend: accepted, nothing changes
        if request.state == "withdrawn":
            raise AnswerRefused(409, "withdrawn", f"the request was withdrawn ({request.reason or 'cancelled'})")
        if request.state == "expired":
            raise AnswerRefused(409, "expired", "the request expired: the gateway's deadline passed "
                                "(its held connections were refused)")
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
        with self.bus.lock:  # the bus first, then ours: the changes and their events in one order
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
        ``cancelled()`` turning true (withdrawn, the reason ``cancelled.reason`` when it has one, e.g.
        ``cancelled by SIGTERM``, else ``run cancelled``), or the registry's :meth:`close`. Polls
        ``cancelled`` every :data:`POLL_S` seconds. An origin request is never decided here at its
        deadline (the gateway's timeout decides it): waiting for one, bound the wait with ``cancelled``."""
        while request.pending:
            if cancelled is not None and cancelled():
                self.withdraw(request, getattr(cancelled, "reason", None) or "run cancelled")
                break
            left = request.seconds_left()
            if request.kind == ORIGIN:
                left = None
            if left is not None and left <= 0:
                self.deny(request, by="timeout",
                          reason=f"no answer within {request.deadline_s:g}s (--approval-timeout)")
                break
            request._decided.wait(POLL_S if left is None else min(POLL_S, left))
        return request


def _check_signin_submit(request: Request, response: dict[str, Any]) -> tuple[list[tuple[str, str]], str | None]:
    """The ``(field_id, value)`` pairs and option of a valid submit to ``request``; AnswerRefused 400
    otherwise (the message names the rule and ids, never a value)."""
    from pydantic import ValidationError

    from wire.browser import FillRequest

    def refuse(message: str) -> AnswerRefused:
        return AnswerRefused(400, "invalid_answer", message)
    if set(response) - {"action", "fields", "selected_option", "type"}:
        raise refuse("a sign-in answer has action, fields and selected_option only")
    if response.get("type", SIGN_IN) != SIGN_IN:
        raise refuse("type must be browser_authentication")
    raw_fields = response.get("fields", [])
    option = response.get("selected_option")
    given: list[tuple[str, str]] = []
    if raw_fields or option is not None:  # the wire's limits (an empty answer has nothing to check)
        try:
            checked = FillRequest.model_validate({"credential_origin": request.credential_origin or "-",
                                                  "fields": raw_fields, "selected_option": option})
        except ValidationError as exc:
            first = exc.errors(include_input=False, include_url=False)[0]
            where = ".".join(str(part) for part in first.get("loc", ())) or "answer"
            raise refuse(f"{where}: {first.get('msg', 'invalid')}") from None
        given = [(f.field_id, f.value) for f in checked.fields]
    known = {f["id"]: f for f in request.fields}
    if request.options:
        by_id = {o["id"]: o for o in request.options}
        if option not in by_id:
            raise refuse("selected_option must be one of the request's options")
        active = list(by_id[option]["field_ids"])
    else:
        if option is not None:
            raise refuse("this request has no options: leave selected_option out")
        active = list(known)
        if known and not given:
            raise refuse("give at least one field")
    for field_id, _ in given:
        if field_id not in active:
            raise refuse(f"field {clean(field_id, 80)} is not a field of this request (or of the chosen option)")
    given_ids = {field_id for field_id, _ in given}
    for field_id in active:
        if known.get(field_id, {}).get("required") and field_id not in given_ids:
            raise refuse(f"field {field_id} is required")
    return given, option


class RequestWorker:
    """Handles the requests of one ``kind`` as they open, one at a time, in order, on a thread of the
    registry's bus (a queued subscriber: the run never waits for it). ``handle(request)`` is called
    once per request, only while it is still pending when its turn comes; ``name``: the subscriber's
    name on the bus (what a ``view_dropped`` line would say)."""

    def __init__(self, registry: "ApprovalRegistry", kind: str, handle: Callable[[Request], Any], *, name: str) -> None:
        self.registry, self.kind, self.handle = registry, kind, handle
        self.stopped = threading.Event()
        self._seen: set[str] = set()
        self._subscription = registry.bus.subscribe(
            self._deliver, name=name,
            accepts=lambda event: isinstance(event, ApprovalChanged) and event.request.kind == kind
            and event.request.pending)

    def _deliver(self, published: Any) -> None:
        request = published.event.request
        if request.id in self._seen or self.stopped.is_set():
            return
        self._seen.add(request.id)
        if request.pending:
            self.handle(request)

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop handling (a handler under way should look at :attr:`stopped`); waits up to ``timeout_s``
        for the one under way to end."""
        self.stopped.set()
        self._subscription.close()
        self._subscription.join(timeout_s)

