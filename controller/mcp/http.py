"""The MCP server over streamable HTTP: on 127.0.0.1 only, every request carrying the bearer key.

The ASGI app, outermost first:

1. :class:`wire.connections.ConnectionGuard` (the project's connection rules): a ``Host`` that does not
   name the server (``127.0.0.1:PORT`` or ``localhost:PORT``) is refused 403 ``bad_host`` before
   anything else, so a page whose name was rebound to 127.0.0.1 (DNS rebinding) reaches nothing;
2. :class:`BearerGate`: a request without exactly one ``Authorization: Bearer <key>`` with the server's
   key (compared in constant time) is refused 401 ``unauthorized`` (``WWW-Authenticate: Bearer``);
3. :class:`HandshakeOnly`: a request of the session-less 2026-07-28 era (an ``MCP-Protocol-Version``
   header that is not a handshake version) is answered 400 with a JSON-RPC error, so a client in ``auto``
   mode falls back to the initialize handshake and gets a session (a sandbox lives as long as one);
4. the ``mcp`` package's streamable-HTTP app at ``/mcp``, with its own DNS-rebinding protection on
   (``Host`` and ``Origin`` must name this server) and its stateful sessions (``Mcp-Session-Id``; a
   session ends with the client's ``DELETE``, after ``idle_timeout_s`` without a request or an open
   stream, or when the server stops).

The key (:func:`controller.agents_api.server.load_or_make_key`): read from the key file, or a new random
one written there (mode 0600) when it does not exist; it is never printed, logged or passed in argv.
"""

from __future__ import annotations

import json
from typing import Any, Awaitable, Callable

from mcp.server.transport_security import TransportSecuritySettings
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS

from wire.connections import ConnectionGuard, bearer_matches, error_body

HOST = "127.0.0.1"
PATH = "/mcp"
"""Where the MCP endpoint is served."""

ASGIApp = Callable[[dict[str, Any], Any, Any], Awaitable[None]]


async def _json(send: Any, status: int, body: dict[str, Any], headers: list[tuple[bytes, bytes]] = ()) -> None:
    data = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()),
                            *headers]})
    await send({"type": "http.response.body", "body": data})


class BearerGate:
    """ASGI wrapper: 401 unless the request carries ``Authorization: Bearer <key>`` (module docstring)."""

    def __init__(self, app: ASGIApp, key: str) -> None:
        self.app = app
        self.expected = key.encode()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and not bearer_matches(scope.get("headers") or (), self.expected):
            await _json(send, 401, error_body(401, "unauthorized", "this server needs Authorization: Bearer <key> "
                                                                "(the key is in the server's key file)"),
                        [(b"www-authenticate", b"Bearer")])
            return
        await self.app(scope, receive, send)


class HandshakeOnly:
    """ASGI wrapper: a request naming a protocol version outside the handshake era is refused with a
    JSON-RPC error (400), which a client probing ``server/discover`` takes as "use initialize"."""

    HEADER = b"mcp-protocol-version"

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            versions = [v.decode("latin-1") for k, v in scope.get("headers") or () if k.lower() == self.HEADER]
            if versions and versions[0] not in HANDSHAKE_PROTOCOL_VERSIONS:
                await _json(send, 400, {"jsonrpc": "2.0", "id": None, "error": {
                    "code": -32600,
                    "message": "this server keeps a desktop sandbox per session: connect with the initialize "
                               f"handshake (protocol versions {', '.join(HANDSHAKE_PROTOCOL_VERSIONS)})"}})
                return
        await self.app(scope, receive, send)


def security_settings(port: int) -> TransportSecuritySettings:
    """The ``mcp`` package's DNS-rebinding protection for a server on 127.0.0.1:``port``: the ``Host``
    and any ``Origin`` must name it."""
    hosts = [f"{HOST}:{port}", f"localhost:{port}"]
    return TransportSecuritySettings(enable_dns_rebinding_protection=True, allowed_hosts=hosts,
                                     allowed_origins=[f"http://{h}" for h in hosts])


def guarded_app(mcp_app: ASGIApp, key: str) -> ASGIApp:
    """``mcp_app`` behind the Host check, the key and the era check (module docstring)."""
    return ConnectionGuard(BearerGate(HandshakeOnly(mcp_app), key), token=key,
                           error=lambda status, code, message: error_body(status, code, message))


__all__ = ["BearerGate", "HOST", "HandshakeOnly", "PATH", "guarded_app", "security_settings"]
