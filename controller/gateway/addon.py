"""mitmproxy addon that enforces a :class:`~controller.gateway.policy.NetworkPolicy` on every connection.

Where it decides (mitmproxy hooks):

* ``http_connect`` — a CONNECT ``host:port`` is the origin ``https://host:port``; denied => 403.
* ``tls_clienthello`` — TLS inside an allowed tunnel is passed through untouched (no interception, no
  CA in the guest) only when the ClientHello's SNI names the CONNECT host (or is absent for an IP-literal
  host); otherwise the tunnel is closed before any upstream connection is made.
* ``requestheaders`` — every plain-HTTP request (absolute-form, or plaintext inside a tunnel) is
  judged on its own URL, so redirects and sub-resources to a denied origin are denied one by one; a
  Host header cannot redirect a request, because the connection goes to the decided address.
* ``server_connect`` — the single point where upstream TCP connections open. A connection opens only
  when an allow decision for this client and exactly this (host, port) exists, and it is re-pointed to
  the address that decision checked (no second lookup, so DNS rebinding cannot swap it). Anything else
  is killed.

Each decision is appended, one JSON object a line, to the decision log (see
:class:`~controller.gateway.policy.Decision`, the model the controller reads the log back with). Denied HTTP requests get ``403`` with a one-line
``text/plain`` body ``denied by sandbox egress policy: <reason>``.
"""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path
from typing import Optional

from mitmproxy import connection, http, tls
from mitmproxy.proxy import server_hooks

from controller.gateway.policy import Decision, NetworkPolicy, Origin, PolicyError, Resolver, system_resolver

DENIED_STATUS = 403
DENIED_PREFIX = "denied by sandbox egress policy: "


def _client_text(client: connection.Client) -> Optional[str]:
    peer = client.peername
    if not peer:
        return None
    host, port = peer[0], peer[1]
    return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"


class DecisionLog:
    """Append-only JSONL writer; each line is flushed and fsync'd so a collector never sees a torn line.

    ``path`` None writes nowhere (decisions are still returned and kept in ``recent``).
    """

    def __init__(self, path: Optional[Path]) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._file = None
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(path, "a", encoding="utf-8")

    def write(self, decision: Decision) -> None:
        """Append one decision as a JSON line."""
        if self._file is None:
            return
        line = decision.model_dump_json(exclude_none=True) + "\n"
        with self._lock:
            self._file.write(line)
            self._file.flush()
            os.fsync(self._file.fileno())

    def close(self) -> None:
        """Close the file (idempotent)."""
        if self._file is not None:
            self._file.close()
            self._file = None


class EgressPolicy:
    """The addon. ``policy``: the policy to enforce; ``log_path``: JSONL decision log (None: no file);
    ``resolver``: name resolution used for decisions (defaults to getaddrinfo in this process)."""

    def __init__(
        self,
        policy: NetworkPolicy,
        log_path: Optional[Path] = None,
        resolver: Resolver = system_resolver,
    ) -> None:
        self.policy = policy
        self.log = DecisionLog(log_path)
        self.resolver = resolver
        # (client id, host as the proxy will connect to it, port) -> allow decision with its checked address
        self._allowed: dict[tuple[str, str, int], Decision] = {}
        # server connection id -> CONNECT origin (for the SNI check)
        self._tunnels: dict[str, Origin] = {}
        # server connection ids whose tunnel failed the SNI check
        self._refused_tunnels: set[str] = set()

    # -- helpers ----------------------------------------------------------------------------------

    async def _decide(self, scheme: str, host: str, port: int, client: connection.Client, via: str) -> Decision:
        decision = await asyncio.to_thread(
            self.policy.decide, scheme, host, port, client=_client_text(client), via=via, resolver=self.resolver
        )
        self.log.write(decision)
        if decision.allowed:
            self._allowed[(client.id, host, port)] = decision
        return decision

    def _record(self, origin: str, reason: str, client: connection.Client, via: str) -> None:
        self.log.write(Decision(origin=origin, decision="deny", reason=reason, client=_client_text(client), via=via))

    @staticmethod
    def _deny_response(flow: http.HTTPFlow, reason: str) -> None:
        flow.response = http.Response.make(
            DENIED_STATUS,
            (DENIED_PREFIX + reason + "\n").encode("utf-8", "replace"),
            {"Content-Type": "text/plain; charset=utf-8", "Connection": "close"},
        )

    # -- hooks ------------------------------------------------------------------------------------

    async def http_connect(self, flow: http.HTTPFlow) -> None:
        """CONNECT host:port => origin https://host:port; denied => 403 and no upstream connection."""
        request = flow.request
        decision = await self._decide("https", request.host, request.port, flow.client_conn, "connect")
        if not decision.allowed:
            self._deny_response(flow, decision.reason)
            return
        try:
            self._tunnels[flow.server_conn.id] = Origin.from_parts("https", request.host, request.port)
        except PolicyError:  # pragma: no cover - decide() already parsed it
            self._deny_response(flow, "invalid-origin")

    def tls_clienthello(self, data: tls.ClientHelloData) -> None:
        """Pass TLS through untouched when SNI names the tunnel's host; otherwise refuse the tunnel."""
        server = data.context.server
        origin = self._tunnels.get(server.id)
        sni = data.client_hello.sni
        data.ignore_connection = True  # never intercept; a refused tunnel is killed in server_connect
        if origin is None:
            self._refused_tunnels.add(server.id)
            self._record("tls://" + (sni or "?"), "tls-outside-tunnel", data.context.client, "tls")
            return
        if sni is None:
            if origin.is_ip_literal:
                return
            reason = "sni-missing"
        else:
            try:
                if Origin.from_parts("https", sni, origin.port) == origin:
                    return
                reason = f"sni-mismatch: {sni}"
            except PolicyError:
                reason = "sni-invalid"
        self._refused_tunnels.add(server.id)
        self._record(str(origin), reason, data.context.client, "tls")

    async def requestheaders(self, flow: http.HTTPFlow) -> None:
        """Judge every plain HTTP request on its own scheme, host and port."""
        request = flow.request
        if flow.response is not None:
            return
        decision = await self._decide(request.scheme, request.host, request.port, flow.client_conn, "request")
        if not decision.allowed:
            self._deny_response(flow, decision.reason)

    def server_connect(self, data: server_hooks.ServerConnectionHookData) -> None:
        """Open only connections an allow decision covers, to the address that decision checked."""
        server = data.server
        if server.address is None:
            return
        host, port = server.address[0], server.address[1]
        if server.id in self._refused_tunnels:
            server.error = "tunnel refused by egress policy"
            return
        decision = self._allowed.get((data.client.id, host, port))
        if decision is None or decision.address is None:
            server.error = "no allow decision for this connection"
            self._record(f"tcp://{host}:{port}", "no-allow-decision", data.client, "server")
            return
        server.address = (decision.address, port)

    def client_disconnected(self, client: connection.Client) -> None:
        """Forget this client's decisions."""
        for key in [k for k in self._allowed if k[0] == client.id]:
            del self._allowed[key]

    def server_disconnected(self, data: server_hooks.ServerConnectionHookData) -> None:
        """Forget per-connection tunnel state."""
        self._tunnels.pop(data.server.id, None)
        self._refused_tunnels.discard(data.server.id)

    def done(self) -> None:
        """mitmproxy shutdown: close the log."""
        self.log.close()


__all__ = ["DENIED_PREFIX", "DENIED_STATUS", "DecisionLog", "EgressPolicy"]
