"""The browser tools wire schema: the calls the agent serves for the openai SDK's ``BrowserToolset``.

One home for these shapes (docs/ARCHITECTURE.md, contract 9): the guest agent serves them on
``GET /v1/browser/state`` and ``POST /v1/browser/call`` (:mod:`guest.browser_tools`), the controller's
driver sends and reads them. Member names and argument fields are the SDK's
(``openai.lib.browser._MEMBERS``; a test keeps them equal), so a call's ``arguments`` are exactly what
the SDK hands its driver.

* :class:`BrowserCall` ``{member, arguments}``: ``member`` one of :data:`GUEST_MEMBERS`, ``arguments``
  validated by that member's strict model (:data:`ARGUMENT_MODELS`: unknown fields refused, no
  coercion: ``"5"`` is no integer, ``1`` no boolean). Nullable fields (``tab_id``, ``type``'s
  ``target``, ``new_tab``'s ``url``) may be left out (None).
* :class:`BrowserCallResult` ``{result, target, viewport}``: the SDK's result for the member (None, a
  string, a read report :class:`ReadReport` for ``read_page``/``find``/``get_page_text``, an
  ``input_image`` dict for ``screenshot``/``zoom``); ``target``: the box of the element acted on in
  **viewport CSS px** (:class:`Box`); ``viewport``: where the tab's viewport lies on the X screen, in
  **screen px** (:class:`ScreenBox`), or None when the browser does not say.
* :class:`BrowserStateV1`: what ``openai.lib.browser._state`` accepts with an observation.
* :class:`GuestUrlRule` (``PUT /v1/browser/rule``): what the agent's chromium may load, judged by the
  agent for every request (:func:`guest_local`: the guest's own hosts, which the gateway refuses; those
  of the rule's local origins chromium reaches directly, :meth:`GuestUrlRule.direct_hosts`).

Units: ``x``/``y`` of ``click_at``, ``hover_at``, ``drag_path`` and ``zoom``'s ``region`` are viewport
CSS px (0, 0 the viewport's top left corner), never screen px; ``scroll``'s ``amount`` is CSS px;
``duration_ms``/``timeout_ms`` milliseconds. Text limits count UTF-8 bytes where the SDK does
(labels, values, keys, refs), characters elsewhere.

Refusals (:data:`REFUSAL_CODES`, HTTP 422) carry a message that is safe to show the model: it names
the rule, never page text.

This module imports pydantic only: the guest has no openai SDK. Over 400 lines: it is the one home of
the browser tools vocabulary (members, arguments, results, state, limits).
"""

from __future__ import annotations

import re
from ipaddress import IPv4Address, IPv6Address, ip_network
from typing import Annotated, Any, Iterable, Literal, Union
from urllib.parse import urlsplit

from pydantic import (AfterValidator, BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, ValidationError,
                      field_validator, model_validator)

from .actions import MAX_TEXT_CHARS

GUEST_MEMBERS: tuple[str, ...] = (
    "navigate", "read_page", "get_page_text", "find", "click", "type", "key", "scroll", "select_option",
    "hover", "screenshot", "zoom", "new_tab", "switch_tab", "close_tab", "scroll_to", "wait_for",
    "hover_at", "set_checked", "click_at", "drag_path", "hold_keys")
"""The SDK members the agent serves. ``list_tabs`` is answered by the SDK from the state;
``read_page_scoped``, ``read_diagnostics``, ``run_script``, ``upload_file`` and ``download_file`` are
not served."""
XTEST_MEMBERS: frozenset[str] = frozenset({"click_at", "hover_at", "drag_path", "hold_keys"})
"""Members whose input goes through the agent's X input (XTEST, the computer actions' input lock):
they need the tab in front on the agent's display."""

MAX_READ_ELEMENTS = 200
"""Most elements in one read report (more: omission ``target_limit``)."""
MAX_READ_TEXT = 20_000
"""Most characters of a report's text (more: omission ``text_limit``)."""
MAX_WORK_NODES = 20_000
"""Most DOM nodes one read visits (more: omission ``work_limit``)."""
MAX_LABEL_BYTES = 256
"""Longest label, option label or ref (UTF-8 bytes; a longer label is cut: omission ``name_limit``)."""
MAX_VALUE_BYTES = 512
"""Longest value or option value (UTF-8 bytes; a longer one is left out: omission ``value``)."""
MAX_OPTIONS = 50
"""Most options reported for one select control (more: omission ``report_limit``)."""
MAX_REPORT_OPTIONS = 500
"""Most options in one report, all controls together (more: omission ``report_limit``)."""
MAX_CHANGES = 64
"""Changes retained in the observation; older ones are counted in ``dropped_changes``."""
MAX_TABS = 20
"""Most tabs; ``new_tab`` past it is refused (``too_many_tabs``), tabs past it are not reported."""
MAX_TITLE_BYTES = 1024
"""Longest tab title (UTF-8 bytes; a longer one is cut and the observation says ``title_truncated``)."""
MAX_URL_CHARS = 2048
"""Longest URL navigated to or reported."""
MAX_IMAGE_BYTES = 8 * 1024 * 1024
"""Largest screenshot or zoom image (bytes of the encoded image, before base64)."""
MAX_KEYS = 16
"""Most keys in one ``key`` chord."""
MAX_KEY_BYTES = 64
"""Longest key name (UTF-8 bytes)."""
MAX_SELECT_VALUES = 100
"""Most values in one ``select_option``."""
MAX_QUERY_BYTES = 256
"""Longest ``find`` query and ``wait_for`` text (UTF-8 bytes, after whitespace is normalised)."""
MAX_SCROLL_PX = 1_000_000
"""Largest ``scroll`` amount acted on (CSS px); a larger one scrolls this far."""
LOAD_TIMEOUT_S = 20.0
"""How long ``navigate`` and ``new_tab`` wait for the page's load; past it they return (the document is
there, still loading)."""

RefusalCode = Literal["stale_ref", "unknown_tab", "not_actionable", "wait_timeout", "unsupported_url",
                      "too_many_tabs"]
REFUSAL_CODES: tuple[str, ...] = RefusalCode.__args__  # type: ignore[attr-defined]
"""422 codes whose message the model may see: ``stale_ref`` (a ref never issued, or issued for a
document the tab no longer shows), ``unknown_tab``, ``not_actionable`` (the element is hidden, disabled,
covered, or not of the kind the member needs; a point outside the viewport; a tab not in front for an
X input member; the last tab closed), ``wait_timeout``, ``unsupported_url`` (not http(s) or
about:blank), ``too_many_tabs``."""

ReadRole = Literal["button", "textbox", "combobox", "checkbox", "radio", "slider", "listbox"]
"""The SDK's element roles. Links are reported as ``button`` (they are clicked the same way)."""
Omission = Literal["report_limit", "text_limit", "target_limit", "work_limit", "frame_limit",
                   "unsupported_root", "unsupported_control", "remote_action", "private", "value",
                   "name_limit"]
Modifier = Literal["Control", "Alt", "Meta", "Shift"]


def utf8_len(text: str) -> int:
    """Length of ``text`` in UTF-8 bytes (a lone surrogate counts 3)."""
    return len(text.encode("utf-8", "surrogatepass"))


def cut_utf8(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` UTF-8 bytes at a character boundary."""
    return text[:limit].encode("utf-8", "surrogatepass")[:limit].decode("utf-8", "ignore")


def normalise_space(text: str) -> str:
    """Whitespace runs as one space, ends stripped (how ``wait_for`` compares text)."""
    return " ".join(text.split())


_LABEL = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?")


def reportable_url(url: str) -> str:
    """The URL a tab reports: ``url`` when it is an http(s) URL of at most :data:`MAX_URL_CHARS`
    characters whose host is one the SDK accepts (DNS labels, a dotted-quad IPv4 address or an IPv6
    address; no ``%``, no control characters), else ``"about:blank"``."""
    if not isinstance(url, str) or len(url) > MAX_URL_CHARS or re.search(r"[\x00-\x20\x7f\ud800-\udfff]", url):
        return "about:blank"
    match = re.match(r"(https?)://([^/?#]*)", url)
    if not match:
        return "about:blank"
    host_port = match[2].rsplit("@", 1)[-1]
    try:
        parts = urlsplit(f"{match[1]}://{host_port}")
        host, port = parts.hostname or "", parts.port
    except ValueError:
        return "about:blank"
    if not host or "%" in host_port or "\\" in host_port or (port is not None and not 0 <= port <= 65535):
        return "about:blank"
    if ":" in host:
        try:
            IPv6Address(host)
        except ValueError:
            return "about:blank"
        return url
    labels = host.removesuffix(".").split(".")
    if any(_LABEL.fullmatch(label) is None for label in labels):
        return "about:blank"
    if re.fullmatch(r"(?:[0-9]+|0x[0-9a-f]*)", labels[-1]):
        try:
            if str(IPv4Address(host)) != host:
                return "about:blank"
        except ValueError:
            return "about:blank"
    return url


# -- the guest's URL rule -------------------------------------------------------------------------------
_LOCAL_NAMES = frozenset({"localhost", "localhost6", "localhost.localdomain", "localhost6.localdomain6",
                          "ip6-localhost", "ip6-loopback"})
_LINK_LOCAL = (ip_network("169.254.0.0/16"), ip_network("fe80::/10"))
_THIS_NETWORK = ip_network("0.0.0.0/8")
DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}
"""Effective port per scheme of the URLs the rule judges (WebSocket schemes count as http(s))."""
MAX_RULE_ENTRIES = 256
"""Most origins, or gateway hosts, in one :class:`GuestUrlRule`."""
REFUSED_GATEWAY = "the gateway's own address is never loaded"
REFUSED_AGENT = "the agent's own address is never loaded"
REFUSED_LOCAL = "a guest-local address the task does not open"
REFUSED_UNREADABLE = "an address the agent cannot read"
"""The reasons a URL is refused by the guest's rule (:meth:`GuestUrlRule.refusal`), also the controller's
words for the same cases: short, fixed, safe to show."""
REFUSED_SIGNIN_REDIRECT = "a redirect that would send a sign-in's values to another origin"
"""Why the agent refuses a redirect hop of a sign-in submit's POST (a 307 or 308 sends the body again) to
an origin other than the credential origin (docs/ARCHITECTURE.md, contract 8)."""
_DIRECT_NAME = re.compile(r"[a-z0-9_](?:[a-z0-9_-]*[a-z0-9_])?(?:\.[a-z0-9_](?:[a-z0-9_-]*[a-z0-9_])?)*")


def _ipv4_literal(text: str) -> IPv4Address | None:
    """An IPv4 literal in any form the WHATWG URL parser (and ``inet_aton``) reads: one to four parts,
    each decimal, hex (``0x``) or octal (leading ``0``), the last filling the remaining bytes
    (``127.1``, ``2130706433``, ``0x7f.1``); None for anything else, an overflow included."""
    parts = text.split(".")
    if len(parts) > 4 or not all(re.fullmatch(r"0[xX][0-9a-fA-F]*|[0-9]+", p) for p in parts):
        return None
    values = []
    for part in parts:
        if part[:2] in ("0x", "0X"):
            values.append(int(part[2:] or "0", 16))
        elif len(part) > 1 and part.startswith("0"):
            if not set(part) <= set("01234567"):
                return None
            values.append(int(part, 8))
        else:
            values.append(int(part))
    head, last = values[:-1], values[-1]
    if any(v > 255 for v in head) or last >= 256 ** (5 - len(values)):
        return None
    number = last
    for index, value in enumerate(head):
        number += value << (8 * (3 - index))
    return IPv4Address(number)


def host_key(host: str) -> IPv4Address | IPv6Address | str:
    """``host`` (a URL's host: brackets, any case, one trailing dot allowed) as compared by the rule: an
    IP address in any literal form as its address (an IPv4-mapped IPv6 address as its IPv4 one), a name
    lower-case without its trailing dot."""
    text = host.strip().lower()
    text = text[1:-1] if text.startswith("[") and text.endswith("]") else text
    text = text[:-1] if text.endswith(".") and not text.endswith("..") else text
    if ":" in text:
        try:
            address = IPv6Address(text)
        except ValueError:
            return text
        return address.ipv4_mapped or address
    return _ipv4_literal(text) or text


def _local_key(key: IPv4Address | IPv6Address | str) -> str | None:
    """``loopback`` or ``link`` when :func:`host_key` ``key`` is guest-local, else None."""
    if isinstance(key, str):
        return "loopback" if key in _LOCAL_NAMES or key.endswith(".localhost") else None
    if isinstance(key, IPv6Address) and int(key) >> 32 == 0:
        key = IPv4Address(int(key))  # ::, ::1 and the IPv4-compatible ::a.b.c.d
    if key.is_loopback or key.is_unspecified or (isinstance(key, IPv4Address) and key in _THIS_NETWORK):
        return "loopback"
    return "link" if any(key in net for net in _LINK_LOCAL if net.version == key.version) else None


def guest_local(host: str) -> bool:
    """Whether ``host`` is the guest itself or its link: the names of loopback (``localhost``,
    ``*.localhost``, ...), loopback, unspecified (``0.0.0.0/8``, ``::``) and link-local addresses, in any
    literal form (``127.1``, ``0x7f.1``, ``2130706433``, ``[::ffff:127.0.0.1]``). The gateway cannot reach
    them: chromium reaches those of the rule's local origins directly (:meth:`GuestUrlRule.direct_hosts`),
    the rest through the gateway's proxy, which refuses them."""
    return _local_key(host_key(host)) is not None


def loopback_host(host: str) -> bool:
    """Whether ``host`` is the guest's own loopback: :func:`guest_local` but link-local addresses."""
    return _local_key(host_key(host)) == "loopback"


def origin_key(url: str) -> tuple[str, IPv4Address | IPv6Address | str, int] | None:
    """``(scheme, host key, port)`` of an http(s) or ws(s) URL (ws as http, wss as https; the host as
    :func:`host_key` reads it, the port the effective one): two URLs are of one origin when their keys
    are equal. Raises ValueError for a URL that cannot be read; None for another scheme."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS:
        return None
    port = parts.port
    host = parts.hostname
    if not host:
        raise ValueError("no host")
    scheme = {"ws": "http", "wss": "https"}.get(scheme, scheme)
    return scheme, host_key(host), port if port is not None else DEFAULT_PORTS[scheme]


def _checked_origin(text: str) -> str:
    parsed = origin_key(text) if re.fullmatch(r"https?://[^/?#@\\\s]+/?", text) else None
    if parsed is None or not guest_local(urlsplit(text).hostname or ""):
        raise ValueError("each local origin is http(s)://host[:port] on a guest-local host")
    return text


def _checked_host(text: str) -> str:
    if not text or len(text) > 253 or re.search(r"[\s/?#@]", text):
        raise ValueError("each gateway host is a host name or address")
    return text


class GuestUrlRule(BaseModel):
    """``PUT /v1/browser/rule``: what the agent's chromium may load, judged by the agent for every
    request chromium makes (docs/ARCHITECTURE.md, contract 9). ``local_origins``: origins
    ``http(s)://host[:port]`` on guest-local hosts (:func:`guest_local`) that may be loaded; every other
    guest-local origin is refused (the agent adds the origins its chromium was launched with).
    ``gateway_hosts``: the gateway's names and addresses, never loaded. ``agent_port``: the agent's port,
    never loaded on loopback. Origins elsewhere are left to the gateway, which decides every connection
    chromium makes through it. Raises ValidationError (strict: no coercion, unknown fields refused)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, hide_input_in_errors=True)

    local_origins: list[Annotated[StrictStr, Field(max_length=MAX_URL_CHARS), AfterValidator(_checked_origin)]] = \
        Field(default_factory=list, max_length=MAX_RULE_ENTRIES)
    gateway_hosts: list[Annotated[StrictStr, AfterValidator(_checked_host)]] = \
        Field(default_factory=lambda: ["gateway"], max_length=MAX_RULE_ENTRIES)
    agent_port: StrictInt | None = Field(default=None, ge=1, le=65535)

    def refusal(self, url: str, launched: Iterable[str] = ()) -> str | None:
        """Why chromium may not load ``url`` (one of the ``REFUSED_*`` reasons), or None: a URL of another
        scheme than http(s) and ws(s) is not judged (it makes no request to a host). ``launched``: more
        local origins (those chromium was launched with)."""
        try:
            origin = origin_key(url)
        except ValueError:
            return REFUSED_UNREADABLE
        if origin is None:
            return None
        scheme, host, port = origin
        if host in {host_key(h) for h in self.gateway_hosts}:
            return REFUSED_GATEWAY
        local = _local_key(host)
        if local is None:
            return None
        if self.agent_port is not None and port == self.agent_port and local == "loopback":
            return REFUSED_AGENT
        for allowed in (*self.local_origins, *launched):
            try:
                if origin_key(allowed) == origin:
                    return None
            except ValueError:
                continue
        return REFUSED_LOCAL

    def direct_hosts(self, launched: Iterable[str] = ()) -> list[str]:
        """``host:port`` of each local origin (the rule's and ``launched``), as chromium's proxy bypass
        list names a host (an IPv4 address dotted, an IPv6 one in brackets, a name in lower case): the
        guest's own services its chromium reaches without the gateway, every scheme on that host and
        port. The agent's port is never one; a name that is not plain DNS labels (a comma or a ``*``
        would be more rules) is left out, so it goes to the gateway, which refuses it."""
        hosts: list[str] = []
        for allowed in (*self.local_origins, *launched):
            try:
                key = origin_key(allowed)
            except ValueError:
                continue
            if key is None or _local_key(key[1]) is None:
                continue
            _scheme, host, port = key
            if self.agent_port is not None and port == self.agent_port and _local_key(host) == "loopback":
                continue
            if isinstance(host, IPv6Address):
                text = f"[{host}]"
            elif isinstance(host, IPv4Address) or _DIRECT_NAME.fullmatch(host):
                text = str(host)
            else:
                continue
            hosts.append(f"{text}:{port}")
        return list(dict.fromkeys(hosts))


# -- arguments ---------------------------------------------------------------------------------------
class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


TabId = Annotated[StrictStr | None, Field(default=None, max_length=128)]
Ref = Annotated[StrictStr, Field(min_length=1, max_length=MAX_LABEL_BYTES)]
Coordinate = Annotated[StrictInt, Field(ge=0, le=9_007_199_254_740_991)]


def _query_text(value: str) -> str:
    if not normalise_space(value) or utf8_len(normalise_space(value)) > MAX_QUERY_BYTES:
        raise ValueError(f"must hold text, at most {MAX_QUERY_BYTES} bytes once whitespace is normalised")
    return value


QueryText = Annotated[StrictStr, AfterValidator(_query_text)]
"""Text a page is searched for (``find``'s query, ``wait_for``'s text): not blank, at most
:data:`MAX_QUERY_BYTES` in UTF-8 once whitespace is normalised (:func:`normalise_space`)."""


class _TabArgs(_Args):
    tab_id: TabId = None


class _TargetArgs(_TabArgs):
    target: Ref


class NavigateArgs(_TabArgs):
    """``navigate``: load ``url`` (http(s) or about:blank) in the tab."""

    url: StrictStr = Field(max_length=MAX_URL_CHARS)


class ReadPageArgs(_TabArgs):
    """``read_page``: ``all`` (visible text and elements) or ``interactive`` (elements, no text)."""

    filter: Literal["all", "interactive"]


class GetPageTextArgs(_TabArgs):
    """``get_page_text``: the visible text (a read report without elements)."""


class FindArgs(_TabArgs):
    """``find``: elements and text lines whose label or text holds ``query`` (case-insensitive)."""

    query: QueryText


class ClickArgs(_TargetArgs):
    """``click``: a left click at the centre of element ``target``."""


class TypeArgs(_TabArgs):
    """``type``: replace the content of element ``target`` with ``text``, or insert ``text`` at the
    focus when ``target`` is None."""

    text: StrictStr = Field(max_length=MAX_TEXT_CHARS)
    target: Annotated[StrictStr | None, Field(default=None, min_length=1, max_length=MAX_LABEL_BYTES)] = None


class KeyArgs(_TabArgs):
    """``key``: press ``keys`` as one chord (in order, released in reverse)."""

    keys: list[StrictStr] = Field(min_length=1, max_length=MAX_KEYS)

    @field_validator("keys")
    @classmethod
    def _keys(cls, value: list[str]) -> list[str]:
        if any(not k or utf8_len(k) > MAX_KEY_BYTES for k in value):
            raise ValueError(f"each key is a nonempty name of at most {MAX_KEY_BYTES} bytes")
        return value


class ScrollArgs(_TabArgs):
    """``scroll``: a mouse wheel of ``amount`` CSS px towards ``direction`` at the viewport's centre."""

    direction: Literal["up", "down", "left", "right"]
    amount: Coordinate


class SelectOptionArgs(_TargetArgs):
    """``select_option``: select the options of ``target`` (a select control) whose value or label is
    one of ``values`` (every value must match one)."""

    values: list[Annotated[StrictStr, Field(max_length=4 * MAX_VALUE_BYTES)]] = Field(max_length=MAX_SELECT_VALUES)


class HoverArgs(_TargetArgs):
    """``hover``: move the mouse to the centre of ``target``."""


class ScreenshotArgs(_TabArgs):
    """``screenshot``: the tab's viewport as a PNG."""


class ZoomArgs(_TabArgs):
    """``zoom``: the viewport region ``[left, top, right, bottom]`` (viewport CSS px), enlarged."""

    region: list[Coordinate] = Field(min_length=4, max_length=4)

    @field_validator("region")
    @classmethod
    def _region(cls, value: list[int]) -> list[int]:
        if not (value[0] < value[2] and value[1] < value[3]):
            raise ValueError("region is [left, top, right, bottom] with left < right and top < bottom")
        return value


class NewTabArgs(_Args):
    """``new_tab``: open a tab (at ``url``, else about:blank) and bring it to the front."""

    url: Annotated[StrictStr | None, Field(default=None, max_length=MAX_URL_CHARS)] = None


class SwitchTabArgs(_Args):
    """``switch_tab``: bring tab ``tab_id`` to the front."""

    tab_id: StrictStr = Field(max_length=128)


class CloseTabArgs(_Args):
    """``close_tab``: close tab ``tab_id`` (not the last one)."""

    tab_id: StrictStr = Field(max_length=128)


class ScrollToArgs(_TargetArgs):
    """``scroll_to``: scroll ``target`` into the middle of the viewport."""


class WaitForArgs(_TabArgs):
    """``wait_for``: wait until the visible text holds ``text`` (whitespace normalised), at most
    ``timeout_ms``."""

    text: QueryText
    timeout_ms: StrictInt = Field(ge=1, le=30_000)


class HoverAtArgs(_TabArgs):
    """``hover_at``: the X pointer to viewport point (``x``, ``y``) (CSS px)."""

    x: Coordinate
    y: Coordinate


class SetCheckedArgs(_TargetArgs):
    """``set_checked``: click checkbox or radio ``target`` when its state is not ``checked``."""

    checked: StrictBool


def _unique_modifiers(value: list[str]) -> list[str]:
    if len(set(value)) != len(value):
        raise ValueError("modifiers must be unique")
    return value


Modifiers = Annotated[list[Modifier], Field(max_length=4), AfterValidator(_unique_modifiers)]
"""The modifiers ``click_at`` and ``drag_path`` hold: at most four, each once."""


class Point(_Args):
    """A viewport point ``{x, y}`` (CSS px)."""

    x: Coordinate
    y: Coordinate


class ClickAtArgs(_TabArgs):
    """``click_at``: ``click_count`` clicks of ``button`` at viewport point (``x``, ``y``) (CSS px),
    ``keys`` held, through the X input."""

    x: Coordinate
    y: Coordinate
    button: Literal["left", "right", "middle"]
    click_count: Literal[1, 2, 3]
    keys: Modifiers


class DragPathArgs(_TabArgs):
    """``drag_path``: left button down at the first point, through every point, up at the last
    (viewport CSS px), ``keys`` held, through the X input."""

    path: list[Point] = Field(min_length=2, max_length=100)
    keys: Modifiers


class HoldKeysArgs(_TabArgs):
    """``hold_keys``: hold ``keys`` down for ``duration_ms``, through the X input."""

    keys: list[StrictStr] = Field(min_length=1, max_length=8)
    duration_ms: StrictInt = Field(ge=1, le=3000)

    @field_validator("keys")
    @classmethod
    def _keys(cls, value: list[str]) -> list[str]:
        if any(not k or utf8_len(k) > MAX_KEY_BYTES for k in value) or len(set(value)) != len(value):
            raise ValueError(f"keys are unique nonempty names of at most {MAX_KEY_BYTES} bytes")
        return value


ARGUMENT_MODELS: dict[str, type[_Args]] = {
    "navigate": NavigateArgs, "read_page": ReadPageArgs, "get_page_text": GetPageTextArgs, "find": FindArgs,
    "click": ClickArgs, "type": TypeArgs, "key": KeyArgs, "scroll": ScrollArgs,
    "select_option": SelectOptionArgs, "hover": HoverArgs, "screenshot": ScreenshotArgs, "zoom": ZoomArgs,
    "new_tab": NewTabArgs, "switch_tab": SwitchTabArgs, "close_tab": CloseTabArgs, "scroll_to": ScrollToArgs,
    "wait_for": WaitForArgs, "hover_at": HoverAtArgs, "set_checked": SetCheckedArgs, "click_at": ClickAtArgs,
    "drag_path": DragPathArgs, "hold_keys": HoldKeysArgs,
}
"""Each served member's argument model."""
if tuple(ARGUMENT_MODELS) != GUEST_MEMBERS:
    raise ImportError("wire.browser_tools: ARGUMENT_MODELS must name GUEST_MEMBERS in order")

Member = Literal[GUEST_MEMBERS]  # type: ignore[valid-type]


class BrowserCall(BaseModel):
    """``POST /v1/browser/call``: run ``member`` with ``arguments`` (validated by the member's model;
    :attr:`args` is the parsed model)."""

    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)

    member: Member
    arguments: dict[StrictStr, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _check(self) -> "BrowserCall":
        ARGUMENT_MODELS[self.member].model_validate(self.arguments)
        return self

    @property
    def args(self) -> Any:
        """The arguments as the member's model (:data:`ARGUMENT_MODELS`)."""
        return ARGUMENT_MODELS[self.member].model_validate(self.arguments)


def call_problem(body: Any) -> str | None:
    """Why ``body`` is no :class:`BrowserCall` (``where: rule``, never the value), or None."""
    if isinstance(body, dict) and body.get("member") in ARGUMENT_MODELS and isinstance(body.get("arguments"), dict):
        model, value, prefix = ARGUMENT_MODELS[body["member"]], body["arguments"], "arguments."
        if set(body) - {"member", "arguments"}:
            model, value, prefix = BrowserCall, body, ""
    else:
        model, value, prefix = BrowserCall, body, ""
    try:
        model.model_validate(value)
    except ValidationError as exc:
        first = exc.errors(include_input=False, include_url=False)[0]
        where = prefix + ".".join(str(part) for part in first.get("loc", ())) if first.get("loc") else prefix.rstrip(".") or "body"
        message = str(first.get("msg", "invalid"))
        if first.get("type") == "literal_error" and where == "member":
            message = "unknown or unserved member; served: " + ", ".join(GUEST_MEMBERS)
        return f"{where}: {message}"
    return None


# -- results -----------------------------------------------------------------------------------------
class _Out(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Box(_Out):
    """A box in viewport CSS px: ``x``, ``y`` its top left corner."""

    x: float
    y: float
    width: float
    height: float


class ScreenBox(_Out):
    """A box in screen px of the agent's display."""

    x: int
    y: int
    width: int
    height: int


class ReadOption(_Out):
    """An option of a select control (``selected`` for a listbox only)."""

    label: str = Field(min_length=1)
    value: str
    selected: bool | None = None


class ReadElement(_Out):
    """One element of a read report: an opaque ``ref``, its SDK ``role`` and ``label``; ``value``,
    ``options``, ``checked`` when they apply (absent otherwise)."""

    ref: str = Field(min_length=1)
    role: ReadRole
    label: str = Field(min_length=1)
    value: str | None = None
    options: list[ReadOption] | None = None
    checked: bool | None = None


class ReadReport(_Out):
    """The SDK's ``BrowserReadV1``."""

    version: Literal[1] = 1
    text: str
    elements: list[ReadElement] = Field(max_length=MAX_READ_ELEMENTS)
    omitted: list[Omission]


class InputImage(_Out):
    """The SDK's ``input_image`` content: a ``data:image/png;base64,...`` (or jpeg) URL."""

    type: Literal["input_image"] = "input_image"
    image_url: str
    detail: Literal["original"] = "original"


class BrowserCallResult(_Out):
    """``POST /v1/browser/call`` 200 (module docstring)."""

    result: Union[None, str, ReadReport, InputImage] = None
    target: Box | None = None
    viewport: ScreenBox | None = None

    def wire(self) -> dict[str, Any]:
        """JSON of the answer: None fields inside read reports and options left out (the SDK's
        optional keys are absent, never null)."""
        out = self.model_dump(exclude={"result"})
        if isinstance(self.result, BaseModel):
            out["result"] = self.result.model_dump(exclude_none=True)
        else:
            out["result"] = self.result
        return out


class Tab(_Out):
    """A tab: the agent's own ``id`` (``tab-N``, at most 128 bytes), ``title`` (page text, at most
    :data:`MAX_TITLE_BYTES`), ``url`` (:func:`reportable_url`: what the agent sends must already be one;
    the controller refuses anything else as a malformed answer, so a hostile guest fails a call, never
    the SDK's own state check, which would end the run)."""

    id: str = Field(min_length=1, max_length=128)
    title: str
    url: str
    active: bool

    @model_validator(mode="after")
    def _reportable(self) -> "Tab":
        if utf8_len(self.id) > 128 or utf8_len(self.title) > MAX_TITLE_BYTES:
            raise ValueError(f"a tab id is at most 128 bytes, a title at most {MAX_TITLE_BYTES}")
        if reportable_url(self.url) != self.url:
            raise ValueError("a tab's url must be an http(s) URL the SDK accepts, or about:blank")
        return self


ChangeType = Literal["tab_opened", "tab_closed", "tab_switched", "navigation", "navigation_refused",
                     "dialog_dismissed", "download"]


class Change(_Out):
    """One change in the observation (the SDK's ``BrowserStateChange``): ``sequence`` counts from 1;
    ``reason`` for ``navigation_refused``, ``kind`` for ``dialog_dismissed``, ``status`` for ``download``."""

    type: ChangeType
    sequence: int
    tab_id: str | None
    reason: Literal["policy", "unsupported"] | None = None
    kind: Literal["alert", "confirm", "prompt", "beforeunload", "other"] | None = None
    status: Literal["blocked", "started", "completed", "failed"] | None = None


class Observation(_Out):
    """The SDK's ``BrowserObservationV1``: ``sequence`` == ``dropped_changes`` + len(``changes``)."""

    version: Literal[1] = 1
    sequence: int
    dropped_changes: int
    title_truncated: bool
    changes: list[Change] = Field(max_length=MAX_CHANGES)

    @model_validator(mode="after")
    def _sequence(self) -> "Observation":
        if self.sequence != self.dropped_changes + len(self.changes):
            raise ValueError("sequence must be dropped_changes + len(changes)")
        return self


class BrowserStateV1(_Out):
    """``GET /v1/browser/state``: the SDK's ``BrowserState`` with an observation."""

    tabs: list[Tab] = Field(max_length=MAX_TABS)
    observation: Observation

    @model_validator(mode="after")
    def _one_active(self) -> "BrowserStateV1":
        if self.tabs and sum(t.active for t in self.tabs) != 1:
            raise ValueError("exactly one tab is active when there are tabs")
        if len({t.id for t in self.tabs}) != len(self.tabs):
            raise ValueError("tab ids are unique")
        return self

    def wire(self) -> dict[str, Any]:
        """JSON of the state, each change with only the fields of its type."""
        out = self.model_dump()
        out["observation"]["changes"] = [c.model_dump(exclude_none=True) | {"tab_id": c.tab_id}
                                         for c in self.observation.changes]
        return out
