"""One X connection to the guest display, reconnected after the X server goes away.

The agent keeps a single python-xlib connection for input (XTEST) and state queries. Any
failure of that connection (server restarted, socket closed, refused) is turned into
:class:`DisplayUnavailable`, which the HTTP layer answers with 503 ``display_unavailable``;
the next call tries to connect again. Nothing here ever exits the process: python-xlib
reports connection loss as exceptions, and asynchronous protocol errors only reach the
error handler installed below, which records them.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import Xlib.display
import Xlib.error

log = logging.getLogger(__name__)

#: Exceptions that mean the connection to the X server is gone or unusable.
CONNECTION_ERRORS: tuple[type[BaseException], ...] = (
    Xlib.error.ConnectionClosedError,
    Xlib.error.DisplayError,
    OSError,
    EOFError,
    AssertionError,  # python-xlib asserts on a truncated reply from a dying server
)


class DisplayUnavailable(RuntimeError):
    """The X display cannot be reached right now (HTTP 503 ``display_unavailable``)."""


def describe(exc: BaseException) -> str:
    """A non-empty reason for a connection failure: the exception's text, else its type.

    python-xlib and mss raise bare ``AssertionError()`` (empty text) when the server dies mid-reply.
    """
    text = " ".join(str(exc).split())
    return text or f"{type(exc).__name__} while talking to the X server"


def close_quietly(connection: object) -> None:
    """Close an X connection (an ``Xlib`` display, an ``mss`` instance) that may already be dead;
    ``None`` is nothing to close."""
    if connection is not None:
        try:
            connection.close()  # type: ignore[attr-defined]
        except Exception:  # noqa: BLE001 - the socket may already be dead
            pass


def went_away(display: str, exc: BaseException) -> DisplayUnavailable:
    """The error for a connection that was working and broke (server stopped, restarted or crashed)."""
    return DisplayUnavailable(f"X display {display} went away (the X server closed or broke the "
                              f"connection: {describe(exc)}); the next request reconnects")


@dataclass(frozen=True)
class ScreenInfo:
    """Geometry of screen 0 in screen pixels; ``depth`` in bits per pixel."""

    width: int
    height: int
    depth: int


class DisplayConnection:
    """A lazily opened, reconnecting python-xlib connection to one X display.

    Use :meth:`session` for every piece of work: it holds the connection's lock (python-xlib
    connections are not thread-safe), yields a connected ``Xlib.display.Display`` and converts
    connection failures into :class:`DisplayUnavailable` after dropping the broken connection,
    so the next session reconnects. ``timeout`` (seconds) bounds the wait for the lock.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._dpy: Xlib.display.Display | None = None
        self._info: ScreenInfo | None = None
        self._lock = threading.RLock()
        self.protocol_errors = 0

    def _on_protocol_error(self, err: Xlib.error.XError, request: object) -> None:
        # Asynchronous X errors (e.g. a BadValue from a request without reply) must never
        # propagate or terminate the agent; they are counted and logged.
        self.protocol_errors += 1
        log.warning("X protocol error: %s", err)

    def _connect(self) -> Xlib.display.Display:
        try:
            dpy = Xlib.display.Display(self.name)
        except CONNECTION_ERRORS as exc:
            raise DisplayUnavailable(f"cannot connect to X display {self.name} ({describe(exc)}); "
                                     "is its X server running?") from exc
        dpy.set_error_handler(self._on_protocol_error)
        if not dpy.query_extension("XTEST").present:
            dpy.close()
            raise DisplayUnavailable(f"X display {self.name} has no XTEST extension")
        screen = dpy.screen()
        self._info = ScreenInfo(screen.width_in_pixels, screen.height_in_pixels, screen.root_depth)
        return dpy

    def drop(self) -> None:
        """Forget the current connection (closing it quietly); the next use reconnects."""
        with self._lock:
            dpy, self._dpy = self._dpy, None
            self._info = None
        if dpy is not None:
            try:
                dpy.close()
            except Exception:  # noqa: BLE001 - the socket may already be dead
                pass

    def get(self) -> Xlib.display.Display:
        """Return the live connection, connecting first if needed.

        Raises:
            DisplayUnavailable: the server cannot be reached.
        """
        with self._lock:
            if self._dpy is None:
                self._dpy = self._connect()
            return self._dpy

    @contextmanager
    def session(self, timeout: float = -1) -> Iterator[Xlib.display.Display]:
        """Yield the connection under its lock; on connection loss drop it and raise
        DisplayUnavailable. Raises TimeoutError when the lock is not free within ``timeout``."""
        if not self._lock.acquire(timeout=timeout):
            raise TimeoutError("the X connection is busy")
        try:
            dpy = self.get()
            try:
                yield dpy
            except DisplayUnavailable:
                self.drop()
                raise
            except CONNECTION_ERRORS as exc:
                self.drop()
                raise went_away(self.name, exc) from exc
        finally:
            self._lock.release()

    def focus_box(self, timeout: float = -1) -> tuple[int, int, int, int] | None:
        """The box ``(x, y, width, height)`` in screen px of the top-level window that holds the X input
        focus (the window keys typed now reach), cut to the screen; None when the focus is on no window
        (the root, ``None``, ``PointerRoot``) or the window is gone.

        Raises:
            DisplayUnavailable: the server cannot be reached.
            TimeoutError: the connection stayed busy for ``timeout`` seconds.
        """
        with self.session(timeout) as dpy:
            root = dpy.screen().root
            window = dpy.get_input_focus().focus
            if not hasattr(window, "query_tree") or window.id == root.id:
                return None
            try:
                for _ in range(64):  # a top-level window is a child of the root; the tree is never deeper
                    parent = window.query_tree().parent
                    if parent is None or parent.id == root.id:
                        break
                    window = parent
                geometry = window.get_geometry()
                origin = window.translate_coords(root, 0, 0)
            except Xlib.error.XError:
                return None  # the window went away between the calls
            info = self._info
            assert info is not None
            x, y = -int(origin.x), -int(origin.y)
            left, top = max(0, x), max(0, y)
            right = min(info.width, x + int(geometry.width) + 2 * int(geometry.border_width))
            bottom = min(info.height, y + int(geometry.height) + 2 * int(geometry.border_width))
            if right <= left or bottom <= top:
                return None
            return left, top, right - left, bottom - top

    def info(self, timeout: float = -1) -> ScreenInfo:
        """Screen geometry, verified with a round trip so a dead server is noticed.

        Raises:
            DisplayUnavailable: the server cannot be reached.
            TimeoutError: the connection stayed busy for ``timeout`` seconds.
        """
        with self.session(timeout) as dpy:
            dpy.get_input_focus()  # round trip: fails fast if the server is gone
            info = self._info
            assert info is not None
            return info
