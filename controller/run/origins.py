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
stream is down. After every snapshot (and every poll) it reconciles: a request pending locally but not
at the gateway is fetched by id and decided from the gateway's answer. Each request becomes an
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
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import queue
import re
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Mapping

import httpcore

from controller.agent_transport import DeadlineBackend, Deadlines
from controller.gateway.policy import Origin, PolicyError
from controller.gateway.tiers import MAX_HOLD_TIMEOUT_S, MAX_PENDING_LIMIT
from controller import json_semantics
from rich.console import Console

from controller.run.approvals import Decision, OriginPrompter, TerminalAsker
from controller.run.entries import Approval
from controller.run.registry import ORIGIN, AnswerRefused, ApprovalRegistry, Request
from controller.text import clean

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

GATEWAY_STATES = {"approved": "approved", "denied": "denied", "cancelled": "cancelled", "timeout": "expired"}
"""The gateway's decided states and the registry state each one is."""

RECORD_DECISIONS = {"approved": "approved", "denied": "denied", "cancelled": "cancelled", "expired": "timeout",
                    "withdrawn": "withdrawn"}
"""Registry state -> the ``approval`` line's ``decision`` for an origin request."""

LOG_REASON_DECISIONS = {"approved": "approved", "approved_earlier": "approved", "user_denied": "denied",
                        "denied_earlier": "denied", "cancelled": "cancelled", "timeout": "timeout"}
"""The gateway's decision-log reasons that say how an origin request was decided."""

BY = ("terminal", "console", "command line")
"""Who the gateway accepts as ``by`` of a decision."""

_ID = re.compile(r"oreq_[A-Za-z0-9_-]{1,128}")


class GatewayError(Exception):
    """A control API call that failed: ``status`` (the HTTP status; 0 when there was no usable
    answer), ``code`` (the gateway's error code, or ``unreachable``, ``deadline``, ``too_large``,
    ``bad_response``) and ``message`` (escaped)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.status, self.code, self.message = status, code, message


def _time(value: Any) -> _dt.datetime:
    if not isinstance(value, str) or len(value) > 64:
        raise ValueError("not a time")
    when = _dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    if when.utcoffset() is None:
        raise ValueError("a time without a time zone")
    return when


def origin_request(item: Any) -> dict[str, Any]:
    """An OriginRequest from the gateway, checked: ``id`` (``oreq_`` + up to 128 URL-safe
    characters), ``origin`` and ``reason`` (strings, escaped and cut), ``via``, ``held`` (int >= 0),
    ``created_at`` / ``deadline_at`` (ISO-8601 with offset), ``state`` (pending | approved | denied |
    cancelled | timeout), ``by`` (escaped, or None), ``decided_at``. Raises ValueError naming the field
    that is wrong."""
    if not isinstance(item, dict):
        raise ValueError("an origin request must be a JSON object")
    rid = item.get("id")
    if not isinstance(rid, str) or not _ID.fullmatch(rid):
        raise ValueError("id: not an origin request id")
    for name in ("origin", "reason"):
        if not isinstance(item.get(name), str):
            raise ValueError(f"{name}: not a string")
    state = item.get("state")
    if state != "pending" and state not in GATEWAY_STATES:
        raise ValueError("state: unknown")
    held = item.get("held", 0)
    if held is None:
        held = 0
    if not isinstance(held, int) or isinstance(held, bool) or held < 0:
        raise ValueError("held: not a count")
    for name in ("created_at", "deadline_at"):
        try:
            _time(item.get(name))
        except ValueError:
            raise ValueError(f"{name}: not an ISO-8601 time with its offset") from None
    by, via, decided = item.get("by"), item.get("via"), item.get("decided_at")
    return {"id": rid, "origin": clean(item["origin"], 300), "reason": clean(item["reason"], 500),
            "via": clean(via, 20) if isinstance(via, str) else None, "held": held,
            "created_at": item["created_at"], "deadline_at": item["deadline_at"], "state": state,
            "by": clean(by, 40) if isinstance(by, str) else None,
            "decided_at": decided if isinstance(decided, str) and len(decided) <= 64 else None}


class GatewayControl:
    """The gateway's control API (module docstring), every call bounded.

    ``url``: ``http://127.0.0.1:PORT`` (the API's root); ``token``: its bearer token; ``timeout_s``:
    each call's deadline (seconds). Methods raise :class:`GatewayError`. Thread-safe.
    """

    def __init__(self, url: str, token: str, *, timeout_s: float = CALL_TIMEOUT_S) -> None:
        if not isinstance(url, str) or not re.fullmatch(r"http://[^/?#\s@]+/?", url):
            raise ValueError("the gateway control URL must be http://host:port")
        if not isinstance(token, str) or not token or not all(33 <= ord(c) < 127 for c in token):
            raise ValueError("the gateway control token must be visible ASCII")
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self._deadlines = Deadlines()
        self._pool = httpcore.ConnectionPool(network_backend=DeadlineBackend(self._deadlines), max_connections=8,
                                             max_keepalive_connections=4, keepalive_expiry=5.0)
        self._headers = [(b"Authorization", f"Bearer {token}".encode("ascii")), (b"Accept-Encoding", b"identity")]
        self._lock = threading.Lock()
        self._streams: list[Any] = []
        self._closed = False

    def _deadline(self, deadline: float | None) -> float:
        """A call's deadline (``time.monotonic()`` seconds): :attr:`timeout_s` from now, or ``deadline``
        when that is earlier (a caller's budget: a reconciliation's, a stop's)."""
        end = time.monotonic() + self.timeout_s
        return end if deadline is None else min(end, deadline)

    @contextlib.contextmanager
    def _open(self, method: str, path: str, *, deadline: float, headers: list[tuple[bytes, bytes]] = (),
              body: bytes | None = None, read_s: float | None = None,
              head_deadline: float | None = None) -> Iterator[httpcore.Response]:
        """One request whose every socket wait ends by ``deadline`` (``read_s``: at most this long
        per read; ``head_deadline``: the answer's status and headers by then); yields the response
        (body not read). Raises :class:`GatewayError` (``deadline``, ``unreachable``)."""
        left = deadline - time.monotonic()
        if left <= 0:
            raise GatewayError(0, "deadline", f"{method} {path}: no time left for the call")
        timeouts = {"connect": min(self.timeout_s, left),
                    "read": read_s if read_s is not None else min(self.timeout_s, left),
                    "write": min(self.timeout_s, left), "pool": min(self.timeout_s, left)}
        try:
            with contextlib.ExitStack() as stack:
                stack.enter_context(self._deadlines.until(deadline))
                with self._deadlines.until(deadline if head_deadline is None else min(deadline, head_deadline)):
                    resp = stack.enter_context(self._pool.stream(
                        method, self.url + path, headers=self._headers + list(headers), content=body,
                        extensions={"timeout": timeouts}))
                yield resp
        except httpcore.TimeoutException:
            raise GatewayError(0, "deadline", f"{method} {path}: no complete answer in time") from None
        except (httpcore.NetworkError, httpcore.ProtocolError, httpcore.UnsupportedProtocol) as exc:
            raise GatewayError(0, "unreachable", clean(f"{method} {path}: {type(exc).__name__} {exc}", 300)) from None

    # -- plain calls -------------------------------------------------------------------------------
    def _call(self, method: str, path: str, body: Any = None, *, deadline: float | None = None) -> tuple[int, Any]:
        """One call: (status, parsed JSON body or None for an empty one); ``deadline``: see
        :meth:`_deadline`."""
        payload = None if body is None else json.dumps(body).encode()
        headers = [] if payload is None else [(b"Content-Type", b"application/json")]
        with self._open(method, path, deadline=self._deadline(deadline), headers=headers,
                        body=payload) as resp:
            raw = _read_capped(resp, MAX_BODY_BYTES, f"{method} {path}")
        return resp.status, _json(raw, resp.status, f"{method} {path}")

    @staticmethod
    def _refusal(status: int, data: Any, what: str) -> GatewayError:
        err = data.get("error") if isinstance(data, dict) else None
        code = err.get("code") if isinstance(err, dict) and isinstance(err.get("code"), str) else "http_error"
        message = err.get("message") if isinstance(err, dict) and isinstance(err.get("message"), str) else ""
        return GatewayError(status, clean(code, 40), clean(f"{what}: HTTP {status} {message}".rstrip(), 300))

    def list(self, state: str = "pending", *, deadline: float | None = None) -> tuple[int | None, list[dict[str, Any]]]:
        """``GET /v1/origin-requests?state=``: (the gateway's ``seq``, the requests that passed
        :func:`origin_request`; others are left out). ``deadline`` (``time.monotonic()`` seconds):
        the call ends by then when that is sooner than :attr:`timeout_s` (also for :meth:`get`,
        :meth:`decide`)."""
        status, data = self._call("GET", f"/v1/origin-requests?state={'all' if state == 'all' else 'pending'}",
                                  deadline=deadline)
        if status != 200:
            raise self._refusal(status, data, "listing origin requests")
        items = data.get("data") if isinstance(data, dict) else None
        if not isinstance(items, list) or len(items) > MAX_REQUESTS:
            raise GatewayError(status, "bad_response", "listing origin requests: no data list (or too long)")
        seq = data.get("seq")
        return (seq if isinstance(seq, int) and not isinstance(seq, bool) else None), _valid(items)

    def get(self, request_id: str, *, deadline: float | None = None) -> dict[str, Any]:
        """``GET /v1/origin-requests/{id}`` (checked by :func:`origin_request`)."""
        if not _ID.fullmatch(request_id):
            raise GatewayError(0, "unknown_request", "not an origin request id")
        status, data = self._call("GET", f"/v1/origin-requests/{request_id}", deadline=deadline)
        if status != 200:
            raise self._refusal(status, data, "reading an origin request")
        try:
            return origin_request(data)
        except ValueError as exc:
            raise GatewayError(status, "bad_response", clean(f"reading an origin request: {exc}", 300)) from None

    def decide(self, request_id: str, decision: str, by: str, *, deadline: float | None = None) -> None:
        """``POST /v1/origin-requests/{id}/decision``; returns on 202, raises :class:`GatewayError`
        with the gateway's status and code otherwise."""
        if not _ID.fullmatch(request_id):
            raise GatewayError(404, "unknown_request", "not an origin request id")
        status, data = self._call("POST", f"/v1/origin-requests/{request_id}/decision",
                                  {"decision": decision, "by": by}, deadline=deadline)
        if status != 202:
            raise self._refusal(status, data, f"answering {decision}")

    # -- the event stream --------------------------------------------------------------------------
    def events(self, last_event_id: int | None) -> Iterator[tuple[str, int | None, Any]]:
        """``GET /v1/origin-requests/events`` (``Last-Event-ID`` when given): yields ``("open", None,
        None)`` once the stream is open, then ``(event, id, data)`` for each event (``data`` parsed
        JSON; ``ping`` for a comment, with None), until the stream ends, falls silent for
        :data:`SSE_IDLE_S`, reaches :data:`SSE_LIFETIME_S` or is broken by :meth:`interrupt`. Raises
        :class:`GatewayError` when it cannot be opened or is malformed."""
        headers = [(b"Accept", b"text/event-stream")]
        if last_event_id is not None:
            headers.append((b"Last-Event-ID", str(last_event_id).encode()))
        try:
            # the answer's head within one call's deadline: until it comes there is no socket for
            # interrupt() to shut down, so a gateway that never answers must not hold a stop for SSE_IDLE_S
            now = time.monotonic()
            with self._open("GET", "/v1/origin-requests/events", deadline=now + SSE_LIFETIME_S,
                            headers=headers, read_s=SSE_IDLE_S, head_deadline=now + self.timeout_s) as resp:
                if resp.status != 200:
                    raw = _read_capped(resp, MAX_BODY_BYTES, "the event stream")
                    try:
                        data = _json(raw, resp.status, "the event stream")
                    except GatewayError:
                        data = None
                    raise self._refusal(resp.status, data, "opening the event stream")
                if _header(resp, b"content-encoding") not in (None, b"identity"):
                    raise GatewayError(200, "bad_response", "the event stream is encoded")
                yield "open", None, None
                stream = resp.extensions.get("network_stream")
                with self._lock:
                    self._streams.append(stream)
                    closed = self._closed
                if closed:
                    _shutdown(stream)
                try:
                    yield from _parse_sse(resp.iter_stream())
                finally:
                    with self._lock:
                        if stream in self._streams:
                            self._streams.remove(stream)
        except GatewayError as exc:
            if exc.code == "deadline":
                return  # silent too long, or the connection's lifetime is over: the caller reconnects
            raise

    def interrupt(self, final: bool = False) -> None:
        """Break every open event stream at once (its socket is shut down), from any thread;
        ``final``: also every stream opened from now on."""
        with self._lock:
            streams = list(self._streams)
            self._closed = self._closed or final
        for stream in streams:
            _shutdown(stream)

    def close(self) -> None:
        """Break the streams and close the connections."""
        self.interrupt(final=True)
        self._pool.close()


def _header(resp: httpcore.Response, name: bytes) -> bytes | None:
    values = [v.strip().lower() for k, v in resp.headers if k.lower() == name]
    return values[0] if len(values) == 1 else (b"several" if values else None)


def _shutdown(stream: Any) -> None:
    """Shut down the socket under an httpcore network stream (wakes a read blocked on it)."""
    try:
        sock = stream.get_extra_info("socket") if stream is not None else None
        if sock is not None:
            sock.shutdown(socket.SHUT_RDWR)
    except (OSError, AttributeError):
        pass


def _read_capped(resp: httpcore.Response, cap: int, what: str) -> bytes:
    """The body, at most ``cap`` bytes (a larger declared or actual one: ``too_large``), unencoded."""
    declared = _header(resp, b"content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > cap):
        raise GatewayError(resp.status, "too_large", f"{what}: the answer declares {clean(declared, 40)} bytes")
    if _header(resp, b"content-encoding") not in (None, b"identity"):
        raise GatewayError(resp.status, "bad_response", f"{what}: the answer is encoded")
    body = bytearray()
    for chunk in resp.iter_stream():
        body += chunk
        if len(body) > cap:
            raise GatewayError(resp.status, "too_large", f"{what}: the answer is larger than {cap} bytes")
    return bytes(body)


def _json(raw: bytes, status: int, what: str) -> Any:
    if not raw.strip():
        return None
    try:
        return json_semantics.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise GatewayError(status, "bad_response", f"{what}: the answer is not JSON") from None


def _valid(items: Iterable[Any]) -> list[dict[str, Any]]:
    out = []
    for item in items:
        try:
            out.append(origin_request(item))
        except ValueError:
            continue
    return out


def _parse_sse(chunks: Iterable[bytes]) -> Iterator[tuple[str, int | None, Any]]:
    """Server-sent events from raw bytes: ``(event, id, data)``; a comment is ``("ping", None, None)``.
    An event over :data:`MAX_EVENT_BYTES`, data that is not UTF-8 JSON or an ``id`` that is not a
    decimal integer raises :class:`GatewayError` (``bad_response`` / ``too_large``)."""
    buf = b""
    name, data, eid, size = "message", [], None, 0
    for chunk in chunks:
        buf += chunk
        if len(buf) > MAX_EVENT_BYTES:
            raise GatewayError(200, "too_large", f"an event of the stream is over {MAX_EVENT_BYTES} bytes")
        while True:
            cut = buf.find(b"\n")
            if cut < 0:
                break
            line, buf = buf[:cut].rstrip(b"\r"), buf[cut + 1:]
            size += len(line) + 1
            if size > MAX_EVENT_BYTES:
                raise GatewayError(200, "too_large", f"an event of the stream is over {MAX_EVENT_BYTES} bytes")
            if not line:
                if data:
                    try:
                        parsed = json_semantics.loads(b"\n".join(data).decode("utf-8"))
                    except (UnicodeDecodeError, ValueError, RecursionError):
                        raise GatewayError(200, "bad_response", "an event's data is not JSON") from None
                    yield name, eid, parsed
                name, data, eid, size = "message", [], None, 0
                continue
            if line.startswith(b":"):
                yield "ping", None, None
                continue
            field, _, value = line.partition(b":")
            value = value[1:] if value.startswith(b" ") else value
            if field == b"data":
                data.append(value)
            elif field == b"event":
                name = value.decode("utf-8", "replace")
            elif field == b"id":
                if not value.isdigit() or len(value) > 18:
                    raise GatewayError(200, "bad_response", "an event id is not a decimal number")
                eid = int(value)


@dataclass
class _Job:
    request_id: str
    answer: str
    by: str


class GatewayWatcher:
    """Mirrors the gateway's origin requests into ``registry`` (see the module docstring).

    ``control``: the gateway's control API; ``on_decision``: gets one :class:`Decision`
    (``what="origin_access"``) per request once it is decided (the record's ``approval`` line);
    ``approve``: origins answered ``approve`` at once, ``by="command line"`` (``--approve-origin``);
    ``on_problem``: gets a one-line, escaped message the first time the control API fails in a new way;
    ``max_pending``: most requests mirrored as pending at once (1..100, default :data:`MAX_PENDING`; the
    task's policy ``max_pending`` where the caller knows it).
    :meth:`start` starts the watch (a thread for the stream, one for answers); :meth:`stop` ends it,
    withdrawing what is still pending (``cancel`` at the gateway). Thread-safe.

    Everything the gateway controls is bounded: requests pending at once (``max_pending``), the time a
    reconciliation fetches (:data:`RECONCILE_BUDGET_S`), the time a stop takes (:data:`STOP_TIMEOUT_S`)
    and how far off a deadline is taken (:data:`MAX_DEADLINE_S`).
    """

    def __init__(self, control: GatewayControl, registry: ApprovalRegistry, *,
                 on_decision: Callable[[Decision], None] | None = None, approve: Iterable[Origin] = (),
                 on_problem: Callable[[str], None] | None = None, max_pending: int = MAX_PENDING) -> None:
        if not isinstance(max_pending, int) or isinstance(max_pending, bool) \
                or not 1 <= max_pending <= MAX_PENDING_LIMIT:
            raise ValueError(f"max_pending must be 1..{MAX_PENDING_LIMIT}")
        self.control = control
        self.registry = registry
        self.on_decision = on_decision
        self.approve = frozenset(approve)
        self.on_problem = on_problem
        self.max_pending = max_pending
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
                    self._problem(exc)
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
            self._problem(exc)
            return False
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
        try:
            self.control.decide(request_id, answer, gateway_by, deadline=self._bound())
            return
        except GatewayError as exc:
            refused = exc
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
    return latest.isoformat(timespec="milliseconds") if _time(value) > latest else value


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


class OriginAccess:
    """A run's origin access, as the runner uses it: the :class:`GatewayWatcher`, the terminal's origin
    prompts (:class:`controller.run.approvals.OriginPrompter`) and the ``--approve-origin`` opt-ins
    (:meth:`start`); :meth:`stop` at the run's end, then :meth:`reconcile` once the gateway's decision
    log is read. Nothing at all when the sandbox's gateway has no control API (an older policy or
    backend)."""

    def __init__(self, watcher: GatewayWatcher, prompter: OriginPrompter | None) -> None:
        self.watcher, self.prompter = watcher, prompter

    @classmethod
    def start(cls, sandbox: Any, registry: ApprovalRegistry, record: Any, asker: Any, console: Console, *,
              approve: Iterable[Origin] = (), has_view: bool = False, asks: bool = True,
              max_pending: int | None = None) -> "OriginAccess | None":
        """Write one opt-in ``approval`` line per origin in ``approve`` (``--approve-origin``); when the
        sandbox's gateway has a control API (:func:`control_endpoint`), start mirroring its origin
        requests into ``registry``, each decision an ``approval`` line in ``record`` (a
        :class:`controller.run.record.RunRecord`), and asking about them on the terminal when
        ``asker`` is a :class:`controller.run.approvals.TerminalAsker`. ``has_view``: a console
        follows the run; ``asks``: the task's policy may ask (``[network] mode = "ask"``); ``max_pending``:
        its ``max_pending`` (the watcher's cap; None: :data:`MAX_PENDING`). Returns None
        when there is no control API or the policy never asks."""
        approve = list(approve)
        for origin in approve:
            record.write(Approval(what="opt-in", decision="approved", by="command line", origin=clean(origin, 300),
                                  message=clean(f"--approve-origin {origin}", 400)))
        endpoint = control_endpoint(sandbox) if asks else None
        if endpoint is None:
            if approve:
                why = "no control API" if asks else "the task's [network] mode is not \"ask\""
                console.print(f"--approve-origin: this sandbox's gateway asks about no origin ({why}); "
                              "the option has no effect", style="yellow", markup=False, emoji=False, highlight=False)
            return None

        def say(problem: str) -> None:
            console.print(f"gateway control API: {clean(problem, 300)}", style="yellow", markup=False, emoji=False,
                          highlight=False)

        try:
            control = GatewayControl(*endpoint)
        except ValueError as exc:  # a backend's URL or token this client does not take: nothing can ask
            say(f"not used: {exc}")
            return None
        watcher = GatewayWatcher(control, registry, approve=approve, max_pending=max_pending or MAX_PENDING,
                                 on_decision=lambda d: record.write(Approval(**d.as_record())), on_problem=say)
        prompter = None
        if isinstance(asker, TerminalAsker):
            prompter = OriginPrompter(asker, registry, console=console, skip=watcher.approves).start()
        elif not has_view:
            others = "requests for other origins" if approve else "origin requests"
            hint = "" if approve else " (--approve-origin ORIGIN approves one unattended)"
            console.print(f"{others}: no terminal and no console to answer them: the gateway refuses each at "
                          f"its deadline{hint}", markup=False, emoji=False, highlight=False)
        watcher.start()
        return cls(watcher, prompter)

    def cancelled_by(self, by: str) -> None:
        """A view cancelled the run: pending origin requests are cancelled at the gateway by it."""
        if by in ("console", "terminal", "command line"):
            self.watcher.cancel_by = by

    def stop(self, reason: str) -> None:
        """Stop asking and watching; what is still pending is withdrawn and cancelled at the gateway."""
        if self.prompter is not None:
            self.prompter.stop()
        self.watcher.stop(reason)

    def reconcile(self, record: Any, network: Any) -> None:
        """Every origin request the gateway's decision log names (``network``: the run's
        :class:`controller.run.recording.DecisionTail`, read to its end) gets an ``approval`` line in
        ``record`` (written now, ``by="gateway_log"``, for one the watch missed); then the control
        API is closed."""
        try:
            if network is not None and network.requests:
                reconcile_approvals(network.requests, self.watcher.reported,
                                    lambda d: record.write(Approval(**d.as_record())), fetch=self.watcher.control.get)
        finally:
            self.watcher.control.close()


def control_endpoint(sandbox: Any) -> tuple[str, str] | None:
    """The sandbox's gateway control API as ``(url, token)``, or None when its gateway has none (an
    older policy or backend): the sandbox's own ``gateway_control_url`` / ``gateway_control_token``,
    else its topology's (:meth:`controller.sandbox.Sandbox.topology`)."""
    for source in (sandbox, None):
        if source is None:
            topology = getattr(sandbox, "topology", None)
            try:
                source = topology() if callable(topology) else None
            except Exception:  # noqa: BLE001 - a backend that cannot say has no control API for us
                return None
        url = getattr(source, "gateway_control_url", None)
        token = getattr(source, "gateway_control_token", None)
        if isinstance(url, str) and url and isinstance(token, str) and token:
            return url, token
    return None


__all__ = [
    "OriginAccess", "GatewayControl", "GatewayError", "GatewayWatcher", "control_endpoint", "origin_decision", "origin_request",
    "reconcile_approvals", "wait_for_origins", "MAX_PENDING", "RECONCILE_BUDGET_S", "STOP_TIMEOUT_S", "MAX_DEADLINE_S",
]
