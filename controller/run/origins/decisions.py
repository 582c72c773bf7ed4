"""What a run's record and its screenshots see of origin requests: the ``approval`` line of a decided
request (:func:`origin_decision`), the teardown's reconciliation with the gateway's decision log
(:func:`reconcile_approvals`), and the screenshot's wait for pending requests (:func:`wait_for_origins`).
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Iterable, Mapping

from controller.run.approvals import Decision
from controller.run.origins.bounds import MAX_WAIT_S, WAIT_MARGIN_S
from controller.run.origins.control import GATEWAY_STATES
from controller.run.registry import ORIGIN, ApprovalRegistry, Request
from controller.text import clean

RECORD_DECISIONS = {"approved": "approved", "denied": "denied", "cancelled": "cancelled", "expired": "timeout",
                    "withdrawn": "withdrawn"}
"""Registry state -> the ``approval`` line's ``decision`` for an origin request."""

LOG_REASON_DECISIONS = {"approved": "approved", "approved_earlier": "approved", "user_denied": "denied",
                        "denied_earlier": "denied", "cancelled": "cancelled", "timeout": "timeout",
                        "gateway_stopped": "withdrawn"}
"""The gateway's decision-log reasons that say how an origin request was decided (``gateway_stopped``:
nobody did, the gateway stopped while it held the connection)."""


def origin_decision(request: Request) -> Decision:
    """The ``approval`` line of a decided origin request: ``what="origin_access"``, ``origin``,
    ``decision`` (:data:`RECORD_DECISIONS`), ``by``, ``request_id``, ``latency_ms`` (from the
    gateway's ``created_at``), ``message`` (why, for a withdrawal or a timeout)."""
    return Decision(what="origin_access", decision=RECORD_DECISIONS.get(request.state, "withdrawn"),
                    by=request.by or "gateway", origin=request.origin, request_id=request.id,
                    latency_ms=request.latency_ms, message=request.reason)


def wait_for_origins(registry: ApprovalRegistry, cancelled: Callable[[], bool], *,
                     margin_s: float = WAIT_MARGIN_S, cap_s: float = MAX_WAIT_S) -> float | None:
    """Before a screenshot: while any origin request is pending, wait for its outcome, so the model
    sees the page after the decision. Bounded by the latest deadline among the pending requests plus
    ``margin_s`` (recomputed as requests come and go), by ``cap_s`` in all, and by ``cancelled()``
    (polled every 0.1 s). Returns the milliseconds waited, or None when nothing was pending."""
    def pending() -> list[Request]:
        return [r for r in registry.pending() if r.kind == ORIGIN]

    if not pending():
        return None
    changed = threading.Event()
    stop = registry.subscribe(lambda _r: changed.set())
    started = time.monotonic()
    try:
        while not cancelled():
            now = time.monotonic()
            waiting = pending()
            if not waiting:
                break
            deadlines = [r.deadline_mono for r in waiting if r.deadline_mono is not None]
            until = min(started + cap_s, (max(deadlines) if deadlines else started + cap_s) + margin_s)
            if now >= until:
                break
            changed.clear()
            if not pending():
                break
            changed.wait(min(0.1, until - now))
    finally:
        stop()
    return round((time.monotonic() - started) * 1000, 1)


def reconcile_approvals(log_requests: Mapping[str, Mapping[str, Any]], reported: Iterable[str],
                        write: Callable[[Decision], Any],
                        fetch: Callable[[str], Mapping[str, Any]] | None = None) -> list[Decision]:
    """At teardown: every origin request id in the gateway's decision log (``log_requests``: id ->
    the last decision-log line naming it, with ``origin`` and ``reason``) gets an ``approval`` line.
    For each id not in ``reported`` (ids that already have one), ``write`` gets a :class:`Decision`
    with ``by="gateway_log"``: its outcome from ``fetch(id)`` (the gateway's OriginRequest, when it can
    still be read and is decided), else from the log's reason (:data:`LOG_REASON_DECISIONS`), else
    ``withdrawn`` with a message saying the outcome is unknown. Returns what was written."""
    written = []
    done = set(reported)
    for request_id, line in log_requests.items():
        if request_id in done:
            continue
        done.add(request_id)
        decision, message = None, None
        if fetch is not None:
            try:
                item = fetch(request_id)
                if item.get("state") in GATEWAY_STATES:
                    decision = RECORD_DECISIONS[GATEWAY_STATES[item["state"]]]
            except Exception:  # noqa: BLE001 - the log's reason is the fallback
                decision = None
        if decision is None:
            decision = LOG_REASON_DECISIONS.get(str(line.get("reason") or ""))
        if decision is None:
            decision, message = "withdrawn", "the gateway's log names this request; its outcome is not known"
        origin = line.get("origin")
        entry = Decision(what="origin_access", decision=decision, by="gateway_log",
                         origin=clean(origin, 300) if isinstance(origin, str) else None,
                         request_id=clean(request_id, 200), message=message)
        write(entry)
        written.append(entry)
    return written
