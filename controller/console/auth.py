"""Who may use the console: a one-time login token, a session cookie, CSRF, Origin and Host checks.

The console listens on 127.0.0.1 only, but every web page the user's browser opens can send requests
to it (and a DNS-rebinding page can even read answers), so:

* **a secret base path**: everything the console serves is under ``/s/<128 random bits>`` (the
  :attr:`Auth.base`); any other path is 404. Browsers keep cookies apart by host and path, not by
  port, and SameSite counts every port of 127.0.0.1 as the same site: a page served by any other
  program on another 127.0.0.1 port could otherwise have the browser send it the console's cookie.
  Scoped to the secret path, the cookie goes only to a URL that names the secret;
* **login**: the URL the console prints, ``<base>/login?t=<token>`` (``secrets.token_urlsafe(32)``),
  is exchanged once for a session: the answer sets the cookie ``ds_console_<port>`` (random,
  ``HttpOnly; SameSite=Strict; Path=<base>``) and redirects to ``<base>/``, or to the run's page
  ``<base>/runs/<id>`` when the URL carries ``&next=/runs/<id>`` (``run-task --ui`` prints that one;
  :func:`landing`: any other ``next`` gives the runs list, so the link never leads off the console);
  the token is then spent, a second use is refused (403 ``token_spent``);
* **every request** but ``/login`` needs that cookie (401 ``unauthenticated``); when the browser sends
  several cookies of that name (another port's program may set one with ``Path=/``), any one that
  opens a session counts, so a tossed cookie cannot log the person out;
* **every state-changing request** (any method but GET / HEAD) also needs the session's CSRF token in
  ``X-CSRF-Token`` (403 ``bad_csrf``; the page reads it from ``<meta name="csrf-token">``) and an
  ``Origin`` equal to the console's own origin as the request addresses it (403 ``bad_origin``);
* **every request** must carry one ``Host: 127.0.0.1:<port>`` or ``localhost:<port>`` (403 ``bad_host``;
  the rule of every server here, :func:`wire.connections.host_refusal`): a rebound name never matches;
* **every request from another site is refused** (:meth:`Guard.check_site`), cookie or not: an
  ``Origin`` that is not the console's own (403 ``bad_origin``; ``null`` included), or a
  ``Sec-Fetch-Site`` other than ``same-origin`` or ``none`` (403 ``cross_site``: ``same-site`` is what a
  page on another 127.0.0.1 port gets, and the browser sends it the SameSite=Strict cookie). Requests
  without these headers (curl, older browsers) pass. The one exception is a top-level navigation
  (``Sec-Fetch-Mode: navigate``, ``Sec-Fetch-Dest: document``) to a page, :data:`PAGE_PATH` (the
  login URL, the runs list, a run's page): a person may follow a link to the console from another
  page and sees it in a window of its own (``Cross-Origin-Opener-Policy: same-origin``: the linking
  page keeps no handle on it, and no frame may hold it). Data, streams, images, video, scripts and
  styles (the run's state and approvals, ``events``, ``screen.jpg``, ``screen.mjpeg``, ``shots/``,
  ``video/``, ``static/``) are never served to another site, not even to a navigation. A URL opened
  from the terminal or typed is ``Sec-Fetch-Site: none``; the console's own requests are ``same-origin``.
* **a WebSocket** (a run page's ``/runs/{id}/live``) is checked as a GET, and its handshake must also
  carry an ``Origin`` equal to the console's own (403 ``bad_origin``, none at all included): a
  WebSocket is not bound by CORS, and every browser names the page that opens one.

Secrets are compared with :func:`hmac.compare_digest`. Every response, refusals and errors included,
carries :data:`SECURITY_HEADERS` (``Cross-Origin-Resource-Policy: same-origin`` among them: a browser
hands no answer of the console to another origin's page). Refusals are ``{"error": {"code",
"message"}}`` (JSON), or a plain page when the request asked for HTML (a browser's navigation), sent
before the app sees the request (no stream is opened), and logged at INFO on the ``controller.console``
logger (method, path inside the secret base, status, code; never the secret or the query).
"""

from __future__ import annotations

import hmac
import html
import json
import logging
import re
import secrets
import threading
from typing import Any, Awaitable, Callable
from urllib.parse import quote

from starlette.datastructures import Headers, MutableHeaders

from controller.console.runs import valid_run_id
from controller.model.errors import DesktopSandboxError
from wire.connections import HOST_REFUSED, scope_host_refusal

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

SECURITY_HEADERS: dict[str, str] = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data: blob:; connect-src 'self'; "
                               "frame-ancestors 'none'; base-uri 'none'; form-action 'self'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
    "Cross-Origin-Resource-Policy": "same-origin",
    "Cross-Origin-Opener-Policy": "same-origin",
}
"""Headers set on every response (replacing any the app set)."""

REPORT_CSP = ("default-src 'none'; img-src 'self' data:; media-src 'self'; style-src 'unsafe-inline'; "
              "frame-ancestors 'none'; base-uri 'none'; form-action 'none'")
"""The policy of a finished run's report page (``controller.report``: no script at all, its CSS inline,
every value in it autoescaped, the run's video from the console's own ``video/``), chosen by the app
with the private header :data:`POLICY_HEADER`."""

POLICY_HEADER = "x-console-policy"
"""Set by a route to ``report`` to get :data:`REPORT_CSP`; removed before the response leaves."""

SAFE_METHODS = ("GET", "HEAD")
LOGIN_PATH = "/login"
PAGE_PATH = re.compile(r"/(?:login|runs/[^/]+)?\Z")
"""The pages (paths inside the secret base) another site may navigate a window to: ``/login``, ``/``
(the runs list) and ``/runs/{id}`` (a run's page). Everything else is refused to another site."""
RUN_PAGE = "/runs/"
"""The start of a run's page (a path inside the secret base): the one kind of page a login may lead to
besides the runs list (:func:`landing`)."""
SITES_ALLOWED = ("same-origin", "none")
"""``Sec-Fetch-Site`` values served: the console's own requests, and a URL the person opened themselves."""

log = logging.getLogger("controller.console")


def landing(next_page: str | None) -> str:
    """The page a login leads to, as a path inside the secret base: ``next_page`` when it is a run's
    page, ``/runs/<id>`` with an id a run may have (:func:`controller.console.runs.valid_run_id`:
    letters, digits, ``.``, ``_``, ``-``, not ``.`` or ``..``); else ``/``, the runs list. Nothing else
    is taken from it, so a login link cannot lead off the console or out of its base (``//host/``,
    ``https://host``, ``/s/other/..``, a ``\\``, escapes or control characters all give ``/``)."""
    if next_page and next_page.startswith(RUN_PAGE) and valid_run_id(next_page[len(RUN_PAGE):]):
        return next_page
    return "/"


class Refused(DesktopSandboxError):
    """A request the console does not serve: ``status`` (401, 403), ``code`` and ``message``."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


class Auth:
    """The console's secrets: the one-time login token and the sessions it opened.

    ``port`` (set once the server listens) names the origin and the cookie.
    """

    def __init__(self) -> None:
        self.login_token = secrets.token_urlsafe(32)
        self.base = "/s/" + secrets.token_urlsafe(16)
        """The secret path everything is served under (``/s/<22 urlsafe characters>``, no slash at the end)."""
        self.port: int | None = None
        self._spent = False
        self._sessions: dict[str, str] = {}  # session cookie value -> its CSRF token
        self._lock = threading.Lock()

    @property
    def cookie_name(self) -> str:
        """``ds_console_<port>``: cookies are not kept apart by port, names are."""
        return f"ds_console_{self.port}"

    def origin_ok(self, origin: str | None, host: str) -> bool:
        """Whether ``Origin`` is this console's own origin as the (already checked) ``host`` names it."""
        return origin is not None and hmac.compare_digest(origin.lower().encode(), f"http://{host.lower()}".encode())

    def redeem(self, token: str | None) -> tuple[str, str]:
        """Exchange the login token for a new session; returns ``(cookie value, csrf token)``.
        :class:`Refused` 403 ``invalid_token`` for another token, ``token_spent`` for a second use."""
        given = (token or "").encode()
        if not hmac.compare_digest(given, self.login_token.encode()):
            raise Refused(403, "invalid_token", "this login link is not valid")
        with self._lock:
            if self._spent:
                raise Refused(403, "token_spent", "this login link was already used; start the console again "
                                                  "for a new one")
            self._spent = True
            session, csrf = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
            self._sessions[session] = csrf
        return session, csrf

    def csrf_for(self, cookie: str | None) -> str | None:
        """The CSRF token of the session this cookie value opens, or None (every session compared
        in constant time)."""
        if not cookie:
            return None
        found = None
        with self._lock:
            sessions = list(self._sessions.items())
        for session, csrf in sessions:
            if hmac.compare_digest(cookie.encode(), session.encode()):
                found = csrf
        return found

    def csrf_for_header(self, cookie_header: str) -> str | None:
        """The CSRF token of the first cookie named :attr:`cookie_name` in a raw ``Cookie`` header that
        opens a session (a browser sends every cookie of that name whose path matches), or None."""
        for pair in cookie_header.split(";"):
            name, sep, value = pair.strip().partition("=")
            if sep and name == self.cookie_name:
                csrf = self.csrf_for(value.strip().strip('"'))
                if csrf is not None:
                    return csrf
        return None

    def session_cookie(self, session: str) -> str:
        """The ``Set-Cookie`` value for a new session (scoped to :attr:`base`)."""
        return f"{self.cookie_name}={session}; HttpOnly; SameSite=Strict; Path={self.base}"


def wants_html(headers: Headers) -> bool:
    """Whether the request is a browser's navigation (it accepts HTML): refusals then are a page."""
    return "text/html" in headers.get("accept", "")


def refusal_body(status: int, code: str, message: str, as_html: bool) -> tuple[bytes, str]:
    """``(body, content type)`` of a refusal: the structured JSON error, or a plain page."""
    if as_html:
        page = (f"<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{status}</title></head>"
                f"<body><h1>{status} {html.escape(code)}</h1><p>{html.escape(message)}</p></body></html>")
        return page.encode(), "text/html; charset=utf-8"
    return json.dumps({"error": {"code": code, "message": message}}).encode(), "application/json"


async def send_refusal(send: Send, refused: Refused, as_html: bool) -> None:
    body, ctype = refusal_body(refused.status, refused.code, refused.message, as_html)
    await send({"type": "http.response.start", "status": refused.status,
                "headers": [(b"content-type", ctype.encode()), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


class Guard:
    """ASGI wrapper: checks every request as the module docstring says, passes the session's CSRF
    token on as ``scope["state"]["csrf"]`` and sets :data:`SECURITY_HEADERS` on every response."""

    def __init__(self, app: Callable[..., Awaitable[None]], auth: Auth) -> None:
        self.app, self.auth = app, auth

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await self.websocket(scope, receive, send)
            return
        if scope["type"] != "http":
            return

        async def send_secured(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(raw=list(message.get("headers", [])))
                report = headers.get(POLICY_HEADER) == "report"
                if POLICY_HEADER in headers:
                    del headers[POLICY_HEADER]
                for name, value in SECURITY_HEADERS.items():
                    headers[name] = value
                if report:
                    headers["Content-Security-Policy"] = REPORT_CSP
                message = {**message, "headers": headers.raw}
            await send(message)

        headers = Headers(scope=scope)
        try:
            scope = self.check(scope, headers)
        except Refused as refused:
            log.info("refused %s %s: %d %s", scope.get("method", "-"), self.shown_path(scope["path"]),
                     refused.status, refused.code)
            await send_refusal(send_secured, refused, wants_html(headers))
            return
        await self.app(scope, receive, send_secured)

    async def websocket(self, scope: Scope, receive: Receive, send: Send) -> None:
        """A WebSocket handshake: checked as a GET (:meth:`check`) with the console's own ``Origin``
        required; a refusal is the handshake's answer (the JSON error, before the app sees it, logged as
        for HTTP), the :data:`SECURITY_HEADERS` go with every answer."""
        async def send_secured(message: Message) -> None:
            if message["type"] in ("websocket.accept", "websocket.http.response.start"):
                headers = MutableHeaders(raw=list(message.get("headers", [])))
                for name, value in SECURITY_HEADERS.items():
                    headers[name] = value
                message = {**message, "headers": headers.raw}
            await send(message)

        headers = Headers(scope=scope)
        try:
            checked = self.check({**scope, "method": "GET"}, headers)
            if not self.auth.origin_ok(headers.get("origin"), headers.get("host") or ""):
                raise Refused(403, "bad_origin", "a WebSocket must come from the console's own page (its Origin)")
        except Refused as refused:
            log.info("refused WEBSOCKET %s: %d %s", self.shown_path(scope["path"]), refused.status, refused.code)
            if "websocket.http.response" not in scope.get("extensions", {}):
                await send({"type": "websocket.close", "code": 1008})
                return
            body, ctype = refusal_body(refused.status, refused.code, refused.message, False)
            await send_secured({"type": "websocket.http.response.start", "status": refused.status,
                                "headers": [(b"content-type", ctype.encode()),
                                            (b"content-length", str(len(body)).encode())]})
            await send({"type": "websocket.http.response.body", "body": body})
            return
        del checked["method"]
        await self.app(checked, receive, send_secured)

    def shown_path(self, path: str) -> str:
        """``path`` as a log line shows it: inside the secret base, without the base and percent-encoded
        (no space or control character); ``-`` for any other path."""
        base = self.auth.base
        if hmac.compare_digest(path[:len(base)].encode(), base.encode()) and path[len(base):len(base) + 1] in ("", "/"):
            return quote(path[len(base):] or "/", safe="/")
        return "-"

    @staticmethod
    def check_site(method: str, inner: str, headers: Headers, origin_ok: Callable[[str], bool]) -> None:
        """Refuse a request another site sends (module docstring): :class:`Refused` 403 ``bad_origin``
        for an ``Origin`` that ``origin_ok`` rejects, 403 ``cross_site`` for a ``Sec-Fetch-Site`` other
        than :data:`SITES_ALLOWED` -- unless it is a top-level navigation to a :data:`PAGE_PATH` page."""
        origin = headers.get("origin")
        if origin is not None and not origin_ok(origin):
            raise Refused(403, "bad_origin", "the request's Origin is not the console's")
        site = headers.get("sec-fetch-site")
        if site is None or site.lower() in SITES_ALLOWED:
            return
        navigation = (method in SAFE_METHODS and headers.get("sec-fetch-mode", "").lower() == "navigate"
                      and headers.get("sec-fetch-dest", "").lower() == "document")
        if navigation and PAGE_PATH.match(inner):
            return
        raise Refused(403, "cross_site", "the console serves no data, stream or image to another site's page; "
                                         "open the console's own pages")

    def check(self, scope: Scope, headers: Headers) -> Scope:
        """The request's scope for the app (its path without the secret base, which becomes
        ``root_path``); :class:`Refused` unless the request may reach the app (module docstring)."""
        problem = scope_host_refusal(scope)  # the rule every server of the project keeps
        if problem is not None:
            raise Refused(HOST_REFUSED[0], HOST_REFUSED[1], problem)
        host = headers.get("host")
        base, path = self.auth.base, scope["path"]
        if not (hmac.compare_digest(path[:len(base)].encode(), base.encode())
                and (len(path) == len(base) or path[len(base)] == "/")):
            raise Refused(404, "not_found", "nothing is served here; open the URL the console printed")
        inner = path[len(base):] or "/"
        self.check_site(scope["method"], inner, headers, lambda origin: self.auth.origin_ok(origin, host or ""))
        scope = {**scope, "path": inner, "raw_path": inner.encode()}
        if inner == LOGIN_PATH:
            return scope
        csrf = self.auth.csrf_for_header(headers.get("cookie", ""))
        if csrf is None:
            raise Refused(401, "unauthenticated", "log in with the URL the console printed")
        if scope["method"] not in SAFE_METHODS:
            if not self.auth.origin_ok(headers.get("origin"), host or ""):
                raise Refused(403, "bad_origin", "the request's Origin is not the console's")
            if not hmac.compare_digest(headers.get("x-csrf-token", "").encode(), csrf.encode()):
                raise Refused(403, "bad_csrf", "the request lacks the page's CSRF token")
        scope.setdefault("state", {})["csrf"] = csrf
        return scope
