"""Helpers that act inside a Docker sandbox's guest (through ``exec_in_guest``)."""

from __future__ import annotations

#: Requests through the guest's proxy (HTTP_PROXY), each to an origin deny-all refuses.
_DENIED_REQUESTS = (
    "import sys, urllib.request\n"
    "for url in sys.argv[1:]:\n"
    "    try:\n"
    "        urllib.request.urlopen(url, timeout=10)\n"
    "    except Exception as exc:\n"
    "        print(url, getattr(exc, 'code', exc))\n"
)


def guest_requests(sandbox, urls: list[str]) -> str:
    """Make one request per URL from the guest through its proxy; returns what the guest printed."""
    result = sandbox.exec_in_guest(["/opt/desktop-sandbox/bin/python", "-c", _DENIED_REQUESTS, *urls], timeout=60)
    assert result.exit_code == 0, result.stderr.decode()
    return result.stdout.decode()
