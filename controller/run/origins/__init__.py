"""Origin access: the gateway's questions, mirrored into the run's approval registry.

With ``[network] mode = "ask"`` the gateway holds a guest connection to an origin in the task's ask
tier until a person answers, and publishes the question on its control API (a bearer token, on the
host's 127.0.0.1; the sandbox's ``gateway_control_url`` / ``gateway_control_token``):

==============================================  =============================================================
``GET /v1/origin-requests?state=pending|all``   ``{"seq": N, "data": [OriginRequest...]}``
``GET /v1/origin-requests/{id}``                one OriginRequest
``POST /v1/origin-requests/{id}/decision``      ``{"decision": "approve"|"deny"|"cancel", "by"}`` -> 202;
                                                409 ``already_decided`` / ``expired``; 404 ``unknown_request``;
                                                400 ``invalid_answer``
``GET /v1/origin-requests/events``              SSE: ``snapshot`` ``{"seq", "pending": [...]}`` first, then
                                                ``created`` / ``resolved`` (data: an OriginRequest, ``id: seq``);
                                                ``Last-Event-ID`` replays; ``:`` ping comments
==============================================  =============================================================

An OriginRequest is ``{"id": "oreq_...", "origin", "reason", "via": "CONNECT"|"http", "held",
"created_at", "deadline_at", "state": "pending"|"approved"|"denied"|"cancelled"|"timeout", "by",
"decided_at"}``.

:class:`GatewayControl` is the client. The gateway container sits next to the hostile guest, so every
answer is treated as hostile, as the agent's are (contract 1): one deadline per call, enforced at the
socket (every connect, read and write waits at most the time left), a size cap on every body (a declared
``Content-Length`` over it is refused before reading, bytes are counted as they come), strict JSON,
shapes checked, strings escaped before anyone shows them; no proxy from the environment is used.

:class:`GatewayWatcher` keeps one SSE connection (each connection lives at most
:data:`SSE_LIFETIME_S`, a silent one is dropped after :data:`SSE_IDLE_S`), reconnects with a backoff
(:data:`BACKOFF_S`) and ``Last-Event-ID``, and polls ``?state=pending`` every :data:`POLL_S` while the
stream is down. Until the API answered once the run does not go on, and when every call fails for
:data:`UNREACHABLE_S` (at the start, or later) the run ends ``error`` naming it. After every snapshot
(and every poll) it reconciles: a request pending locally but not at the gateway is fetched by id and
decided from the gateway's answer. Each request becomes an
``origin_access`` request in the registry with the same id (:meth:`ApprovalRegistry.mirror`); answers
go to the gateway synchronously (the registry's ``forward``) and the gateway's refusals pass through;
decisions made at the gateway (its timeout, an answer from elsewhere) decide the entry. A request
withdrawn in the registry (the run was cancelled or ended) is answered ``cancel`` at the gateway.
Each decided request is reported once (``on_decision``: the record's ``approval`` line). Mirroring,
decisions and withdrawals are idempotent by id: a replayed or repeated event adds nothing.

Every quantity the gateway controls is bounded as well: at most :data:`MAX_PENDING` requests are
mirrored as pending at once (one more is reported once and left to the gateway's deadline), one
reconciliation fetches for :data:`RECONCILE_BUDGET_S` in all, :meth:`GatewayWatcher.stop` takes
:data:`STOP_TIMEOUT_S` in all with both threads ended, and a ``deadline_at`` counts at most
:data:`MAX_DEADLINE_S` ahead.

:func:`wait_for_origins` is the screenshot's wait (the model sees the page after the decision);
:func:`reconcile_approvals` makes sure, at teardown, that every request the gateway's decision log
names has an ``approval`` line.

The package, one concern a module: :mod:`~controller.run.origins.bounds` (every bound above),
:mod:`~controller.run.origins.control` (the client), :mod:`~controller.run.origins.watcher` (the
mirror), :mod:`~controller.run.origins.decisions` (``approval`` lines, the reconciliation, the
screenshot's wait), :mod:`~controller.run.origins.access` (the run's origin access). Every public name
is re-exported here: ``from controller.run.origins import X`` names them all.
"""

from __future__ import annotations

from controller.run.origins.access import ControlUnreachable, OriginAccess, control_endpoint
from controller.run.origins.bounds import (  # noqa: F401 - re-exported: every bound
    BACKOFF_S, CALL_TIMEOUT_S, MAX_BODY_BYTES, MAX_DEADLINE_S, MAX_EVENT_BYTES, MAX_MIRRORED, MAX_PENDING,
    MAX_REQUESTS, MAX_WAIT_S, POLL_S, RECONCILE_BUDGET_S, SSE_IDLE_S, SSE_LIFETIME_S, STOP_MARGIN_S, STOP_TIMEOUT_S,
    UNREACHABLE_S, WAIT_MARGIN_S,
)
from controller.run.origins.control import (  # noqa: F401 - re-exported
    BY, GATEWAY_STATES, GatewayControl, GatewayError, origin_request,
)
from controller.run.origins.decisions import (  # noqa: F401 - re-exported
    LOG_REASON_DECISIONS, RECORD_DECISIONS, origin_decision, reconcile_approvals, wait_for_origins,
)
from controller.run.origins.watcher import GatewayWatcher
from controller.text import clean  # noqa: F401 - re-exported: the escaping these modules apply

__all__ = [
    "ControlUnreachable", "OriginAccess", "GatewayControl", "GatewayError", "GatewayWatcher", "control_endpoint",
    "origin_decision", "origin_request",
    "reconcile_approvals", "wait_for_origins", "MAX_PENDING", "RECONCILE_BUDGET_S", "STOP_TIMEOUT_S", "MAX_DEADLINE_S",
]
