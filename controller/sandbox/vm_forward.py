"""One guest connection to the host gateway: the program QEMU runs for each guest-forwarded connection.

QEMU's user-mode network (``guestfwd=tcp:GUEST_ADDR:PORT-cmd:...``) starts this once per TCP connection
the guest opens to the gateway's guest-side address, with that connection as stdin/stdout (and stderr,
so nothing may ever be printed). It connects to ``HOST:PORT`` (the gateway on the host's loopback) and
copies bytes both ways until both sides are done.

Usage (argv, no shell): ``python3 -I -S vm_forward.py 127.0.0.1 PORT``. Standard library only, so it
starts fast under ``-I -S``. Exit status: 0 after a clean close, 1 when the gateway is unreachable.
"""

from __future__ import annotations

import os
import selectors
import socket
import sys

CHUNK = 65536


def _pump(guest: socket.socket, gateway: socket.socket) -> None:
    """Copy bytes between the two sockets; half-close each direction when its source ends."""
    sel = selectors.DefaultSelector()
    peers = {guest: gateway, gateway: guest}
    for sock in peers:
        sel.register(sock, selectors.EVENT_READ)
    open_dirs = 2
    while open_dirs:
        for key, _ in sel.select():
            src = key.fileobj
            dst = peers[src]
            try:
                data = src.recv(CHUNK)
            except OSError:
                data = b""
            if data:
                try:
                    dst.sendall(data)
                    continue
                except OSError:
                    return
            sel.unregister(src)
            open_dirs -= 1
            try:
                dst.shutdown(socket.SHUT_WR)
            except OSError:
                pass


def main(argv: list[str]) -> int:
    """Connect to ``argv[1]:argv[2]`` and relay the guest connection on fd 0 to it."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)  # stderr is the guest's connection: never write to it
    host, port = argv[1], int(argv[2])
    guest = socket.socket(fileno=os.dup(0))
    try:
        gateway = socket.create_connection((host, port), timeout=10)
    except OSError:
        guest.close()
        return 1
    gateway.settimeout(None)
    try:
        _pump(guest, gateway)
    finally:
        gateway.close()
        guest.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
