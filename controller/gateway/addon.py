"""mitmproxy addon that enforces a :class:`~controller.gateway.policy.NetworkPolicy` on every connection.

Where it decides (mitmproxy hooks):

* ``http_connect`` — a CONNECT ``host:port`` is the origin ``https://host:port``; denied => 403. A
  ``Host`` header on the CONNECT, when there is one, must name that origin too.
* ``tls_clienthello`` — TLS inside an allowed tunnel is passed through untouched (no interception, no
  CA in the guest) only when the ClientHello's SNI names the CONNECT host (or is absent for an IP-literal
  host); otherwise the tunnel is closed before any upstream connection is made.
* ``requestheaders`` — every plain-HTTP request (absolute-form, or plaintext inside a tunnel) is
  judged on its own URL, so redirects and sub-resources to a denied origin are denied one by one.
* ``server_connect`` — the single point where upstream TCP connections open. A connection opens only
  when an allow decision for this client and exactly this (host, port) exists, and it is re-pointed to
  the address that decision checked (no second lookup, so DNS rebinding cannot swap it). Anything else
  is killed.

Every field that names a destination must agree with the origin that was decided. The TCP connection
goes to the decided address whatever the request says, but the server there may host many sites (virtual
hosting, a CDN) and picks one by the ``Host`` header or HTTP/2 ``:authority``: a request whose Host
named another site would reach a site that was never allowed. So an allowed request is refused
(``host-mismatch: ...``, see :func:`~controller.gateway.policy.destination_mismatch`) unless its single
Host header, its request target's authority (absolute-form inside a tunnel, HTTP/2 ``:authority``) and,
inside a CONNECT tunnel, the tunnel's host and port all name the decided origin by the policy's
canonicalisation (:class:`~controller.gateway.policy.Origin`). The absolute URI of a proxied request is
the decided origin itself; the SNI check above covers TLS.

Mode ``ask`` (:meth:`~controller.gateway.policy.NetworkPolicy.evaluate`): a CONNECT or a plain-HTTP
request to an origin of the ``ask`` tier is held (``flow.intercept()``) on the origin's one pending
request in :class:`~controller.gateway.holds.OriginRequests` until a person answers through the control
API (:mod:`controller.gateway.control`) or the deadline passes. Approve resumes every held connection
to the address checked before holding (pinned like any allow); deny, cancel and timeout answer each
403. A client that closes a held connection is logged ``client_gone``; a connection still held when the
gateway stops is refused and logged ``gateway_stopped`` (its line written before the log closes).

Each decision is appended, one JSON object a line, to the decision log (see
:class:`~controller.gateway.policy.Decision`, the model the controller reads the log back with): one
line per request or tunnel, a host mismatch logged as a deny in place of the allow; a held connection
gets its line when it ends, with ``request_id`` and ``held_ms``. Denied HTTP requests (and CONNECTs)
get ``403`` with a one-line ``text/plain`` body ``denied by sandbox egress policy: <reason>``.

Recorded web origins (:mod:`controller.gateway.web`, switched by the control API's ``/v1/web``): in mode
``record`` the response of each allowed plain-HTTP request is kept by the rules of
:class:`~controller.gateway.web.WebStore` (captured as it streams to the guest, never beyond the per-body
cap; an allowed CONNECT counted ``tunnel``); in mode ``serve`` names resolve only to the recording's
addresses, an allowed request is answered from the recording or denied ``not_recorded``, a CONNECT is
denied ``tunnel_not_recorded``, and ``server_connect`` opens nothing (``offline_web``).
"""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path
import ipaddress
from typing import Any, Callable, Optional

from mitmproxy import connection, http, tls
from mitmproxy.proxy import server_hooks

from controller.gateway.holds import OriginRequests, Outcome, Via
from controller.gateway.policy import (
    Decision, NetworkPolicy, Origin, OwnEndpoint, PolicyError, Resolver, Verdict, destination_mismatch,
    system_resolver,
)
from controller.gateway.web import (
    NO_UPSTREAM, NOT_RECORDED, TUNNEL_NOT_RECORDED, WebStore, canonical_url, recorded_headers, request_skip,
    response_skip,
)
from controller.text import clean

DENIED_STATUS = 403
DENIED_PREFIX = "denied by sandbox egress policy: "

HELD_REASONS = {"approved": "approved", "denied": "user_denied", "cancelled": "cancelled", "timeout": "timeout",
                "client_gone": "client_gone", "gateway_stopped": "gateway_stopped"}
"""Decision reason of a held connection, by how it ended (:class:`~controller.gateway.holds.Outcome`)."""

WEB_CAPTURE = "desktop_sandbox_web"
"""``flow.metadata`` key of a response being recorded (mode record): what is kept of it so far."""


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
    ``resolver``: name resolution used for decisions (defaults to getaddrinfo in this process);
    ``own_endpoint``: which (address, port) pairs are the gateway itself (refused whatever the policy
    says). ``requests``: the origin requests held connections wait on (mode ask; the control API serves
    them). ``web``: the recorded web origins (:class:`~controller.gateway.web.WebStore`; the control API
    switches its mode)."""

    def __init__(
        self,
        policy: NetworkPolicy,
        log_path: Optional[Path] = None,
        resolver: Resolver = system_resolver,
        own_endpoint: Optional[OwnEndpoint] = None,
        close_client: Optional[Callable[[str], bool]] = None,
        web: Optional[WebStore] = None,
    ) -> None:
        self.policy = policy
        self.web = web if web is not None else WebStore()
        self.web.on_serve = self._end_upstream
        self.close_client = close_client or _close_live_client
        self.log = DecisionLog(log_path)
        self.resolver = resolver
        self.own_endpoint = own_endpoint
        self.requests = OriginRequests(policy.hold_timeout, policy.pending_limit)
        # (client id, host as the proxy will connect to it, port) -> allow decision with its checked address
        self._allowed: dict[tuple[str, str, int], Decision] = {}
        # server connection id -> CONNECT origin (for the SNI check)
        self._tunnels: dict[str, Origin] = {}
        # server connection ids whose tunnel failed the SNI check
        self._refused_tunnels: set[str] = set()
        # connections held now: id(ticket) -> the decision fields of its line (origin, client, via)
        self._held: dict[int, dict[str, Optional[str]]] = {}

    # -- the policy, replaced at runtime -----------------------------------------------------------

    def set_policy(self, policy: NetworkPolicy) -> dict[str, Any]:
        """Enforce ``policy`` from now on (call on the proxy's event loop: the control API does). Every
        decision after this call is the new policy's. Connections opened under the old one that the new
        one refuses (their origin no longer admitted, or the address they were pinned to now refused)
        are closed, client connection and all, each logged as a deny ``policy_swapped``; pending
        origin requests the new policy does not ask about are answered ``cancelled`` by ``policy``
        (their held connections are refused). A connection whose verdict was still being made is
        judged again under the new policy; one whose held request was approved but that had not resumed
        yet is refused ``policy_swapped`` unless the new policy admits it (:meth:`_decide`). Returns
        ``{"policy": the policy as JSON, "closed": n, "pending_refused": n}``."""
        self.policy = policy
        pending_refused = self.requests.reconfigure(policy.hold_timeout, policy.pending_limit,
                                                    lambda origin: policy.ask_match(origin) is not None
                                                    and not policy.admits_origin(origin))
        refused_clients: dict[str, Decision] = {}
        for (client_id, _host, _port), decision in list(self._allowed.items()):
            if client_id not in refused_clients and not self._still_allowed(decision):
                refused_clients[client_id] = decision
        closed = 0
        for client_id, decision in refused_clients.items():
            for key in [k for k in self._allowed if k[0] == client_id]:
                del self._allowed[key]
            self.log.write(Decision(origin=decision.origin, decision="deny", reason="policy_swapped",
                                    client=decision.client, via="policy"))
            if self.close_client(client_id):
                closed += 1
        return {"policy": policy.model_dump(mode="json"), "closed": closed, "pending_refused": pending_refused}

    def _still_allowed(self, decision: Decision) -> bool:
        """Whether an allow decision made under an earlier policy holds under the current one: its origin
        in the allow tier (or, in mode ask, an approved origin the ask tier still names) and its pinned
        address not refused."""
        try:
            origin = Origin.parse(decision.origin)
            address = ipaddress.ip_address(decision.address or "")
        except (PolicyError, ValueError):
            return False
        if not self.policy.admits_origin(origin):
            remembered = self.requests.memory(origin)
            if not (remembered and remembered[0] == "approved" and self.policy.ask_match(origin) is not None):
                return False
        return self.policy.address_refusal(address) is None

    # -- helpers ----------------------------------------------------------------------------------

    async def _decide(
        self,
        flow: http.HTTPFlow,
        scheme: str,
        host: str,
        port: int,
        via: str,
        hold_via: Via,
        mismatch: Callable[[Origin], Optional[str]],
    ) -> Decision:
        """The decision on (scheme, host, port) for ``flow``'s client: the policy's verdict; an allow
        (or an ask) becomes a deny with the reason ``mismatch(origin)`` gives when that is not None; an
        ask holds ``flow`` until its request is answered (:meth:`_hold`, ``hold_via`` names how it came).
        Logged once; an allow is kept for ``server_connect``.

        A policy swapped in while the verdict was being made (the name lookup runs on a worker thread)
        makes it again under the new policy; one swapped in while the connection was held refuses an
        approval the new policy no longer admits (``policy_swapped``).

        Serving a web recording, names resolve to the recording's addresses only: a name it does not
        hold is denied ``not_recorded`` (a CONNECT ``tunnel_not_recorded``)."""
        client = flow.client_conn
        while True:
            policy, serving = self.policy, self.web.serving
            verdict: Verdict = await asyncio.to_thread(
                policy.evaluate, scheme, host, port, client=_client_text(client), via=via,
                resolver=self.web.resolve if serving else self.resolver,
                memory=self.requests.memory, own_endpoint=self.own_endpoint,
            )
            if self.policy is policy and self.web.serving == serving:
                break
        decision = verdict.decision
        if serving and not decision.allowed and decision.reason.startswith("resolve-failed"):
            decision = Decision(origin=decision.origin, decision="deny",
                                reason=TUNNEL_NOT_RECORDED if via == "connect" else NOT_RECORDED,
                                client=decision.client, via=via, detail="the recording holds no address for it")
        if verdict.action != "deny":
            try:
                reason = mismatch(verdict.origin or Origin.from_parts(scheme, host, port))
            except PolicyError as exc:  # pragma: no cover - evaluate() already parsed it
                reason = f"invalid-origin: {exc}"
            if reason is not None:
                decision = Decision(origin=decision.origin, decision="deny", reason=reason, client=decision.client,
                                    via=via)
            elif verdict.action == "ask":
                decision = await self._hold(flow, verdict, hold_via)
                if decision.reason == HELD_REASONS["gateway_stopped"]:
                    return decision  # refused by the stop, its line written then (done)
                if decision.allowed and self.policy is not policy and not self._still_allowed(decision):
                    decision = Decision(origin=decision.origin, decision="deny", reason="policy_swapped",
                                        client=decision.client, via=via, request_id=decision.request_id,
                                        held_ms=decision.held_ms)
        self.log.write(decision)
        if decision.allowed:
            self._allowed[(client.id, host, port)] = decision
        return decision

    async def _hold(self, flow: http.HTTPFlow, verdict: Verdict, hold_via: Via) -> Decision:
        """Hold ``flow`` (an ``ask`` verdict) on its origin's pending request until it ends; the decision
        it ends with. An answer that came while the verdict was being made counts at once
        (``approved_earlier`` / ``denied_earlier``); a new origin while ``max_pending`` others wait is a
        deny ``prompt_limit``. An approval allows the address the verdict checked."""
        assert verdict.origin is not None and verdict.address is not None
        base = verdict.decision
        fields = dict(origin=base.origin, client=base.client, via=base.via)
        remembered = self.requests.memory(verdict.origin)
        if remembered is not None:
            if remembered[0] == "approved":
                return Decision(decision="allow", reason="approved_earlier", address=verdict.address,
                                request_id=remembered[1], **fields)
            return Decision(decision="deny", reason="denied_earlier", request_id=remembered[1], **fields)
        ticket = self.requests.join(verdict.origin, hold_via, flow.client_conn.id)
        if ticket is None:
            return Decision(decision="deny", reason="prompt_limit", **fields)
        self._held[id(ticket)] = fields
        flow.intercept()
        try:
            outcome = await ticket.wait()
        finally:
            self._held.pop(id(ticket), None)
            if flow.intercepted:
                flow.resume()
        return self._held_decision(outcome, fields, verdict.address)

    @staticmethod
    def _held_decision(outcome: Outcome, fields: dict[str, Optional[str]], address: Optional[str]) -> Decision:
        """The decision line of a held connection that ended with ``outcome`` (an approval allows the
        ``address`` checked before holding)."""
        reason = HELD_REASONS.get(outcome.state, "timeout")
        if reason == "approved":
            return Decision(decision="allow", reason=reason, address=address, request_id=outcome.request_id,
                            held_ms=outcome.held_ms, **fields)
        return Decision(decision="deny", reason=reason, request_id=outcome.request_id, held_ms=outcome.held_ms,
                        **fields)

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

    @staticmethod
    def _fields(request: http.Request) -> tuple[list[str], Optional[str]]:
        """(every Host header value, the request target's authority or HTTP/2 ``:authority``, None when
        absent) of ``request``, as the client sent them (bytes read as UTF-8, undecodable bytes kept as
        surrogates, which no host accepts)."""
        authority = request.data.authority.decode("utf-8", "surrogateescape") or None
        return list(request.headers.get_all("Host")), authority

    async def http_connect(self, flow: http.HTTPFlow) -> None:
        """CONNECT host:port => origin https://host:port; denied => 403 and no upstream connection. A Host
        header naming another origin, or more than one, is a deny (``host-mismatch: ...``)."""
        request = flow.request
        hosts, authority = self._fields(request)

        def mismatch(origin: Origin) -> Optional[str]:
            return destination_mismatch(origin, hosts=hosts, authority=authority, host_required=False)

        def offline(origin: Origin) -> Optional[str]:
            return TUNNEL_NOT_RECORDED if self.web.serving else mismatch(origin)

        decision = await self._decide(flow, "https", request.host, request.port, "connect", "CONNECT", offline)
        if not decision.allowed:
            self._web_missing(decision)
            self._deny_response(flow, decision.reason)
            return
        if self.web.recording:
            self.web.skip("tunnel")
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
        """Judge every plain HTTP request on its own scheme, host and port (for an absolute-form request:
        its URI; inside a tunnel: the tunnel's host and port). Allowed only when its Host header (exactly
        one for HTTP/1), its target's authority or ``:authority``, and inside a tunnel the tunnel's host
        and port, all name that origin; otherwise a deny (``host-mismatch: ...``)."""
        request = flow.request
        if flow.response is not None:
            return
        hosts, authority = self._fields(request)
        tunnel = self._tunnels.get(flow.server_conn.id)
        required = not (request.is_http2 or request.is_http3)

        def mismatch(origin: Origin) -> Optional[str]:
            if tunnel is not None and (tunnel.host, tunnel.port) != (origin.host, origin.port):
                return f"host-mismatch: request for {origin} inside the tunnel to {clean(str(tunnel), 80)}"
            refused = destination_mismatch(origin, hosts=hosts, authority=authority, host_required=required)
            if refused is None and self.web.serving and self._recorded(flow, tunnel) is None:
                return NOT_RECORDED
            return refused

        decision = await self._decide(flow, request.scheme, request.host, request.port, "request", "http", mismatch)
        if not decision.allowed:
            self._web_missing(decision)
            self._deny_response(flow, decision.reason)
        elif self.web.serving:
            self._serve(flow, tunnel)
        elif self.web.recording and tunnel is None:
            flow.metadata[WEB_CAPTURE] = self.web.begin({"origin": decision.origin, "address": decision.address})

    # -- recorded web origins ---------------------------------------------------------------------

    @staticmethod
    def _url(flow: http.HTTPFlow) -> Optional[str]:
        request = flow.request
        return canonical_url(request.scheme, request.host, request.port, request.path)

    @staticmethod
    def _has_body(request: http.Request) -> bool:
        """Whether ``request`` carries a body, or announces one in its headers."""
        length = request.headers.get("content-length", "0").strip()
        return bool(request.raw_content) or "transfer-encoding" in request.headers or length not in ("", "0")

    def _recorded(self, flow: http.HTTPFlow, tunnel: Optional[Origin]) -> Any:
        """The recorded response ``flow``'s request would be served now (mode serve), or None: none for
        a request inside a tunnel, nor for one that would not have been recorded."""
        request = flow.request
        if tunnel is not None or request_skip(request.method, request.headers.keys(), self._has_body(request)):
            return None
        return self.web.recorded(request.method, self._url(flow))

    def _serve(self, flow: http.HTTPFlow, tunnel: Optional[Origin]) -> None:
        """Answer an allowed request from the recording (mode serve): its recorded status, headers and
        body as they came; a recording that changed meanwhile (a new one put): ``not_recorded``."""
        found = self.web.take(flow.request.method, self._url(flow)) if self._recorded(flow, tunnel) else None
        if found is None:  # the recording was replaced while the request was being decided
            self.web.missing += 1
            self._record(str(Origin.from_parts("http", flow.request.host, flow.request.port))
                         if flow.request.scheme == "http" else flow.request.pretty_url, NOT_RECORDED,
                         flow.client_conn, "request")
            self._deny_response(flow, NOT_RECORDED)
            return
        response, body = found
        headers = [(name.encode("ascii"), value.encode("ascii")) for name, value in response.headers]
        flow.response = http.Response.make(response.status, b"", headers)
        flow.response.raw_content = body  # as recorded: never decoded nor encoded again
        flow.response.headers["content-length"] = str(len(body))

    def _web_missing(self, decision: Decision) -> None:
        if decision.reason in (NOT_RECORDED, TUNNEL_NOT_RECORDED):
            self.web.missing += 1

    def _end_upstream(self) -> int:
        """Mode serve was entered (:attr:`~controller.gateway.web.WebStore.on_serve`): every client
        connection that had an allow decision -- so may hold an upstream connection or an HTTPS tunnel
        opened before -- is closed, upstream and all, each logged as a deny ``offline_web`` (via
        ``policy``). Returns how many were closed."""
        closed: dict[str, Decision] = {}
        for key, decision in list(self._allowed.items()):
            closed.setdefault(key[0], decision)
            del self._allowed[key]
        for client_id, decision in closed.items():
            self.log.write(Decision(origin=decision.origin, decision="deny", reason=NO_UPSTREAM,
                                    client=decision.client, via="policy",
                                    detail="a connection opened before the recording was served: closed"))
            self.close_client(client_id)
        return len(closed)

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        """Mode record: decide whether the response of an allowed plain-HTTP request is kept (the rules of
        :mod:`controller.gateway.web`); if so, capture its body as it streams to the guest, within the
        per-body and the total cap (:class:`~controller.gateway.web.Capture`; a body declared larger than
        the per-body cap is streamed and skipped ``too_large`` at once)."""
        capture = flow.metadata.get(WEB_CAPTURE)
        if capture is None or flow.response is None:
            return
        if not capture.current:
            del flow.metadata[WEB_CAPTURE]
            flow.response.stream = True
            return
        request, response = flow.request, flow.response
        reason = (request_skip(request.method, request.headers.keys(), self._has_body(request))
                  or response_skip(response.status_code, response.headers.keys())
                  or (None if self._url(flow) is not None else "url"))
        declared = response.headers.get("content-length", "").strip()
        if reason is None and declared.isdigit() and int(declared) > self.web.max_body_bytes:
            reason = "too_large"
        if reason is not None:
            self.web.skip(reason)
            del flow.metadata[WEB_CAPTURE]
            response.stream = True
            return
        capture.meta.update(method=request.method, url=self._url(flow), status=response.status_code,
                            headers=recorded_headers(response.headers.items(multi=True)))

        def keep(chunk: bytes) -> bytes:
            capture.feed(chunk)
            return chunk

        response.stream = keep

    def response(self, flow: http.HTTPFlow) -> None:
        """Mode record: keep the whole response whose body was captured (:meth:`responseheaders`); a
        response that ended in an error never reaches here (:meth:`error` drops it), so nothing partial
        is kept."""
        capture = flow.metadata.pop(WEB_CAPTURE, None)
        if capture is None:
            return
        if flow.response is None or "status" not in capture.meta:  # never reached responseheaders' capture
            capture.abandon()
            return
        # streamed through keep(); a response without a body (HEAD, an empty one) ends at its headers
        capture.finish(flow.response.raw_content or b"")

    def error(self, flow: http.HTTPFlow) -> None:
        """A flow that ended in an error (the origin or the guest closed it mid-body): what was captured of
        it is dropped, its bytes given back to the recording's caps."""
        capture = flow.metadata.pop(WEB_CAPTURE, None)
        if capture is not None:
            capture.abandon()

    def server_connect(self, data: server_hooks.ServerConnectionHookData) -> None:
        """Open only connections an allow decision covers, to the address that decision checked."""
        server = data.server
        if server.address is None:
            return
        host, port = server.address[0], server.address[1]
        if self.web.serving:
            server.error = "serving a web recording: no upstream connection"
            self._record(f"tcp://{host}:{port}", NO_UPSTREAM, data.client, "server")
            return
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
        """Forget this client's decisions; a connection of it still held ends ``client_gone``."""
        self.requests.client_gone(client.id)
        for key in [k for k in self._allowed if k[0] == client.id]:
            del self._allowed[key]

    def server_disconnected(self, data: server_hooks.ServerConnectionHookData) -> None:
        """Forget per-connection tunnel state."""
        self._tunnels.pop(data.server.id, None)
        self._refused_tunnels.discard(data.server.id)

    def done(self) -> None:
        """mitmproxy shutdown: every connection still held is refused (``gateway_stopped``), each with its
        decision line written now, while the log is open; then the log is closed."""
        for ticket in self.requests.close():
            fields = self._held.pop(id(ticket), None)
            if fields is not None and ticket.future.done():
                self.log.write(self._held_decision(ticket.future.result(), fields, None))
        self.log.close()


def _close_live_client(client_id: str) -> bool:
    """Close the client connection ``client_id`` of the running proxy (its upstream connections go with
    it); False when it is already gone."""
    from mitmproxy import ctx

    proxyserver = ctx.master.addons.get("proxyserver")
    handler = getattr(proxyserver, "connections", {}).get(client_id) if proxyserver is not None else None
    if handler is None:
        return False
    handler.close_connection(handler.client)
    return True


__all__ = ["DENIED_PREFIX", "DENIED_STATUS", "HELD_REASONS", "WEB_CAPTURE", "DecisionLog", "EgressPolicy"]
