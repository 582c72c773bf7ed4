"""IP addresses for the egress policy: literals in every form a resolver accepts, and the special-purpose
classification that decides which addresses the gateway refuses unless a rule names them.

Pure module (standard library only); :mod:`controller.gateway.policy` builds the allow/deny decision on
it. Rules: the isolation model in ARCHITECTURE.md.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Optional, Union

from controller.model.errors import DesktopSandboxError

IPAddress = Union[ipaddress.IPv4Address, ipaddress.IPv6Address]
IPNetwork = Union[ipaddress.IPv4Network, ipaddress.IPv6Network]

_NUMERIC_PART_RE = re.compile(r"^(?:0[xX][0-9a-fA-F]*|[0-9]+)$")


class PolicyError(DesktopSandboxError, ValueError):
    """A policy file, origin or address rule is malformed. The message says which entry and why."""

METADATA_ADDRESSES: frozenset[IPAddress] = frozenset(
    ipaddress.ip_address(a)
    for a in (
        "169.254.169.254",  # AWS, GCP, Azure, OpenStack, Oracle instance metadata
        "169.254.169.253",  # AWS VPC DNS
        "169.254.169.123",  # AWS time sync
        "169.254.170.2",  # AWS ECS task metadata
        "169.254.170.23",  # AWS EKS pod identity
        "100.100.100.200",  # Alibaba Cloud metadata
        "192.0.0.192",  # Oracle Cloud legacy metadata
        "fd00:ec2::254",  # AWS IMDS over IPv6
        "fd00:ec2::253",  # AWS VPC DNS over IPv6
        "fd00:ec2::123",  # AWS time sync over IPv6
        "fd00:ec2::23",  # AWS EKS pod identity over IPv6
    )
)
"""Cloud instance-metadata endpoints. A network rule never admits these; only a rule naming the exact
address does."""



# --------------------------------------------------------------------------------------------------
# IP literals


def parse_ipv4_literal(host: str) -> Optional[ipaddress.IPv4Address]:
    """Parse ``host`` the way ``inet_aton`` / the WHATWG URL host parser read IPv4 literals.

    Accepts one to four dot-separated parts, each decimal, hexadecimal (``0x``) or octal (leading ``0``);
    the last part fills the remaining bytes (``127.1`` -> 127.0.0.1, ``2130706433`` -> 127.0.0.1,
    ``0x7f.1`` -> 127.0.0.1). One trailing dot is allowed. Returns None when ``host`` is not an IPv4 literal
    in any of these forms. Raises PolicyError when it looks numeric but overflows (``256.1.1.1``,
    ``4294967296``): resolvers reject it, and so do we rather than treat it as a name.
    """
    text = host[:-1] if host.endswith(".") else host
    if not text:
        return None
    parts = text.split(".")
    if len(parts) > 4 or not all(_NUMERIC_PART_RE.match(p) for p in parts):
        return None
    values: list[int] = []
    for part in parts:
        if part[:2] in ("0x", "0X"):
            values.append(int(part[2:] or "0", 16))
        elif len(part) > 1 and part.startswith("0"):
            if not set(part) <= set("01234567"):
                raise PolicyError(f"invalid octal part {part!r} in IPv4 literal {host!r}")
            values.append(int(part, 8))
        else:
            values.append(int(part, 10))
    head, last = values[:-1], values[-1]
    if any(v > 255 for v in head) or last >= 256 ** (5 - len(values)):
        raise PolicyError(f"IPv4 literal out of range: {host!r}")
    number = last
    for index, value in enumerate(head):
        number += value << (8 * (3 - index))
    return ipaddress.IPv4Address(number)


def parse_ip_literal(host: str) -> Optional[IPAddress]:
    """Return the address if ``host`` is an IP literal in any accepted form, else None.

    IPv6 may be bracketed (``[::1]``) or bare (``::1``); zone identifiers (``fe80::1%eth0``) are rejected
    with PolicyError, since a zone only makes sense for link-local addresses, which are refused anyway.
    """
    text = host.strip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    elif text.startswith("[") or text.endswith("]"):
        raise PolicyError(f"unbalanced brackets in host {host!r}")
    if ":" in text:
        if "%" in text:
            raise PolicyError(f"IPv6 zone identifiers are not accepted: {host!r}")
        try:
            return ipaddress.IPv6Address(text)
        except ValueError as exc:
            raise PolicyError(f"invalid IPv6 literal {host!r}") from exc
    return parse_ipv4_literal(text)


# --------------------------------------------------------------------------------------------------
# Address classification


def _nets(*texts: str) -> tuple[IPNetwork, ...]:
    return tuple(ipaddress.ip_network(t) for t in texts)


# Ordered (category, blocks) table from the IANA IPv4/IPv6 special-purpose address registries, spelled
# out here so the verdict does not depend on the Python version's ``ipaddress`` tables.
_SPECIAL_BLOCKS: tuple[tuple[str, tuple[IPNetwork, ...]], ...] = (
    ("unspecified", _nets("0.0.0.0/32", "::/128")),
    ("loopback", _nets("127.0.0.0/8", "::1/128")),
    ("ipv4-mapped", _nets("::ffff:0:0/96")),
    # NAT64 (RFC 6052, 8215), 6to4 (RFC 3056), Teredo (RFC 4380), IPv4-compatible (RFC 4291 2.5.5.1)
    ("embedded-ipv4", _nets("64:ff9b::/96", "64:ff9b:1::/48", "2002::/16", "2001::/32", "::/96")),
    ("link-local", _nets("169.254.0.0/16", "fe80::/10")),
    ("cgnat", _nets("100.64.0.0/10")),  # RFC 6598 shared address space
    ("multicast", _nets("224.0.0.0/4", "ff00::/8")),
    ("private", _nets("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "fc00::/7")),
    (
        "reserved",
        _nets(
            "0.0.0.0/8",  # "this network"
            "192.0.0.0/24",  # IETF protocol assignments
            "192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24",  # documentation
            "192.88.99.0/24",  # deprecated 6to4 relay anycast
            "198.18.0.0/15",  # benchmarking
            "240.0.0.0/4",  # reserved, incl. limited broadcast
            "100::/64",  # discard-only
            "2001::/23",  # IETF protocol assignments (ORCHID, benchmarking, ...)
            "2001:db8::/32", "3fff::/20",  # documentation
            "5f00::/16",  # SRv6 SIDs
            "fec0::/10",  # deprecated site-local
        ),
    ),
)
_GLOBAL_UNICAST_V6 = ipaddress.ip_network("2000::/3")


def classify_address(address: IPAddress) -> Optional[str]:
    """Return why ``address`` is special (a short category), or None when it is an ordinary public address.

    Categories, checked in this order: ``metadata``, ``unspecified``, ``loopback``, ``ipv4-mapped``,
    ``embedded-ipv4`` (NAT64, 6to4, Teredo, IPv4-compatible), ``link-local``, ``cgnat``, ``multicast``,
    ``private``, ``reserved`` (documentation, benchmarking, IETF assignments, 240/4, IPv6 outside
    2000::/3), ``not-global`` (anything else the running Python's ``ipaddress`` marks not global).
    """
    if address in METADATA_ADDRESSES:
        return "metadata"
    for category, blocks in _SPECIAL_BLOCKS:
        if any(address.version == block.version and address in block for block in blocks):
            return category
    if isinstance(address, ipaddress.IPv6Address) and address not in _GLOBAL_UNICAST_V6:
        return "reserved"
    if not address.is_global:
        return "not-global"
    return None


def _unmapped(address: IPAddress) -> IPAddress:
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address
