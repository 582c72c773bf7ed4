"""Origins: the (scheme, host, port) an egress rule, a pattern and a request are compared on, and the
canonical host text they are compared by. The floor of the policy's vocabulary: :mod:`controller.gateway.tiers`
(patterns) and :mod:`controller.gateway.policy` (the decision) both build on it, and it imports neither.

Pure module (no proxy import). Rules: :mod:`controller.gateway.policy`'s docstring and the isolation model
in ARCHITECTURE.md.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Any, Callable, Optional
from urllib.parse import urlsplit

from controller.gateway.addresses import PolicyError, parse_ip_literal, parse_ipv4_literal

DEFAULT_PORTS: dict[str, int] = {"http": 80, "https": 443}
"""Effective port per scheme when an origin names none (RFC 9110 sections 4.2.1 and 4.2.2)."""

_LABEL_RE = re.compile(r"^[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?$")


def canonical_host(host: str) -> str:
    """Canonical host text: IP literals in standard form (IPv6 without brackets), names IDNA-encoded
    (UTS #46), lower-case, trailing dot stripped.

    Raises PolicyError for empty hosts, whitespace, ``%``, ``@``, ``/``, ``\\`` or any other character a
    host name cannot contain, and for labels IDNA rejects.
    """
    if not host or any(c.isspace() for c in host):
        raise PolicyError(f"invalid host {host!r}")
    literal = parse_ip_literal(host)
    if literal is not None:
        return str(literal)
    name = host[:-1] if host.endswith(".") else host
    if not name or name.endswith("."):
        raise PolicyError(f"invalid host {host!r}")
    if name.isascii():
        name = name.lower()
        labels = name.split(".")
        if len(name) > 253 or not all(_LABEL_RE.match(label) for label in labels):
            raise PolicyError(f"invalid host name {host!r}")
        encoded = name
    else:
        import idna  # local import: only needed for non-ASCII names

        try:
            encoded = idna.encode(name, uts46=True).decode("ascii")
        except idna.IDNAError as exc:
            raise PolicyError(f"invalid internationalised host name {host!r}: {exc}") from exc
        # UTS #46 maps other full stops (U+3002, U+FF0E, ...) to '.', so a trailing one shows up only now.
        if encoded.endswith("."):
            encoded = encoded[:-1]
            if not encoded or encoded.endswith("."):
                raise PolicyError(f"invalid host {host!r}")
    # A name that ends in a number is read as an IPv4 literal by resolvers and URL parsers alike.
    if parse_ipv4_literal(encoded.rsplit(".", 1)[-1]) is not None and parse_ipv4_literal(encoded) is None:
        raise PolicyError(f"host {host!r} ends in a number but is not a valid IPv4 literal")
    return encoded


@dataclass(frozen=True, order=True)
class Origin:
    """An origin: (scheme, host, port), canonical. ``host`` is IDNA ASCII or a canonical IP text form.

    Build with :meth:`parse` (policy entries) or :meth:`from_parts` (what a proxy saw); equality is the
    only way origins are compared.
    """

    scheme: str
    host: str
    port: int

    @property
    def is_ip_literal(self) -> bool:
        """True when the host is an IP address rather than a name."""
        try:
            ipaddress.ip_address(self.host)
        except ValueError:
            return False
        return True

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        if DEFAULT_PORTS.get(self.scheme) == self.port:
            return f"{self.scheme}://{host}"
        return f"{self.scheme}://{host}:{self.port}"

    @classmethod
    def from_parts(cls, scheme: str, host: str, port: Optional[int] = None) -> "Origin":
        """Canonical origin from separately known parts. ``port`` None means the scheme's default.

        Raises PolicyError for unsupported schemes (only http and https), bad hosts and ports outside
        1..65535.
        """
        scheme = scheme.lower()
        if scheme not in DEFAULT_PORTS:
            raise PolicyError(f"unsupported scheme {scheme!r} (http and https only)")
        if port is None:
            port = DEFAULT_PORTS[scheme]
        if not isinstance(port, int) or not 1 <= port <= 65535:
            raise PolicyError(f"port out of range: {port!r}")
        return cls(scheme, canonical_host(host), port)

    @classmethod
    def parse(cls, text: str) -> "Origin":
        """Parse a policy entry ``scheme://host[:port]`` (an optional single trailing ``/`` is allowed).

        Raises PolicyError for user info, paths, queries, fragments, wildcards, empty or malformed ports.
        """
        if not isinstance(text, str) or any(c.isspace() for c in text):
            raise PolicyError(f"invalid origin {text!r}")
        match = re.fullmatch(r"([A-Za-z][A-Za-z0-9+.-]*)://([^/?#]*)/?", text)
        if not match:
            raise PolicyError(f"invalid origin {text!r}: expected scheme://host[:port]")
        scheme, authority = match.groups()
        if "@" in authority or "*" in authority or "\\" in authority:
            raise PolicyError(f"invalid origin {text!r}: user info and wildcards are not accepted")
        host, port = _split_authority(authority, text)
        return cls.from_parts(scheme, host, port)

    @classmethod
    def from_url(cls, url: str) -> "Origin":
        """Origin of a full URL (user info ignored, as browsers do). Raises PolicyError when malformed."""
        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError as exc:
            raise PolicyError(f"invalid URL {url!r}: {exc}") from exc
        if parts.hostname is None:
            raise PolicyError(f"URL has no host: {url!r}")
        return cls.from_parts(parts.scheme, parts.hostname, port)

    @classmethod
    def from_authority(cls, scheme: str, authority: str) -> "Origin":
        """The origin an authority ``host[:port]`` names for ``scheme`` (a Host header, HTTP/2
        ``:authority``, a request target's authority); no port means the scheme's default.

        Raises PolicyError for an empty authority, user info, whitespace, a path, query or fragment,
        an IPv6 literal without brackets or anything else within them, an empty or malformed port and a
        bad host.
        """
        if not isinstance(authority, str) or not authority or any(c in authority for c in "@/?#\\*"):
            raise PolicyError(f"invalid authority {authority!r}")
        if any(c.isspace() for c in authority):
            raise PolicyError(f"invalid authority {authority!r}")
        host, port = _split_authority(authority, authority)
        if host.startswith("[") and ":" not in host:
            raise PolicyError(f"invalid authority {authority!r}: only IPv6 literals are bracketed")
        return cls.from_parts(scheme, host, port)


def _split_authority(authority: str, text: str) -> tuple[str, Optional[int]]:
    if authority.startswith("["):
        end = authority.find("]")
        if end < 0:
            raise PolicyError(f"invalid origin {text!r}: unbalanced brackets")
        host, rest = authority[: end + 1], authority[end + 1 :]
        if rest and not rest.startswith(":"):
            raise PolicyError(f"invalid origin {text!r}")
        port_text = rest[1:] if rest else None
    elif authority.count(":") > 1:
        raise PolicyError(f"invalid origin {text!r}: IPv6 literals must be bracketed")
    elif ":" in authority:
        host, port_text = authority.split(":", 1)
    else:
        host, port_text = authority, None
    if port_text is None:
        return host, None
    if not port_text.isdigit() or not port_text.isascii():
        raise PolicyError(f"invalid origin {text!r}: bad port {port_text!r}")
    return host, int(port_text)


def canonical_list(value: object, not_a_list: str, canonical: Callable[[Any], str], *,
                   unique: bool = True) -> tuple[str, ...]:
    """A policy field that holds a list (origins, patterns, address rules): the texts ``canonical`` makes
    of its entries, in order, a repeated one dropped when ``unique``.

    Raises ValueError ``not_a_list`` when ``value`` is a string or not a list, ValueError with the
    message of a PolicyError ``canonical`` raises, and lets any other ValueError of it through."""
    if isinstance(value, str) or not isinstance(value, (list, tuple)):
        raise ValueError(not_a_list)
    out: list[str] = []
    for entry in value:
        try:
            text = canonical(entry)
        except PolicyError as exc:
            raise ValueError(str(exc)) from exc
        if not unique or text not in out:
            out.append(text)
    return tuple(out)
