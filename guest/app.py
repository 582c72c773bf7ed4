"""The agent's HTTP API (v1), as a FastAPI app. Contract: ARCHITECTURE.md, "Contract 1".

Every endpoint except ``GET /livez`` requires ``Authorization: Bearer <token>``; the token is
compared with :func:`hmac.compare_digest`. Errors are JSON ``{"error": {"code", "message", ...}}``:
400 ``invalid_request`` / ``invalid_action`` / ``unknown_key`` / ``out_of_bounds`` / ``timeout`` /
``bad_path`` / ``unknown_app`` / ``launch_failed``, 401 ``unauthorized``, 403 ``forbidden``, 404
``not_found``, 405 ``http_error``, 409 ``busy``, 413 ``too_large``, 503 ``display_unavailable``
(docs/ARCHITECTURE.md, contract 1, "Errors", says when each is given).

JSON bodies are at most :data:`MAX_BODY_BYTES` (413 ``too_large``, counted while reading, so a larger
one is never held in memory) and must be JSON whose strings are text: nesting deeper than
:data:`MAX_JSON_DEPTH` and lone UTF-16 surrogates (the JSON escape ``\\ud800``, which no text holds and
UTF-8 cannot encode) are 400 ``invalid_request``. Query numbers are plain ASCII decimals (``int()``
would also take ``1_0`` and non-ASCII digits).

Threads: the token check and ``GET /v1/screenshot`` run on the event loop itself: a screenshot is a few
milliseconds of grab and encode, less than the two trips through the thread pool it used to take (the
token check, then the endpoint: 0.9 ms a shot on a busy 2-core host), and other requests wait for it at
most that long. So does a short ``POST /v1/actions`` of pointer actions and key chords when the input
lock is free (:func:`guest.actions.quick`; a click is a few X round trips). Everything that can wait
on a lock for long (other actions, release, display, files, launch) runs in the thread pool.
"""

from __future__ import annotations

import hmac
import json
import logging
import os
import re
import secrets
from dataclasses import dataclass, field
from typing import Any, Callable

from fastapi import Depends, FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from wire.browser import FillRequest
from wire.browser_tools import BrowserCall, GuestUrlRule, call_problem
from wire.screen_match import ScreenBinding

from .actions import BUSY_TIMEOUT_S, REQUEST_TIMEOUT_S, WAIT_CAP_S, WAIT_QUIET_S, ActionError, Executor
from .capture import BadCapture, Capture, Shot
from .display import DisplayConnection, DisplayUnavailable
from .files import DEFAULT_MAX_BYTES, FileError, FileReader
from .browser import BrowserError, BrowserHost
from .browser_tools import BrowserTools
from .launch import Launcher, LaunchError

log = logging.getLogger(__name__)

#: Largest accepted request body (bytes); 500 actions of the longest ``type`` text fit.
MAX_BODY_BYTES = 16 * 1024 * 1024
#: Deepest nesting of arrays/objects accepted in a body (a drag path is 4 deep).
MAX_JSON_DEPTH = 16
_DECIMAL = re.compile(r"[+-]?[0-9]+")


@dataclass
class AgentConfig:
    """Everything the agent needs: X display name, bearer token, file roots and caps, app allowlist
    (``apps``; ``channel_apps``: those started with a DevTools pipe, :mod:`guest.launch`), and the input limits (seconds: ``busy_timeout``, ``wait_cap``, ``wait_quiet``, ``request_timeout``)."""

    display: str
    token: str
    files_roots: list[str] = field(default_factory=lambda: ["~"])
    max_file_bytes: int = DEFAULT_MAX_BYTES
    apps: dict[str, list[str]] = field(default_factory=dict)
    channel_apps: dict[str, list[str]] = field(default_factory=dict)
    busy_timeout: float = BUSY_TIMEOUT_S
    wait_cap: float = WAIT_CAP_S
    wait_quiet: float = WAIT_QUIET_S
    request_timeout: float = REQUEST_TIMEOUT_S
    token_file: str | None = None
    on_token: Callable[[str], None] | None = None
    """Told each new token ``POST /v1/token`` takes (the connection guard's own copy)."""


def _first_problem(exc: ValidationError) -> str:
    """``field.path: message`` of a validation error's first problem, never the input's value."""
    err = exc.errors(include_input=False)[0]
    return f"{'.'.join(str(p) for p in err.get('loc', ())) or 'body'}: {err.get('msg', 'invalid')}"


def _error(status: int, code: str, message: str, **extra: Any) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message, **extra}}, status_code=status)


def _parse_crop(value: str | None) -> tuple[int, int, int, int] | None:
    if value is None or value == "":
        return None
    parts = [p.strip() for p in value.split(",")]
    if len(parts) != 4:
        raise BadCapture("crop must be x,y,w,h")
    if not all(_DECIMAL.fullmatch(p) for p in parts):
        raise BadCapture("crop must be four integers x,y,w,h")
    x, y, w, h = (int(p) for p in parts)
    return x, y, w, h


def _parse_int(name: str, value: str | None) -> int | None:
    if value is None or value == "":
        return None
    if not _DECIMAL.fullmatch(value.strip()):
        raise BadCapture(f"{name} must be an integer")
    return int(value)


def _json_problem(value: Any) -> str | None:
    """Why parsed JSON is refused (nesting past :data:`MAX_JSON_DEPTH`, a string holding a lone
    surrogate), or None. Iterative, so no input can exhaust the stack."""
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return "the body holds a lone UTF-16 surrogate, which is not text"
        elif isinstance(item, (list, dict)):
            if depth >= MAX_JSON_DEPTH:
                return f"the body nests deeper than {MAX_JSON_DEPTH} levels"
            children = [*item.keys(), *item.values()] if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)
    return None


def _replace_token_file(path: str, token: str) -> None:
    """Write ``token`` over the token file (a new 0400 file renamed into place), so that the agent,
    restarted, reads the token in force and not the one it started with. Best effort: a directory the
    agent cannot write keeps the old file (logged)."""
    folder = os.path.dirname(os.path.abspath(path))
    partial = os.path.join(folder, f".token.{secrets.token_hex(6)}")
    try:
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
        with os.fdopen(fd, "w", encoding="ascii") as out:
            out.write(token + "\n")
        os.replace(partial, path)
    except OSError as exc:
        logging.getLogger("guest.app").warning("the token file was not rewritten: %s", exc.strerror or exc)
        try:
            os.unlink(partial)
        except OSError:
            pass


TOKEN_MIN_CHARS = 32
"""Shortest bearer token ``POST /v1/token`` accepts."""
TOKEN_MAX_CHARS = 256
"""Longest bearer token ``POST /v1/token`` accepts."""


def create_app(config: AgentConfig) -> FastAPI:
    """Build the agent app for ``config``; the X connections open on first use."""
    if not config.token:
        raise ValueError("the bearer token must not be empty")
    token = [config.token.encode()]  # one cell: POST /v1/token replaces it
    conn = DisplayConnection(config.display)
    capture = Capture(config.display)
    executor = Executor(conn, capture, busy_timeout=config.busy_timeout, wait_cap=config.wait_cap,
                        wait_quiet=config.wait_quiet, request_timeout=config.request_timeout)
    files = FileReader(config.files_roots, config.max_file_bytes)
    browser = BrowserHost()
    tools = BrowserTools(browser, executor)
    launcher = Launcher(config.apps, config.display, channel_apps=config.channel_apps, on_channel=browser.take_channel)

    app = FastAPI(title="desktop-sandbox guest agent", version="1", docs_url=None, redoc_url=None,
                  openapi_url=None)
    app.state.executor = executor
    app.state.capture = capture
    app.state.launcher = launcher
    app.state.browser = browser
    app.state.browser_tools = tools

    class Unauthorized(Exception):
        pass

    async def authorize(request: Request) -> None:
        header = request.headers.get("authorization", "")
        scheme, _, given = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), token[0]):
            raise Unauthorized()

    @app.exception_handler(Unauthorized)
    async def _unauthorized(_: Request, __: Exception) -> JSONResponse:
        resp = _error(401, "unauthorized", "missing or wrong bearer token")
        resp.headers["WWW-Authenticate"] = "Bearer"
        return resp

    @app.exception_handler(ActionError)
    async def _action_error(_: Request, exc: ActionError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(DisplayUnavailable)
    async def _display_unavailable(_: Request, exc: DisplayUnavailable) -> JSONResponse:
        return _error(503, "display_unavailable", str(exc))

    @app.exception_handler(BadCapture)
    async def _bad_capture(_: Request, exc: BadCapture) -> JSONResponse:
        return _error(400, "invalid_request", str(exc))

    @app.exception_handler(FileError)
    async def _file_error(_: Request, exc: FileError) -> JSONResponse:
        return _error(exc.status, exc.code, exc.message)

    @app.exception_handler(LaunchError)
    async def _launch_error(_: Request, exc: LaunchError) -> JSONResponse:
        return _error(exc.status, exc.code, exc.message)

    @app.exception_handler(BrowserError)
    async def _browser_error(_: Request, exc: BrowserError) -> JSONResponse:
        return _error(exc.status, exc.code, exc.message)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        return _error(400, "invalid_request", str(exc.errors()[:1]))

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return _error(exc.status_code, "not_found" if exc.status_code == 404 else "http_error", str(exc.detail))

    async def json_body(request: Request) -> Any:
        too_large = ActionError(413, "too_large", f"the body is larger than {MAX_BODY_BYTES} bytes")
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
            raise too_large
        raw = bytearray()
        async for chunk in request.stream():
            raw += chunk
            if len(raw) > MAX_BODY_BYTES:
                raise too_large
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            raise ActionError(400, "invalid_request", "the body must be JSON") from None
        except RecursionError:
            raise ActionError(400, "invalid_request", f"the body nests deeper than {MAX_JSON_DEPTH} levels") from None
        problem = _json_problem(body)
        if problem:
            raise ActionError(400, "invalid_request", problem)
        return body

    auth = [Depends(authorize)]

    @app.get("/livez")
    async def livez() -> dict[str, str]:
        """Liveness: 200 ``{"status": "ok"}`` while the process serves (no token needed)."""
        return {"status": "ok"}

    @app.post("/v1/token", dependencies=auth)
    async def rotate_token(request: Request) -> Response:
        """Replace the bearer token: ``{"token": "<new>"}`` (:data:`TOKEN_MIN_CHARS` to
        :data:`TOKEN_MAX_CHARS` visible ASCII characters), sent with the current one; 204, and from then
        on only the new token is accepted (connections already open keep no privilege: every request is
        checked). What a claim from a warm pool or a restored snapshot does first, so whoever held the
        sandbox before can no longer drive it. 400 ``invalid_request`` for a malformed token."""
        body = await json_body(request)
        new = body.get("token") if isinstance(body, dict) else None
        if (not isinstance(body, dict) or set(body) != {"token"} or not isinstance(new, str)
                or not TOKEN_MIN_CHARS <= len(new) <= TOKEN_MAX_CHARS or not all(33 <= ord(c) < 127 for c in new)):
            raise ActionError(400, "invalid_request", f"the body must be {{\"token\": TEXT}} with {TOKEN_MIN_CHARS} "
                                                      f"to {TOKEN_MAX_CHARS} visible ASCII characters")
        token[0] = new.encode()
        if config.on_token is not None:
            config.on_token(new)
        if config.token_file:
            _replace_token_file(config.token_file, new)
        return Response(status_code=204)

    @app.get("/v1/display", dependencies=auth)
    def display() -> dict[str, int]:
        """Screen geometry ``{"width", "height", "depth"}``; 503 when the X server is gone."""
        try:
            info = conn.info(timeout=config.busy_timeout)
        except TimeoutError:
            raise ActionError(409, "busy", "the X connection stayed busy") from None
        return {"width": info.width, "height": info.height, "depth": info.depth}

    @app.get("/v1/focus", dependencies=auth)
    def focus() -> dict[str, Any]:
        """``{"box": [x, y, width, height] | null}``: screen px of the top-level window holding the X
        input focus (where typed keys go), cut to the screen; null when no window has it. 503 when the
        X server is gone."""
        try:
            box = conn.focus_box(timeout=config.busy_timeout)
        except TimeoutError:
            raise ActionError(409, "busy", "the X connection stayed busy") from None
        return {"box": list(box) if box is not None else None}

    def shoot(q: Any, fmt: str) -> Callable[[], Shot]:
        """The capture a screenshot query ``q`` asks for (``fmt``: its format), its parameters checked
        now (BadCapture), the grab and encode done when the returned callable runs."""
        fmt = fmt.lower()
        fmt = "jpeg" if fmt == "jpg" else fmt
        quality = _parse_int("quality", q.get("quality"))
        max_width = _parse_int("max_width", q.get("max_width"))
        max_height = _parse_int("max_height", q.get("max_height"))
        crop = _parse_crop(q.get("crop"))
        capture.check(fmt=fmt, quality=quality, max_width=max_width, max_height=max_height, crop=crop)
        return lambda: capture.screenshot(fmt=fmt, quality=quality, max_width=max_width, max_height=max_height,
                                          crop=crop)

    def image(shot: Shot, **extra: str) -> Response:
        return Response(shot.data, media_type=shot.mime, headers={
            "X-Screen-Size": f"{shot.screen[0]}x{shot.screen[1]}",
            "X-Frame": ",".join(str(v) for v in shot.frame),
            "X-Image-Size": f"{shot.size[0]}x{shot.size[1]}",
            "Cache-Control": "no-store",
            **extra,
        })

    # The two endpoints of every model step are plain Starlette routes: FastAPI's dependency and
    # response machinery cost 0.2-0.3 ms a request on a quiet 2-core host, more than their own work for
    # a click. They check the token first themselves; errors go to the same exception handlers.
    async def actions(request: Request) -> Response:
        """Run ``{"actions": [...]}`` in order under the input lock; 200 ``{"executed": n}``, plus
        ``"settled"`` (the last ``wait``'s result, see :class:`guest.actions.Outcome`) when it held one.

        With ``?screenshot=png|jpeg`` (and the screenshot's other parameters) the screen is captured
        after the actions, still under the input lock, and the answer is the image as
        ``GET /v1/screenshot`` gives it, with ``X-Executed: n`` and, when a ``wait`` was held,
        ``X-Settled: true|false``. Its parameters are checked before any action runs.

        A short request of pointer actions and key chords (:func:`guest.actions.quick`) runs on the event
        loop when the input lock is free (a trip through the thread pool would cost more than the
        X round trips it makes); anything else, or anything that must wait for the lock, in the pool.
        """
        await authorize(request)
        q = request.query_params
        fmt = q.get("screenshot")
        then = shoot(q, fmt) if fmt else None
        body = await json_body(request)
        if not isinstance(body, dict) or not isinstance(body.get("actions"), list):
            raise ActionError(400, "invalid_action", "body must be an object with an 'actions' list")
        expect = None
        if body.get("expect_screen") is not None:
            try:
                expect = ScreenBinding.model_validate(body["expect_screen"])
            except ValidationError as exc:
                raise ActionError(400, "invalid_request", "expect_screen: " + _first_problem(exc)) from None
        outcome = executor.try_execute(body["actions"], then, expect)
        if outcome is None:
            outcome = await run_in_threadpool(executor.execute, body["actions"], then, expect)
        if then is not None:
            extra = {"X-Executed": str(outcome.executed)}
            if outcome.settled is not None:
                extra["X-Settled"] = "true" if outcome.settled else "false"
            return image(outcome.then, **extra)
        if outcome.settled is None:
            return JSONResponse({"executed": outcome.executed})
        return JSONResponse({"executed": outcome.executed, "settled": outcome.settled})

    async def screenshot(request: Request) -> Response:
        """Image bytes with ``X-Screen-Size``, ``X-Frame`` (screen px) and ``X-Image-Size``; grabbed and
        encoded on the event loop (module doc)."""
        if request.method != "GET":  # Starlette lets HEAD into a GET route; the contract has no HEAD
            raise StarletteHTTPException(405, "Method Not Allowed")
        await authorize(request)
        q = request.query_params
        return image(shoot(q, q.get("format") or "png")())

    app.add_route("/v1/actions", actions, methods=["POST"])
    app.add_route("/v1/screenshot", screenshot, methods=["GET"])

    @app.post("/v1/release", dependencies=auth)
    def release() -> dict[str, bool]:
        """Release every key and button still down; 200 ``{"released": true}``."""
        executor.release()
        return {"released": True}

    @app.get("/v1/files", dependencies=auth)
    def read_file(path: str = "") -> Response:
        """Bytes of one file under the allowed roots (see :mod:`guest.files`)."""
        return Response(files.read(path), media_type="application/octet-stream")

    @app.post("/v1/launch", dependencies=auth)
    async def launch(request: Request) -> dict[str, int]:
        """Start an allowlisted app: ``{"app": name, "args": [...]}`` -> ``{"pid"}``."""
        body = await json_body(request)
        if not isinstance(body, dict) or not isinstance(body.get("app"), str):
            raise LaunchError(400, "invalid_request", "body must be {\"app\": name, \"args\": [strings]}")
        args = body.get("args")
        if args is None:
            args = []
        if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
            raise LaunchError(400, "invalid_request", "'args' must be a list of strings")
        if body["app"] in config.channel_apps:
            tools.launching(args)  # the origins it opens may be loaded (contract 9)
        return {"pid": await run_in_threadpool(launcher.launch, body["app"], args)}

    # The agent's chromium (contract 8): its sign-in form, filling it, a page's text for checks.
    @app.get("/v1/browser", dependencies=auth)
    def browser_status() -> dict[str, Any]:
        """``{"running": bool, "pid": int | null}`` of the agent's chromium."""
        return browser.status()

    @app.get("/v1/browser/signin", dependencies=auth)
    def signin_page() -> dict[str, Any]:
        """The active tab's origin, URL, title and sign-in form (:class:`wire.browser.SignInPage`)."""
        return browser.signin_page().model_dump()

    @app.post("/v1/browser/signin", dependencies=auth)
    async def signin_fill(request: Request) -> dict[str, Any]:
        """Fill and submit the sign-in form (:class:`wire.browser.FillRequest` -> ``FillResult``). A
        refused body's error names the field and the rule, never a value."""
        body = await json_body(request)
        try:
            fill = FillRequest.model_validate(body)
        except ValidationError as exc:
            first = exc.errors(include_input=False, include_url=False)[0]
            where = ".".join(str(part) for part in first.get("loc", ())) or "body"
            raise ActionError(400, "invalid_request", f"{where}: {first.get('msg', 'invalid')}") from None
        del body
        try:
            result = await run_in_threadpool(browser.fill, fill)
        finally:
            del fill
        return result.model_dump()

    @app.get("/v1/browser/page", dependencies=auth)
    def page_text(url: str = "") -> dict[str, Any]:
        """The text of ``url`` opened in a background tab: ``{"origin", "url", "text", "truncated"}``."""
        if not url.startswith(("http://", "https://")) or len(url) > 2048:
            raise ActionError(400, "invalid_request", "url must be an http:// or https:// URL of at most 2048 characters")
        return browser.page_text(url)

    # The agent's chromium as the SDK's BrowserToolset driver (contract 9, wire/browser_tools.py).
    @app.get("/v1/browser/state", dependencies=auth)
    def browser_state() -> dict[str, Any]:
        """The SDK's ``BrowserState`` with its observation (:class:`wire.browser_tools.BrowserStateV1`)."""
        return tools.state()

    @app.put("/v1/browser/rule", dependencies=auth)
    async def browser_rule(request: Request) -> dict[str, Any]:
        """Judge every request of the agent's chromium by this URL rule from now on
        (:class:`wire.browser_tools.GuestUrlRule`, echoed); a bad body is 400 ``invalid_request`` naming
        the field and the rule, never its value."""
        body = await json_body(request)
        try:
            rule = GuestUrlRule.model_validate(body)
        except ValidationError as exc:
            raise ActionError(400, "invalid_request", _first_problem(exc)) from None
        tools.set_rule(rule)
        return rule.model_dump()

    @app.post("/v1/browser/call", dependencies=auth)
    async def browser_call(request: Request) -> dict[str, Any]:
        """Run one browser member (:class:`wire.browser_tools.BrowserCall` -> ``BrowserCallResult``);
        a bad body is 400 ``invalid_request`` naming the field and the rule, never its value."""
        body = await json_body(request)
        problem = call_problem(body)
        if problem is not None:
            raise ActionError(400, "invalid_request", problem)
        result = await run_in_threadpool(tools.call, BrowserCall.model_validate(body))
        return result.wire()

    return app
