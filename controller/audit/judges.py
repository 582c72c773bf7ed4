"""A probe (what ``guest/netprobe.py`` runs and how its observation is judged) and the judges' parts.

Observations come from the guest, which is hostile: a judge reads ``detail`` (any JSON value) only through
:func:`hops`, so a malformed detail makes the probe fail, never the audit crash.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from controller.audit.report import Expected

DENY_BODY = "denied by sandbox egress policy: "
"""How the gateway's own refusal body (HTTP 403) begins."""

Hits = list[dict[str, Any]]
Judge = Callable[[str, Any, Hits], tuple[bool, bool]]
"""``judge(observed, detail, hits) -> (passed, escaped)``; ``hits``: the targets' and host canary's records
(``{"target": "allowed"|"recorder"|"host", "hit", "port", "peer", ...}``)."""


@dataclass
class Probe:
    """A probe: what netprobe runs (``spec``, whose ``name`` is the probe's) and how to judge it."""

    name: str
    category: str
    target: str
    expected: Expected
    spec: dict[str, Any]
    judge: Judge = field(repr=False, default=None)  # type: ignore[assignment]


def no_hits(port: Optional[int] = None, target: str = "recorder") -> Callable[[Hits], bool]:
    """A hit check for ``blocked``: True when no record of ``target`` (``recorder``, ``allowed``, ``host``)
    in ``hits`` is on ``port`` (any port when None)."""

    def hit_free(hits: Hits) -> bool:
        return not any(h["target"] == target and (port is None or h.get("port") == port) for h in hits)

    return hit_free


def anything(_hits: Hits) -> bool:
    """The hit check of a probe whose target records nothing: always True."""
    return True


def blocked(success: Callable[[str, Any], bool], hit_free: Callable[[Hits], bool] = anything) -> Judge:
    """The judge of a probe expected ``blocked``: it escaped when ``success(observed, detail)`` (the guest
    got through) or ``hit_free(hits)`` is False (a target or the host canary recorded it)."""

    def judge(observed: str, detail: Any, hits: Hits) -> tuple[bool, bool]:
        escaped = success(observed, detail) or not hit_free(hits)
        return not escaped, escaped

    return judge


def one_of(*words: str) -> Judge:
    """The judge of a probe that passes only when the guest observed one of ``words`` (any other word is
    an escape): the IPv6 check, the gateway's port scan."""

    def judge(observed: str, _detail: Any, _hits: Hits) -> tuple[bool, bool]:
        return observed in words, observed not in words

    return judge


def connected(observed: str, _detail: Any) -> bool:
    """True when netprobe reports a direct connection, reply, answer, resolution or open port."""
    return observed in ("connected", "reply", "answer", "resolved", "tls-established") or observed.startswith("open:")


def hops(detail: Any) -> list[dict[str, Any]]:
    """The HTTP hops of an ``http`` probe's ``detail`` (``{"hops": [{"status", "body", ...}]}``), keeping
    only well-formed ones (``status`` an int, ``body`` a str); [] for anything else."""
    found = detail.get("hops") if isinstance(detail, dict) else None
    if not isinstance(found, list):
        return []
    return [h for h in found if isinstance(h, dict) and type(h.get("status")) is int
            and isinstance(h.get("body", ""), str)]


def _proxy_refused(observed: str, detail: Any) -> bool:
    """True when the gateway refused: 403 with the policy body, or 400 for a malformed target."""
    if observed == "status:400":
        return True
    if observed != "status:403":
        return False
    if isinstance(detail, str):
        body = detail
    else:
        last = hops(detail)[-1:]
        body = last[0].get("body", "") if last else ""
    return body.startswith(DENY_BODY)


def through_proxy(observed: str, detail: Any) -> bool:
    """True when the gateway let the request or tunnel through (any upstream answer, incl. its 502)."""
    if observed == "tls-established":
        return True
    return observed.startswith("status:") and not _proxy_refused(observed, detail)


def host_port(host: str, port: Optional[int] = None) -> str:
    """``host:port`` with an IPv6 ``host`` bracketed (``[::1]:443``); ``host`` alone when ``port`` is None."""
    h = f"[{host}]" if ":" in host else host
    return f"{h}:{port}" if port is not None else h


def ip_forms(address: str) -> list[str]:
    """Spellings of an IPv4 address a resolver accepts: dotted, decimal, hex, octal, short, mixed,
    IPv4-mapped IPv6 (bracketed)."""
    ip = ipaddress.IPv4Address(address)
    n = int(ip)
    a, b, c, d = ip.packed
    return [
        str(ip),
        str(n),
        hex(n),
        ".".join(f"0{x:o}" for x in ip.packed),
        f"{a}.{(b << 16) | (c << 8) | d}",
        f"{a}.{b}.{(c << 8) | d}",
        f"0x{a:x}.{b}.{c}.{d}",
        f"[::ffff:{ip}]",
        f"[::ffff:{(a << 8) | b:x}:{(c << 8) | d:x}]",
    ]


LOOPBACK_FORMS = ip_forms("127.0.0.1") + ["localhost", "[::1]", "0", "0.0.0.0"]
"""Spellings of the loopback address the probes ask the proxy for (every form of 127.0.0.1, the name,
IPv6, and the addresses that mean "this host")."""
