"""What the controller's two HTTP servers (the web console, ``controller.console``; the Agents API,
``controller.agents_api``) share: uvicorn run on a thread that says when it listens, and a request body
read under a size cap. The connection rules they keep with every other server of the project (head
deadline, body floor, the cap on unauthenticated connections, ``Host``) are :mod:`wire.connections`."""

from __future__ import annotations

import re
import threading
from typing import Any

import uvicorn
from starlette.requests import Request

from controller import json_semantics
from controller.model.errors import DesktopSandboxError

_SURROGATE = re.compile("[\ud800-\udfff]")


class BodyTooLarge(DesktopSandboxError):
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


def text_problem(value: Any) -> str | None:
    """Why a parsed JSON value is not text all through, or None: a lone UTF-16 surrogate (the escape
    ``\\ud800``, which no text holds and UTF-8 cannot encode) in any string or object key."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if _SURROGATE.search(item):
                return "a string holds a lone UTF-16 surrogate (not text)"
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return None


async def read_json(request: Request, max_bytes: int) -> Any:
    """The request's body (:func:`read_capped`) as strict JSON (:func:`controller.json_semantics.loads`)
    whose strings are text (:func:`text_problem`). Raises :class:`BodyTooLarge`, or ValueError (also for
    a body that is not UTF-8, or nests past the parser's depth) with the reason."""
    body = await read_capped(request, max_bytes)
    try:
        value = json_semantics.loads(body.decode("utf-8"))
    except UnicodeDecodeError:
        raise ValueError("the body is not UTF-8") from None
    except RecursionError:
        raise ValueError("the body nests too deeply") from None
    problem = text_problem(value)
    if problem:
        raise ValueError(problem)
    return value
