"""Egress policy: origins, address classification and the allow/deny decision.

Pure module (no proxy import) so the controller can validate a task's ``[network]`` table and the gateway
can enforce the very same rules.

Rules (from the isolation model in ARCHITECTURE.md):

* Default deny. ``mode = "allowlist"`` admits exactly the listed origins. ``mode = "ask"`` adds tiers:
  ``allow`` (admitted, no prompt), ``quiet`` (refused without a prompt) and ``ask`` (the ceiling of what a
  person may be asked for; the gateway holds such a connection until someone answers, see
  :mod:`controller.gateway.holds`). Patterns: :mod:`controller.gateway.tiers`.
* An origin is the tuple (scheme, host, effective port). The host is IDNA-encoded (UTS #46), lower-case,
  without a trailing dot; IP literals are canonicalised to their standard text form. Matching is tuple
  equality, never a string prefix: ``https://example.com`` does not admit ``https://example.com.evil.test``,
  ``https://example.com@evil.test``, ``https://example.computer.com``, ``http://example.com`` or
  ``https://example.com:8443``.
* The gateway resolves names itself and refuses the connection if ANY resolved address is special
  (loopback, private, link-local, CGNAT, cloud metadata, multicast, unspecified, reserved, IPv4-mapped or
  other IPv4-embedding IPv6, anything not globally routable), unless an ``allow_addresses`` rule names it.
  IP literals are recognised in every form a resolver accepts (``2130706433``, ``0x7f000001``,
  ``0177.0.0.1``, ``127.1``, ``0x7f.1``, ``[::ffff:127.0.0.1]``) and classified the same way.
* The connection goes to the address that was checked (the decision carries it), so a second lookup
  cannot rebind the name.
* The gateway's own endpoints (its proxy, relay and control ports on any of its own addresses) are
  refused whatever the policy says: the gateway passes them in as ``own_endpoint`` (no rule lifts it).

Over 400 lines: the ``[network]`` model, its validation and the decision in every mode and tier are one
unit. Origins and their canonical hosts are in :mod:`controller.gateway.origin` (re-exported here), the
address rules in :mod:`controller.gateway.addresses`, the tier patterns in :mod:`controller.gateway.tiers`.
"""

from __future__ import annotations

import datetime as _dt
import ipaddress
import socket
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Literal, Optional, Sequence, Union

from pydantic import (
    BaseModel, ConfigDict, Field, StrictFloat, StrictInt, ValidationInfo, field_validator, model_serializer,
    model_validator,
)

from controller.gateway.addresses import (  # noqa: F401 - re-exported: the policy's address API
    METADATA_ADDRESSES, IPAddress, IPNetwork, PolicyError, _unmapped, classify_address, parse_ip_literal, parse_ipv4_literal,
)
from controller.gateway.origin import (  # noqa: F401 - re-exported: the policy's origin API
    DEFAULT_PORTS, Origin, canonical_host, canonical_list,
)
from controller.gateway.tiers import (
    DEFAULT_ASK, DEFAULT_HOLD_TIMEOUT_S, DEFAULT_MAX_PENDING, DEFAULT_QUIET, MAX_HOLD_TIMEOUT_S, MAX_PENDING_LIMIT,
    canonical_patterns, first_match,
)
from controller.text import clean


def destination_mismatch(
    origin: Origin,
    *,
    hosts: Sequence[str],
    authority: Optional[str] = None,
    host_required: bool = True,
) -> Optional[str]:
    """Why a request's fields that can select a destination disagree with ``origin`` (the origin the
    policy decided on), or None when every one of them names exactly ``origin``.

    ``hosts``: every ``Host`` header value the request carries, in order; ``authority``: the request
    target's authority (absolute-form or CONNECT authority-form) or HTTP/2 ``:authority``, None or empty
    when there is none; ``host_required``: a request without any ``Host`` header and without
    ``authority`` is refused (HTTP/1 requests other than CONNECT).

    Each value is read with :meth:`Origin.from_authority` for ``origin``'s scheme and compared by
    equality, so case, a trailing dot, IDNA and IP-literal spellings of the same origin agree, and a
    missing port is the scheme's default. Reasons, values escaped and cut: ``host-mismatch: duplicate
    Host headers (...)``, ``host-mismatch: no Host header``, ``host-mismatch: <field> <value> does not
    parse``, ``host-mismatch: <field> <value> names <origin>, not <origin>``.
    """
    if len(hosts) > 1:
        return f"host-mismatch: duplicate Host headers ({clean(', '.join(hosts), 120)})"
    if host_required and not hosts and not authority:
        return "host-mismatch: no Host header"
    fields = ([("authority", authority)] if authority else []) + [("Host", value) for value in hosts]
    for label, value in fields:
        try:
            named = Origin.from_authority(origin.scheme, value)
        except PolicyError:
            return f"host-mismatch: {label} {clean(value, 80)} does not parse"
        if named != origin:
            return f"host-mismatch: {label} {clean(value, 80)} names {clean(str(named), 80)}, not {origin}"
    return None


# --------------------------------------------------------------------------------------------------
# Policy and decisions


class Decision(BaseModel):
    """One gateway decision, as written (one JSON object a line) to the decision log.

    ``ts``: ISO-8601 UTC; ``origin``: canonical origin text (or the raw target when it could not be
    parsed); ``decision``: allow | deny; ``reason``: short machine-readable reason; ``client``: the
    client's ``ip:port`` as the gateway saw it; ``address``: the checked address the gateway connects to
    (allow only); ``via``: which proxy step decided (``connect``, ``request``, ``tls``, ``server``,
    ``policy``: a policy swap, :meth:`controller.gateway.addon.EgressPolicy.set_policy`, or entering
    the web mode ``serve``, which closes the connections opened before it, each a deny ``offline_web``).

    Every mode: ``policy_swapped``: the policy swapped in at runtime refuses what an earlier one allowed:
    with ``via`` ``policy``, a connection it had open, which it closed; with the hook's ``via``, a
    decision under way when the swap landed (a name being resolved, a held connection approved), judged
    again under the new policy.

    Reasons in mode ``ask`` (besides the ones every mode has: ``allowlisted``, ``invalid-origin: ...``,
    ``resolve-failed: ...``, ``host-mismatch: ...``, ``sni-...``): ``approved`` (a person approved the
    request this connection waited on), ``approved_earlier`` (the origin was approved before),
    ``user_denied``, ``denied_earlier``, ``cancelled`` (the request was cancelled: this connection is
    refused, the next one asks again), ``timeout`` (nobody answered by the deadline), ``quiet`` (quiet
    tier), ``policy`` (outside every tier), ``address_refused`` (a special address or the gateway's own
    endpoint; ``detail`` says which), ``prompt_limit`` (``max_pending`` requests were already waiting),
    ``client_gone`` (the client closed the held connection before the answer), ``gateway_stopped`` (the
    gateway stopped while it held the connection). Old modes keep their
    reasons (``deny-all``, ``not-allowlisted``, ``address-refused: ...``). Serving a web recording
    (:mod:`controller.gateway.web`): ``not_recorded``, ``tunnel_not_recorded``, ``offline_web``.

    Optional (absent on lines of older gateways and where they do not apply): ``request_id``: the origin
    request (``oreq_...``) the connection waited on, or that answered for it earlier; ``held_ms``: how
    long the gateway held the connection (milliseconds); ``detail``: more on the reason, in the
    gateway's words (e.g. ``127.0.0.1 (loopback)``).

    The gateway addon writes with this model and the controller reads the log back with it
    (:func:`controller.run.recording.network_entry`): the log is append-only, so a decision's line
    number in it identifies it.
    """

    model_config = ConfigDict(extra="forbid")

    ts: str = Field(default_factory=lambda: _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds"))
    origin: str
    decision: Literal["allow", "deny"]
    reason: str
    client: Optional[str] = None
    address: Optional[str] = None
    via: Optional[str] = None
    request_id: Optional[str] = None
    held_ms: Optional[int] = None
    detail: Optional[str] = None

    @property
    def allowed(self) -> bool:
        """True for an allow decision."""
        return self.decision == "allow"


Resolver = Callable[[str, int], Iterable[str]]
"""Resolve (host, port) to address texts. Raises OSError when the name does not resolve."""


def system_resolver(host: str, port: int) -> list[str]:
    """Resolve with ``socket.getaddrinfo`` in this process (the gateway), TCP only, de-duplicated, in
    resolver order. Raises OSError (``socket.gaierror``) when the name does not resolve."""
    seen: list[str] = []
    for _family, _type, _proto, _canon, sockaddr in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM):
        text = sockaddr[0]
        if text not in seen:
            seen.append(text)
    return seen


OwnEndpoint = Callable[[IPAddress, int], bool]
"""``(address, port) -> bool``: True when a connection to ``port`` at ``address`` would reach the gateway
itself (its proxy, relay or control port on one of its own addresses). Never raises."""

ASK_ONLY_FIELDS = ("ask", "quiet", "hold_timeout_s", "max_pending")
"""Policy keys valid only with ``mode = "ask"``."""


@dataclass(frozen=True)
class Verdict:
    """What the policy says about one connection, before any person is asked.

    ``action``: ``allow`` | ``deny`` | ``ask`` (mode ask only: the gateway holds the connection and asks).
    ``decision``: the line to log for ``allow`` / ``deny``; for ``ask`` a deny with reason ``ask`` (what
    stands while nobody has answered). ``origin``: the parsed origin (None when it did not parse).
    ``address``: for ``allow`` and ``ask``, the checked address the connection must go to. An answer
    remembered from earlier (``approved_earlier``, ``denied_earlier``) carries its request id in
    ``decision.request_id``.
    """

    action: Literal["allow", "deny", "ask"]
    decision: Decision
    origin: Optional[Origin] = None
    address: Optional[str] = None


Memory = Callable[[Origin], Optional[tuple[str, Optional[str]]]]
"""What the gateway remembers of an origin: ``("approved" | "denied", request id or None)``, or None."""


def _network_text(entry: object) -> str:
    """An ``allow_addresses`` entry as canonical network text. Raises ValueError naming the entry."""
    try:
        return str(ipaddress.ip_network(str(entry).strip("[]"), strict=True))
    except ValueError as exc:
        raise ValueError(f"invalid address rule {entry!r}: {exc}") from exc


class NetworkPolicy(BaseModel):
    """The task's ``[network]`` table.

    ``mode``: ``deny-all`` (default; ``allow`` must be empty), ``allowlist`` or ``ask``.
    ``allow``: origins ``scheme://host[:port]`` (http/https), canonicalised on load; admitted without a
    prompt in modes ``allowlist`` and ``ask``.
    ``allow_addresses``: addresses or networks (``10.0.0.5``, ``172.30.0.0/24``, ``::1``) that admitted
    origins may resolve to even though they are special (private, loopback, ...). Cloud metadata
    addresses are admitted only by a rule naming the exact address. These rules never admit an origin
    by themselves: the origin must still be allowed or approved.

    Mode ``ask`` only (an error with another mode; left out they take their defaults, see
    :mod:`controller.gateway.tiers`):
    ``ask``: origin patterns a person may be asked for (default ``["*"]``: any origin); ``quiet``:
    patterns refused without asking (default: the guest browser's background hosts,
    :data:`~controller.gateway.tiers.DEFAULT_QUIET`); ``hold_timeout_s``: seconds a connection is held
    for an answer (0 < s <= 600; default :data:`~controller.gateway.tiers.DEFAULT_HOLD_TIMEOUT_S`); then
    it is denied by ``timeout``; ``max_pending``: requests that may wait at once (1..100, default 3); a
    connection to one more unknown origin is denied ``prompt_limit``.

    Raises pydantic.ValidationError (a ValueError) with the offending entry when malformed.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    mode: Literal["deny-all", "allowlist", "ask"] = "deny-all"
    allow: tuple[str, ...] = ()
    allow_addresses: tuple[str, ...] = ()
    ask: Optional[tuple[str, ...]] = None
    quiet: Optional[tuple[str, ...]] = None
    hold_timeout_s: Optional[Union[StrictInt, StrictFloat]] = Field(None, gt=0, le=MAX_HOLD_TIMEOUT_S)
    max_pending: Optional[StrictInt] = Field(None, ge=1, le=MAX_PENDING_LIMIT)

    @model_validator(mode="before")
    @classmethod
    def _ask_defaults(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("mode") == "ask":
            data = dict(data)
            for key, default in (("ask", list(DEFAULT_ASK)), ("quiet", list(DEFAULT_QUIET)),
                                 ("hold_timeout_s", DEFAULT_HOLD_TIMEOUT_S), ("max_pending", DEFAULT_MAX_PENDING)):
                if data.get(key) is None:
                    data[key] = default
        return data

    @field_validator("allow", mode="before")
    @classmethod
    def _canonical_origins(cls, value: object) -> tuple[str, ...]:
        if value is None:
            return ()
        return canonical_list(value, "allow must be a list of origins", lambda entry: str(Origin.parse(entry)))

    @field_validator("ask", "quiet", mode="before")
    @classmethod
    def _canonical_patterns(cls, value: object, info: ValidationInfo) -> Optional[tuple[str, ...]]:
        if value is None:
            return None
        return canonical_patterns(value, info.field_name or "patterns")

    @field_validator("allow_addresses", mode="before")
    @classmethod
    def _canonical_networks(cls, value: object) -> tuple[str, ...]:
        if value is None:
            return ()
        return canonical_list(value, "allow_addresses must be a list of addresses or networks", _network_text,
                              unique=False)

    @model_validator(mode="after")
    def _mode_rules(self) -> "NetworkPolicy":
        if self.mode == "deny-all" and self.allow:
            raise ValueError("mode 'deny-all' takes no allow entries; use mode 'allowlist' or 'ask'")
        if self.mode != "ask":
            given = [name for name in ASK_ONLY_FIELDS if getattr(self, name) is not None]
            if given:
                raise ValueError(f"{', '.join(given)}: only valid with mode \"ask\" (mode is {self.mode!r})")
        return self

    @model_serializer(mode="wrap")
    def _dump(self, handler: Callable[[Any], dict[str, Any]]) -> dict[str, Any]:
        # Old modes dump exactly as before the ask tier existed (no null keys in records and files).
        data = handler(self)
        if self.mode != "ask":
            for name in ASK_ONLY_FIELDS:
                data.pop(name, None)
        return data

    # -- loading ----------------------------------------------------------------------------------

    @classmethod
    def from_toml(cls, path: Union[str, Path]) -> "NetworkPolicy":
        """Load from a policy file or a task file: the ``[network]`` table if present; else, for a task
        file (it has ``name`` or ``instructions``), deny-all; else the whole file is the policy
        (``mode``, ``allow``, ``allow_addresses``, and in mode ask ``ask``, ``quiet``, ``hold_timeout_s``,
        ``max_pending``), and any other key is an error -- a misspelt ``allow`` must not quietly leave the
        allowlist empty.

        Raises OSError when unreadable, ValueError (tomllib.TOMLDecodeError, UnicodeDecodeError or
        ValidationError) when malformed.
        """
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
        if "network" in data:
            return cls.model_validate(data["network"])
        if "name" in data or "instructions" in data:
            return cls()
        return cls.model_validate(data)

    # -- matching ---------------------------------------------------------------------------------

    @property
    def origins(self) -> frozenset[Origin]:
        """The allowlisted origins (the ``allow`` tier), parsed."""
        return frozenset(Origin.parse(text) for text in self.allow)

    @property
    def address_rules(self) -> tuple[IPNetwork, ...]:
        """The ``allow_addresses`` rules, parsed."""
        return tuple(ipaddress.ip_network(text) for text in self.allow_addresses)

    def admits_origin(self, origin: Origin) -> bool:
        """Exact tuple equality against the ``allow`` tier (never prefixes), in modes allowlist and ask."""
        return self.mode in ("allowlist", "ask") and origin in self.origins

    def quiet_match(self, origin: Origin) -> Optional[str]:
        """The ``quiet`` pattern that names ``origin`` (mode ask), or None."""
        return first_match(self.quiet or (), origin) if self.mode == "ask" else None

    def ask_match(self, origin: Origin) -> Optional[str]:
        """The ``ask`` pattern that names ``origin`` (mode ask), or None."""
        return first_match(self.ask or (), origin) if self.mode == "ask" else None

    @property
    def hold_timeout(self) -> float:
        """Seconds a connection is held for an answer (the default outside mode ask)."""
        return float(self.hold_timeout_s if self.hold_timeout_s is not None else DEFAULT_HOLD_TIMEOUT_S)

    @property
    def pending_limit(self) -> int:
        """Requests that may wait for an answer at once (the default outside mode ask)."""
        return self.max_pending if self.max_pending is not None else DEFAULT_MAX_PENDING

    def address_refusal(self, address: IPAddress) -> Optional[str]:
        """Why ``address`` is refused (category), or None when it may be connected to.

        Special addresses are admitted only when an ``allow_addresses`` rule covers them (metadata:
        only an exact rule). IPv4-mapped IPv6 is judged by a rule on either form.
        """
        category = classify_address(address)
        if category is None:
            return None
        candidates = {address, _unmapped(address)}
        for network in self.address_rules:
            for candidate in candidates:
                if candidate.version != network.version or candidate not in network:
                    continue
                if candidate in METADATA_ADDRESSES and network.num_addresses != 1:
                    continue
                return None
        return category

    def _check_addresses(
        self, origin: Origin, resolver: Resolver, own_endpoint: Optional[OwnEndpoint],
    ) -> tuple[Optional[str], Optional[str], str]:
        """Resolve ``origin`` (IP literals as they are) and check every address: (the address to connect
        to, None) when all pass, else (None, why) with why ``resolve-failed: ...`` or
        ``<address> (<category>)``; the third item is the reason kind (``resolve`` | ``address``)."""
        if origin.is_ip_literal:
            addresses = [ipaddress.ip_address(origin.host)]
        else:
            try:
                addresses = [ipaddress.ip_address(a.split("%", 1)[0]) for a in resolver(origin.host, origin.port)]
            except (OSError, UnicodeError, ValueError) as exc:
                return None, f"resolve-failed: {exc}", "resolve"
            if not addresses:
                return None, "resolve-failed: no addresses", "resolve"
        for address in addresses:
            if own_endpoint is not None and (own_endpoint(address, origin.port)
                                             or own_endpoint(_unmapped(address), origin.port)):
                return None, f"{address}:{origin.port} (the gateway's own endpoint)", "address"
            refusal = self.address_refusal(address)
            if refusal is not None:
                return None, f"{address} ({refusal})", "address"
        return str(addresses[0]), None, "address"

    def evaluate(
        self,
        scheme: str,
        host: str,
        port: Optional[int],
        *,
        client: Optional[str] = None,
        via: Optional[str] = None,
        resolver: Resolver = system_resolver,
        memory: Optional[Memory] = None,
        own_endpoint: Optional[OwnEndpoint] = None,
    ) -> Verdict:
        """Judge one connection to (scheme, host, port). Never raises; malformed input is a deny.

        Modes deny-all and allowlist: parse -> mode -> allowlist (exact origin) -> address checks.
        Mode ask: parse -> hard refusals -> ``allow`` -> remembered deny (``denied_earlier``) / approve
        (``approved_earlier``) -> ``quiet`` -> ``ask`` (verdict ``ask``) -> deny ``policy``. Hard
        refusals: an IP literal is checked at once; a name is resolved with ``resolver`` only when it
        could be admitted (allow tier, remembered approval, ask tier), so a name no tier admits is never
        looked up; it is refused if ANY resolved address is special (unless ``allow_addresses`` covers
        it) or is the gateway's own endpoint (``own_endpoint``: nothing lifts that). ``memory``: what the
        gateway remembers of earlier answers (:data:`Memory`). On allow and ask, ``Verdict.address`` is
        the checked address the caller must connect to.
        """
        raw = f"{scheme}://{host}:{port}" if port is not None else f"{scheme}://{host}"
        try:
            origin = Origin.from_parts(scheme, host, port)
        except PolicyError as exc:
            return Verdict("deny", Decision(origin=raw, decision="deny", reason=f"invalid-origin: {exc}",
                                            client=client, via=via))
        text = str(origin)

        def deny(reason: str, detail: Optional[str] = None, request_id: Optional[str] = None) -> Verdict:
            return Verdict("deny", Decision(origin=text, decision="deny", reason=reason, client=client, via=via,
                                            detail=detail, request_id=request_id), origin)

        def allow(reason: str, address: str, request_id: Optional[str] = None) -> Verdict:
            return Verdict("allow", Decision(origin=text, decision="allow", reason=reason, client=client,
                                             address=address, via=via, request_id=request_id), origin, address)

        if self.mode != "ask":
            if self.mode == "deny-all":
                return deny("deny-all")
            if not self.admits_origin(origin):
                return deny("not-allowlisted")
            address, why, _kind = self._check_addresses(origin, resolver, own_endpoint)
            if address is None:
                return deny(why if why and why.startswith("resolve-failed") else f"address-refused: {why}")
            return allow("allowlisted", address)

        def checked(then: Callable[[str], Verdict]) -> Verdict:
            address, why, kind = self._check_addresses(origin, resolver, own_endpoint)
            if address is None:
                return deny(why or "resolve-failed") if kind == "resolve" else deny("address_refused", why)
            return then(address)

        if origin.is_ip_literal:  # hard refusals first: no lookup needed
            address, why, _kind = self._check_addresses(origin, resolver, own_endpoint)
            if address is None:
                return deny("address_refused", why)
        if self.admits_origin(origin):
            return checked(lambda address: allow("allowlisted", address))
        remembered = memory(origin) if memory is not None else None
        if remembered is not None and remembered[0] == "denied":
            return deny("denied_earlier", request_id=remembered[1])
        if remembered is not None and remembered[0] == "approved" and self.ask_match(origin) is not None:
            return checked(lambda address: allow("approved_earlier", address, remembered[1]))
        if self.quiet_match(origin) is not None:
            return deny("quiet")
        if self.ask_match(origin) is not None:
            return checked(lambda address: Verdict(
                "ask", Decision(origin=text, decision="deny", reason="ask", client=client, via=via), origin, address))
        return deny("policy")

    def decide(
        self,
        scheme: str,
        host: str,
        port: Optional[int],
        *,
        client: Optional[str] = None,
        via: Optional[str] = None,
        resolver: Resolver = system_resolver,
        own_endpoint: Optional[OwnEndpoint] = None,
    ) -> Decision:
        """The decision :meth:`evaluate` gives with nothing remembered, for a caller that cannot ask a
        person: in mode ask an ``ask``-tier origin comes back as a deny with reason ``ask``. On allow,
        ``Decision.address`` is the checked address the caller must connect to. Never raises."""
        return self.evaluate(scheme, host, port, client=client, via=via, resolver=resolver,
                             own_endpoint=own_endpoint).decision
