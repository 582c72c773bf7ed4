"""The console's routes (FastAPI). Errors are ``{"error": {"code", "message"}}`` with the status.

==============================================  ===============================================================
``GET /login?t=<token>&next=/runs/{id}``        the one-time token for the session cookie; 303 to the run's
                                                page (``next``, only ever a run's page), else to ``/``
(every path here is under the secret base, :attr:`controller.console.auth.Auth.base`)
``GET /``                                       the runs list (live runs on top, then newest first)
``GET /runs/{id}``                              a live run's page, or a finished run's report
``GET /runs/{id}/state``                        ``describe()`` plus ``last_action`` (JSON)
``GET /runs/{id}/events``                       events (SSE, controller.console.streams)
``WebSocket /runs/{id}/live?after=N``           events and, as asked, live frames on one connection (what a
                                                run page holds; controller.console.streams.live_socket)
``GET /runs/{id}/approvals``                    ``{"version", "pending": [request...]}``
``POST /runs/{id}/approvals/{request_id}``      ``{"answer": "approve"|"deny"|"cancel"}`` -> 202 request; registry
                                                refusals (``cancel``: origin requests only; their answers go
                                                to the gateway first, which may refuse: 409 ``expired``, 502);
                                                a sign-in request (``browser_authentication``): ``{"action":
                                                "submit", "fields": [{"field_id", "value"}], "selected_option"?}``
                                                or ``{"action": "cancel"}`` (at most :data:`SIGNIN_MAX_BODY`
                                                bytes) -> 202 request (never a value); registry refusals
``POST /runs/{id}/takeover|resume|cancel``      -> 202 ``{"state": describe()}``; 409 ``run_finished``
``POST /runs/{id}/input``                       one action in screen px -> 202 ``{"action": shown}``
``GET /runs/{id}/screen.jpg``                   one JPEG of the live screen
``GET /runs/{id}/screen.mjpeg?fps=5``           the live screen, multipart JPEG, 1..10 fps (frames of the
                                                run's one grab loop: controller.console.frames)
``GET /runs/{id}/shots/{name}``                 a recorded screenshot (``shot-NNNN.png|jpg``)
``GET /runs/{id}/video/{name}``                 the run's video (``run.webm``, :data:`controller.run.shots.VIDEO_NAME`);
                                                one ``Range: bytes=A-B`` answered 206 (what a player seeks
                                                with), 416 when it is outside the file
==============================================  ===============================================================

Who may call them is decided before any route runs (:class:`controller.console.auth.Guard`: the
session cookie, Host, CSRF and Origin; no data, stream or image for another site's page, only a
navigation to ``/login``, ``/`` or ``/runs/{id}``). Live-only routes answer 404 ``not_live`` for a run
that is only on disk. Request bodies are capped at
:data:`MAX_BODY` bytes (413 ``too_large``) and parsed as strict JSON (400 ``invalid_body``).

A sign-in answer's values are credentials: the body is read only by that route, never logged, never
echoed (refusals name the rule and ids, never a value: :meth:`ApprovalRegistry.answer_signin`), never
put in a response, an event or the record; the registry holds them apart until the sign-in flow takes
them. uvicorn's access log is off (:class:`controller.console.server.ConsoleServer`), and an unexpected
error while answering is logged by its type's name only.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

from fastapi import FastAPI, Request, WebSocket
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response, StreamingResponse
from fastapi.staticfiles import StaticFiles
from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.exceptions import HTTPException as StarletteHTTPException

from controller.agent_client import AgentError
from controller.asgi import BodyTooLarge, read_json as read_capped_json
from controller.console import streams
from controller.console.frames import FrameFeed
from controller.console.auth import POLICY_HEADER, Auth, Refused, landing, refusal_body, wants_html
from controller.console.runs import RunIndex, run_dir, shot_file, valid_run_id
from controller.run.live import HumanActionInvalid, LiveRun, NotInControl, RunOver
from controller.report.html import render_report
from controller.run.shots import VIDEO_TYPE, open_video, read_shot, video_name
from controller.run.record import read_entries, summarize
from controller.model.errors import DesktopSandboxError
from controller.model.requests import request_kind
from controller.run.registry import AnswerRefused
from controller.text import clean

log = logging.getLogger("controller.console")
HERE = Path(__file__).resolve().parent
MAX_BODY = 64 * 1024
"""Largest request body read (bytes)."""
SIGNIN_MAX_BODY = 256 * 1024
"""Largest body of a sign-in answer (bytes): its values take at most
:data:`wire.browser.MAX_SUBMIT_BYTES` (120 KiB) of JSON, escapes and the rest of the answer fit in the rest."""
WAIT_THREADS = 16
"""Threads for the event streams' waits (streams beyond take turns, see controller.console.streams)."""


class ApiError(DesktopSandboxError):
    """A route's refusal: ``status``, ``code``, ``message``."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def error(status: int, code: str, message: str) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status)


FRAME_THREADS = 4
"""Threads that fetch live frames from the guest (one grab at a time per run, whatever its viewers)."""


class ConsoleState:
    """What the routes share: ``runs_dir``, ``auth``, the live runs (by id, in the order added),
    ``closing`` (set when the console stops: streams end), the runs list, ``waits``, the threads
    the event streams wait in, ``feeds``, each live run's one :class:`FrameFeed` (by run id), and
    ``sockets``, how many run pages' sockets are open now (``no_sockets`` is set while none is)."""

    def __init__(self, runs_dir: Path, auth: Auth) -> None:
        self.runs_dir = Path(runs_dir)
        self.auth = auth
        self.live: dict[str, LiveRun] = {}
        self.closing = threading.Event()
        self.index = RunIndex(self.runs_dir)
        self.waits = ThreadPoolExecutor(max_workers=WAIT_THREADS, thread_name_prefix="console-events")
        # frames and a person's input call the guest, which may be slow on purpose: each has threads of
        # its own, so neither starves the other, the event streams, or the run's controls (run inline)
        self.frames = ThreadPoolExecutor(max_workers=FRAME_THREADS, thread_name_prefix="console-frames")
        self.inputs = ThreadPoolExecutor(max_workers=1, thread_name_prefix="console-input")
        self.feeds: dict[str, FrameFeed] = {}
        self.sockets = 0
        self.no_sockets = threading.Event()
        self.no_sockets.set()

    def feed(self, live: LiveRun) -> FrameFeed:
        """The live screen of ``live`` for every viewer of it: one :class:`FrameFeed` per run, made on
        first use (on the console's event loop)."""
        feed = self.feeds.get(live.run_id)
        if feed is None or feed.live is not live:
            feed = self.feeds[live.run_id] = FrameFeed(live, self.frames, self.closing)
        return feed

    def live_run(self, run_id: str) -> LiveRun:
        """The live run ``run_id``: 404 ``unknown_run`` for a bad or unknown id, ``not_live`` for a
        run that is only recorded."""
        if not valid_run_id(run_id):
            raise ApiError(404, "unknown_run", "no run with this id")
        live = self.live.get(run_id)
        if live is None:
            if run_dir(self.runs_dir, run_id) is not None:
                raise ApiError(404, "not_live", "this run is not in progress in this console")
            raise ApiError(404, "unknown_run", "no run with this id")
        return live

    def directory(self, run_id: str) -> Path:
        """A run's record directory (live or recorded); 404 ``unknown_run``."""
        if valid_run_id(run_id) and run_id in self.live:
            return self.live[run_id].record_dir
        path = run_dir(self.runs_dir, run_id)
        if path is None:
            raise ApiError(404, "unknown_run", "no run with this id")
        return path


async def read_json(request: Request, limit: int = MAX_BODY) -> Any:
    """The request body as strict JSON, at most ``limit`` bytes (413 / 400 otherwise; neither error
    says anything of the body)."""
    try:
        return await read_capped_json(request, limit)
    except BodyTooLarge:
        raise ApiError(413, "too_large", f"the body must be at most {limit} bytes") from None
    except ValueError:
        raise ApiError(400, "invalid_body", "the body must be one JSON value of text") from None


def render_finished(state: ConsoleState, templates: Environment, request: Request, run_id: str,
                    directory: Path) -> HTMLResponse:
    """A finished run: :func:`controller.report.html.render_report` (images from ``/shots/``, served
    under :data:`controller.console.auth.REPORT_CSP`); when the record cannot be read, a page saying why
    with the screenshots there are."""
    try:
        page = render_report(directory, embed_images=False, home_url=state.auth.base + "/",
                             image_url=lambda name: f"{state.auth.base}/runs/{run_id}/shots/{name}",
                             video_url=lambda name: f"{state.auth.base}/runs/{run_id}/video/{name}")
        return HTMLResponse(page, headers={POLICY_HEADER: "report"})
    except (OSError, ValueError) as exc:  # an unreadable record: said on the summary page
        problem = clean(exc, 500)
    try:
        summary = summarize(read_entries(directory))
    except (OSError, ValueError) as exc:
        summary, problem = None, problem or clean(exc, 500)
    shots = sorted(p.name for p in directory.glob("shot-*") if shot_file(directory, p.name))
    video = next((p.name for p in directory.glob("run.webm") if video_name(p.name)), None)
    page = templates.get_template("run_finished.html").render(
        run_id=run_id, summary=summary, problem=problem, shots=shots, video=video, csrf=request.state.csrf)
    return HTMLResponse(page)


VIDEO_CHUNK = 256 * 1024
"""Bytes of the video read and sent at a time."""


def byte_range(header: str | None, size: int) -> tuple[int, int]:
    """The bytes ``(first, last)`` (inclusive) of a file of ``size`` bytes that a ``Range`` header asks
    for: the whole file without one (or for an empty file); one range ``bytes=A-B``, ``bytes=A-`` or
    ``bytes=-N`` (the last N, N at least 1), cut to the file. ValueError for anything else, or a range
    that starts past the end (the route answers 416)."""
    if header is None or size == 0:
        return 0, max(0, size - 1)
    unit, _, spec = header.strip().partition("=")
    if unit.strip().lower() != "bytes" or "," in spec:
        raise ValueError("one byte range only")
    start, sep, end = spec.strip().partition("-")
    if not sep or not (start.isascii() and end.isascii()) or not (start.isdigit() or start == "") \
            or not (end.isdigit() or end == "") or (start == "" and end == "") or len(start) > 18 or len(end) > 18:
        raise ValueError("not a byte range")
    if start == "":
        if int(end) == 0:  # the last 0 bytes: nothing to send
            raise ValueError("outside the file")
        return max(0, size - int(end)), size - 1
    first = int(start)
    last = min(int(end), size - 1) if end else size - 1
    if first >= size or last < first:
        raise ValueError("outside the file")
    return first, last


async def file_chunks(fh: Any, start: int, stop: int) -> Any:
    """Bytes ``start`` to ``stop`` (exclusive) of the open file ``fh``, :data:`VIDEO_CHUNK` at a time (each
    read on a thread); ``fh`` is closed at the end, also when the client leaves first."""
    try:
        position = start
        while position < stop:
            data = await asyncio.to_thread(os.pread, fh.fileno(), min(VIDEO_CHUNK, stop - position), position)
            if not data:
                return
            position += len(data)
            yield data
    finally:
        fh.close()


def create_app(state: ConsoleState) -> FastAPI:
    """The routes (module docstring) over ``state``; wrap it in :class:`controller.console.auth.Guard`."""
    app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)
    templates = Environment(loader=FileSystemLoader(HERE / "templates"), autoescape=select_autoescape(default=True))
    templates.globals["base"] = state.auth.base  # every link and script names the secret base path
    app.mount("/static", StaticFiles(directory=HERE / "static"), name="static")

    @app.exception_handler(ApiError)
    async def api_error(_request: Request, exc: ApiError) -> JSONResponse:
        return error(exc.status, exc.code, exc.message)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        body, ctype = refusal_body(exc.status_code, code, clean(exc.detail, 200), wants_html(request.headers))
        return Response(body, status_code=exc.status_code, media_type=ctype)

    @app.exception_handler(RequestValidationError)
    async def invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()))
        return error(400, "invalid_request", clean(f"{where}: {first.get('msg', 'invalid')}", 300))

    @app.get("/login")
    async def login(request: Request, t: str = "", next: str = "/") -> Response:  # noqa: A002 - the URL's name
        auth = state.auth
        page = auth.base + landing(next)  # a run's page or the runs list: never off the console
        if auth.csrf_for_header(request.headers.get("cookie", "")) is not None:
            return RedirectResponse(page, status_code=303)  # already logged in in this browser
        try:
            session, _csrf = auth.redeem(t)
        except Refused as refused:
            body, ctype = refusal_body(refused.status, refused.code, refused.message, wants_html(request.headers))
            return Response(body, status_code=refused.status, media_type=ctype)
        response = RedirectResponse(page, status_code=303)
        response.headers.append("set-cookie", auth.session_cookie(session))
        return response

    @app.get("/", response_class=HTMLResponse)
    async def runs_list(request: Request) -> HTMLResponse:
        rows = await asyncio.to_thread(state.index.rows, dict(state.live))
        page = templates.get_template("runs.html").render(rows=rows, csrf=request.state.csrf)
        return HTMLResponse(page)

    @app.get("/runs/{run_id}", response_class=HTMLResponse)
    async def run_page(request: Request, run_id: str) -> HTMLResponse:
        directory = state.directory(run_id)
        live = state.live.get(run_id)
        if live is not None and live.state != "finished":
            page = templates.get_template("run_live.html").render(
                run_id=run_id, info=live.describe(), csrf=request.state.csrf)
            return HTMLResponse(page)
        return await asyncio.to_thread(render_finished, state, templates, request, run_id, directory)

    @app.get("/runs/{run_id}/state")
    async def run_state(run_id: str) -> dict[str, Any]:
        return streams.state_of(state.live_run(run_id))

    @app.get("/runs/{run_id}/events")
    async def events(request: Request, run_id: str, after: str | None = None) -> StreamingResponse:
        live = state.live_run(run_id)
        try:
            seq = streams.start_seq(request.headers.get("last-event-id"), after, live)
        except ValueError as exc:
            raise ApiError(400, "invalid_event_id", str(exc)) from None
        return StreamingResponse(streams.event_stream(live, seq, state.closing, state.waits),
                                 media_type="text/event-stream",
                                 headers={"X-Accel-Buffering": "no"})

    @app.websocket("/runs/{run_id}/live")
    async def live_socket(socket: WebSocket, run_id: str, after: str | None = None) -> None:
        # refusals are the handshake's answer (the JSON error, as for a GET): no socket opens
        try:
            live = state.live_run(run_id)
            try:
                seq = streams.start_seq(None, after, live)
            except ValueError as exc:
                raise ApiError(400, "invalid_event_id", str(exc)) from None
        except ApiError as exc:
            await socket.send_denial_response(error(exc.status, exc.code, exc.message))
            return
        state.sockets += 1
        state.no_sockets.clear()
        try:
            await streams.live_socket(socket, state.feed(live), seq, state.closing, state.waits)
        finally:
            state.sockets -= 1
            if not state.sockets:
                state.no_sockets.set()

    @app.get("/runs/{run_id}/approvals")
    async def approvals(run_id: str) -> dict[str, Any]:
        return state.live_run(run_id).registry.snapshot()

    @app.post("/runs/{run_id}/approvals/{request_id}", status_code=202)
    async def answer(request: Request, run_id: str, request_id: str) -> Any:
        live = state.live_run(run_id)
        try:
            kind = live.registry.get(request_id).kind
        except AnswerRefused as refused:
            return JSONResponse(refused.as_json(), status_code=refused.status)
        if request_kind(kind).form:  # a sign-in request: answered with its filled form
            return await answer_signin(request, live, request_id)
        body = await read_json(request)
        if not isinstance(body, dict) or "answer" not in body:
            raise ApiError(400, "invalid_body",
                           "the body must be {\"answer\": \"approve\" | \"deny\" | \"cancel\"}")
        try:
            # an origin request's answer is forwarded to the gateway (a bounded call): not on the loop
            decided = await asyncio.to_thread(live.registry.answer, request_id, body["answer"], by="console")
        except AnswerRefused as refused:
            return JSONResponse(refused.as_json(), status_code=refused.status)
        return JSONResponse(decided.as_json(), status_code=202)

    async def answer_signin(request: Request, live: LiveRun, request_id: str) -> JSONResponse:
        """A person's answer to the sign-in request ``request_id`` (module docstring). The body holds
        credentials: no error, log line or response here carries any of it, and no reference to it is
        kept once the registry has taken (or refused) it."""
        body = await read_json(request, SIGNIN_MAX_BODY)
        try:
            if not isinstance(body, dict) or "action" not in body:
                raise ApiError(400, "invalid_body", "the body must be {\"action\": \"submit\", \"fields\": "
                                                    "[{\"field_id\", \"value\"}], \"selected_option\"?} "
                                                    "or {\"action\": \"cancel\"}")
            decided = await asyncio.to_thread(live.registry.answer_signin, request_id, body, by="console")
        except AnswerRefused as refused:  # its message names the rule and ids, never a value
            return JSONResponse(refused.as_json(), status_code=refused.status)
        except ApiError:
            raise
        except Exception as exc:  # noqa: BLE001 - never let a traceback (or its message) near a log
            log.error("a sign-in answer failed: %s", type(exc).__name__)
            raise ApiError(500, "internal_error", "the sign-in answer could not be handled") from None
        finally:
            del body
        return JSONResponse(decided.as_json(), status_code=202)

    def control(name: str, act: Callable[[LiveRun], Any]) -> None:
        @app.post(f"/runs/{{run_id}}/{name}", status_code=202, name=name)
        async def route(run_id: str) -> JSONResponse:
            live = state.live_run(run_id)
            if live.state == "finished":
                raise ApiError(409, "run_finished", "the run has finished")
            try:
                act(live)  # flags under a lock, never the guest: answered at once whatever the guest does
            except RunOver as exc:
                raise ApiError(409, "run_finished" if live.state == "finished" else "not_started", str(exc)) from None
            return JSONResponse({"state": live.describe()}, status_code=202)

    control("takeover", lambda live: live.take_over(by="console"))
    control("resume", lambda live: live.resume(by="console"))
    control("cancel", lambda live: live.cancel(by="console"))

    @app.post("/runs/{run_id}/input", status_code=202)
    async def human_input(request: Request, run_id: str) -> JSONResponse:
        live = state.live_run(run_id)
        action = await read_json(request)
        try:
            shown = await asyncio.get_running_loop().run_in_executor(state.inputs, live.human_action, action,
                                                                     "console")
        except NotInControl as exc:
            raise ApiError(409, "not_in_control", str(exc)) from None
        except RunOver as exc:
            raise ApiError(409, "run_finished", str(exc)) from None
        except HumanActionInvalid as exc:
            raise ApiError(400, "invalid_action", clean(exc, 300)) from None
        except AgentError as exc:
            raise ApiError(502, exc.code, clean(exc.message, 300)) from None
        return JSONResponse({"action": shown}, status_code=202)

    @app.get("/runs/{run_id}/screen.jpg")
    async def screen_jpg(run_id: str) -> Response:
        live = state.live_run(run_id)
        try:
            jpeg = await asyncio.get_running_loop().run_in_executor(state.frames, live.frame)
        except RunOver as exc:
            raise ApiError(409, "run_finished" if live.state == "finished" else "not_started", str(exc)) from None
        except AgentError as exc:
            raise ApiError(502, exc.code, clean(exc.message, 300)) from None
        except ValueError as exc:
            raise ApiError(502, "bad_frame", clean(exc, 300)) from None
        return Response(jpeg, media_type="image/jpeg")

    @app.get("/runs/{run_id}/screen.mjpeg")
    async def screen_mjpeg(run_id: str, fps: float | None = None) -> StreamingResponse:
        live = state.live_run(run_id)
        return StreamingResponse(streams.mjpeg_stream(state.feed(live), streams.clamp_fps(fps), state.closing),
                                 media_type=f"multipart/x-mixed-replace; boundary={streams.BOUNDARY}")

    @app.get("/runs/{run_id}/shots/{name}")
    async def shot(run_id: str, name: str) -> Response:
        directory = state.directory(run_id)
        found = shot_file(directory, name)
        # read through the report's reader (no link followed, regular file, capped, magic checked):
        # what was checked above is what is sent, whatever a writer in runs_dir swaps meanwhile
        data = (await asyncio.to_thread(read_shot, directory, name))[0] if found is not None else None
        if data is None:
            raise ApiError(404, "unknown_shot", "no recorded screenshot of this name")
        return Response(data, media_type=found[1])

    @app.get("/runs/{run_id}/video/{name}")
    async def video(request: Request, run_id: str, name: str) -> Response:
        directory = state.directory(run_id)
        # opened once by the reading rule (no link followed, a regular file, capped, WebM's magic): what
        # is sent is read from that open file, whatever a writer in runs_dir swaps meanwhile
        fh, size, _why = await asyncio.to_thread(open_video, directory, name) if video_name(name) else (None, 0, None)
        if fh is None:
            raise ApiError(404, "unknown_video", "no video of this name")
        try:
            first, last = byte_range(request.headers.get("range"), size)
        except ValueError:
            fh.close()
            return Response(status_code=416, headers={"Content-Range": f"bytes */{size}"})
        headers = {"Accept-Ranges": "bytes", "Content-Length": str(last - first + 1 if size else 0)}
        status = 200
        if request.headers.get("range") is not None:
            status, headers["Content-Range"] = 206, f"bytes {first}-{last}/{size}"
        return StreamingResponse(file_chunks(fh, first, last + 1), status_code=status, media_type=VIDEO_TYPE,
                                 headers=headers)

    return app
