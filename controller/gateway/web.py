"""Recorded web origins: the plain-HTTP responses the gateway let through, kept per run (mode ``record``)
and served back instead of fetched (mode ``serve``, the offline web of a replay or of a task).

Pure module (no proxy import): the gateway's addon (:class:`controller.gateway.addon.EgressPolicy`) and
control API (:mod:`controller.gateway.control`, ``/v1/web``) use :class:`WebStore`; the controller reads
and writes recordings with the same models (:class:`WebResponse`, :class:`WebAnswer`,
:mod:`controller.run.web`).

What is recorded (mode ``record``): the response to a plain-HTTP request the policy allowed, unless a
rule of :data:`SKIPS` keeps it out -- an HTTPS tunnel (TLS passes through untouched: nothing in it can be
seen), a method other than GET or HEAD, a request that carried a body, ``Authorization`` or ``Cookie``, a
response that sets a cookie, a status that does not replay, a URL that is not visible ASCII, a body over
the caps. What is skipped is counted by reason, never kept. No request body is ever kept, so no value a
sign-in fill typed (a sign-in form is sent with POST, contract 8) can be in a recording. The body is kept
as it came (its ``Content-Encoding`` as recorded), content-addressed by its SHA-256; with it the method,
the URL (canonical origin + path and query), the status, the headers of :data:`RECORDED_HEADERS`, the
origin and the address the gateway had checked and connected to.

Mode ``serve``: every connection is still judged by the policy first (a denied origin stays denied;
names resolve only to the addresses of the recording, never through DNS); an allowed request with a
recorded answer gets it (the ``n``-th request for a method and URL the ``n``-th recorded response, the
last one again after that), one without is denied :data:`NOT_RECORDED`, a CONNECT is denied
:data:`TUNNEL_NOT_RECORDED`, and no upstream connection is ever opened (:data:`NO_UPSTREAM`); entering
the mode closes the connections opened before it (:attr:`WebStore.on_serve`).

Memory: the bodies held stay within the total cap, and so do the bodies being captured at once
(:class:`Capture`); the index within :data:`MAX_INDEX_LINES_BYTES`.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import re
import socket
from typing import Annotated, Any, Callable, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, field_validator, model_validator

from controller.gateway.origin import Origin
from controller.gateway.addresses import PolicyError

MODES = ("off", "record", "serve")
"""The gateway's web modes: ``off`` (nothing kept, nothing served: the default), ``record``, ``serve``."""

DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024
"""Largest body kept by default (bytes); a larger one is skipped ``too_large``."""
DEFAULT_MAX_TOTAL_BYTES = 64 * 1024 * 1024
"""Most body bytes a recording holds by default (distinct bodies counted once); past it: ``total_cap``."""
MAX_BODY_LIMIT = 32 * 1024 * 1024
"""The largest per-body cap a caller may set (bytes)."""
MAX_TOTAL_LIMIT = 128 * 1024 * 1024
"""The largest total cap a caller may set (bytes): the gateway keeps its recording in memory."""
MAX_RESPONSES = 2000
"""Most responses one recording holds; past it: ``count_cap``."""
MAX_URL_CHARS = 4096
"""Longest URL kept (characters); a longer one: ``url``."""
MAX_HEADER_CHARS = 1024
"""Longest header value kept (characters); a longer one is left out of the response's headers."""
MAX_INDEX_BYTES = 8 * 1024 * 1024
"""Largest index (the ``/v1/web`` JSON, either way, and ``index.jsonl``) read (bytes)."""
MAX_INDEX_LINES_BYTES = MAX_INDEX_BYTES - 64 * 1024
"""Most bytes the responses of one recording may take as ``index.jsonl`` lines (what the ``/v1/web``
answer's other fields need is left over); past it: ``count_cap``, so a recording is always read back."""

RECORDED_HEADERS = ("content-type", "content-encoding", "content-language", "content-disposition", "location",
                    "access-control-allow-origin")
"""The response headers a recording keeps (lower case); every other header is left out, and a replayed
response carries these, ``Content-Length`` and nothing else."""

METHODS = ("GET", "HEAD")
"""The only request methods whose responses are recorded."""

CREDENTIAL_HEADERS = ("authorization", "proxy-authorization", "cookie")
"""Request headers that make a response private: such a response is never recorded (``credentials``)."""

SKIPS = {
    "tunnel": "an HTTPS (CONNECT) tunnel: TLS passes through untouched, nothing in it can be recorded",
    "method": "a request method other than GET or HEAD",
    "request_body": "the request carried a body (a form sent, a sign-in): neither it nor its answer is kept",
    "credentials": "the request carried Authorization, Proxy-Authorization or Cookie",
    "sets_cookie": "the response sets a cookie",
    "status": "a status that does not replay (1xx, 206 Partial Content, 304 Not Modified)",
    "url": f"a URL of more than {MAX_URL_CHARS} characters or not visible ASCII",
    "too_large": "the body is larger than the per-body cap",
    "total_cap": "the body would take the recording over its total cap, or the bodies being captured at once "
                 "over as much again",
    "count_cap": f"the recording's index is full: {MAX_RESPONSES} responses, or as many lines as its "
                 f"{MAX_INDEX_BYTES // 2**20} MiB hold",
    "unverified": "(controller) the gateway's body for it could not be read or did not match its SHA-256",
}
"""Why a response was not recorded: the reasons a ``web_recording`` record entry counts (``skipped``)."""

NOT_RECORDED = "not_recorded"
"""Decision reason (mode serve): an allowed plain-HTTP request with no recorded answer; denied, never fetched."""
TUNNEL_NOT_RECORDED = "tunnel_not_recorded"
"""Decision reason (mode serve): a CONNECT (HTTPS is never recorded); denied."""
NO_UPSTREAM = "offline_web"
"""Decision reason (mode serve): an upstream connection the proxy was about to open; refused."""
SERVE_REASONS = {NOT_RECORDED: "no recorded answer for the request", TUNNEL_NOT_RECORDED: "HTTPS is never recorded",
                 NO_UPSTREAM: "serving the recording: no upstream connection is opened"}
"""The decision reasons of mode serve."""

UNREPLAYED_STATUSES = frozenset({101, 206, 304})
"""Statuses never recorded (besides 1xx): a protocol switch, a partial body, a cache revalidation."""

SHA256 = re.compile(r"[0-9a-f]{64}")
"""A body's name: its SHA-256, lower-case hex (never a path given by anyone else)."""
_VISIBLE_URL = re.compile(r"http://[\x21-\x7e]+")
_HEADER_VALUE = re.compile(r"[\x20-\x7e]*")


def request_skip(method: str, header_names: Any, has_body: bool) -> Optional[str]:
    """Why a request's response is not recorded, from the request alone (None: it may be), the first
    rule that holds: ``request_body`` (``has_body``: a body was sent or announced), ``method``,
    ``credentials``. ``header_names``: the request's header names (any case)."""
    if has_body:
        return "request_body"
    if method not in METHODS:
        return "method"
    if any(str(name).lower() in CREDENTIAL_HEADERS for name in header_names):
        return "credentials"
    return None


def response_skip(status: int, header_names: Any) -> Optional[str]:
    """Why a response is not recorded, from its status and headers (None: it may be): ``status`` (also
    one outside 200..599, which an origin may send), ``sets_cookie``."""
    if status < 200 or status > 599 or status in UNREPLAYED_STATUSES:
        return "status"
    if any(str(name).lower() == "set-cookie" for name in header_names):
        return "sets_cookie"
    return None


def recorded_headers(headers: Any) -> list[tuple[str, str]]:
    """The ``(name, value)`` pairs of ``headers`` (pairs, any case) a recording keeps: the first value of
    each of :data:`RECORDED_HEADERS`, in that order, when it is printable ASCII of at most
    :data:`MAX_HEADER_CHARS`."""
    first: dict[str, str] = {}
    for name, value in headers:
        first.setdefault(str(name).lower(), str(value))
    return [(name, first[name]) for name in RECORDED_HEADERS
            if name in first and len(first[name]) <= MAX_HEADER_CHARS and _HEADER_VALUE.fullmatch(first[name])]


_SKIPS_GIVEN = ("tunnel", "method", "request_body", "credentials", "sets_cookie", "status", "url", "too_large",
                "total_cap", "count_cap", "unverified")
if set(_SKIPS_GIVEN) != set(SKIPS):  # pragma: no cover - a reason given that the table does not describe
    raise ImportError(f"SKIPS and the reasons given differ: {sorted(set(_SKIPS_GIVEN) ^ set(SKIPS))}")


def canonical_url(scheme: str, host: str, port: int, path: str) -> Optional[str]:
    """The URL a recording keys a request by: the canonical origin (:class:`Origin`) and the request's
    path with its query as sent; None when it is not plain HTTP, does not parse, is longer than
    :data:`MAX_URL_CHARS` or is not visible ASCII (skip ``url``)."""
    if scheme != "http":
        return None
    try:
        origin = Origin.from_parts(scheme, host, port)
    except PolicyError:
        return None
    url = str(origin) + (path if path.startswith("/") else "/" + path)
    if len(url) > MAX_URL_CHARS or not _VISIBLE_URL.fullmatch(url):
        return None
    return url


def origin_of(url: str) -> Optional[str]:
    """The canonical origin of a recorded URL, or None when it has none."""
    match = re.match(r"http://[^/?#]+", url)
    if match is None:
        return None
    try:
        return str(Origin.parse(match.group(0)))
    except PolicyError:
        return None


class WebResponse(BaseModel):
    """One recorded response, a line of a recording's ``index.jsonl``: ``method`` (GET | HEAD), ``url``
    (canonical origin + path and query, visible ASCII, at most :data:`MAX_URL_CHARS`), ``origin`` (the
    URL's), ``address`` (the IP address the gateway connected to), ``status``, ``headers`` (``[name,
    value]`` pairs of :data:`RECORDED_HEADERS`, in order), ``sha256`` (of the body as it came: its file
    is ``<sha256>`` beside the index) and ``bytes`` (its length). Raises pydantic.ValidationError for
    anything else (a hostile index is refused, never trusted)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    method: Literal["GET", "HEAD"]
    url: StrictStr = Field(max_length=MAX_URL_CHARS)
    origin: StrictStr = Field(max_length=300)
    address: StrictStr = Field(max_length=64)
    status: StrictInt = Field(ge=100, le=599)
    headers: list[tuple[StrictStr, StrictStr]] = Field(default_factory=list, max_length=len(RECORDED_HEADERS))
    sha256: StrictStr
    bytes: StrictInt = Field(ge=0, le=MAX_BODY_LIMIT)

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        if not _VISIBLE_URL.fullmatch(v):
            raise ValueError("must be an http:// URL of visible ASCII")
        return v

    @field_validator("address")
    @classmethod
    def _address(cls, v: str) -> str:
        return str(ipaddress.ip_address(v))

    @field_validator("status")
    @classmethod
    def _status(cls, v: int) -> int:
        if v < 200 or v in UNREPLAYED_STATUSES:
            raise ValueError("a status that is never recorded")
        return v

    @field_validator("headers")
    @classmethod
    def _headers(cls, v: list[tuple[str, str]]) -> list[tuple[str, str]]:
        names = [name for name, _ in v]
        if len(set(names)) != len(names) or any(name not in RECORDED_HEADERS for name in names):
            raise ValueError(f"header names must be distinct, of {', '.join(RECORDED_HEADERS)}")
        if any(len(value) > MAX_HEADER_CHARS or not _HEADER_VALUE.fullmatch(value) for _, value in v):
            raise ValueError(f"header values must be printable ASCII of at most {MAX_HEADER_CHARS} characters")
        return v

    @field_validator("sha256")
    @classmethod
    def _sha(cls, v: str) -> str:
        if not SHA256.fullmatch(v):
            raise ValueError("must be 64 lower-case hex digits")
        return v

    @model_validator(mode="after")
    def _origin_matches(self) -> "WebResponse":
        if origin_of(self.url) != self.origin:
            raise ValueError("origin must be the URL's canonical origin")
        return self


def index_line_bytes(response: WebResponse) -> int:
    """The length of ``response``'s line in an ``index.jsonl`` (bytes, its newline included): the line
    :func:`controller.run.web.write_recording` writes, longer than its part of a ``/v1/web`` answer."""
    return len(json.dumps(response.model_dump(mode="json"), ensure_ascii=True)) + 1


class WebConfig(BaseModel):
    """The body of ``PUT /v1/web``: ``mode`` (:data:`MODES`), the caps (bytes) and, for mode ``serve``, the
    recording's ``responses`` (its index; the bodies follow one by one, ``PUT /v1/web/bodies/<sha256>``)."""

    model_config = ConfigDict(extra="forbid")

    mode: Literal["off", "record", "serve"]
    max_body_bytes: StrictInt = Field(DEFAULT_MAX_BODY_BYTES, ge=1, le=MAX_BODY_LIMIT)
    max_total_bytes: StrictInt = Field(DEFAULT_MAX_TOTAL_BYTES, ge=1, le=MAX_TOTAL_LIMIT)
    responses: list[WebResponse] = Field(default_factory=list, max_length=MAX_RESPONSES)

    @model_validator(mode="after")
    def _responses_only_served(self) -> "WebConfig":
        if self.responses and self.mode != "serve":
            raise ValueError("responses are given in mode serve only")
        return self


class WebAnswer(BaseModel):
    """The answer of ``GET /v1/web`` (and of ``PUT``): ``mode``, the caps, ``responses`` (the index so far:
    recorded, or loaded to serve), ``skipped`` (reason of :data:`SKIPS` -> count), ``bytes`` (distinct body
    bytes held), ``bodies`` (distinct bodies held), ``served`` / ``missing`` (mode serve: responses served,
    requests denied :data:`NOT_RECORDED` or :data:`TUNNEL_NOT_RECORDED`). The controller validates the
    gateway's answer with it (extra fields, unknown reasons, wrong types: refused)."""

    model_config = ConfigDict(extra="forbid")

    mode: Literal["off", "record", "serve"]
    max_body_bytes: StrictInt = Field(ge=1, le=MAX_BODY_LIMIT)
    max_total_bytes: StrictInt = Field(ge=1, le=MAX_TOTAL_LIMIT)
    responses: list[WebResponse] = Field(max_length=MAX_RESPONSES)
    skipped: dict[Literal[tuple(SKIPS)], Annotated[StrictInt, Field(ge=0)]]  # type: ignore[valid-type]
    bytes: StrictInt = Field(ge=0)
    bodies: StrictInt = Field(ge=0)
    served: StrictInt = Field(0, ge=0)
    missing: StrictInt = Field(0, ge=0)


class Capture:
    """One response being recorded (mode record) as its body streams to the guest: ``meta`` (what
    :meth:`WebStore.store` takes), the body kept so far, and ``skip`` (None, or the reason of :data:`SKIPS`
    it will not be kept for, or ``stale``: its bytes are dropped at once). Made by :meth:`WebStore.begin`; every byte
    it keeps is counted against its recording's caps while it streams (:meth:`feed`), and given back by
    :meth:`finish` or :meth:`abandon`. A capture of a recording that was replaced since keeps nothing."""

    __slots__ = ("meta", "body", "skip", "_store", "_generation")

    def __init__(self, store: "WebStore", meta: dict[str, Any]) -> None:
        self.meta, self.body, self.skip = meta, bytearray(), None
        self._store, self._generation = store, store.generation

    @property
    def current(self) -> bool:
        """Whether the recording it was begun in is still the store's."""
        return self._generation == self._store.generation and self._store.recording

    def feed(self, chunk: bytes) -> None:
        """Keep ``chunk`` (bytes, as they reach the guest) unless that takes the body over the per-body cap
        (``too_large``) or the bodies being captured at once over the total cap (``total_cap``): then
        the body is dropped and the rest of it is not kept."""
        if self.skip is not None or not chunk:
            return
        if not self.current:
            self.skip = "stale"
        elif len(self.body) + len(chunk) > self._store.max_body_bytes:
            self.skip = "too_large"
        elif self._store.capturing + len(chunk) > self._store.max_total_bytes:
            self.skip = "total_cap"
        else:
            self.body.extend(chunk)
            self._store.capturing += len(chunk)
            return
        self.abandon()

    def abandon(self) -> None:
        """Drop what was kept (the response ended in an error, or is skipped); idempotent."""
        if self.current:
            self._store.capturing -= len(self.body)
        self.body = bytearray()

    def finish(self, tail: bytes = b"") -> Optional[str]:
        """The response ended whole: keep it (:meth:`WebStore.store`; ``tail``: a body that did not stream,
        e.g. an answer without one). Returns None, or the reason it was not kept (counted); ``stale``
        (not counted) for a capture of a recording replaced since."""
        if self.skip is None and tail and not self.body:
            self.feed(tail)
        body, current = bytes(self.body), self.current
        self.abandon()
        if not current or self.skip == "stale":
            return "stale"
        if self.skip is not None:
            self._store.skip(self.skip)
            return self.skip
        return self._store.store(self.meta, body)


class WebStore:
    """The gateway's web state (module docstring), on the proxy's event loop (the addon's hooks and the
    control API run there: no lock). Starts ``off``; :meth:`configure` starts a new recording (or a new
    recording to serve) and forgets the last.

    Memory (mode record): at most ``max_total_bytes`` of bodies held, and at most as much again in the
    bodies being captured at once (:class:`Capture`), however many responses stream together.
    ``on_serve``: called (no arguments) each time mode ``serve`` is entered, after the recording is in
    place (the addon closes the connections opened before it)."""

    def __init__(self) -> None:
        self.generation = 0
        self.on_serve: Optional[Callable[[], Any]] = None
        self.configure(WebConfig(mode="off"))

    # -- both modes --------------------------------------------------------------------------------
    def configure(self, config: WebConfig) -> dict[str, Any]:
        """Enter ``config.mode`` with its caps; everything held before is dropped (a response still being
        captured for the last recording is kept in none). Entering ``serve`` calls :attr:`on_serve`.
        Returns :meth:`answer`."""
        self.generation += 1
        self.capturing = 0
        self.mode = config.mode
        self.max_body_bytes, self.max_total_bytes = config.max_body_bytes, config.max_total_bytes
        self.responses: list[WebResponse] = list(config.responses)
        self.index_bytes = sum(index_line_bytes(r) for r in self.responses)
        self.bodies: dict[str, bytes] = {}
        self.held_bytes = 0
        self.skipped: dict[str, int] = {}
        self.served = self.missing = 0
        self._keyed: dict[tuple[str, str], list[WebResponse]] = {}
        self._asked: dict[tuple[str, str], int] = {}
        self._hosts: dict[str, list[str]] = {}
        for response in self.responses:
            self._keyed.setdefault((response.method, response.url), []).append(response)
            host = Origin.parse(response.origin).host
            if response.address not in self._hosts.setdefault(host, []):
                self._hosts[host].append(response.address)
        if self.serving and self.on_serve is not None:
            self.on_serve()
        return self.answer()

    @property
    def recording(self) -> bool:
        """Mode ``record``."""
        return self.mode == "record"

    @property
    def serving(self) -> bool:
        """Mode ``serve``."""
        return self.mode == "serve"

    def answer(self) -> dict[str, Any]:
        """The state as ``GET /v1/web`` answers it (:class:`WebAnswer`'s fields)."""
        return {"mode": self.mode, "max_body_bytes": self.max_body_bytes, "max_total_bytes": self.max_total_bytes,
                "responses": [r.model_dump(mode="json") for r in self.responses], "skipped": dict(self.skipped),
                "bytes": self.held_bytes, "bodies": len(self.bodies),
                "served": self.served, "missing": self.missing}

    def body(self, sha256: str) -> Optional[bytes]:
        """A body held, by its SHA-256; None when there is none."""
        return self.bodies.get(sha256) if SHA256.fullmatch(sha256) else None

    # -- mode record -------------------------------------------------------------------------------
    def begin(self, meta: dict[str, Any]) -> Capture:
        """A :class:`Capture` for one response of this recording (``meta``: as :meth:`store` takes it)."""
        return Capture(self, meta)

    def skip(self, reason: str) -> None:
        """Count one response not recorded (``reason`` of :data:`SKIPS`)."""
        assert reason in SKIPS, reason
        self.skipped[reason] = self.skipped.get(reason, 0) + 1

    def store(self, meta: dict[str, Any], body: bytes) -> Optional[str]:
        """Keep one response (``meta``: :class:`WebResponse`'s fields but ``sha256`` and ``bytes``) with its
        ``body``; returns None, or the reason of :data:`SKIPS` it was not kept for (also counted)."""
        reason = None
        digest = hashlib.sha256(body).hexdigest()
        if len(body) > self.max_body_bytes:
            reason = "too_large"
        elif len(self.responses) >= MAX_RESPONSES:
            reason = "count_cap"
        elif digest not in self.bodies and self.held_bytes + len(body) > self.max_total_bytes:
            reason = "total_cap"
        if reason is None:
            try:
                response = WebResponse(**meta, sha256=digest, bytes=len(body))
            except ValueError:
                reason = "url"
            else:
                line = index_line_bytes(response)
                if self.index_bytes + line > MAX_INDEX_LINES_BYTES:
                    reason = "count_cap"
                else:
                    self._hold(digest, body)
                    self.responses.append(response)
                    self.index_bytes += line
                    return None
        self.skip(reason)
        return reason

    def _hold(self, digest: str, body: bytes) -> None:
        if digest not in self.bodies:
            self.bodies[digest] = bytes(body)
            self.held_bytes += len(body)

    # -- mode serve --------------------------------------------------------------------------------
    def put_body(self, sha256: str, data: bytes) -> Optional[str]:
        """Take one body of the recording being served: None when taken, else an error code:
        ``not_serving``, ``not_indexed`` (no response of the index names it), ``hash_mismatch``,
        ``too_large`` (over the per-body or the total cap)."""
        if not self.serving:
            return "not_serving"
        if not SHA256.fullmatch(sha256) or not any(r.sha256 == sha256 for r in self.responses):
            return "not_indexed"
        if hashlib.sha256(data).hexdigest() != sha256:
            return "hash_mismatch"
        if len(data) > self.max_body_bytes or (sha256 not in self.bodies
                                               and self.held_bytes + len(data) > self.max_total_bytes):
            return "too_large"
        self._hold(sha256, data)
        return None

    def recorded(self, method: str, url: Optional[str]) -> Optional[WebResponse]:
        """The response a request for (``method``, ``url``) is answered with now, without counting it;
        None when there is none whose body is held."""
        if url is None:
            return None
        found = self._keyed.get((method, url))
        if not found:
            return None
        response = found[min(self._asked.get((method, url), 0), len(found) - 1)]
        return response if response.sha256 in self.bodies else None

    def take(self, method: str, url: Optional[str]) -> Optional[tuple[WebResponse, bytes]]:
        """The response for (``method``, ``url``) and its body, counted as served (the next request for
        them gets the next recorded one); None when there is none."""
        response = self.recorded(method, url)
        if response is None or url is None:
            return None
        key = (method, url)
        self._asked[key] = self._asked.get(key, 0) + 1
        self.served += 1
        return response, self.bodies[response.sha256]

    def resolve(self, host: str, port: int) -> list[str]:
        """The resolver of mode serve: a host's addresses as recorded, never a DNS lookup. Raises
        socket.gaierror for a host the recording does not hold."""
        addresses = self._hosts.get(host.lower().rstrip("."))
        if not addresses:
            raise socket.gaierror(socket.EAI_NONAME, f"{host} is not in the web recording")
        return list(addresses)


__all__ = [
    "CREDENTIAL_HEADERS", "DEFAULT_MAX_BODY_BYTES", "DEFAULT_MAX_TOTAL_BYTES", "MAX_BODY_LIMIT", "MAX_HEADER_CHARS",
    "MAX_INDEX_BYTES", "MAX_INDEX_LINES_BYTES", "MAX_RESPONSES", "MAX_TOTAL_LIMIT", "MAX_URL_CHARS", "METHODS",
    "MODES", "NOT_RECORDED",
    "NO_UPSTREAM", "RECORDED_HEADERS", "SERVE_REASONS", "SHA256", "SKIPS", "TUNNEL_NOT_RECORDED",
    "UNREPLAYED_STATUSES", "Capture", "WebAnswer", "WebConfig", "WebResponse", "WebStore", "canonical_url",
    "index_line_bytes", "origin_of", "recorded_headers", "request_skip", "response_skip",
]
