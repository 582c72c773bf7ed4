"""Client of QEMU's machine protocol (QMP) over a unix socket in a VM sandbox's private directory: what
the VM backend's machine snapshots use (``stop``, ``migrate`` to a file, ``cont``, ``query-status``).

QEMU itself answers here, not the guest, but a reply can still carry text the guest chose (an event's
data, an error naming a device): every read is capped (:data:`LINE_MAX_BYTES` per message) and bounded
by a deadline, and text from a reply is escaped (:func:`controller.text.clean`) before it is shown.
"""

from __future__ import annotations

import collections
import json
import socket
import threading
import time
from pathlib import Path
from typing import Any

from controller.sandbox.errors import SandboxError
from controller.text import clean

LINE_MAX_BYTES = 1024 * 1024
"""Longest QMP message (one JSON line) read; a longer one closes the channel with an error."""
EVENTS_KEPT = 64
"""Asynchronous events (``{"event": ...}``) kept, newest last; older ones are dropped."""


class QMPChannel:
    """One QMP connection: the greeting, ``qmp_capabilities``, then one command at a time (thread-safe).

    ``path``: the socket QEMU serves (``-qmp unix:PATH,server=on,wait=off``). Connects on first use,
    retrying until the command's deadline while QEMU has not made the socket yet. Events that arrive
    between replies are kept in ``events`` (at most :data:`EVENTS_KEPT`).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._sock: socket.socket | None = None
        self._buf = b""
        self._lock = threading.Lock()
        self._next_id = 0
        self.events: collections.deque[dict[str, Any]] = collections.deque(maxlen=EVENTS_KEPT)

    def close(self) -> None:
        """Close the connection (QEMU goes on running)."""
        if self._sock is not None:
            try:
                self._sock.close()
            finally:
                self._sock = None
        self._buf = b""

    def _read_message(self, deadline: float) -> dict[str, Any]:
        """The next JSON object QEMU sends (at most :data:`LINE_MAX_BYTES`), before ``deadline``."""
        assert self._sock is not None
        while b"\n" not in self._buf:
            if len(self._buf) > LINE_MAX_BYTES:
                raise ValueError(f"QMP message over {LINE_MAX_BYTES} bytes")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("QEMU did not answer on QMP")
            self._sock.settimeout(remaining)
            try:
                chunk = self._sock.recv(65536)
            except TimeoutError:
                raise TimeoutError("QEMU did not answer on QMP") from None
            if not chunk:
                raise ConnectionError("QMP socket closed (QEMU exited?)")
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        if len(line) > LINE_MAX_BYTES:
            raise ValueError(f"QMP message over {LINE_MAX_BYTES} bytes")
        message = json.loads(line)
        if not isinstance(message, dict):
            raise ValueError("QMP message is not an object")
        return message

    def _connect(self, deadline: float) -> None:
        """Connect (retrying while the socket is not there yet), read the greeting, enter command mode."""
        delay = 0.01
        while True:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.settimeout(max(deadline - time.monotonic(), 0.01))
                sock.connect(str(self.path))
                break
            except (FileNotFoundError, ConnectionRefusedError):
                sock.close()
                if time.monotonic() + delay > deadline:
                    raise TimeoutError(f"no QMP socket at {self.path}") from None
                time.sleep(delay)  # poll interval while QEMU makes its socket, bounded by the deadline
                delay = min(delay * 2, 0.1)
            except BaseException:
                sock.close()
                raise
        self._sock, self._buf = sock, b""
        greeting = self._read_message(deadline)
        if "QMP" not in greeting:
            raise ValueError("QMP greeting missing")
        self._send_and_wait("qmp_capabilities", None, deadline)

    def _send_and_wait(self, name: str, arguments: dict[str, Any] | None, deadline: float) -> Any:
        assert self._sock is not None
        self._next_id += 1
        ident = f"ds-{self._next_id}"
        msg: dict[str, Any] = {"execute": name, "id": ident}
        if arguments is not None:
            msg["arguments"] = arguments
        self._sock.sendall(json.dumps(msg).encode() + b"\n")
        while True:
            reply = self._read_message(deadline)
            if "event" in reply:
                self.events.append(reply)
                continue
            if reply.get("id") != ident:
                continue  # a reply to a command whose wait timed out earlier
            if "error" in reply:
                error = reply["error"]
                desc = error.get("desc", error) if isinstance(error, dict) else error
                raise QMPCommandError(f"QEMU {name}: {clean(desc, 300)}")
            return reply.get("return")

    def command(self, name: str, arguments: dict[str, Any] | None = None, *, timeout: float = 10.0) -> Any:
        """Run QMP command ``name`` (with ``arguments``) and return its ``return`` value.

        Raises SandboxError (:class:`QMPCommandError` for QEMU's error reply, its text escaped) when QEMU
        refuses, the socket is gone, a message is malformed or over the cap, or no answer comes within
        ``timeout`` seconds (connecting included).
        """
        deadline = time.monotonic() + timeout
        with self._lock:
            try:
                if self._sock is None:
                    self._connect(deadline)
                return self._send_and_wait(name, arguments, deadline)
            except QMPCommandError:
                raise
            except (OSError, TimeoutError, ConnectionError, ValueError) as exc:
                self.close()
                raise SandboxError(f"QMP {name}: {type(exc).__name__}: {clean(exc, 300)}") from exc


class QMPCommandError(SandboxError):
    """QEMU answered a QMP command with an error (the message holds QEMU's description, escaped)."""
