"""Clients that never finish a request, against a real server process: many connections each holding an
unfinished request head, counted as the server closes them, and the server's open descriptors.

Used by the connection-rule tests of every server (``wire.connections``): the server process runs with a
low descriptor limit (:func:`limit_descriptors`), more unfinished connections than that limit are opened
(:class:`Unfinished`), and a request with the right key must still be answered at once.
"""

from __future__ import annotations

import errno
import os
import resource
import select
import socket
import time

from wire.connections import HEAD_TIMEOUT_S

LOW_LIMIT = 256
"""The descriptor limit the server runs with in these tests."""
FLOOD = 300
"""Unfinished connections opened: more than :data:`LOW_LIMIT`."""
UNFINISHED_HEAD = b"GET / HTTP/1.1\r\n"
"""What each unfinished connection sends: a request line, never the end of the headers."""
CLOSE_MARGIN_S = 4.0
"""Slack past the head deadline for the last unfinished connection to be closed (a busy 2-core host)."""


def limit_descriptors(pid: int, limit: int = LOW_LIMIT) -> None:
    """Set the process's ``RLIMIT_NOFILE`` (soft and hard) to ``limit``."""
    resource.prlimit(pid, resource.RLIMIT_NOFILE, (limit, limit))


def descriptors(pid: int) -> int:
    """How many descriptors the process has open now."""
    return len(os.listdir(f"/proc/{pid}/fd"))


def _closed(sock: socket.socket) -> bool:
    """Whether the peer closed ``sock`` (EOF or reset); never blocks."""
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    if not poller.poll(0):
        return False
    try:
        return sock.recv(4096, socket.MSG_PEEK) == b""
    except OSError:
        return True


class Unfinished:
    """``count`` connections to ``address``, each having sent only ``head`` (see the module docstring).
    A connection the server closed while they were being opened counts as closed."""

    def __init__(self, address: tuple[str, int], count: int = FLOOD, head: bytes = UNFINISHED_HEAD) -> None:
        self.socks: list[socket.socket] = []
        self.gone_early = 0
        try:
            for _ in range(count):
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                self.socks.append(sock)
                sock.settimeout(10)
                sock.connect(address)
                try:
                    sock.sendall(head)
                except OSError as exc:  # closed by the server already (to make room for newer ones)
                    if exc.errno not in (errno.EPIPE, errno.ECONNRESET):
                        raise
                    self.gone_early += 1
        except BaseException:
            self.close()
            raise
        self.opened_at = time.monotonic()

    def closed(self) -> int:
        """How many of the connections the server has closed."""
        return sum(1 for sock in self.socks if _closed(sock))

    def wait_all_closed(self, timeout: float = HEAD_TIMEOUT_S + CLOSE_MARGIN_S) -> int:
        """Wait until the server closed every connection or ``timeout`` seconds after the last was opened
        pass; returns how many it closed."""
        deadline = self.opened_at + timeout
        while True:
            closed = self.closed()
            if closed == len(self.socks) or time.monotonic() >= deadline:
                return closed
            poller = select.poll()  # wakes when one of them is closed (or sends something)
            for sock in self.socks:
                if not _closed(sock):
                    poller.register(sock, select.POLLIN)
            poller.poll(1000 * min(0.5, max(0.0, deadline - time.monotonic())))

    def close(self) -> None:
        for sock in self.socks:
            sock.close()


def raw_request(address: tuple[str, int], method: str, path: str, headers: list[tuple[str, str]],
                timeout: float = 10.0) -> tuple[int, bytes]:
    """One request written byte for byte (``headers`` exactly as given: none added, repeats kept, plus
    ``Connection: close``); returns the answer's status and body (read to the close)."""
    head = f"{method} {path} HTTP/1.1\r\n" + "".join(f"{n}: {v}\r\n" for n, v in headers) + "Connection: close\r\n\r\n"
    with socket.create_connection(address, timeout=timeout) as sock:
        sock.sendall(head.encode("latin-1"))
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    status_line, _, rest = data.partition(b"\r\n")
    _, _, body = rest.partition(b"\r\n\r\n")
    return int(status_line.split()[1]), body
