"""The gateway control API's client (:class:`GatewayControl`, contract in :mod:`controller.run.origins`):
one deadline per call enforced at the socket, a size cap on every body, strict JSON, every
OriginRequest's shape checked (:func:`origin_request`) and its strings escaped; the event stream's
parser. The gateway sits next to the hostile guest, so every answer is treated as hostile.
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
import threading
import time
from typing import Any, Iterable, Iterator

import httpcore

from controller import json_semantics
from controller.agent_transport import DeadlineBackend, Deadlines
from controller.model.errors import DesktopSandboxError
from controller.run.origins.bounds import (
    CALL_TIMEOUT_S, MAX_BODY_BYTES, MAX_EVENT_BYTES, MAX_REQUESTS, SSE_IDLE_S, SSE_LIFETIME_S,
)
from controller.run.registry import ORIGIN_ID, parse_time
from controller.text import clean

GATEWAY_STATES = {"approved": "approved", "denied": "denied", "cancelled": "cancelled", "timeout": "expired"}
"""The gateway's decided states and the registry state each one is."""

BY = ("terminal", "console", "command line")
"""Who the gateway accepts as ``by`` of a decision."""



class GatewayError(DesktopSandboxError):
    """A control API call that failed: ``status`` (the HTTP status; 0 when there was no usable
    answer), ``code`` (the gateway's error code, or ``unreachable``, ``deadline``, ``too_large``,
    ``bad_response``) and ``message`` (escaped)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.status, self.code, self.message = status, code, message


def origin_request(item: Any) -> dict[str, Any]:
    """An OriginRequest from the gateway, checked: ``id`` (``oreq_`` + up to 128 URL-safe
    characters), ``origin`` and ``reason`` (strings, escaped and cut), ``via``, ``held`` (int >= 0),
    ``created_at`` / ``deadline_at`` (ISO-8601 with offset), ``state`` (pending | approved | denied |
    cancelled | timeout), ``by`` (escaped, or None), ``decided_at``. Raises ValueError naming the field
    that is wrong."""
    if not isinstance(item, dict):
        raise ValueError("an origin request must be a JSON object")
    rid = item.get("id")
    if not isinstance(rid, str) or not ORIGIN_ID.fullmatch(rid):
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
            parse_time(item.get(name))
        except ValueError:
            raise ValueError(f"{name}: not an ISO-8601 time with its offset") from None
    by, via, decided = item.get("by"), item.get("via"), item.get("decided_at")
    return {"id": rid, "origin": clean(item["origin"], 300), "reason": clean(item["reason"], 500),
            "via": clean(via, 20) if isinstance(via, str) else None, "held": held,
            "created_at": item["created_at"], "deadline_at": item["deadline_at"], "state": state,
            "by": clean(by, 40) if isinstance(by, str) else None,
            "decided_at": decided if isinstance(decided, str) and len(decided) <= 64 else None}


class GatewayControl:
    """The gateway's control API (:mod:`controller.run.origins`), every call bounded.

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
        if not ORIGIN_ID.fullmatch(request_id):
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
        if not ORIGIN_ID.fullmatch(request_id):
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
