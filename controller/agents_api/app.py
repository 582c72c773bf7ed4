"""The HTTP routes (FastAPI) of the local Agents API, under ``/v1``, with the SDK's paths and shapes.

=====================================================  ============================================
``POST /v1/agents/sessions``                           create (``sessions.create``) -> ``AgentSession``
``GET /v1/agents/sessions``                            list (``after``, ``limit`` 1-100, ``order``)
``GET /v1/agents/sessions/{id}``                       retrieve -> ``AgentSession``
``DELETE /v1/agents/sessions/{id}``                    delete -> ``AgentSession.deleted``
``POST /v1/agents/sessions/{id}/events``               input events -> 202, empty body (input events
                                                       are applied, never stored: a sign-in submit's
                                                       values reach the run's registry only)
``GET /v1/agents/sessions/{id}/events``                the session's events (SSE): those after the
                                                       ``Last-Event-ID`` (``0``: all), else from now on
``GET /v1/agents/sessions/{id}/items``                 items, a cursor page (``after``, ``limit``, ``order``)
=====================================================  ============================================

Every request needs ``Authorization: Bearer <key>`` (401 ``invalid_api_key`` otherwise, compared in
constant time). Request bodies: at most :data:`MAX_BODY` bytes (413), one JSON object (400). Any other
path or method is 404 ``unsupported`` naming it. Errors: :mod:`errors`.
"""

from __future__ import annotations

import asyncio
import hmac
import json
from typing import Any, AsyncIterator

from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from controller.asgi import BodyTooLarge, read_json
from controller.agents_api import shapes
from controller.agents_api.errors import ApiError, invalid
from controller.agents_api.requests import SIGN_IN, parse_create, parse_events
from controller.agents_api.sessions import SessionHub, stored_json
from controller.agents_api.store import event_id, event_seq
from controller.text import clean

MAX_BODY = 1024 * 1024
"""Largest request body (bytes)."""
PING_S = 15.0
CONNECTED = b": connected\n"
PING = b": ping\n"
"""An event stream's comments (its start, and every :data:`PING_S` seconds without an event). Single
lines, never a block of their own: the SDK's SSE decoder keeps the last event id, so a blank line after
a comment would reach the program as an event with no data (and fail its JSON parse)."""
"""Seconds between keep-alive comments on an idle event stream."""
TERMINAL = ("agent.session.failed",)


def _error(exc: ApiError) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
    return JSONResponse(exc.body(), status_code=exc.status, headers=headers)


async def read_body(request: Request) -> Any:
    """The body as strict JSON (no duplicate keys, no NaN), at most :data:`MAX_BODY` bytes."""
    try:
        return await read_json(request, MAX_BODY)
    except BodyTooLarge:
        raise ApiError(413, "body_too_large", f"the request body must be at most {MAX_BODY} bytes") from None
    except ValueError as exc:
        raise invalid(f"the body must be one JSON object of text ({clean(exc, 200)})") from None


def _query_int(value: str | None, name: str, low: int, high: int, default: int) -> int:
    if value is None:
        return default
    if not (value.isascii() and value.isdigit()) or len(value) > 9 or not low <= int(value) <= high:
        raise invalid(f"{name} must be an integer from {low} to {high}", name)
    return int(value)


def _order(value: str | None) -> str:
    if value not in (None, "asc", "desc"):
        raise invalid("order must be asc or desc", "order")
    return value or "desc"


def create_app(hub: SessionHub, key: str, *, closing: Any = None) -> FastAPI:
    """The app over ``hub``, admitting requests that carry ``key``. ``closing``: a threading.Event set
    when the server stops (event streams end)."""
    app = FastAPI(openapi_url=None, docs_url=None, redoc_url=None)
    expected = key.encode()

    @app.exception_handler(ApiError)
    async def api_error(_request: Request, exc: ApiError) -> JSONResponse:
        return _error(exc)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        what = f"{request.method} {request.url.path}"[:200]
        if exc.status_code == 405:
            return _error(ApiError(405, "unsupported", f"not supported by this server: {what}"))
        return _error(ApiError(exc.status_code, "unsupported" if exc.status_code == 404 else "http_error",
                               f"not supported by this server: {what}" if exc.status_code == 404 else str(exc.detail)))

    @app.middleware("http")
    async def auth(request: Request, call_next: Any) -> Response:
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        # the scheme is case-insensitive (RFC 9110, 11.1); the key is compared in constant time
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.encode("latin-1", "replace"), expected):
            return _error(ApiError(401, "invalid_api_key", "missing or incorrect API key: send "
                                   "Authorization: Bearer <the key in the server's key file>"))
        if request.headers.get("idempotency-key") is not None:
            return _error(ApiError(400, "unsupported", "not supported by this server: the Idempotency-Key header"))
        return await call_next(request)

    @app.post("/v1/agents/sessions")
    async def create(request: Request) -> JSONResponse:
        params = parse_create(await read_body(request))
        return JSONResponse(await run_in_threadpool(hub.create, params))

    @app.get("/v1/agents/sessions")
    async def list_sessions(request: Request) -> JSONResponse:
        q = request.query_params
        unknown = sorted(k for k in q.keys() if k not in ("after", "limit", "order"))
        if unknown:
            raise ApiError(400, "unsupported", f"not supported by this server: list parameter {unknown[0]}", unknown[0])
        limit = _query_int(q.get("limit"), "limit", 1, 100, 20)
        order = _order(q.get("order"))
        rows = hub.store.sessions()
        sessions = [hub.session_json(r["id"]) if hub.get(r["id"]) else stored_json(r) for r in rows]
        if order == "desc":
            sessions.reverse()
        after = q.get("after")
        if after is not None:
            ids = [s["id"] for s in sessions]
            if after not in ids:
                raise invalid("after is not a session of this list", "after")
            sessions = sessions[ids.index(after) + 1:]
        return JSONResponse(shapes.page(sessions[:limit], len(sessions) > limit))

    @app.get("/v1/agents/sessions/{session_id}")
    async def retrieve(session_id: str) -> JSONResponse:
        return JSONResponse(hub.session_json(session_id))

    @app.delete("/v1/agents/sessions/{session_id}")
    async def delete(session_id: str) -> JSONResponse:
        return JSONResponse(await run_in_threadpool(hub.delete, session_id))

    @app.post("/v1/agents/sessions/{session_id}/events")
    async def events_create(session_id: str, request: Request) -> Response:
        hub.session_json(session_id)  # 404 first
        events = parse_events(await read_body(request))
        live = hub.get(session_id)
        if live is None:
            raise ApiError(409, "session_failed", "the session is not running here any more (it failed)")
        for event in events:
            if event.type == "message":
                await run_in_threadpool(live.add_turn, event.text or "")
            elif event.type == "cancel":
                await run_in_threadpool(live.cancel)
            elif event.response_type == SIGN_IN:  # values go to the registry only (never stored or echoed)
                await run_in_threadpool(live.answer_signin, event.request_id or "", event.action or "",
                                        event.fields, event.selected_option)
            else:
                await run_in_threadpool(live.answer, event.request_id or "", event.response_type or "",
                                        event.decision or "")
        return Response(status_code=202)

    @app.get("/v1/agents/sessions/{session_id}/events")
    async def events_stream(session_id: str, request: Request) -> StreamingResponse:
        hub.session_json(session_id)
        unknown = sorted(k for k in request.query_params.keys() if k != "include_obfuscation")
        if unknown:
            raise ApiError(400, "unsupported", f"not supported by this server: stream parameter {unknown[0]}",
                           unknown[0])
        last = request.headers.get("last-event-id")
        if last is None:
            start = hub.store.last_seq(session_id)
        elif last.strip() == "0":
            start = 0
        else:
            start = event_seq(last.strip())
            if start is None or hub.store.event_session(start) != session_id:
                raise invalid("Last-Event-ID is not an event of this session (evt_N, or 0 for all)", "Last-Event-ID")
        return StreamingResponse(_stream(hub, session_id, start, closing), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})

    @app.get("/v1/agents/sessions/{session_id}/items")
    async def items(session_id: str, request: Request) -> JSONResponse:
        hub.session_json(session_id)
        q = request.query_params
        unknown = sorted(k for k in q.keys() if k not in ("after", "limit", "order"))
        if unknown:
            raise ApiError(400, "unsupported", f"not supported by this server: items parameter {unknown[0]}", unknown[0])
        limit = _query_int(q.get("limit"), "limit", 1, 100, 20)
        try:
            data, more = hub.store.items(session_id, after=q.get("after"), limit=limit, order=_order(q.get("order")))
        except KeyError:
            raise invalid("after is not an item of this session", "after") from None
        return JSONResponse(shapes.page([{k: v for k, v in d.items() if not k.startswith("_")} for d in data], more))

    @app.api_route("/{path:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE"])
    async def anything_else(path: str, request: Request) -> JSONResponse:
        raise ApiError(404, "unsupported", f"not supported by this server: {request.method} /{path[:200]} "
                       "(served: agents sessions create, retrieve, list, delete; their events and items)")

    return app


def sse(seq: int, event: dict[str, Any]) -> bytes:
    """One event as SSE: ``id: evt_N``, ``event: <type>``, ``data: <json with event_id>``."""
    return (f"id: {event_id(seq)}\nevent: {event['type']}\n"
            f"data: {json.dumps(event, separators=(',', ':'))}\n\n").encode()


async def _stream(hub: SessionHub, session_id: str, start: int, closing: Any) -> AsyncIterator[bytes]:
    seq = start
    yield CONNECTED
    while closing is None or not closing.is_set():
        version = hub.notifier.version(session_id)
        rows = hub.recent_after(session_id, seq)  # what the server just sent, from memory
        if rows is None:
            rows = await asyncio.to_thread(hub.store.events_after, session_id, seq)
        for number, event in rows:
            seq = number
            shot = (event.get("item") or {}).get("_shot") if isinstance(event.get("item"), dict) else None
            if shot is None or hub.has_shot(shot):  # nothing to read from disk
                yield sse(number, _public(hub, event, number))
            else:
                yield sse(number, await asyncio.to_thread(_public, hub, event, number))
        if rows and rows[-1][1].get("type") in TERMINAL:
            return
        if rows:
            continue
        row = await asyncio.to_thread(hub.store.session, session_id)
        if row is None or row["deleted"]:
            return
        if row["status"] == "failed" and hub.get(session_id) is None:
            return
        await hub.notifier.wait(session_id, version, PING_S)
        if hub.notifier.version(session_id) == version:
            yield PING


def _public(hub: SessionHub, event: dict[str, Any], seq: int) -> dict[str, Any]:
    """The stored event as sent: its ``event_id``, and a screenshot's bytes in its item's ``output``."""
    out = {"event_id": event_id(seq), **event}
    item = out.get("item")
    if isinstance(item, dict) and "_shot" in item:
        item = {k: v for k, v in item.items() if k != "_shot"}
        url = hub.screenshot_url(event["item"]["_shot"])
        item["output"] = None if url is None else {"type": "computer_screenshot", "image_url": url}
        out["item"] = item
    return out
