"""HTTP client for the guest agent API (contract 1 in ARCHITECTURE.md).

``AgentClient(base_url, token)`` speaks HTTP/1.1 to the agent over kept-alive connections, every
socket wait bounded by the call's deadline (:mod:`controller.agent_transport`). Coordinates it sends are
**screen pixels** (mapping from model space is the driver's job). Every non-2xx answer raises
:class:`AgentError` carrying the HTTP status and the agent's ``code``, ``message`` and ``index``.

The guest is untrusted: a process in it can stop the agent and answer on its port. So every answer is
streamed and held to two limits (the rule is stated once, in ARCHITECTURE.md, contract 1):

* a **size cap** per call -- :data:`JSON_MAX_BYTES` for the JSON endpoints and every error body,
  :func:`screenshot_cap` for ``GET /v1/screenshot`` and ``POST /v1/actions?screenshot=``,
  ``max_file_bytes`` (default :data:`FILE_MAX_BYTES`) for ``GET /v1/files``; the status lines and
  headers of any answer, interim 1xx answers included, at most
  :data:`controller.agent_transport.HEAD_MAX_BYTES` (100 KiB). A
  ``Content-Length`` over the cap is refused before any of the body is read, and bytes are counted as
  they arrive, so a lying or absent ``Content-Length`` (chunked, close-delimited) is caught too:
  ``AgentError`` code ``too_large``.
* an **overall deadline** per call (the client's ``timeout``): wall clock from sending the request to
  the last byte of the answer, headers included. Every socket operation waits at most the time left,
  so a peer that trickles one byte just inside each read timeout, or stalls mid-answer, is cut off
  at the deadline: ``AgentError`` code ``deadline``.

Answers must also have the shape the contract promises (parseable JSON, ``X-Frame`` etc. headers,
integer ``executed``/``pid``, no ``Content-Encoding``); anything else is code ``bad_response``. Text
the guest supplies (its error ``code`` and ``message``, a non-JSON error body) reaches messages only
with control and format characters escaped and its length capped (:func:`guest_text`).
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, replace
from typing import Any, Sequence
from urllib.parse import quote, urlencode, urlsplit

import httpx

from controller.agent_transport import AgentTransport, TransportError
from controller.model.errors import DesktopSandboxError
from controller.redaction import Redactor, image_boxes, paint
from controller.text import clean

from guest.files import DEFAULT_MAX_BYTES as _AGENT_FILE_MAX_BYTES

JSON_MAX_BYTES = 1024 * 1024
"""Cap in bytes on the answer of every JSON endpoint (``/livez``, ``/v1/display``, ``/v1/actions``,
``/v1/release``, ``/v1/launch``) and on every error body. The agent's real answers are under 1 KiB."""

FILE_MAX_BYTES = _AGENT_FILE_MAX_BYTES
"""Default cap in bytes on ``GET /v1/files``: the agent's own default ``--max-file-bytes`` (16 MiB,
``guest.files.DEFAULT_MAX_BYTES``), above which the agent refuses with 413 itself. Pass
``max_file_bytes`` to :class:`AgentClient` when the agent runs with another value."""

MAX_SCREEN_PX = 8192
"""Largest screen width or height in px the controller ever gives a guest (a task's ``[screen]`` is
at most 8192x8192, ``controller.run.tasks``); bounds a screenshot answer when the request does not."""

SCREENSHOT_BYTES_PER_PX = 4
"""Bytes per image px a screenshot answer may take: an uncompressed RGBA frame. The agent's PNG is
8-bit RGB with one filter byte a row and deflate framing (under 3.01 bytes/px even when nothing
compresses); its JPEG is smaller still."""

SCREENSHOT_HEADROOM_BYTES = 1024 * 1024
"""Bytes allowed on top of the pixels: PNG chunk and JPEG table overhead, which dominate tiny images."""

MAX_GUEST_TEXT = 200
"""Most characters of guest-supplied text (error messages) put into an :class:`AgentError` message."""

_SIZE = re.compile(r"([0-9]{1,6})x([0-9]{1,6})")
_FRAME = re.compile(r"([0-9]{1,6}),([0-9]{1,6}),([0-9]{1,6}),([0-9]{1,6})")
_CODE = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_COUNT = re.compile(r"([0-9]{1,6})")


class AgentError(DesktopSandboxError, RuntimeError):
    """A failed agent call: ``status`` (HTTP), ``code`` (e.g. ``unknown_key``), ``message``,
    ``index`` (the failing action's position, when the agent names one), ``body`` (parsed JSON).

    ``status`` 0 means no usable answer arrived; ``code`` then says why: ``unreachable`` (no
    connection, or it broke), ``deadline`` (no complete answer within the call's deadline),
    ``too_large`` (the answer is over the call's size cap) or ``bad_response`` (the answer is not what
    the contract promises: malformed JSON, headers or fields, or a ``Content-Encoding``).
    """

    def __init__(self, status: int, code: str, message: str, index: int | None = None,
                 body: dict[str, Any] | None = None) -> None:
        super().__init__(f"{status} {code}: {message}" + (f" (action {index})" if index is not None else ""))
        self.status, self.code, self.message, self.index = status, code, message, index
        self.body = body or {}


@dataclass(frozen=True)
class AgentScreenshot:
    """An image from ``GET /v1/screenshot``.

    ``data`` bytes, ``mime`` type, ``screen_size`` (W, H) screen px, ``frame`` (x, y, w, h) the
    captured region in screen px, ``image_size`` (w, h) of the image in image px, ``redacted``: the
    held regions (screen px boxes, :mod:`controller.redaction`) filled in ``data`` before it left
    the client.
    """

    data: bytes
    mime: str
    screen_size: tuple[int, int]
    frame: tuple[int, int, int, int]
    image_size: tuple[int, int]
    redacted: tuple[tuple[int, int, int, int], ...] = ()


def screenshot_cap(max_width: int | None = None, max_height: int | None = None,
                   crop: tuple[int, int, int, int] | None = None) -> int:
    """Cap in bytes on a ``GET /v1/screenshot`` answer for these request parameters.

    The image is never larger than the crop (screen px), nor than ``max_width`` x ``max_height``
    (image px), nor than :data:`MAX_SCREEN_PX` square; the cap is that many px times
    :data:`SCREENSHOT_BYTES_PER_PX` plus :data:`SCREENSHOT_HEADROOM_BYTES`. The default 1280x800
    model image gets 5 MiB; an unbounded request 257 MiB.
    """
    w, h = screenshot_bounds(max_width, max_height, crop)
    return w * h * SCREENSHOT_BYTES_PER_PX + SCREENSHOT_HEADROOM_BYTES


def screenshot_bounds(max_width: int | None = None, max_height: int | None = None,
                      crop: tuple[int, int, int, int] | None = None) -> tuple[int, int]:
    """Largest (w, h) in image px the agent may answer a screenshot request with (see
    :func:`screenshot_cap`); at least 1 x 1."""
    w = h = MAX_SCREEN_PX
    if crop is not None:
        w, h = min(w, int(crop[2])), min(h, int(crop[3]))
    if max_width is not None:
        w = min(w, int(max_width))
    if max_height is not None:
        h = min(h, int(max_height))
    return max(w, 1), max(h, 1)


@dataclass(frozen=True)
class Answer:
    """A 2xx answer read in full: ``status``, ``headers`` and the raw ``body``."""

    status: int
    headers: httpx.Headers
    body: bytes


def _json(answer: Answer, what: str) -> Any:
    """The answer's body parsed as JSON; ``bad_response`` when it is not JSON."""
    try:
        return json.loads(answer.body)
    except (ValueError, RecursionError) as exc:  # RecursionError: nested deeper than the parser goes
        raise AgentError(0, "bad_response", f"{what}: the answer is not JSON ({clean(exc, MAX_GUEST_TEXT)})") from None


def _int_field(body: Any, name: str, what: str, minimum: int) -> int:
    value = body.get(name) if isinstance(body, dict) else None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise AgentError(0, "bad_response", f"{what}: {name!r} must be an integer >= {minimum}, "
                                            f"got {clean(repr(value), 60)}")
    return value


def _header(headers: httpx.Headers, name: str, pattern: re.Pattern[str], what: str) -> tuple[int, ...]:
    value = headers.get(name)
    match = pattern.fullmatch(value) if value is not None else None
    if match is None:
        shown = "missing" if value is None else clean(repr(value), 60)
        raise AgentError(0, "bad_response", f"{what}: header {name} is malformed ({shown})")
    return tuple(int(v) for v in match.groups())


@dataclass(frozen=True)
class AgentStep:
    """The answer of :meth:`AgentClient.actions_screenshot`: ``executed`` actions run in full,
    ``settled`` (the request's last ``wait``: True settled, False cut off by the cap or the deadline;
    None when it held no ``wait``) and the ``screenshot`` taken after them."""

    executed: int
    settled: bool | None
    screenshot: AgentScreenshot


_SETTLED = {"true": True, "false": False}


class AgentClient:
    """Synchronous client for one agent. Thread-safe: concurrent calls use separate kept-alive
    connections (:class:`controller.agent_transport.AgentTransport`).

    ``base_url``: ``http://HOST:PORT`` of the agent (a path prefix is kept). ``timeout`` (seconds):
    the overall deadline of each call, from sending the request to the last byte of the answer; keep
    it above the agent's ``--request-timeout`` plus its ``--busy-timeout`` (20 + 5 s by default) for
    action calls, so the agent's own ``timeout`` or ``busy`` answer arrives first. ``max_file_bytes``:
    cap on a ``read_file`` answer (default :data:`FILE_MAX_BYTES`, the agent's default
    ``--max-file-bytes``). ``transport``: for tests, an object with the ``request`` and ``close``
    methods of :class:`controller.agent_transport.AgentTransport` (which it replaces). Raises ValueError
    for a ``timeout`` or ``max_file_bytes`` that is not positive, a ``base_url`` that is not
    ``http://HOST[:PORT]`` or a ``token`` that is not printable ASCII.
    """

    def __init__(self, base_url: str, token: str, *, timeout: float = 30.0,
                 max_file_bytes: int = FILE_MAX_BYTES, transport: AgentTransport | None = None) -> None:
        if not timeout > 0:
            raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
        if max_file_bytes < 1:
            raise ValueError(f"max_file_bytes must be at least 1, got {max_file_bytes!r}")
        self.base_url = base_url.rstrip("/")
        self.redactor = Redactor()
        """The regions of this agent's screen kept out of every picture this client returns
        (:mod:`controller.redaction`); whoever makes a new client for the same sandbox hands it on."""
        parts = urlsplit(self.base_url)
        try:
            port = parts.port or 80
        except ValueError:
            port = 0
        if parts.scheme != "http" or not parts.hostname or not port or parts.query or parts.fragment:
            raise ValueError(f"base_url must be http://HOST[:PORT], got {clean(base_url, 100)!r}")
        if not (token.isascii() and token.isprintable()):
            raise ValueError("the token must be printable ASCII (it goes into a header)")
        self.timeout = float(timeout)
        self.max_file_bytes = int(max_file_bytes)
        self._prefix = quote(parts.path, safe="/%:@!$&'()*+,;=-._~")  # a path prefix, as sent
        host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
        host_header = host if parts.port is None else f"{host}:{port}"
        self._transport = transport if transport is not None else AgentTransport(
            parts.hostname, port, host_header, {"Authorization": f"Bearer {token}", "Accept-Encoding": "identity"})

    def close(self) -> None:
        """Close the kept-alive connections; later calls raise AgentError ``unreachable``."""
        self._transport.close()

    def stop_calls(self, grace_s: float | None) -> None:
        """The caller is stopping (a run cancelled): a call in flight now is cut once ``grace_s``
        seconds have passed (AgentError ``interrupted``), and each later call ends within ``grace_s``
        seconds, however the agent stalls; ``None``: calls get their own deadlines again
        (:meth:`controller.agent_transport.AgentTransport.stop_calls`)."""
        stop = getattr(self._transport, "stop_calls", None)
        if stop is not None:
            stop(grace_s)

    def __enter__(self) -> "AgentClient":
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # -- plumbing ----------------------------------------------------------------------------
    def _request(self, method: str, path: str, cap: int, *, params: dict[str, Any] | None = None,
                 json_body: Any = None, timeout: float | None = None) -> Answer:
        """One call: the status, headers and whole body of a 2xx answer of at most ``cap`` bytes,
        complete within ``timeout`` seconds (default ``self.timeout``). Raises AgentError: the agent's
        own error for a non-2xx answer (its body capped at :data:`JSON_MAX_BYTES`), or status 0 with
        ``unreachable``, ``deadline``, ``too_large`` or ``bad_response``."""
        what = f"{method} {path}"
        timeout = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        target = self._prefix + path + ("?" + urlencode(params) if params else "")
        body = None
        if json_body is not None:
            body = json.dumps(json_body, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
        try:
            reply = self._transport.request(method, target, body, deadline=deadline, cap=cap,
                                            error_cap=JSON_MAX_BYTES)
        except TransportError as exc:
            if exc.code == "deadline":
                raise AgentError(0, "deadline", f"{what}: no complete answer within the {timeout:g} s "
                                                "deadline of the call") from None
            raise AgentError(0, exc.code, f"{what}: {clean(exc.message, 2 * MAX_GUEST_TEXT)}") from None
        answer = Answer(reply.status, httpx.Headers(reply.headers), reply.body)
        if 200 <= answer.status < 300:
            return answer
        body = answer.body
        try:
            parsed = json.loads(body)
        except (ValueError, RecursionError):
            parsed = None
        if not isinstance(parsed, dict):
            raise AgentError(answer.status, "http_error", clean(body.decode("utf-8", "replace"), MAX_GUEST_TEXT))
        err = parsed.get("error")
        err = err if isinstance(err, dict) else {}
        code = err.get("code")
        code = code if isinstance(code, str) and _CODE.fullmatch(code) else "http_error"
        message = err.get("message")
        message = clean(message if message is not None else body.decode("utf-8", "replace"), MAX_GUEST_TEXT)
        index = err.get("index")
        index = index if isinstance(index, int) and not isinstance(index, bool) else None
        raise AgentError(answer.status, code, message, index, parsed)

    @staticmethod
    def _screenshot_params(quality: int | None, max_width: int | None, max_height: int | None,
                           crop: tuple[int, int, int, int] | None) -> dict[str, Any]:
        params: dict[str, Any] = {}
        if quality is not None:
            params["quality"] = quality
        if max_width is not None:
            params["max_width"] = max_width
        if max_height is not None:
            params["max_height"] = max_height
        if crop is not None:
            params["crop"] = ",".join(str(int(v)) for v in crop)
        return params

    @staticmethod
    def _shot(answer: Answer, what: str, max_width: int | None, max_height: int | None,
              crop: tuple[int, int, int, int] | None) -> AgentScreenshot:
        """The image of a screenshot answer, its headers checked (see :meth:`screenshot`)."""
        frame = _header(answer.headers, "X-Frame", _FRAME, what)
        screen = _header(answer.headers, "X-Screen-Size", _SIZE, what)
        image = _header(answer.headers, "X-Image-Size", _SIZE, what)
        bound = screenshot_bounds(max_width, max_height, crop)
        if not (1 <= image[0] <= bound[0] and 1 <= image[1] <= bound[1]):
            raise AgentError(0, "bad_response", f"{what}: X-Image-Size {image[0]}x{image[1]} is outside "
                                                f"1x1..{bound[0]}x{bound[1]}, what the request allows")
        return AgentScreenshot(
            data=answer.body,
            mime=clean(answer.headers.get("content-type", ""), 100),
            screen_size=(screen[0], screen[1]),
            frame=(frame[0], frame[1], frame[2], frame[3]),
            image_size=(image[0], image[1]),
        )

    # -- API -----------------------------------------------------------------------------------
    # Every method below raises AgentError: the agent's refusal (its status and code), or status 0
    # with unreachable, deadline (over ``timeout`` s), too_large (over the call's cap) or bad_response.

    def livez(self) -> bool:
        """True when ``GET /livez`` answers 200 (answer capped at :data:`JSON_MAX_BYTES`)."""
        return self._request("GET", "/livez", JSON_MAX_BYTES).status == 200

    def display(self) -> dict[str, int]:
        """``{"width", "height", "depth"}`` of the guest screen (screen px, bits); each a positive int,
        else ``bad_response``. Answer capped at :data:`JSON_MAX_BYTES`."""
        what = "GET /v1/display"
        body = _json(self._request("GET", "/v1/display", JSON_MAX_BYTES), what)
        return {name: _int_field(body, name, what, 1) for name in ("width", "height", "depth")}

    def actions(self, actions: Sequence[dict[str, Any]], expect_screen: dict[str, Any] | None = None) -> int:
        """Run Responses computer actions (screen px) in one request; returns ``executed`` (an int
        >= 0, else ``bad_response``). Answer capped at :data:`JSON_MAX_BYTES`. ``expect_screen``: a bound
        approval's screen check (``wire.screen_match.ScreenBinding`` as JSON, contract 1), sent in the
        body; the agent refuses with 409 ``screen_changed`` (nothing ran) when the screen no longer
        matches it."""
        what = "POST /v1/actions"
        body = _json(self._request("POST", "/v1/actions", JSON_MAX_BYTES,
                                   json_body=_actions_body(actions, expect_screen)), what)
        return _int_field(body, "executed", what, 0)

    def screenshot(self, format: str = "png", quality: int | None = None, max_width: int | None = None,
                   max_height: int | None = None,
                   crop: tuple[int, int, int, int] | None = None) -> AgentScreenshot:
        """Capture the screen (optionally ``crop`` in screen px, bounded to max_width/max_height image px).

        The answer is capped at :func:`screenshot_cap` of these parameters. ``X-Screen-Size``,
        ``X-Frame`` and ``X-Image-Size`` must be decimal ``WxH`` / ``x,y,w,h`` and the image no larger
        than the request allows (:func:`screenshot_bounds`), else ``bad_response``.
        """
        params = {"format": format, **self._screenshot_params(quality, max_width, max_height, crop)}
        since = self.redactor.mark()
        answer = self._request("GET", "/v1/screenshot", screenshot_cap(max_width, max_height, crop), params=params)
        return self._redact(self._shot(answer, "GET /v1/screenshot", max_width, max_height, crop), since)

    def _redact(self, shot: AgentScreenshot, since: float) -> AgentScreenshot:
        """``shot`` with every region held since ``since`` filled (:mod:`controller.redaction`);
        ``bad_response`` when the picture cannot be decoded to fill it (it is then never returned)."""
        x, y, w, h = shot.frame  # the frame shown is on the screen, whatever size the answer says it has
        boxes = self.redactor.boxes(since, (max(shot.screen_size[0], x + w), max(shot.screen_size[1], y + h)))
        if not boxes:
            return shot
        inside = image_boxes(boxes, shot.frame, shot.image_size)
        try:
            data = paint(shot.data, shot.mime, inside, size=shot.image_size)
        except ValueError as exc:
            raise AgentError(0, "bad_response", f"screenshot: {clean(exc, MAX_GUEST_TEXT)}") from None
        return replace(shot, data=data, redacted=tuple(boxes))

    def focus_box(self) -> tuple[int, int, int, int] | None:
        """``GET /v1/focus``: the box (x, y, width, height, screen px) of the top-level window holding the X
        input focus, None when none does. Answer capped at :data:`JSON_MAX_BYTES`; a box that is not four
        integers with a positive size is ``bad_response``."""
        what = "GET /v1/focus"
        body = _json(self._request("GET", "/v1/focus", JSON_MAX_BYTES), what)
        box = body.get("box") if isinstance(body, dict) else "?"
        if box is None:
            return None
        if (not isinstance(box, list) or len(box) != 4 or any(isinstance(v, bool) or not isinstance(v, int) for v in box)
                or box[0] < 0 or box[1] < 0 or box[2] < 1 or box[3] < 1 or max(box) > MAX_SCREEN_PX):
            raise AgentError(0, "bad_response", f"{what}: 'box' must be [x, y, width, height] in screen px, "
                                                f"got {clean(repr(box), 80)}")
        return box[0], box[1], box[2], box[3]

    def actions_screenshot(self, actions: Sequence[dict[str, Any]], format: str = "png",
                           quality: int | None = None, max_width: int | None = None,
                           max_height: int | None = None,
                           crop: tuple[int, int, int, int] | None = None,
                           expect_screen: dict[str, Any] | None = None) -> AgentStep:
        """Run ``actions`` (screen px), then capture the screen, in one request
        (``POST /v1/actions?screenshot=FORMAT``, contract 1): one round trip instead of two, and the
        image is taken while the request still holds the input, so it shows the screen the actions
        (a ``wait`` among them) left. Screenshot parameters as :meth:`screenshot`; ``expect_screen`` as
        :meth:`actions`.

        The answer is capped at :func:`screenshot_cap`; ``X-Executed`` must be a decimal integer and
        ``X-Settled`` absent, ``true`` or ``false``, the image headers as :meth:`screenshot`, else
        ``bad_response``. An agent that predates the combined request answers the actions alone (JSON
        ``executed``); the screenshot is then fetched with ``GET /v1/screenshot``.
        """
        what = "POST /v1/actions?screenshot"
        params = {"screenshot": format, **self._screenshot_params(quality, max_width, max_height, crop)}
        since = self.redactor.mark()
        answer = self._request("POST", "/v1/actions", screenshot_cap(max_width, max_height, crop), params=params,
                               json_body=_actions_body(actions, expect_screen))
        if "X-Executed" not in answer.headers and answer.body[:1] == b"{":
            # An older agent ignored the query and ran the actions only.
            body = _json(answer, what)
            executed = _int_field(body, "executed", what, 0)
            settled = body.get("settled") if isinstance(body, dict) else None
            return AgentStep(executed, settled if isinstance(settled, bool) else None,
                             self.screenshot(format, quality, max_width, max_height, crop))
        (executed,) = _header(answer.headers, "X-Executed", _COUNT, what)
        raw_settled = answer.headers.get("X-Settled")
        if raw_settled is not None and raw_settled not in _SETTLED:
            raise AgentError(0, "bad_response", f"{what}: header X-Settled is malformed "
                                                f"({clean(repr(raw_settled), 60)})")
        settled = _SETTLED[raw_settled] if raw_settled is not None else None
        return AgentStep(executed, settled, self._redact(self._shot(answer, what, max_width, max_height, crop), since))

    def replace_token(self, new: str) -> None:
        """Tell the agent to accept only ``new`` as its bearer token from now on (``POST /v1/token``;
        32 to 256 visible ASCII characters). This client keeps sending the old one: make a new client
        with ``new``. Raises AgentError (``invalid_request`` for a malformed token)."""
        self._request("POST", "/v1/token", JSON_MAX_BYTES, json_body={"token": new})

    def release(self) -> None:
        """Release every key and button the guest reports down (answer capped at :data:`JSON_MAX_BYTES`)."""
        self._request("POST", "/v1/release", JSON_MAX_BYTES)

    def read_file(self, path: str) -> bytes:
        """Bytes of a guest file under the agent's allowed roots; at most ``max_file_bytes``, else
        ``too_large`` (the agent itself answers 413 ``too_large`` for a file over its limit)."""
        return self._request("GET", "/v1/files", self.max_file_bytes, params={"path": path}).body

    def launch(self, app: str, args: Sequence[str] = ()) -> int:
        """Start an allowlisted guest app with extra argv entries; returns its pid (an int >= 1, else
        ``bad_response``). Answer capped at :data:`JSON_MAX_BYTES`."""
        what = "POST /v1/launch"
        body = _json(self._request("POST", "/v1/launch", JSON_MAX_BYTES, json_body={"app": app, "args": list(args)}),
                     what)
        return _int_field(body, "pid", what, 1)


    # -- the agent's chromium (contract 8) ---------------------------------------------------------
    def signin_page(self) -> Any:
        """The active tab's sign-in page (:class:`wire.browser.SignInPage`), or None when the agent's
        chromium is not running or shows no page (409 ``no_browser`` / ``no_page``). Answer capped at
        :data:`JSON_MAX_BYTES`. Raises AgentError otherwise (``bad_response`` for a shape not the schema's)."""
        from pydantic import ValidationError

        from wire.browser import SignInPage

        try:
            body = _json(self._request("GET", "/v1/browser/signin", JSON_MAX_BYTES), "GET /v1/browser/signin")
        except AgentError as exc:
            if exc.status == 409 and exc.code in ("no_browser", "no_page"):
                return None
            raise
        try:
            return SignInPage.model_validate(body)
        except ValidationError as exc:
            raise AgentError(0, "bad_response", f"GET /v1/browser/signin: not a sign-in page: "
                                                f"{clean(str(exc.errors(include_input=False)[0].get('msg')), 200)}") from None

    def signin_fill(self, request: Any) -> Any:
        """Fill and submit the sign-in form (:class:`wire.browser.FillRequest` -> ``FillResult``). The
        values go in the request body only (never a URL, a log or an error message). Raises AgentError."""
        from pydantic import ValidationError

        from wire.browser import FillResult

        what = "POST /v1/browser/signin"
        body = {"credential_origin": request.credential_origin, "selected_option": request.selected_option,
                "fields": [{"field_id": f.field_id, "value": f.value} for f in request.fields]}
        try:
            answer = self._request("POST", "/v1/browser/signin", JSON_MAX_BYTES, json_body=body)
        finally:
            del body
        try:
            return FillResult.model_validate(_json(answer, what))
        except ValidationError:
            raise AgentError(0, "bad_response", f"{what}: not a fill result") from None

    def page_text(self, url: str) -> dict[str, Any]:
        """The text of ``url`` as the agent's chromium loads it in a background tab (``{"origin", "url",
        "text", "truncated"}``, at most 1 MiB of text). Raises AgentError."""
        what = "GET /v1/browser/page"
        body = _json(self._request("GET", "/v1/browser/page", 4 * 1024 * 1024, params={"url": url}), what)
        if not (isinstance(body, dict) and isinstance(body.get("text"), str) and isinstance(body.get("origin"), str)):
            raise AgentError(0, "bad_response", f"{what}: not a page text")
        return body

    # -- the agent's chromium as the SDK's BrowserToolset driver (contract 9) ------------------------
    def browser_state(self) -> dict[str, Any]:
        """``GET /v1/browser/state``: the tabs and the agent's observation, as the SDK's ``BrowserState``
        JSON (:class:`wire.browser_tools.BrowserStateV1`, validated and written back with only the
        fields of each change). Answer capped at :data:`JSON_MAX_BYTES`, deadline ``timeout``. Raises
        AgentError: the agent's (409 ``no_browser`` / ``no_page``, 504 ``browser_timeout``, 502
        ``channel_closed``), or ``bad_response`` for a shape not the schema's."""
        from pydantic import ValidationError

        from wire.browser_tools import BrowserStateV1

        what = "GET /v1/browser/state"
        body = _json(self._request("GET", "/v1/browser/state", JSON_MAX_BYTES), what)
        try:
            return BrowserStateV1.model_validate(body).wire()
        except ValidationError as exc:
            raise AgentError(0, "bad_response", f"{what}: not a browser state: {_first_problem(exc)}") from None

    def browser_rule(self, rule: Any) -> None:
        """``PUT /v1/browser/rule``: the URL rule the agent judges every request of its chromium by
        (:class:`wire.browser_tools.GuestUrlRule`; contract 9). Answer capped at :data:`JSON_MAX_BYTES`.
        Raises AgentError."""
        self._request("PUT", "/v1/browser/rule", JSON_MAX_BYTES, json_body=rule.model_dump())

    def browser_call(self, member: str, arguments: dict[str, Any]) -> Any:
        """``POST /v1/browser/call`` ``{member, arguments}`` (:class:`wire.browser_tools.BrowserCall`):
        the :class:`wire.browser_tools.BrowserCallResult` (``result``, ``target`` in viewport CSS px,
        ``viewport`` in screen px). The answer is capped at :data:`BROWSER_CALL_MAX_BYTES` (an image of
        ``MAX_IMAGE_BYTES`` in base64, and room for a read report); the deadline is the longer of
        ``timeout`` and what the member may take on the agent (:func:`browser_call_seconds`). Raises
        AgentError: the agent's refusal (400 ``invalid_request``, 409 ``no_browser`` / ``no_page``,
        422 with one of ``wire.browser_tools.REFUSAL_CODES``, 504 ``browser_timeout``, 502
        ``channel_closed``), or ``bad_response`` for a result not the schema's."""
        from pydantic import ValidationError

        from wire.browser_tools import BrowserCallResult

        what = "POST /v1/browser/call"
        answer = self._request("POST", "/v1/browser/call", BROWSER_CALL_MAX_BYTES,
                               json_body={"member": member, "arguments": arguments},
                               timeout=max(self.timeout, browser_call_seconds(member, arguments)))
        try:
            return BrowserCallResult.model_validate(_json(answer, what))
        except ValidationError as exc:
            raise AgentError(0, "bad_response", f"{what}: not a browser call result: {_first_problem(exc)}") from None


def _actions_body(actions: Sequence[dict[str, Any]], expect_screen: dict[str, Any] | None) -> dict[str, Any]:
    """The ``POST /v1/actions`` body: ``{"actions": [...]}``, with ``expect_screen`` when given."""
    body: dict[str, Any] = {"actions": list(actions)}
    if expect_screen is not None:
        body["expect_screen"] = expect_screen
    return body


def _first_problem(exc: Any) -> str:
    """``where: message`` of a pydantic error's first problem, never the value (it is guest text)."""
    first = exc.errors(include_input=False, include_url=False)[0]
    where = ".".join(str(part) for part in first.get("loc", ())) or "body"
    return clean(f"{where}: {first.get('msg')}", MAX_GUEST_TEXT)


def _image_cap() -> int:
    from wire.browser_tools import MAX_IMAGE_BYTES

    return (MAX_IMAGE_BYTES + 2) // 3 * 4 + JSON_MAX_BYTES


BROWSER_CALL_MAX_BYTES = _image_cap()
"""Cap in bytes on a ``POST /v1/browser/call`` answer: the largest image the agent sends
(``wire.browser_tools.MAX_IMAGE_BYTES``) in base64, plus :data:`JSON_MAX_BYTES` for the JSON around it
(a read report is bounded far below: 20 000 characters of text, 200 elements)."""

BROWSER_CALL_MARGIN_S = 10.0
"""Seconds a browser call's deadline allows beyond the longest the member may wait on the agent."""


def browser_call_seconds(member: str, arguments: Any) -> float:
    """The deadline (seconds) of one browser call: what the member may wait on the agent (``wait_for``:
    its ``timeout_ms``; ``navigate`` / ``new_tab``: the load wait, ``wire.browser_tools.LOAD_TIMEOUT_S``;
    ``hold_keys``: its ``duration_ms``) plus :data:`BROWSER_CALL_MARGIN_S`."""
    from wire.browser_tools import LOAD_TIMEOUT_S

    args = arguments if isinstance(arguments, dict) else {}
    waits = 0.0
    if member == "wait_for" and isinstance(args.get("timeout_ms"), int):
        waits = min(max(args["timeout_ms"], 0), 30_000) / 1000
    elif member in ("navigate", "new_tab"):
        waits = LOAD_TIMEOUT_S
    elif member == "hold_keys" and isinstance(args.get("duration_ms"), int):
        waits = min(max(args["duration_ms"], 0), 3000) / 1000
    return waits + BROWSER_CALL_MARGIN_S


DIRECT_PROBE_S = 1.0
"""Seconds :func:`direct_client` gives an address to answer before falling back."""


def direct_client(base_url: str, token: str, *, probe_timeout: float = DIRECT_PROBE_S,
                  **kwargs: Any) -> AgentClient | None:
    """An :class:`AgentClient` for ``base_url`` (``kwargs`` as the class takes them) when the agent there
    answers an authenticated ``GET /v1/display`` within ``probe_timeout`` seconds, else None.

    For a route to the agent that may not exist from where the controller runs, such as a Docker
    bridge address (routable on a Linux Docker host, not from Docker Desktop's VM): the caller keeps
    its published address when this gives None. The token check proves it is this sandbox's agent.
    """
    try:
        with AgentClient(base_url, token, timeout=probe_timeout) as probe:
            probe.display()
    except (AgentError, ValueError):
        return None
    return AgentClient(base_url, token, **kwargs)
