"""Origin requests: connections the gateway holds until a person approves, denies or cancels.

Pure asyncio (no proxy import): the mitmproxy addon (:mod:`controller.gateway.addon`) holds connections
here, and the control API (:mod:`controller.gateway.control`) lists, watches and answers the requests,
all on the gateway's one event loop (nothing here is thread-safe; call it from that loop only).

* One pending request per origin, however many connections wait on it: :meth:`OriginRequests.join`
  adds a connection to the origin's pending request or opens one (``oreq_`` + 128 random bits), unless
  ``max_pending`` requests for other origins are already waiting (then None: ``prompt_limit``).
* An answer resolves every connection waiting on the request at once: ``approve`` and ``deny`` are
  remembered for the gateway's life (:meth:`OriginRequests.memory`), ``cancel`` only refuses the waiting
  connections (the next one opens a new request). At the deadline (``hold_timeout`` seconds after the
  request opened) the request ends ``timeout``: a deny that is not remembered.
* A connection whose client goes away is taken off its request (``client_gone``); the request stays
  pending until its deadline, so an answer still counts for the next attempt.
* At the gateway's stop (:meth:`OriginRequests.close`) every pending request ends ``timeout`` and its
  held connections end ``gateway_stopped`` (refused).
* Every change is an event with a sequence number (``created``, ``resolved``), kept in a ring buffer so
  a watcher can catch up after a reconnect (:meth:`OriginRequests.events_after`).

Rule source: ARCHITECTURE.md, contract 2 (``[network]``, mode ask) and "Gateway control API".
"""

from __future__ import annotations

import asyncio
import collections
import datetime as _dt
import secrets
import time
from dataclasses import dataclass, field
from typing import Callable, Any, Literal, Optional

from controller.gateway.policy import Origin
from controller.model.errors import DesktopSandboxError
from controller.text import clean

State = Literal["pending", "approved", "denied", "cancelled", "timeout"]
Answer = Literal["approve", "deny", "cancel"]
Via = Literal["CONNECT", "http"]

ANSWER_STATE: dict[str, State] = {"approve": "approved", "deny": "denied", "cancel": "cancelled"}
"""The state an answer leads to."""

EVENT_BUFFER = 1000
"""Events kept for replay (:meth:`OriginRequests.events_after`)."""

DECIDED_KEPT = 4096
"""Decided requests kept for lookups by id; older ones are forgotten (their origin's answer is not)."""

REASONS: dict[str, str] = {
    "CONNECT": "The guest asked the gateway for a tunnel to this origin (HTTPS); the task's network policy "
               "does not allow it, and it may be opened only if you approve.",
    "http": "The guest sent a plain-HTTP request to this origin through the gateway; the task's network "
            "policy does not allow it, and it may be sent only if you approve.",
}
"""The ``reason`` of a request, in the gateway's own words (never text from the guest or a page)."""


def utc_text(moment: _dt.datetime) -> str:
    """ISO-8601 UTC text with milliseconds (``2026-01-02T03:04:05.678+00:00``)."""
    return moment.astimezone(_dt.timezone.utc).isoformat(timespec="milliseconds")


class AnswerRefused(DesktopSandboxError):
    """An answer that cannot be applied: ``code`` ``unknown_request`` | ``already_decided`` | ``expired``."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class Outcome:
    """How a held connection ended: ``state`` approved | denied | cancelled | timeout | client_gone |
    gateway_stopped, ``request_id``, ``held_ms`` (milliseconds from joining to the end)."""

    state: str
    request_id: str
    held_ms: int


@dataclass
class Ticket:
    """One held connection: ``client_id`` (the proxy's id of the client connection), ``joined``
    (monotonic seconds), ``future`` (its :class:`Outcome`, set exactly once)."""

    client_id: str
    joined: float
    future: "asyncio.Future[Outcome]"
    request: "OriginRequest"

    async def wait(self) -> Outcome:
        """The outcome, once the request is answered, expires or the client goes away."""
        return await self.future


@dataclass
class OriginRequest:
    """One origin waiting for a person's answer (the control API's ``OriginRequest``)."""

    id: str
    origin: Origin
    via: str
    created_at: _dt.datetime
    deadline_at: _dt.datetime
    deadline: float
    state: str = "pending"
    by: Optional[str] = None
    decided_at: Optional[_dt.datetime] = None
    tickets: list[Ticket] = field(default_factory=list)
    timer: Optional[asyncio.TimerHandle] = None

    def to_json(self) -> dict[str, Any]:
        """``{"id", "origin", "reason", "via", "held", "created_at", "deadline_at", "state", "by",
        "decided_at"}``: ``held`` the connections held now, times ISO-8601 UTC, ``by`` and
        ``decided_at`` None while pending."""
        return {
            "id": self.id,
            "origin": clean(str(self.origin), 300),
            "reason": REASONS.get(self.via, REASONS["CONNECT"]),
            "via": self.via,
            "held": len(self.tickets),
            "created_at": utc_text(self.created_at),
            "deadline_at": utc_text(self.deadline_at),
            "state": self.state,
            "by": self.by,
            "decided_at": utc_text(self.decided_at) if self.decided_at else None,
        }


class OriginRequests:
    """The gateway's origin requests, remembered answers and event stream (see the module docstring).

    ``hold_timeout``: seconds from opening a request to its deadline; ``max_pending``: requests that
    may be pending at once. Use from the gateway's event loop only.
    """

    def __init__(self, hold_timeout: float, max_pending: int) -> None:
        self.hold_timeout = float(hold_timeout)
        self.max_pending = int(max_pending)
        self.seq = 0
        """Number of the last event (0: none yet)."""
        self._pending: dict[Origin, OriginRequest] = {}
        self._by_id: dict[str, OriginRequest] = {}
        self._decided: collections.deque[str] = collections.deque()
        self._remembered: dict[Origin, tuple[str, str]] = {}
        self._events: collections.deque[tuple[int, str, dict[str, Any]]] = collections.deque(maxlen=EVENT_BUFFER)
        self._changed = asyncio.Event()

    # -- the proxy's side ---------------------------------------------------------------------------

    def memory(self, origin: Origin) -> Optional[tuple[str, Optional[str]]]:
        """The remembered answer for ``origin``: ``("approved" | "denied", request id)``, or None."""
        return self._remembered.get(origin)

    def join(self, origin: Origin, via: Via, client_id: str) -> Optional[Ticket]:
        """Hold one connection from client ``client_id`` to ``origin`` (``via``: CONNECT | http): join
        the origin's pending request, or open one. Returns None, opening nothing, when ``max_pending``
        requests for other origins are pending (the caller denies ``prompt_limit``)."""
        request = self._pending.get(origin)
        opened = request is None
        if request is None:
            if len(self._pending) >= self.max_pending:
                return None
            request = self._open(origin, via)
        loop = asyncio.get_running_loop()
        ticket = Ticket(client_id=client_id, joined=time.monotonic(), future=loop.create_future(), request=request)
        request.tickets.append(ticket)
        if opened:
            self._emit("created", request)
        return ticket

    def client_gone(self, client_id: str) -> int:
        """Take every connection of client ``client_id`` off its request (outcome ``client_gone``); the
        requests stay pending. Returns how many were held."""
        count = 0
        for request in list(self._pending.values()):
            for ticket in [t for t in request.tickets if t.client_id == client_id]:
                request.tickets.remove(ticket)
                self._finish(ticket, "client_gone")
                count += 1
        return count

    def close(self) -> list[Ticket]:
        """Gateway shutdown: every pending request ends ``timeout``, its held connections with the outcome
        ``gateway_stopped`` (refused). Returns those connections, each with its outcome set."""
        stopped: list[Ticket] = []
        for request in list(self._pending.values()):
            stopped.extend(request.tickets)
            self._resolve(request, "timeout", None, outcome="gateway_stopped")
        return stopped

    def reconfigure(self, hold_timeout: float, max_pending: int, still_asked: Callable[[Origin], bool]) -> int:
        """A new policy took over: requests opened from now on wait ``hold_timeout`` seconds, at most
        ``max_pending`` at once (those pending keep their deadlines); each pending request whose origin
        ``still_asked(origin)`` is False is answered ``cancelled`` by ``policy`` (its held connections
        are refused, the stream says ``resolved``); remembered answers for such origins are forgotten.
        Returns how many pending requests were answered so."""
        self.hold_timeout = float(hold_timeout)
        self.max_pending = int(max_pending)
        for origin in [o for o in self._remembered if not still_asked(o)]:
            del self._remembered[origin]
        ended = 0
        for request in list(self._pending.values()):
            if not still_asked(request.origin):
                self._resolve(request, "cancelled", "policy")
                ended += 1
        return ended

    # -- the control API's side ---------------------------------------------------------------------

    def get(self, request_id: str) -> Optional[OriginRequest]:
        """The request with this id (pending, or decided and still kept), or None."""
        return self._by_id.get(request_id)

    def listing(self, state: Literal["pending", "all"] = "pending") -> list[dict[str, Any]]:
        """Requests as JSON (:meth:`OriginRequest.to_json`), oldest first: the pending ones, or all kept."""
        requests = self._pending.values() if state == "pending" else self._by_id.values()
        return [r.to_json() for r in sorted(requests, key=lambda r: (r.created_at, r.id))]

    def answer(self, request_id: str, answer: Answer, by: str) -> bool:
        """Apply ``answer`` (approve | deny | cancel) by ``by`` (a short label) to a request.

        Returns True when it changed the request, False when the request already holds exactly this
        answer (nothing changes). Raises :class:`AnswerRefused`: ``unknown_request``, ``expired`` (the
        request timed out), ``already_decided`` (another answer came first).
        """
        request = self._by_id.get(request_id)
        if request is None:
            raise AnswerRefused("unknown_request", "no origin request with this id")
        if request.state == "pending":
            self._resolve(request, ANSWER_STATE[answer], by)
            return True
        if request.state == "timeout":
            raise AnswerRefused("expired", "the request timed out before the answer; it was denied")
        if request.state == ANSWER_STATE[answer]:
            return False
        raise AnswerRefused("already_decided", f"the request was already answered: {request.state}")

    def events_after(self, last: int) -> Optional[list[tuple[int, str, dict[str, Any]]]]:
        """Events numbered after ``last`` as ``(seq, name, data)``, oldest first; None when they cannot
        all be given (``last`` is older than the buffer, or newer than any event): then a fresh
        snapshot is due."""
        if last > self.seq or last < 0:
            return None
        if last == self.seq:
            return []
        if not self._events or self._events[0][0] > last + 1:
            return None
        return [event for event in self._events if event[0] > last]

    async def changed(self, timeout: float) -> bool:
        """Wait until an event is added after this call (True) or ``timeout`` seconds pass (False)."""
        event = self._changed
        try:
            await asyncio.wait_for(event.wait(), timeout)
        except asyncio.TimeoutError:
            return False
        return True

    # -- internals ----------------------------------------------------------------------------------

    def _open(self, origin: Origin, via: str) -> OriginRequest:
        now = _dt.datetime.now(_dt.timezone.utc)
        request = OriginRequest(
            id="oreq_" + secrets.token_urlsafe(16), origin=origin, via=via, created_at=now,
            deadline_at=now + _dt.timedelta(seconds=self.hold_timeout),
            deadline=time.monotonic() + self.hold_timeout,
        )
        request.timer = asyncio.get_running_loop().call_later(self.hold_timeout, self._expire, request)
        self._pending[origin] = request
        self._by_id[request.id] = request
        return request

    def _expire(self, request: OriginRequest) -> None:
        if request.state == "pending":
            self._resolve(request, "timeout", None)

    def _resolve(self, request: OriginRequest, state: str, by: Optional[str], *, outcome: Optional[str] = None) -> None:
        """Decide ``request`` (``state``, ``by``); each connection held on it ends with ``outcome`` (default:
        the state)."""
        request.state = state
        request.by = by
        request.decided_at = _dt.datetime.now(_dt.timezone.utc)
        if request.timer is not None:
            request.timer.cancel()
            request.timer = None
        if self._pending.get(request.origin) is request:
            del self._pending[request.origin]
        if state in ("approved", "denied"):
            self._remembered[request.origin] = (state, request.id)
        tickets, request.tickets = request.tickets, []
        for ticket in tickets:
            self._finish(ticket, outcome or state)
        self._decided.append(request.id)
        while len(self._decided) > DECIDED_KEPT:
            self._by_id.pop(self._decided.popleft(), None)
        self._emit("resolved", request)

    @staticmethod
    def _finish(ticket: Ticket, state: str) -> None:
        if not ticket.future.done():
            held_ms = int(round((time.monotonic() - ticket.joined) * 1000))
            ticket.future.set_result(Outcome(state=state, request_id=ticket.request.id, held_ms=held_ms))

    def _emit(self, name: str, request: OriginRequest) -> None:
        self.seq += 1
        self._events.append((self.seq, name, request.to_json()))
        self._changed.set()
        self._changed = asyncio.Event()


__all__ = [
    "ANSWER_STATE", "AnswerRefused", "DECIDED_KEPT", "EVENT_BUFFER", "OriginRequest", "OriginRequests",
    "Outcome", "REASONS", "Ticket", "utc_text",
]
