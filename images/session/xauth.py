"""Write an X authority file holding one MIT-MAGIC-COOKIE-1: ``xauth.py PATH < COOKIE_HEX``.

The cookie arrives on stdin as 32 hexadecimal digits (16 bytes), never in argv. ``PATH`` is created
with mode 0600 by the calling user (written to ``PATH.partial`` and renamed over ``PATH``), holding two
entries for display ``$DISPLAY`` (default ``:99``): family Local with this host's name (what
python-xlib, the agent's X library, looks up) and family Wild (what libXau, every other X client and
the X server itself, accepts). Run by images/entrypoint.sh once per user that needs the display (the
desktop user's copy is also the X server's ``-auth`` file; the agent's copy lies in its own directory).

Exits 2 on a malformed cookie or display, 1 when the file cannot be written.
"""

from __future__ import annotations

import os
import re
import socket
import struct
import sys

FAMILY_LOCAL = 256
FAMILY_WILD = 65535
AUTH_NAME = b"MIT-MAGIC-COOKIE-1"


def _field(data: bytes) -> bytes:
    return struct.pack(">H", len(data)) + data


def entries(cookie: bytes, display_number: int, hostname: str) -> bytes:
    """The file's bytes: a Local entry for ``hostname`` and a Wild entry, both for ``display_number``."""
    number = str(display_number).encode()
    out = b""
    for family, address in ((FAMILY_LOCAL, hostname.encode()), (FAMILY_WILD, b"")):
        out += struct.pack(">H", family) + _field(address) + _field(number) + _field(AUTH_NAME) + _field(cookie)
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: xauth.py PATH < COOKIE_HEX", file=sys.stderr)
        return 2
    text = sys.stdin.read().strip()
    match = re.fullmatch(r"[0-9a-f]{32}", text)
    display = os.environ.get("DISPLAY", ":99")
    number = re.fullmatch(r":(\d+)(?:\.\d+)?", display)
    if not match or not number:
        print("xauth.py: expected 32 hex digits on stdin and DISPLAY=:N", file=sys.stderr)
        return 2
    path = argv[0]
    tmp = path + ".partial"
    try:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(entries(bytes.fromhex(text), int(number.group(1)), socket.gethostname()))
        os.rename(tmp, path)
    except OSError as exc:
        print(f"xauth.py: cannot write {path}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
