"""One log line per HTTP request, written after the response has gone out.

:class:`AccessLog` wraps an ASGI app. When the app has sent its whole response it logs, on the
``guest.access`` logger at INFO, ``CLIENT "METHOD PATH?QUERY" STATUS MS`` (``MS``: wall time of the
request in milliseconds). Only the request line and the status are used, never headers or bodies, so
the bearer token and typed text cannot reach the log. The path is percent-quoted (as uvicorn's own
access log does) so a crafted URL cannot forge log lines.

Logging after the response, rather than when the status line is written (uvicorn's access log),
keeps the formatting and the write to stderr off the client's critical path: a client waiting for
one answer before sending the next request never waits for the log.
"""

from __future__ import annotations

import logging
import time
import urllib.parse
from collections.abc import Awaitable, Callable
from typing import Any

log = logging.getLogger("guest.access")

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class AccessLog:
    """ASGI middleware: ``app`` answered as before, then one access line per HTTP request."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not log.isEnabledFor(logging.INFO):
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500  # what the server answers when the app fails before sending a status

        async def send_and_note(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_note)
        finally:
            client = scope.get("client")
            path = urllib.parse.quote(scope["path"])
            query = scope.get("query_string", b"")
            if query:
                path += "?" + query.decode("ascii", "replace")
            log.info('%s "%s %s" %d %.1f', f"{client[0]}:{client[1]}" if client else "-", scope["method"],
                     path, status, (time.perf_counter() - start) * 1000.0)
