"""Client of qemu-guest-agent (the VM backend's ``exec_in_guest``), over a virtio-serial port whose host
end is a unix socket. Every read is bounded by a deadline: the guest is not trusted to answer."""

from __future__ import annotations

import json
import secrets
import socket
import threading
import time
from pathlib import Path
from typing import Any

from controller.sandbox import SandboxError
from controller.text import clean


class GuestAgentChannel:
    """Client of qemu-guest-agent over its virtio-serial port (host end: a unix socket).

    Speaks the QGA JSON protocol: ``guest-sync-delimited`` to resynchronise, then one command at a time.
    Used only for ``guest-exec``/``guest-exec-status``. Thread-safe (one lock).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._sock: socket.socket | None = None
        self._buf = b""
        self._lock = threading.Lock()

    def close(self) -> None:
        """Close the connection (the guest side is unaffected)."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        self._buf = b""

    def _readline(self, deadline: float) -> bytes:
        assert self._sock is not None
        while b"\n" not in self._buf:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("guest agent did not answer")
            self._sock.settimeout(remaining)
            chunk = self._sock.recv(65536)
            if not chunk:
                raise ConnectionError("guest agent channel closed")
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        return line

    def _sync(self, deadline: float) -> None:
        """Connect if needed and discard stale output until a fresh sync id comes back."""
        while True:
            if self._sock is None:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sock.connect(str(self.path))
                self._sock = sock
            sync_id = secrets.randbelow(2**31)
            msg = {"execute": "guest-sync-delimited", "arguments": {"id": sync_id}}
            self._sock.sendall(json.dumps(msg).encode() + b"\n")
            attempt_deadline = min(deadline, time.monotonic() + 3.0)
            try:
                while True:
                    line = self._readline(attempt_deadline).lstrip(b"\xff").strip()
                    if not line:
                        continue
                    try:
                        reply = json.loads(line)
                    except json.JSONDecodeError:
                        continue
                    if reply.get("return") == sync_id:
                        return
            except TimeoutError:
                if time.monotonic() >= deadline:
                    raise
                self._buf = b""  # guest agent not up yet (or a reply lost): resend

    def command(self, name: str, arguments: dict[str, Any] | None = None, *, timeout: float = 30.0) -> Any:
        """Run one QGA command and return its ``return`` value.

        Raises SandboxError on an ``error`` reply, a closed channel, or no answer within ``timeout`` s.
        """
        deadline = time.monotonic() + timeout
        with self._lock:
            try:
                if self._sock is None:
                    self._sync(deadline)
                msg: dict[str, Any] = {"execute": name}
                if arguments is not None:
                    msg["arguments"] = arguments
                assert self._sock is not None
                self._sock.sendall(json.dumps(msg).encode() + b"\n")
                while True:
                    line = self._readline(deadline).lstrip(b"\xff").strip()
                    if not line:
                        continue
                    reply = json.loads(line)
                    if "error" in reply:
                        error = reply["error"]
                        desc = error.get("desc", error) if isinstance(error, dict) else error
                        raise SandboxError(f"guest agent {name}: {clean(desc, 300)}")
                    if "return" in reply:
                        return reply["return"]
            except (OSError, TimeoutError, ConnectionError, json.JSONDecodeError) as exc:
                self.close()
                raise SandboxError(f"guest agent {name}: {type(exc).__name__}: {clean(exc, 300)}") from exc

    def wait_ready(self, timeout: float) -> None:
        """Block until the guest agent answers a sync (raises SandboxError after ``timeout`` s)."""
        with self._lock:
            try:
                self._sync(time.monotonic() + timeout)
            except (OSError, TimeoutError, ConnectionError) as exc:
                self.close()
                raise SandboxError(f"guest agent not answering: {exc}") from exc
