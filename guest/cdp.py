"""The Chrome DevTools Protocol over ``--remote-debugging-pipe``: the agent's channel into its browser.

Chromium started with ``--remote-debugging-pipe`` reads protocol messages from its fd 3 and writes
them to its fd 4; each message is one JSON object followed by a NUL byte (Chromium's
``DevToolsPipeHandler``). The launch broker (:mod:`guest.launch`) makes the two pipes, starts the
browser with their browser ends as fds 3 and 4, and hands the other ends to the agent over its
socket (``SCM_RIGHTS``): no port, no socket path, nothing another process can open. Only the agent
holds them, and the browser runs as a user of its own, so no other user's process can reach them
through ``/proc`` either (docs/ARCHITECTURE.md, "Contract 8").

:class:`Pipe` is a small, strict client: one reader thread splits messages, answers are matched to
commands by ``id`` (sessions by ``sessionId``, the flat mode of ``Target.attachToTarget``), events go
to listeners. The browser is treated as hostile like everything in the guest: a message larger than
:data:`MAX_MESSAGE_BYTES` is dropped unread (its command times out; a page that makes one answer huge
cannot cut the agent off from its browser), every command has a deadline
(:class:`CommandTimeout`), and a protocol error comes back as :class:`CommandFailed`.
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any, Callable

MAX_MESSAGE_BYTES = 16 * 1024 * 1024
"""Largest message the agent accepts from the browser (bytes); a larger one is dropped."""
COMMAND_TIMEOUT_S = 10.0
"""Default deadline of one command (seconds)."""
READ_CHUNK = 256 * 1024

EventListener = Callable[[str, dict[str, Any], str | None], None]
"""``listener(method, params, session_id)``: called on the reader thread; must not block."""


class ChannelError(Exception):
    """The channel failed: ``code`` (``channel_closed``, ``command_timeout``, ``command_failed``)."""

    code = "channel_error"


class ChannelClosed(ChannelError):
    """The browser closed its end, exited, or broke the protocol (an oversized or malformed message)."""

    code = "channel_closed"


class CommandTimeout(ChannelError):
    """A command got no answer within its deadline."""

    code = "command_timeout"


class CommandFailed(ChannelError):
    """The browser answered a command with a protocol error (its ``message`` in the exception)."""

    code = "command_failed"


class Pending:
    """The answer to come of one command sent with :meth:`Pipe.send`."""

    def __init__(self, pipe: "Pipe", ident: int, method: str, slot: list[Any]) -> None:
        self._pipe, self._ident, self.method, self._slot = pipe, ident, method, slot

    def result(self, timeout: float = COMMAND_TIMEOUT_S) -> dict[str, Any]:
        """Wait at most ``timeout`` seconds for the answer's ``result`` (a dict). Raises
        :class:`ChannelClosed`, :class:`CommandTimeout` or :class:`CommandFailed`; the answer is read once."""
        try:
            if not self._slot[0].wait(timeout):
                raise CommandTimeout(f"{self.method}: no answer from the browser within {timeout:g} s")
        finally:
            self._pipe._forget(self._ident)
        answer = self._slot[1]
        if isinstance(answer, ChannelError):
            raise answer
        if "error" in answer:
            error = answer["error"] if isinstance(answer["error"], dict) else {}
            raise CommandFailed(f"{self.method}: {str(error.get('message', 'error'))[:200]}")
        result = answer.get("result")
        return result if isinstance(result, dict) else {}


class Pipe:
    """A CDP client over two pipe file descriptors: ``write_fd`` (the browser's fd 3) and ``read_fd``
    (the browser's fd 4). Owns both; :meth:`close` closes them. Thread-safe."""

    def __init__(self, write_fd: int, read_fd: int, *, max_message: int = MAX_MESSAGE_BYTES) -> None:
        self._write_fd, self._read_fd, self._max = write_fd, read_fd, max_message
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._next_id = 0
        self._waiting: dict[int, list[Any]] = {}
        self._listeners: list[EventListener] = []
        self._closed: str | None = None
        self.dropped = 0
        """Messages dropped for being over the cap (their commands time out)."""
        self._reader = threading.Thread(target=self._read_loop, name="cdp-reader", daemon=True)
        self._reader.start()

    @property
    def closed(self) -> str | None:
        """Why the channel closed, or None while it is open."""
        return self._closed

    def add_listener(self, listener: EventListener) -> Callable[[], None]:
        """Call ``listener`` for every event; returns a function that removes it."""
        with self._lock:
            self._listeners.append(listener)

        def remove() -> None:
            with self._lock:
                if listener in self._listeners:
                    self._listeners.remove(listener)
        return remove

    def call(self, method: str, params: dict[str, Any] | None = None, *, session_id: str | None = None,
             timeout: float = COMMAND_TIMEOUT_S) -> dict[str, Any]:
        """Send one command and wait for its answer's ``result`` (a dict).

        Raises :class:`ChannelClosed`, :class:`CommandTimeout` (after ``timeout`` seconds) or
        :class:`CommandFailed` (the browser's protocol error).
        """
        return self.send(method, params, session_id=session_id).result(timeout)

    def send(self, method: str, params: dict[str, Any] | None = None, *,
             session_id: str | None = None) -> "Pending":
        """Send one command without waiting: its :class:`Pending` answer is read with
        :meth:`Pending.result`. Commands of one session are handled by the browser in the order sent, so
        a tab waiting for the debugger takes several before it runs (its renderer answers only then).
        Raises :class:`ChannelClosed`."""
        event = threading.Event()
        slot: list[Any] = [event, None]
        with self._lock:
            if self._closed:
                raise ChannelClosed(f"the browser channel is closed: {self._closed}")
            self._next_id += 1
            ident = self._next_id
            self._waiting[ident] = slot
        message: dict[str, Any] = {"id": ident, "method": method, "params": params or {}}
        if session_id is not None:
            message["sessionId"] = session_id
        data = json.dumps(message, separators=(",", ":"), ensure_ascii=False).encode("utf-8") + b"\0"
        try:
            self._write(data)
        except BaseException:
            self._forget(ident)
            raise
        return Pending(self, ident, method, slot)

    def _forget(self, ident: int) -> None:
        with self._lock:
            self._waiting.pop(ident, None)

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        with self._write_lock:
            try:
                while view:
                    view = view[os.write(self._write_fd, view):]
            except OSError as exc:
                self._close(f"write failed: {exc.strerror or exc}")
                raise ChannelClosed(f"the browser channel is closed: {self._closed}") from None

    def _read_loop(self) -> None:
        buffer = bytearray()
        skipping = False  # inside a message over the cap: its bytes are dropped up to its NUL
        try:
            while True:
                try:
                    chunk = os.read(self._read_fd, READ_CHUNK)
                except OSError as exc:
                    self._close(f"read failed: {exc.strerror or exc}")
                    return
                if not chunk:
                    self._close("the browser closed the channel")
                    return
                if skipping:
                    end = chunk.find(b"\0")
                    if end < 0:
                        continue
                    chunk, skipping = chunk[end + 1:], False
                buffer += chunk
                while True:
                    end = buffer.find(b"\0")
                    if end < 0:
                        break
                    raw = bytes(buffer[:end])
                    del buffer[:end + 1]
                    self._dispatch(raw)
                if len(buffer) > self._max:
                    buffer.clear()  # its command, if any, times out; the channel stays
                    skipping = True
                    self.dropped += 1
        finally:
            buffer.clear()

    def _dispatch(self, raw: bytes) -> None:
        if len(raw) > self._max:
            self.dropped += 1
            return
        try:
            message = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            return
        if not isinstance(message, dict):
            return
        ident = message.get("id")
        if isinstance(ident, int) and not isinstance(ident, bool):
            with self._lock:
                slot = self._waiting.get(ident)
            if slot is not None:
                slot[1] = message
                slot[0].set()
            return
        method, params = message.get("method"), message.get("params")
        if isinstance(method, str) and isinstance(params, dict):
            session = message.get("sessionId")
            with self._lock:
                listeners = list(self._listeners)
            for listener in listeners:
                try:
                    listener(method, params, session if isinstance(session, str) else None)
                except Exception:  # a listener's bug must not stop the reader
                    pass

    def _close(self, reason: str) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = reason
            waiting = list(self._waiting.values())
        for slot in waiting:
            slot[1] = ChannelClosed(f"the browser channel is closed: {reason}")
            slot[0].set()

    def close(self) -> None:
        """Close both descriptors; pending and later commands raise :class:`ChannelClosed`."""
        self._close("closed by the agent")
        for fd in (self._write_fd, self._read_fd):
            try:
                os.close(fd)
            except OSError:
                pass
        self._reader.join(timeout=2.0)


def wait_until(condition: Callable[[], Any], timeout: float, interval: float = 0.05) -> Any:
    """Call ``condition`` until it returns a truthy value or ``timeout`` seconds pass; returns the last
    value (falsy on timeout). ``interval``: seconds between polls of a bounded condition wait."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(interval)  # poll interval of a bounded condition wait
