"""What the controller's two HTTP servers (the web console, ``controller.console``; the Agents API,
``controller.agents_api``) share: uvicorn run on a thread that says when it listens, and a request body
read under a size cap."""

from __future__ import annotations

import threading

import uvicorn
from starlette.requests import Request


class BodyTooLarge(Exception):
    """A request body over the cap (declared in ``Content-Length``, or counted while it arrives)."""


class ThreadedUvicorn(uvicorn.Server):
    """uvicorn's server telling the thread that started it when it listens: ``ready`` is set once
    startup is over, also when it gave up (then ``started`` stays False)."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.ready = threading.Event()

    async def startup(self, sockets: list | None = None) -> None:
        try:
            await super().startup(sockets)
        finally:
            self.ready.set()


async def read_capped(request: Request, max_bytes: int) -> bytes:
    """The request's body, at most ``max_bytes`` bytes: a ``Content-Length`` that is not a plain decimal
    or declares more is refused before any of the body is read, and the body is counted as it arrives
    (chunked, or a lying length), so more is never held. Raises :class:`BodyTooLarge`."""
    declared = request.headers.get("content-length")
    if declared is not None and (not (declared.isascii() and declared.isdigit()) or int(declared) > max_bytes):
        raise BodyTooLarge()
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > max_bytes:
            raise BodyTooLarge()
    return bytes(body)
