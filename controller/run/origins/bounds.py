"""Bounds on everything the gateway's control API controls (:mod:`controller.run.origins`): call
deadlines, body and event sizes, list lengths, the event stream's life, reconnect and poll intervals,
how many requests are mirrored, how long a stop and a reconciliation take, how far off a deadline is
taken, and how long the screenshot waits. Constants only.
"""

from __future__ import annotations

from controller.gateway.tiers import MAX_HOLD_TIMEOUT_S, MAX_PENDING_LIMIT

CALL_TIMEOUT_S = 5.0
"""Deadline of one control API call (seconds, from sending to the last byte of the answer)."""

MAX_BODY_BYTES = 1024 * 1024
"""Largest answer body of a control API call (bytes)."""

MAX_EVENT_BYTES = 256 * 1024
"""Largest server-sent event (bytes of its lines); a longer one drops the connection."""

MAX_REQUESTS = 1000
"""Most origin requests one answer may list (more: the answer is refused)."""

SSE_IDLE_S = 45.0
"""Seconds an event stream may stay silent (the gateway pings every 15 s) before it is dropped."""

SSE_LIFETIME_S = 600.0
"""Longest life of one event stream connection (seconds); then it is replaced (``Last-Event-ID``)."""

BACKOFF_S = (0.1, 2.0)
"""First and longest wait before reconnecting the event stream (seconds; doubled after each failure)."""

POLL_S = 0.5
"""How often the pending requests are polled while the event stream is down (seconds)."""

UNREACHABLE_S = 15.0
"""Longest the control API may fail every call (no event stream opens, no poll is answered) before the run
ends ``error`` naming it (seconds): at the run's start, where the run does not go on (nothing is launched)
until the API answered once, and any time later. A short refusal -- the gateway still starting, Docker
publishing its port anew after a network was attached -- is waited out with retries; a run whose
questions nobody could see or answer is not left to go on. Below the gateway's default hold (25 s),
so a request held while the API was briefly away is still seen in time."""

WAIT_MARGIN_S = 2.0
"""Seconds past the latest gateway deadline the screenshot waits for a decision to arrive."""

MAX_WAIT_S = 300.0
"""Longest the screenshot waits for origin requests in all (seconds), whatever the deadlines say."""

MAX_PENDING = MAX_PENDING_LIMIT
"""Most origin requests mirrored as pending at once (a count; :class:`GatewayWatcher`'s default
``max_pending``). The gateway itself never holds more pending than the task's ``max_pending`` (a policy
sets 1..:data:`~controller.gateway.tiers.MAX_PENDING_LIMIT`, 100), so more is a gateway that lies or
floods, and each mirrored request is a terminal prompt and a console card. The watcher is not told the
task's policy, so its cap is the largest a policy may set. A new pending request past the cap is not
mirrored: it is reported once as a problem and left to the gateway's own deadline, which refuses it; a
later snapshot or poll mirrors it once there is room."""

RECONCILE_BUDGET_S = 3.0
"""Longest one reconciliation (:meth:`GatewayWatcher.reconcile`) spends fetching requests by id, all
fetches together (seconds; each fetch also ends by then). Without it, N slow answers would hold the
watch for N x :data:`CALL_TIMEOUT_S`; what is left unchecked is checked first on the next round (the
next snapshot or poll)."""

STOP_TIMEOUT_S = 10.0
"""Longest :meth:`GatewayWatcher.stop` takes in all (seconds): the watch ends, what is pending is
withdrawn and answered ``cancel`` at the gateway within it; a ``cancel`` not sent by then is left to the
gateway's own deadline (which refuses the request). At least :data:`CALL_TIMEOUT_S`, so a call already
under way when the stop comes (it ends by its own deadline) ends within it too."""

STOP_MARGIN_S = 0.5
"""Seconds of :data:`STOP_TIMEOUT_S` kept back from the calls made while stopping, so the threads
have ended (not only their calls) when :meth:`GatewayWatcher.stop` returns."""

MAX_MIRRORED = 10_000
"""Most origin requests mirrored over a watcher's life (a count), whatever their state: each becomes a
registry entry and an ``approval`` line, so a gateway that reports decided requests without end cannot
grow the record and the registry without bound (about 3 MB of record at the cap). A real gateway asks
once per origin and answer; more are reported once and not mirrored."""

MAX_DEADLINE_S = MAX_HOLD_TIMEOUT_S
"""Furthest ahead a gateway's ``deadline_at`` is taken (seconds from now; a later one is cut to it):
the longest hold a policy may set (``hold_timeout_s`` <= 600), so a far-off deadline cannot stretch
the screenshot's wait (:func:`wait_for_origins`) or a prompt's countdown."""
