"""Origin patterns for the ``ask`` and ``quiet`` tiers of a policy in mode ``ask``, and their defaults.

Pure module (no proxy import). A pattern is one of:

* ``*`` -- any origin (http or https, any host, any port);
* ``scheme://host[:port]`` -- exactly that origin, as :class:`~controller.gateway.origin.Origin` parses it;
* ``scheme://*.suffix[:port]`` -- every host with one or more whole labels in front of ``suffix``:
  ``https://*.example.test`` matches ``https://a.example.test`` and ``https://a.b.example.test``, never
  ``https://example.test`` itself, ``https://badexample.test`` or ``https://example.test.evil.test``;
* a port of ``*`` (``https://*.example.test:*``) matches every port; no port means the scheme's default.

Matching compares the canonical (IDNA, lower-case, no trailing dot) host label by label, so spelling
tricks that :class:`~controller.gateway.origin.Origin` canonicalises away cannot slip past it. IP
literals never match a wildcard (they have no labels to speak of); they match an exact pattern only.

Rule source: ARCHITECTURE.md, contract 2 (``[network]``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Optional

from controller.gateway.addresses import PolicyError, parse_ip_literal
from controller.gateway.origin import DEFAULT_PORTS, Origin, canonical_list

DEFAULT_HOLD_TIMEOUT_S = 25.0
"""Seconds the gateway holds a connection to an ``ask``-tier origin while it waits for a person.

Measured with the guest's own browser (the image's firefox-esr 153.8.0esr with its enterprise policies
and default preferences, a fresh profile, behind a proxy that reads the request and never answers):
Firefox closes a held CONNECT after 30.7 s and does not retry it (the page then shows a proxy error);
a held plain-HTTP request it was still waiting on after 390 s. The default stays about 5 s below the
CONNECT limit, so an answer still reaches a browser that waits; a longer ``hold_timeout_s`` helps only
plain HTTP and clients other than the browser.
"""

MAX_HOLD_TIMEOUT_S = 600.0
"""Largest ``hold_timeout_s`` a policy may set (seconds)."""

DEFAULT_MAX_PENDING = 3
"""Unknown origins that may wait for an answer at once; one more is denied (``prompt_limit``)."""

MAX_PENDING_LIMIT = 100
"""Largest ``max_pending`` a policy may set."""

DEFAULT_ASK: tuple[str, ...] = ("*",)
"""The ``ask`` tier when a policy in mode ``ask`` names none: any origin may be asked for (the
address rules still refuse special addresses)."""

DEFAULT_QUIET: tuple[str, ...] = (
    # Seen from an idle guest browser in its first minutes (firefox-esr 153, the image's policies and
    # preferences, a fresh profile): remote settings and their attachments, add-on and system add-on
    # update checks, studies.
    "https://firefox.settings.services.mozilla.com",
    "https://firefox-settings-attachments.cdn.mozilla.net",
    "https://services.addons.mozilla.org",
    "https://aus5.mozilla.org",
    "https://normandy.cdn.mozilla.net",
    # What those lead to once answered, and other background services a preference could turn back on:
    # content signatures, blocklists and safe browsing, push, location, telemetry, sponsored content
    # and suggestions, plugin downloads, captive-portal detection.
    "https://content-signature-2.cdn.mozilla.net",
    "https://versioncheck-bg.addons.mozilla.org",
    "https://shavar.services.mozilla.com",
    "https://tracking-protection.cdn.mozilla.net",
    "https://safebrowsing.googleapis.com",
    "https://push.services.mozilla.com",
    "https://location.services.mozilla.com",
    "https://incoming.telemetry.mozilla.org",
    "https://classify-client.services.mozilla.com",
    "https://contile.services.mozilla.com",
    "https://merino.services.mozilla.com",
    "https://spocs.getpocket.com",
    "https://redirector.gvt1.com",
    "http://detectportal.firefox.com",
)
"""The ``quiet`` tier when a policy in mode ``ask`` names none: the guest browser's background traffic,
refused without asking anyone (logged with reason ``quiet``), so that an idle browser raises no prompt.
The image's Firefox policies and default preferences (images/firefox/) turn most of it off; this list
holds what is left and what it would lead to."""

_PATTERN_RE = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://([^/?#]*)/?")


@dataclass(frozen=True)
class OriginPattern:
    """One parsed pattern (see the module docstring). ``any_origin``: the pattern ``*``; otherwise
    ``scheme``, ``host`` (canonical; for a wildcard the suffix after ``*.``), ``wildcard`` and ``port``
    (None: any port)."""

    any_origin: bool = False
    scheme: str = ""
    host: str = ""
    wildcard: bool = False
    port: Optional[int] = None

    def __str__(self) -> str:
        if self.any_origin:
            return "*"
        host = f"*.{self.host}" if self.wildcard else (f"[{self.host}]" if ":" in self.host else self.host)
        if self.port is None:
            return f"{self.scheme}://{host}:*"
        if DEFAULT_PORTS[self.scheme] == self.port:
            return f"{self.scheme}://{host}"
        return f"{self.scheme}://{host}:{self.port}"

    @classmethod
    def parse(cls, text: object) -> "OriginPattern":
        """Parse ``*`` or ``scheme://[*.]host[:port|:*]`` (one optional trailing ``/``).

        Raises PolicyError for anything else: a ``*`` anywhere but as the whole first label or the whole
        port, user info, paths, queries, schemes other than http and https, wildcard IP literals and hosts
        or ports :class:`~controller.gateway.origin.Origin` refuses.
        """
        if not isinstance(text, str) or not text or any(c.isspace() for c in text):
            raise PolicyError(f"invalid origin pattern {text!r}")
        if text == "*":
            return cls(any_origin=True)
        match = _PATTERN_RE.fullmatch(text)
        if not match:
            raise PolicyError(f"invalid origin pattern {text!r}: expected *, scheme://host[:port] or "
                              "scheme://*.domain[:port]")
        scheme, authority = match.group(1).lower(), match.group(2)
        if scheme not in DEFAULT_PORTS:
            raise PolicyError(f"invalid origin pattern {text!r}: unsupported scheme (http and https only)")
        if "@" in authority or "\\" in authority:
            raise PolicyError(f"invalid origin pattern {text!r}: user info is not accepted")
        any_port = authority.endswith(":*")
        if any_port:
            authority = authority[:-2]
        wildcard = authority.startswith("*.")
        if wildcard:
            authority = authority[2:]
        if "*" in authority:
            raise PolicyError(f"invalid origin pattern {text!r}: '*' may only stand for whole leading labels "
                              "('*.example.com') or the whole port (':*')")
        if wildcard and authority.startswith("["):
            raise PolicyError(f"invalid origin pattern {text!r}: IP literals take no wildcard")
        probe = Origin.from_authority(scheme, authority) if authority else None
        if probe is None:
            raise PolicyError(f"invalid origin pattern {text!r}: no host")
        if any_port and ":" in authority.rsplit("]", 1)[-1]:
            raise PolicyError(f"invalid origin pattern {text!r}: two ports")
        if wildcard and parse_ip_literal(probe.host) is not None:
            raise PolicyError(f"invalid origin pattern {text!r}: IP literals take no wildcard")
        return cls(scheme=scheme, host=probe.host, wildcard=wildcard, port=None if any_port else probe.port)

    def matches(self, origin: Origin) -> bool:
        """True when ``origin`` (canonical) is one this pattern names: same scheme, port (or any port),
        and host equal to ``host`` or, for a wildcard, ending in ``.`` + ``host`` (whole labels)."""
        if self.any_origin:
            return True
        if origin.scheme != self.scheme or (self.port is not None and origin.port != self.port):
            return False
        if not self.wildcard:
            return origin.host == self.host
        return not origin.is_ip_literal and origin.host.endswith("." + self.host)


def canonical_patterns(value: object, field: str) -> tuple[str, ...]:
    """``value`` (a list of pattern texts) as canonical pattern texts, duplicates dropped, in order.

    Raises ValueError naming ``field`` and the entry when ``value`` is not a list or an entry does not
    parse."""
    return canonical_list(value, f"{field} must be a list of origin patterns",
                          lambda entry: str(OriginPattern.parse(entry)))


@lru_cache(maxsize=4096)
def _parsed(text: str) -> OriginPattern:
    return OriginPattern.parse(text)


def first_match(patterns: tuple[str, ...], origin: Origin) -> Optional[str]:
    """The first of ``patterns`` (canonical texts, as :func:`canonical_patterns` gives them) that
    matches ``origin``, or None."""
    for text in patterns:
        if _parsed(text).matches(origin):
            return text
    return None


__all__ = [
    "DEFAULT_ASK", "DEFAULT_HOLD_TIMEOUT_S", "DEFAULT_MAX_PENDING", "DEFAULT_QUIET", "MAX_HOLD_TIMEOUT_S",
    "MAX_PENDING_LIMIT", "OriginPattern", "canonical_patterns", "first_match",
]
