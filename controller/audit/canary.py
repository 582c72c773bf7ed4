"""The host canary: TCP and UDP listeners on every host address, one ephemeral port, recording every hit.

Proves the guest cannot reach the host (the Docker host's bridge addresses, or the VM's host) at all: the
guest's probes aim at this port, and any connection or datagram that arrives is an escape, whatever the
guest itself reported.
"""

from __future__ import annotations

import secrets
import socket
import threading
import time
from typing import Any

MAX_HITS = 1000
"""Hits kept in ``HostCanary.hits`` (one is already an escape; a flood is not kept in memory)."""


class HostCanary:
    """Listeners on ``0.0.0.0:port`` (TCP and UDP) recording every hit; use as a context manager.

    ``hits``: list of ``{"proto": "tcp"|"udp", "port": int, "peer": str}`` (at most :data:`MAX_HITS`),
    without the canary's own :meth:`flush` markers.
    """

    def __init__(self) -> None:
        self.hits: list[dict[str, Any]] = []
        self._markers: set[tuple[str, str, int]] = set()
        """(proto, address, port) of flush markers sent and not yet seen."""
        self._seen = threading.Condition()
        self._tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._tcp.bind(("0.0.0.0", 0))
        self.port = self._tcp.getsockname()[1]
        self._udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._udp.bind(("0.0.0.0", self.port))
        self._tcp.listen(16)
        self._closed = False
        for target in (self._accept, self._receive):
            threading.Thread(target=target, daemon=True).start()

    def _record(self, proto: str, peer: tuple[str, int]) -> None:
        with self._seen:
            marker = (proto, peer[0], peer[1])
            if marker in self._markers:
                self._markers.discard(marker)
                self._seen.notify_all()
            elif len(self.hits) < MAX_HITS:
                self.hits.append({"proto": proto, "port": self.port, "peer": peer[0]})

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, peer = self._tcp.accept()
            except OSError:
                return
            conn.close()
            self._record("tcp", peer)

    def _receive(self) -> None:
        while not self._closed:
            try:
                _data, peer = self._udp.recvfrom(2048)
            except OSError:
                return
            if peer is None or self._closed:
                return
            self._record("udp", peer)

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until every hit that reached the canary before this call is in ``hits``.

        Sends one TCP connection and one datagram from the host's loopback, each from a port of its own,
        and waits for the listeners to take them (each listener handles its queue in order). Returns True
        when both were seen within ``timeout`` seconds, False otherwise (the listeners are still busy, with
        hits). Raises nothing.
        """
        deadline = time.monotonic() + timeout
        sockets: list[socket.socket] = []
        try:
            for proto, kind in (("tcp", socket.SOCK_STREAM), ("udp", socket.SOCK_DGRAM)):
                sock = socket.socket(socket.AF_INET, kind)
                sockets.append(sock)
                sock.bind(("127.0.0.1", 0))
                with self._seen:
                    self._markers.add((proto, *sock.getsockname()))
                sock.settimeout(timeout)
                if proto == "tcp":
                    sock.connect(("127.0.0.1", self.port))
                else:
                    sock.sendto(secrets.token_bytes(8), ("127.0.0.1", self.port))
            with self._seen:
                return self._seen.wait_for(lambda: not self._markers, max(deadline - time.monotonic(), 0.0))
        except OSError:
            return False
        finally:
            with self._seen:
                self._markers.clear()
            for sock in sockets:
                sock.close()

    def target_hits(self) -> list[dict[str, Any]]:
        """``hits`` as records of target ``host`` (``{"target": "host", "hit": proto, ...}``) for judges."""
        return [{"target": "host", "hit": h["proto"], **h} for h in self.hits]

    def close(self) -> None:
        """Stop listening (idempotent)."""
        self._closed = True
        for sock in (self._tcp, self._udp):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

    def __enter__(self) -> "HostCanary":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
