"""The mirror of the gateway's origin requests in a run's approval registry (:class:`GatewayWatcher`;
the protocol and its rules: :mod:`controller.run.origins`).

Over 400 lines: one class whose two threads (the event stream with its polls and reconciliations, and
the answers sent to the gateway) share its state (what is mirrored, pending, reported, seen) under one
lock; split, that state would be shared across modules.
"""

from __future__ import annotations

import datetime as _dt
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from controller.gateway.policy import Origin, PolicyError
from controller.gateway.tiers import MAX_PENDING_LIMIT
from controller.run.approvals import Decision
from controller.run.origins.bounds import (
    BACKOFF_S, MAX_DEADLINE_S, MAX_MIRRORED, MAX_PENDING, MAX_REQUESTS, POLL_S, RECONCILE_BUDGET_S,
    STOP_MARGIN_S, STOP_TIMEOUT_S, UNREACHABLE_S,
)
from controller.run.origins.control import BY, GATEWAY_STATES, GatewayControl, GatewayError, _valid, origin_request
from controller.run.origins.decisions import origin_decision
from controller.run.registry import ORIGIN, AnswerRefused, ApprovalRegistry, Request, parse_time
from controller.text import clean

@dataclass
class _Job:
    request_id: str
    answer: str
    by: str


class GatewayWatcher:
    """Mirrors the gateway's origin requests into ``registry`` (see :mod:`controller.run.origins`).

    ``control``: the gateway's control API; ``on_decision``: gets one :class:`Decision`
    (``what="origin_access"``) per request once it is decided (the record's ``approval`` line);
    ``approve``: origins answered ``approve`` at once, ``by="command line"`` (``--approve-origin``);
    ``on_problem``: gets a one-line, escaped message the first time the control API fails in a new way;
    ``max_pending``: most requests mirrored as pending at once (1..100, default :data:`MAX_PENDING`; the
    task's policy ``max_pending`` where the caller knows it); ``on_lost``: called once (on the watch's
    thread) with one line naming the control API and its last error when every call failed for
    ``unreachable_s`` seconds (:data:`UNREACHABLE_S`) -- the watch goes on retrying meanwhile.
    :meth:`start` starts the watch (a thread for the stream, one for answers); :meth:`wait_reached` waits
    for its first answered call; :meth:`stop` ends it, withdrawing what is still pending (``cancel`` at
    the gateway). Thread-safe.

    Everything the gateway controls is bounded: requests pending at once (``max_pending``), the time a
    reconciliation fetches (:data:`RECONCILE_BUDGET_S`), the time a stop takes (:data:`STOP_TIMEOUT_S`)
    and how far off a deadline is taken (:data:`MAX_DEADLINE_S`).
    """

    def __init__(self, control: GatewayControl, registry: ApprovalRegistry, *,
                 on_decision: Callable[[Decision], None] | None = None, approve: Iterable[Origin] = (),
                 on_problem: Callable[[str], None] | None = None, max_pending: int = MAX_PENDING,
                 on_lost: Callable[[str], None] | None = None, unreachable_s: float = UNREACHABLE_S) -> None:
        if not isinstance(max_pending, int) or isinstance(max_pending, bool) \
                or not 1 <= max_pending <= MAX_PENDING_LIMIT:
            raise ValueError(f"max_pending must be 1..{MAX_PENDING_LIMIT}")
        self.control = control
        self.registry = registry
        self.on_decision = on_decision
        self.approve = frozenset(approve)
        self.on_problem = on_problem
        self.max_pending = max_pending
        self.on_lost = on_lost
        self.unreachable_s = unreachable_s
        self.reached = threading.Event()
        """Set once a call of the control API was answered (an event stream opened, a poll answered)."""
        self.lost: str | None = None
        """What :attr:`on_lost` was told (None: the API never stayed unreachable that long)."""
        self._failing_since: float | None = None  # monotonic s of the first failed call since the last answer
        self.cancel_by = "command line"
        """``by`` of the ``cancel`` sent for requests withdrawn by a cancellation (the view that
        cancelled: console; else command line)."""
        self.last_seq: int | None = None
        self.connected = threading.Event()
        """Set while an event stream is open."""
        self.connections = 0
        """Event streams opened so far."""
        self.reported: set[str] = set()
        """Ids of the requests whose decision went to ``on_decision``."""
        self.problems: list[str] = []
        self.sent_by: dict[str, tuple[str, str]] = {}
        """Answers this controller sent, by request id: ``(by, the by the gateway was told)``. The
        gateway knows only :data:`BY`; a view of another name (``agents-api``) is told as ``console``,
        and its own name is what the registry keeps when the gateway's event reports the decision."""
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._jobs: queue.Queue[_Job | None] = queue.Queue()
        self._told: set[str] = set()  # ids answered ``cancel`` at the gateway after a withdrawal
        self._until: float | None = None  # set by stop(): no call of the watch's runs past it (monotonic s)
        self._mirror_lock = threading.Lock()  # the pending count and the mirroring it allows, together
        self._refused: set[str] = set()  # ids not mirrored (over max_pending), reported once; <= MAX_REQUESTS
        self._mirrored = 0  # origin requests mirrored so far (<= MAX_MIRRORED)
        self._mirrored_cap_said = False
        self._checked: dict[str, float] = {}  # pending id -> when reconcile() last fetched it (monotonic s)
        self._unsent = 0  # cancels a stop had no time left for
        self._threads: list[threading.Thread] = []
        self._unsubscribe = registry.subscribe(self._on_change)

    # -- lifecycle ---------------------------------------------------------------------------------
    def start(self) -> "GatewayWatcher":
        """Start watching (the stream's thread and the answers' thread); returns self."""
        if not self._threads:
            for name, target in (("origin-watch", self._watch), ("origin-answers", self._answers)):
                thread = threading.Thread(target=target, name=name, daemon=True)
                thread.start()
                self._threads.append(thread)
        return self

    def stop(self, reason: str = "run ended", timeout_s: float = STOP_TIMEOUT_S) -> None:
        """End the watch within ``timeout_s`` seconds in all (:data:`STOP_TIMEOUT_S`: a hostile gateway
        that answers slowly must not hold the run's end): the stream stops, every origin request still
        pending is withdrawn and each reported, and as many as the time allows are answered ``cancel``
        at the gateway (every call made now ends :data:`STOP_MARGIN_S` before the budget does; the rest
        are left to the gateway's own deadline, reported once as a problem). Both threads have ended
        when it returns (they look at the stop between calls; a call already under way ends by its own
        deadline, :data:`CALL_TIMEOUT_S`, within a budget of at least that). Idempotent."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            until = deadline - min(STOP_MARGIN_S, timeout_s / 2)
            self._until = until if self._until is None else min(self._until, until)
        self._stop.set()
        self.control.interrupt(final=True)
        if self._threads:
            self._threads[0].join(max(0.0, deadline - time.monotonic()))
        for request in self.registry.pending():
            if request.kind == ORIGIN:
                self.registry.withdraw(request, reason)
        self._jobs.put(None)
        if len(self._threads) > 1:
            self._threads[1].join(max(0.0, deadline - time.monotonic()))
        else:
            self._answers()  # never started: send what is queued here
        self._unsubscribe()

    def close(self) -> None:
        """:meth:`stop`, then close the control API's connections."""
        self.stop()
        self.control.close()

    def wait_reached(self, timeout_s: float, cancelled: Callable[[], bool] = lambda: False) -> bool:
        """Wait until a call of the control API was answered (:attr:`reached`), at most ``timeout_s``
        seconds, looking at ``cancelled()`` every 0.1 s; True once reached (False: the time ran out, the
        run was cancelled or the watch stopped)."""
        deadline = time.monotonic() + timeout_s
        while not self.reached.is_set():
            left = deadline - time.monotonic()
            if left <= 0 or cancelled() or self._stop.is_set():
                return self.reached.is_set()
            self.reached.wait(min(0.1, left))
        return True

    # -- reachability ------------------------------------------------------------------------------
    def _answered(self) -> None:
        """A call was answered: the API is reachable (any failing streak ends)."""
        with self._lock:
            self._failing_since = None
        self.reached.set()

    def _failed(self, exc: Exception) -> None:
        """A call failed: reported (:meth:`_problem`), and once every call failed for
        :attr:`unreachable_s` seconds, :attr:`on_lost` (when set) is told, once."""
        self._problem(exc)
        now = time.monotonic()
        hook = None
        with self._lock:
            if self._failing_since is None:
                self._failing_since = now
            if (self.on_lost is not None and self.lost is None and not self._stop.is_set()
                    and now - self._failing_since >= self.unreachable_s):
                hook = self.on_lost
                self.lost = clean(f"gateway control API unreachable for {self.unreachable_s:g}s: {exc}", 400)
        if hook is not None:
            try:
                hook(self.lost)
            except Exception:  # noqa: BLE001 - a report never stops the watch
                pass

    def _bound(self, deadline: float | None = None) -> float | None:
        """The deadline (``time.monotonic()`` seconds) of a call of the watch's: ``deadline``, and the
        stop's budget once :meth:`stop` was called; None for neither (the call's own deadline)."""
        until = self._until
        if until is None:
            return deadline
        return until if deadline is None else min(deadline, until)

    # -- problems ----------------------------------------------------------------------------------
    def _problem(self, exc: Exception) -> None:
        text = clean(str(exc), 300)
        with self._lock:
            new = not self.problems or self.problems[-1].split(":")[0] != text.split(":")[0]
            if len(self.problems) < 100:
                self.problems.append(text)
        if new and self.on_problem is not None:
            try:
                self.on_problem(text)
            except Exception:  # noqa: BLE001 - a report never stops the watch
                pass

    # -- the stream, and polling while it is down ----------------------------------------------------
    def _watch(self) -> None:
        backoff = BACKOFF_S[0]
        while not self._stop.is_set():
            try:
                opened = self._stream()
            except Exception as exc:  # noqa: BLE001 - the watch goes on whatever a stream did
                if not self._stop.is_set():
                    self._failed(exc)
                opened = False
            self.connected.clear()
            if self._stop.is_set():
                return
            backoff = BACKOFF_S[0] if opened else min(BACKOFF_S[1], backoff * 2)
            retry = time.monotonic() + backoff
            while not self._stop.is_set():
                self.poll()
                left = retry - time.monotonic()
                if left <= 0:
                    break
                self._stop.wait(min(POLL_S, left))

    def _stream(self) -> bool:
        """One event stream, until it ends; True when it delivered anything (then the next
        reconnection waits only the shortest backoff)."""
        delivered = False
        for name, eid, data in self.control.events(self.last_seq):
            if self._stop.is_set():
                return delivered
            name = name.removeprefix("origin_request.")
            if name == "open":  # a snapshot follows, or the replay of what was missed (Last-Event-ID)
                self.connections += 1
                self.connected.set()
                self._answered()
                continue
            delivered = True
            if name == "ping":
                continue
            if name == "snapshot":
                pending = data.get("pending") if isinstance(data, dict) else None
                if not isinstance(pending, list) or len(pending) > MAX_REQUESTS:
                    raise GatewayError(200, "bad_response", "a snapshot without a pending list")
                seq = eid if eid is not None else data.get("seq")
                if isinstance(seq, int) and not isinstance(seq, bool):
                    with self._lock:
                        self.last_seq = seq  # a snapshot is the new baseline (a restarted gateway counts anew)
                self.reconcile(_valid(pending))
            elif name in ("created", "updated", "resolved"):
                try:
                    item = origin_request(data)
                except ValueError as exc:
                    self._problem(GatewayError(200, "bad_response", f"{name} event: {exc}"))
                    self._seen(eid)
                    continue
                self.take(item)
                self._seen(eid)
        return delivered

    def _seen(self, seq: int | None) -> None:
        if seq is not None:
            with self._lock:
                self.last_seq = seq if self.last_seq is None else max(self.last_seq, seq)

    def poll(self) -> bool:
        """Read the pending requests once and reconcile (:meth:`reconcile`); False when the gateway
        could not be read."""
        try:
            _seq, pending = self.control.list("pending", deadline=self._bound())
        except GatewayError as exc:
            self._failed(exc)
            return False
        self._answered()
        self.reconcile(pending)
        return True

    # -- mirroring ---------------------------------------------------------------------------------
    def reconcile(self, pending: list[dict[str, Any]], budget_s: float = RECONCILE_BUDGET_S) -> None:
        """``pending``: every request pending at the gateway now (checked items). Each is mirrored;
        each request pending here but not there is fetched by id and decided from the gateway's
        answer (withdrawn when the gateway does not know it). The fetches take ``budget_s`` seconds
        at most, all together (:data:`RECONCILE_BUDGET_S`; each fetch ends by then, and by a stop's
        budget); those left unchecked come first on the next round, then the ones checked longest ago,
        so a few slow answers cannot keep the others from ever being checked."""
        present = set()
        for item in pending:
            present.add(item["id"])
            self.take(item)
        end = time.monotonic() + budget_s
        bound = self._bound(end)
        end = end if bound is None else bound
        stale = [r for r in self.registry.pending() if r.kind == ORIGIN and r.id not in present]
        with self._lock:
            self._checked = {r.id: self._checked.get(r.id, float("-inf")) for r in stale}
            order = sorted(stale, key=lambda r: self._checked[r.id])  # stable: oldest first among equals
        for request in order:
            if self._stop.is_set() or time.monotonic() >= end:
                return  # the rest on the next round
            with self._lock:
                self._checked[request.id] = time.monotonic()
            try:
                item = self.control.get(request.id, deadline=end)
            except GatewayError as exc:
                if exc.status == 404:
                    self.registry.resolve(request.id, "withdrawn", by="gateway",
                                          reason="the gateway does not know this request")
                else:
                    self._problem(exc)
                continue
            self.take(item)

    def take(self, item: dict[str, Any]) -> Request | None:
        """One checked OriginRequest (any state): mirrored when new, decided when the gateway decided
        it; returns the registry's request (None when it could not be mirrored). Its ``deadline_at``
        is taken :data:`MAX_DEADLINE_S` ahead at most. A new pending request is not mirrored while
        :attr:`max_pending` are pending already (:data:`MAX_PENDING`): it is reported once as a problem
        and left to the gateway's deadline."""
        deadline_at = _clamp_deadline(item["deadline_at"])
        try:
            with self._mirror_lock:
                known = self._known(item["id"])
                if not known and self._mirrored >= MAX_MIRRORED:
                    self._over_total()
                    return None
                if item["state"] == "pending" and not known and self._live() >= self.max_pending:
                    request = None
                else:
                    request, new = self.registry.mirror(
                        item["id"], origin=item["origin"], reason=item["reason"], via=item["via"],
                        held=item["held"], created_at=item["created_at"], deadline_at=deadline_at,
                        forward=self._forwarder(item["id"]))
                    self._mirrored += 0 if known else 1
        except ValueError as exc:
            self._problem(GatewayError(200, "bad_response", f"origin request: {exc}"))
            return None
        if request is None:
            self._over_cap(item)
            return None
        state = item["state"]
        if state != "pending":
            self._resolve(request, item)
        elif new and self.approves(request):
            self._jobs.put(_Job(request.id, "approve", "command line"))
        return request

    def _known(self, request_id: str) -> bool:
        try:
            self.registry.get(request_id)
            return True
        except AnswerRefused:
            return False

    def _live(self) -> int:
        """Origin requests pending in the registry now."""
        return sum(1 for r in self.registry.pending() if r.kind == ORIGIN)

    def _over_total(self) -> None:
        """A request past :data:`MAX_MIRRORED`: not mirrored; said once."""
        if not self._mirrored_cap_said:
            self._mirrored_cap_said = True
            self._problem(GatewayError(200, "too_many_requests", f"more than {MAX_MIRRORED} origin requests "
                                       "reported: no more are shown or recorded (a real gateway asks once "
                                       "per origin and answer)"))

    def _over_cap(self, item: dict[str, Any]) -> None:
        """A new pending request past :attr:`max_pending`: reported once (ids remembered up to
        :data:`MAX_REQUESTS`; past that, no more reports), not mirrored."""
        with self._lock:
            first = item["id"] not in self._refused and len(self._refused) < MAX_REQUESTS
            if first:
                self._refused.add(item["id"])
        if first:
            self._problem(GatewayError(200, "too_many_pending", clean(
                f"origin request {item['id']} for {item['origin']} not shown: {self.max_pending} are pending "
                "already (more than the gateway may hold); its deadline refuses it at the gateway", 300)))

    def _resolve(self, request: Request, item: dict[str, Any]) -> None:
        state = GATEWAY_STATES[item["state"]]
        by = "timeout" if item["state"] == "timeout" else (item["by"] or "gateway")
        sent = self.sent_by.get(request.id)
        if sent is not None and by == sent[1]:
            by = sent[0]
        self.registry.resolve(request.id, state, by=by,
                              reason="the gateway's deadline passed" if item["state"] == "timeout" else None)

    def approves(self, request: Request) -> bool:
        """Whether ``request``'s origin is one of :attr:`approve` (``--approve-origin``)."""
        if not self.approve or request.origin is None:
            return False
        try:
            return Origin.parse(request.origin) in self.approve
        except PolicyError:
            return False

    # -- answers -----------------------------------------------------------------------------------
    def _forwarder(self, request_id: str) -> Callable[[str, str], None]:
        def forward(answer: str, by: str) -> None:
            self.forward(request_id, answer, by)
        return forward

    def forward(self, request_id: str, answer: str, by: str) -> None:
        """Send a person's answer to the gateway (the registry's ``forward``): returns once the gateway
        took it (202), or after deciding the entry from the gateway's state when it was decided
        there already (409 ``already_decided`` / ``expired``); raises
        :class:`controller.run.registry.AnswerRefused` otherwise (404, 400 passed through; 502
        ``gateway_unavailable``)."""
        gateway_by = by if by in BY else "console"
        self.sent_by.setdefault(request_id, (by, gateway_by))
        try:
            self.control.decide(request_id, answer, gateway_by, deadline=self._bound())
            return
        except GatewayError as exc:
            refused = exc
            if self.sent_by.get(request_id) == (by, gateway_by):
                del self.sent_by[request_id]
        if refused.status == 409:
            try:
                item = self.control.get(request_id, deadline=self._bound())
            except GatewayError as exc:
                if refused.code == "expired":
                    self.registry.resolve(request_id, "expired", by="timeout", reason="the gateway's deadline passed")
                    return
                raise AnswerRefused(502, "gateway_unavailable",
                                    clean(f"the gateway refused the answer ({refused.code}) and then could "
                                          f"not be read: {exc.message}", 300)) from None
            if item["state"] != "pending":
                request = self.registry.get(request_id)
                self._resolve(request, item)
                return
            raise AnswerRefused(409, clean(refused.code, 40), refused.message)
        if refused.status == 404:
            self.registry.resolve(request_id, "withdrawn", by="gateway", reason="the gateway does not know this request")
            raise AnswerRefused(404, "unknown_request", "the gateway does not know this request")
        if refused.status == 400:
            raise AnswerRefused(400, "invalid_answer", refused.message)
        raise AnswerRefused(502, "gateway_unavailable", clean(f"the gateway did not take the answer: {refused.message}",
                                                              300))

    def _answers(self) -> None:
        """The answers' thread: ``--approve-origin`` approvals and the ``cancel`` of withdrawn requests
        (after a stop, within its budget: the jobs left then are dropped, reported once)."""
        try:
            while True:
                try:
                    job = self._jobs.get(timeout=None if self._threads else 0)
                except queue.Empty:
                    return
                if job is None:
                    # drain what was queued before the end, then stop
                    while True:
                        try:
                            job = self._jobs.get_nowait()
                        except queue.Empty:
                            return
                        if job is not None:
                            self._do(job)
                self._do(job)
        finally:
            with self._lock:
                unsent, self._unsent = self._unsent, 0
            if unsent:
                self._problem(GatewayError(0, "cancel_not_sent", f"{unsent} cancel(s) not sent within the "
                                                                 "stop's time: the gateway's deadline refuses "
                                                                 "those requests"))

    def _do(self, job: _Job) -> None:
        until = self._until
        if until is not None and time.monotonic() >= until:
            with self._lock:
                self._unsent += 1
            return
        try:
            if job.answer == "approve":
                self.registry.answer(job.request_id, "approve", by=job.by)
            else:
                self.control.decide(job.request_id, job.answer, job.by, deadline=self._bound())
        except AnswerRefused as exc:
            self._problem(GatewayError(exc.status, exc.code, exc.message))
        except GatewayError as exc:
            if exc.status != 409:  # decided there already: nothing left to cancel
                self._problem(exc)

    # -- the registry's changes --------------------------------------------------------------------
    def _on_change(self, request: Request) -> None:
        """Registry listener (must not block): a withdrawn origin request is answered ``cancel`` at
        the gateway (on the answers' thread); every decided one is reported once."""
        if request.kind != ORIGIN or request.pending:
            return
        with self._lock:
            tell = request.state == "withdrawn" and request.by == "cancel" and request.id not in self._told
            if tell:
                self._told.add(request.id)
            report = request.id not in self.reported
            self.reported.add(request.id)
        if tell:
            self._jobs.put(_Job(request.id, "cancel", self.cancel_by))
        if report and self.on_decision is not None:
            self.on_decision(origin_decision(request))


def _clamp_deadline(value: str) -> str:
    """A gateway's ``deadline_at`` (checked by :func:`origin_request`), or now + :data:`MAX_DEADLINE_S`
    when it is later than that (UTC ISO-8601)."""
    latest = _dt.datetime.now(_dt.timezone.utc) + _dt.timedelta(seconds=MAX_DEADLINE_S)
    return latest.isoformat(timespec="milliseconds") if parse_time(value) > latest else value
