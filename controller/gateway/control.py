"""The gateway's control API: the controller lists, watches and answers origin requests here.

Served by uvicorn inside the gateway process, on mitmproxy's event loop (:func:`start_control_server`),
over the :class:`~controller.gateway.holds.OriginRequests` the policy addon holds connections in.

Access: every request needs ``Authorization: Bearer <token>`` (a per-sandbox token read from a file,
not the agent's; compared in constant time), else 401 ``unauthorized``; a peer inside a refused network
(the guest's internal subnet) gets 403 ``forbidden`` before anything else is looked at, then a ``Host``
that does not name the server 403 ``bad_host`` (:func:`wire.connections.host_refusal`, ``mapped``: in
Docker the controller reaches it as ``127.0.0.1:<published port>``). The server
listens only where it is told (Docker: the gateway's egress-side addresses, published on the host's
127.0.0.1; VM: the host's 127.0.0.1), and keeps the connection rules of :mod:`wire.connections`.

Endpoints (JSON; errors ``{"error": {"code", "message"}}``):

* ``GET /v1/origin-requests?state=pending|all`` -> ``{"seq": N, "data": [OriginRequest, ...]}`` (``seq``:
  the number of the last event, to resume the event stream from);
* ``GET /v1/origin-requests/{id}`` -> one OriginRequest; 404 ``unknown_request``;
* ``POST /v1/origin-requests/{id}/decision`` ``{"decision": "approve"|"deny"|"cancel", "by": label}``
  -> 202 ``{}``; 202 again for the answer already recorded; 409 ``already_decided`` (another answer came
  first), 409 ``expired`` (the deadline passed: the request was denied); 404 ``unknown_request``; 400
  ``invalid_answer`` (anything malformed);
* ``GET /v1/origin-requests/events`` -> Server-Sent Events: first ``snapshot`` ``{"seq", "pending":
  [...]}``, then ``created`` / ``resolved`` with the OriginRequest as data and ``id: <seq>``; with
  ``Last-Event-ID`` the missed events are replayed from a ring buffer (a fresh snapshot when they are
  no longer all there); a comment line (``: ping``) every 15 s without events.

* ``GET /v1/policy`` -> ``{"policy": the policy enforced now}``;
* ``PUT /v1/policy`` with a ``[network]`` table as strict JSON (at most :data:`MAX_POLICY_BYTES`) -> 200
  ``{"policy", "closed", "pending_refused"}``: the gateway enforces it from then on and closes what it
  refuses (:meth:`controller.gateway.addon.EgressPolicy.set_policy`); 400 ``invalid_policy`` (not
  JSON, not a policy: the message says which field); 413 ``too_large``. Only the controller holds the
  token; the guest's network is refused before the token is looked at.

* ``GET /v1/web`` -> the recorded web origins (:class:`controller.gateway.web.WebAnswer`: mode, caps,
  the index, skipped by reason, bytes, served, missing);
* ``PUT /v1/web`` with a :class:`controller.gateway.web.WebConfig` (strict JSON, at most
  :data:`controller.gateway.web.MAX_INDEX_BYTES`) -> 200 the new state: mode ``record`` starts a new
  recording, ``serve`` a recording to serve (its index; bodies follow), ``off`` ends either; 400
  ``invalid_web``, 413 ``too_large``;
* ``GET /v1/web/bodies/{sha256}`` -> the body (``application/octet-stream``); 404 ``unknown_body``;
* ``PUT /v1/web/bodies/{sha256}`` (mode serve) -> 204; 400 ``hash_mismatch``, 404 ``not_indexed``, 409
  ``not_serving``, 413 ``too_large``.

OriginRequest: :meth:`controller.gateway.holds.OriginRequest.to_json`. Rule source: ARCHITECTURE.md,
"Gateway control API".
"""

import asyncio
import contextlib
import hmac
import ipaddress
import json
import socket
from pathlib import Path
from typing import Any, AsyncIterator, Callable, Iterator, Optional, Sequence

from controller.gateway.addresses import IPNetwork, _unmapped
from controller.gateway.holds import AnswerRefused, OriginRequests
from controller.model.errors import DesktopSandboxError
from controller import json_semantics
from controller.text import clean
from wire.connections import HOST_REFUSED, governed, mark_authenticated, scope_host_refusal, uvicorn_config

PING_INTERVAL_S = 15.0
"""Seconds between comment pings on a quiet event stream."""

MAX_BODY_BYTES = 4096
"""Largest decision body accepted (bytes)."""

MAX_POLICY_BYTES = 256 * 1024
"""Largest policy body accepted by ``PUT /v1/policy`` (bytes)."""

MAX_BY_CHARS = 64
"""Longest ``by`` label (characters)."""


class ControlConfigError(DesktopSandboxError, ValueError):
    """The control API cannot be set up as asked (bad token file, nothing to listen on)."""


def read_token(path: str | Path) -> str:
    """The bearer token in ``path`` (surrounding whitespace stripped). Raises ControlConfigError when the
    file cannot be read, is empty, or holds anything but one line of visible ASCII."""
    try:
        token = Path(path).read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ControlConfigError(f"cannot read the control token file {path}: {exc}") from None
    if not token or not all(33 <= ord(c) < 127 for c in token):
        raise ControlConfigError(f"control token file {path} must hold one token of visible ASCII characters")
    return token


def _error(status: int, code: str, message: str, headers: Optional[dict[str, str]] = None) -> Any:
    from starlette.responses import JSONResponse

    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status, headers=headers)


def _peer_refused(host: Optional[str], refused: Sequence[IPNetwork]) -> bool:
    if host is None or not refused:
        return False
    try:
        address = _unmapped(ipaddress.ip_address(host.split("%", 1)[0]))
    except ValueError:
        return True
    return any(address.version == net.version and address in net for net in refused)


def _sse(name: str, data: dict[str, Any], seq: Optional[int]) -> bytes:
    head = f"id: {seq}\n" if seq is not None else ""
    return f"{head}event: {name}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


class PolicyAccess:
    """The control API's way to the enforced policy: ``current()`` -> the policy as JSON;
    ``replace(data)`` -> the swap's answer, raising ValueError (pydantic's included) for a policy that
    does not validate. The gateway builds it over its addon (:func:`controller.gateway.serve.serve`)."""

    def __init__(self, current: Callable[[], dict[str, Any]], replace: Callable[[Any], dict[str, Any]]) -> None:
        self.current, self.replace = current, replace


def make_app(requests: OriginRequests, token: str, refused: Sequence[IPNetwork] = (),
             ping_interval: float = PING_INTERVAL_S, policy: Optional[PolicyAccess] = None,
             web: Optional[Any] = None) -> Any:
    """The control API as an ASGI app (FastAPI) over ``requests``.

    ``token``: the bearer token (non-empty); ``refused``: networks whose peers are refused (403);
    ``ping_interval``: seconds between pings on a quiet event stream; ``policy``: the enforced policy's
    getter and setter (``/v1/policy``; None: those endpoints answer 404); ``web``: the addon's
    :class:`controller.gateway.web.WebStore` (``/v1/web``; None: 404).
    """
    from fastapi import FastAPI, Request
    from starlette.exceptions import HTTPException as StarletteHTTPException
    from starlette.responses import JSONResponse, Response, StreamingResponse

    if not token:
        raise ControlConfigError("the control token must not be empty")
    app = FastAPI(openapi_url=None, docs_url=None, redoc_url=None)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_request: Request, exc: StarletteHTTPException) -> Any:
        if exc.status_code == 404:
            return _error(404, "not_found", "no such endpoint")
        return _error(exc.status_code, "http_error", str(exc.detail))

    if policy is not None:
        @app.get("/v1/policy")
        async def policy_now() -> Any:
            return JSONResponse({"policy": policy.current()})

        @app.put("/v1/policy")
        async def policy_swap(request: Request) -> Any:
            data = await _json_request(request, MAX_POLICY_BYTES, "invalid_policy")
            if isinstance(data, JSONResponse):
                return data
            try:
                answer = policy.replace(data)
            except ValueError as exc:  # pydantic.ValidationError included
                return _error(400, "invalid_policy", clean(_first_error(exc), 1000))
            return JSONResponse(answer)

    if web is not None:
        from controller.gateway.web import MAX_INDEX_BYTES, SHA256, WebConfig

        @app.get("/v1/web")
        async def web_now() -> Any:
            return JSONResponse(web.answer())

        @app.put("/v1/web")
        async def web_configure(request: Request) -> Any:
            data = await _json_request(request, MAX_INDEX_BYTES, "invalid_web")
            if isinstance(data, JSONResponse):
                return data
            try:
                config = WebConfig.model_validate(data)
            except ValueError as exc:
                return _error(400, "invalid_web", clean(_first_error(exc), 1000))
            return JSONResponse(web.configure(config))

        @app.get("/v1/web/bodies/{sha256}")
        async def web_body(sha256: str) -> Any:
            data = web.body(sha256)
            if data is None:
                return _error(404, "unknown_body", "no body with this SHA-256")
            return Response(data, media_type="application/octet-stream")

        @app.put("/v1/web/bodies/{sha256}")
        async def web_put_body(sha256: str, request: Request) -> Any:
            if not web.serving:
                return _error(409, "not_serving", "the gateway serves no web recording")
            if not SHA256.fullmatch(sha256):
                return _error(404, "not_indexed", "not a body of the recording's index")
            data = await _read_body(request, web.max_body_bytes)
            if data is None:
                return _error(413, "too_large", f"body larger than {web.max_body_bytes} bytes")
            problem = web.put_body(sha256, data)
            if problem is not None:
                status = {"not_serving": 409, "not_indexed": 404, "hash_mismatch": 400}.get(problem, 413)
                return _error(status, problem, f"body refused: {problem}")
            return Response(status_code=204)

    @app.get("/v1/origin-requests")
    async def listing(request: Request) -> Any:
        state = request.query_params.get("state", "pending")
        if state not in ("pending", "all"):
            return _error(400, "invalid_request", "state must be pending or all")
        return JSONResponse({"seq": requests.seq, "data": requests.listing(state)})  # type: ignore[arg-type]

    @app.get("/v1/origin-requests/events")
    async def events(request: Request) -> Any:
        last: Optional[int] = None
        header = (request.headers.get("last-event-id") or "").strip()
        # ASCII digits only: str.isdigit() also holds for superscripts and other scripts' digits.
        if header.isascii() and header.isdigit() and len(header) < 19:
            last = int(header)
        return StreamingResponse(_stream(requests, last, ping_interval), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})

    @app.get("/v1/origin-requests/{request_id}")
    async def one(request_id: str) -> Any:
        found = requests.get(request_id)
        if found is None:
            return _error(404, "unknown_request", "no origin request with this id")
        return JSONResponse(found.to_json())

    @app.post("/v1/origin-requests/{request_id}/decision")
    async def decide(request_id: str, request: Request) -> Any:
        if requests.get(request_id) is None:
            return _error(404, "unknown_request", "no origin request with this id")
        body = await _read_body(request)
        answer = _parse_answer(body)
        if isinstance(answer, str):
            return _error(400, "invalid_answer", answer)
        decision, by = answer
        try:
            requests.answer(request_id, decision, by)  # type: ignore[arg-type]
        except AnswerRefused as exc:
            status = 404 if exc.code == "unknown_request" else 409
            return _error(status, exc.code, exc.message)
        return JSONResponse({}, status_code=202)

    return _Guard(app, ("Bearer " + token).encode("ascii"), tuple(refused))


class _Guard:
    """ASGI wrapper: refuses peers in ``refused`` (403 ``forbidden``), a ``Host`` that does not name the
    server (403 ``bad_host``) and requests without exactly one ``Authorization`` header equal to
    ``expected`` (401, compared in constant time) before ``app``; a request that passes marks its
    connection authenticated (:func:`wire.connections.mark_authenticated`)."""

    def __init__(self, app: Any, expected: bytes, refused: tuple[IPNetwork, ...]) -> None:
        self.app = app
        self.expected = expected
        self.refused = refused

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        client = scope.get("client")
        if _peer_refused(client[0] if client else None, self.refused):
            await _error(403, "forbidden", "the control API does not answer this network")(scope, receive, send)
            return
        problem = scope_host_refusal(scope, mapped=True)
        if problem is not None:
            await _error(HOST_REFUSED[0], HOST_REFUSED[1], problem)(scope, receive, send)
            return
        given = [value for name, value in scope.get("headers", []) if name.lower() == b"authorization"]
        if len(given) != 1 or not hmac.compare_digest(given[0], self.expected):
            response = _error(401, "unauthorized", "missing or wrong bearer token", {"WWW-Authenticate": "Bearer"})
            await response(scope, receive, send)
            return
        mark_authenticated(scope)
        await self.app(scope, receive, send)


def _first_error(exc: ValueError) -> str:
    """The first problem of a validation error, with where it is (``loc: message``)."""
    errors = getattr(exc, "errors", None)
    if callable(errors):
        try:
            first = errors()[0]
            where = ".".join(str(part) for part in first.get("loc", ())) or "policy"
            return f"{where}: {first.get('msg', '')}"
        except Exception:  # noqa: BLE001 - fall back to the text
            pass
    return str(exc)


async def _read_body(request: Any, limit: int = MAX_BODY_BYTES) -> Optional[bytes]:
    """The request body, or None when it is larger than ``limit`` bytes."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


async def _json_request(request: Any, limit: int, code: str) -> Any:
    """The request's body parsed as strict JSON (no duplicate keys), or the error to answer: 413
    ``too_large`` over ``limit`` bytes, 400 ``code`` for a body that is not JSON."""
    body = await _read_body(request, limit)
    if body is None:
        return _error(413, "too_large", f"body larger than {limit} bytes")
    try:
        return json_semantics.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return _error(400, code, "body is not JSON (strict: no duplicate keys)")


def _parse_answer(body: Optional[bytes]) -> tuple[str, str] | str:
    """``(decision, by)`` from a decision body, or why it is malformed (a short text)."""
    if body is None:
        return f"body larger than {MAX_BODY_BYTES} bytes"
    try:
        # Strict JSON (controller.json_semantics): a duplicate key is refused, so no reader of the
        # body can see another decision than the one taken.
        data = json_semantics.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):  # RecursionError: nested deeper than the parser goes
        return "body is not JSON (strict: no duplicate keys)"
    if not isinstance(data, dict):
        return "body must be a JSON object"
    extra = sorted(set(data) - {"decision", "by"})
    if extra:
        return f"unknown field {extra[0][:40]!r}"
    decision, by = data.get("decision"), data.get("by")
    if decision not in ("approve", "deny", "cancel"):
        return "decision must be approve, deny or cancel"
    if not isinstance(by, str) or not by.strip() or len(by) > MAX_BY_CHARS or not by.isprintable():
        return f"by must be a label of 1 to {MAX_BY_CHARS} printable characters"
    return decision, by


async def _stream(requests: OriginRequests, last: Optional[int], ping_interval: float) -> AsyncIterator[bytes]:
    """The event stream (see the module docstring): a replay after ``last`` when the buffer still holds
    every event since, else a snapshot; then events as they come, pings in between."""
    replay = requests.events_after(last) if last is not None else None
    if replay is None:
        yield _sse("snapshot", {"seq": requests.seq, "pending": requests.listing("pending")}, requests.seq)
        last = requests.seq
    else:
        for seq, name, data in replay:
            yield _sse(name, data, seq)
        last = replay[-1][0] if replay else last
    assert last is not None
    while True:
        changed = await requests.changed(ping_interval)
        batch = requests.events_after(last)
        if batch is None:  # fell behind the buffer
            yield _sse("snapshot", {"seq": requests.seq, "pending": requests.listing("pending")}, requests.seq)
            last = requests.seq
        elif batch:
            for seq, name, data in batch:
                yield _sse(name, data, seq)
            last = batch[-1][0]
        elif not changed:
            yield b": ping\n\n"


# -- serving -----------------------------------------------------------------------------------------


def listen_sockets(host: str, port: int, exclude: Sequence[IPNetwork] = ()) -> list[socket.socket]:
    """Bound TCP sockets to serve on: ``host`` itself, or for ``0.0.0.0`` every IPv4 address of this
    machine except loopback and those inside ``exclude`` (the relay's rule,
    :func:`controller.gateway.relay.listen_addresses`). All on ``port`` (0: one free port, the same
    for every address when more than one), accepting as :func:`wire.connections.governed` says. Raises
    ControlConfigError when nothing qualifies, OSError when binding fails."""
    if host in ("0.0.0.0", ""):
        from controller.gateway.relay import listen_addresses

        hosts = listen_addresses([n for n in exclude if n.version == 4])  # type: ignore[misc]
        if not hosts:
            raise ControlConfigError("no address outside the excluded networks to listen on")
    else:
        hosts = [host]
    sockets: list[socket.socket] = []
    try:
        for address in hosts:
            family = socket.AF_INET6 if ":" in address else socket.AF_INET
            sock = socket.socket(family, socket.SOCK_STREAM)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((address, port))
            port = sock.getsockname()[1]
            sock.setblocking(False)
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    return [governed(sock) for sock in sockets]


class ControlServer:
    """The control API's uvicorn server on the running event loop. ``sockets``: from
    :func:`listen_sockets`; ``app``: from :func:`make_app`. :meth:`start` returns once it accepts
    connections; :meth:`stop` closes it (open event streams are cut after one second)."""

    def __init__(self, app: Any, sockets: list[socket.socket]) -> None:
        import uvicorn

        class _Server(uvicorn.Server):
            @contextlib.contextmanager
            def capture_signals(self) -> Iterator[None]:  # the gateway's loop owns the signals
                yield

        config = uvicorn_config(app, ws="none", lifespan="off", log_level="warning", access_log=False,
                                timeout_graceful_shutdown=1, server_header=False, date_header=False)
        self.server = _Server(config)
        self.sockets = sockets
        self.task: Optional[asyncio.Task[None]] = None

    @property
    def addresses(self) -> list[tuple[str, int]]:
        """``(host, port)`` of every listening socket."""
        return [sock.getsockname()[:2] for sock in self.sockets]

    async def start(self, timeout: float = 30.0) -> None:
        """Start serving; raises ControlConfigError when the server stopped or did not start in time."""
        self.task = asyncio.create_task(self.server.serve(sockets=self.sockets))
        deadline = asyncio.get_running_loop().time() + timeout
        while not self.server.started:
            if self.task.done() or asyncio.get_running_loop().time() > deadline:
                raise ControlConfigError("the control API did not start")
            await asyncio.sleep(0.01)  # poll of a condition wait (uvicorn started), bounded by the deadline

    async def stop(self) -> None:
        """Stop serving and wait for the server (at most a few seconds)."""
        self.server.should_exit = True
        if self.task is not None:
            with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError, Exception):
                await asyncio.wait_for(self.task, 5)


__all__ = [
    "ControlConfigError", "ControlServer", "MAX_BODY_BYTES", "MAX_BY_CHARS", "MAX_POLICY_BYTES", "PolicyAccess", "PING_INTERVAL_S", "listen_sockets",
    "make_app", "read_token",
]
