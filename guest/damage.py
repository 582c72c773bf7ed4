"""Screen changes as the X server reports them (DAMAGE extension), for the ``wait`` action.

:class:`DamageWatch` keeps one X connection of its own: not the input connection
(:class:`guest.display.DisplayConnection`), whose lock a wait would then hold for seconds and whose
replies the events would interleave with, and not the capture's. On it sits one damage object on the
root window at report level ``NonEmpty``. Damage on the root includes every window drawn on the screen,
so any drawing anywhere makes the server send one ``DamageNotify`` (the damaged region went from empty
to non-empty); the watch then empties the region (``DamageSubtract``) so the next drawing sends the
next event. At most one event is ever outstanding, however much is drawn, so the connection never
piles up events between two waits. Moving the pointer draws nothing (the cursor is not part of the
frame a screenshot shows), so it is not a change.

:meth:`DamageWatch.wait_quiet` is the settle rule of ``wait`` (see :mod:`guest.actions`): it returns
True once no damage has been reported for ``quiet`` seconds, counted from the start of the call or from
the last report, whichever is later; False when ``until`` comes first; None when the X server has no
DAMAGE extension (the caller then compares frames). Reports that arrived before the call describe
drawing done before it and are discarded. A connection failure drops the connection and raises
:class:`guest.display.DisplayUnavailable`; the next call connects again (and checks for DAMAGE again).
"""

from __future__ import annotations

import logging
import select
import threading
import time

import Xlib.display
import Xlib.error
from Xlib.ext import damage as xdamage

from .display import CONNECTION_ERRORS, DisplayUnavailable, close_quietly, describe, went_away

log = logging.getLogger(__name__)


class DamageWatch:
    """Screen-change notifications for one display (see module doc). Thread-safe: calls are serialised."""

    def __init__(self, display_name: str) -> None:
        self.display_name = display_name
        self._dpy: Xlib.display.Display | None = None
        self._damage = 0
        self._notify = -1
        self._lock = threading.Lock()

    def _on_error(self, err: Xlib.error.XError, request: object) -> None:
        log.warning("X protocol error on the damage connection: %s", err)

    def _connect(self) -> Xlib.display.Display | None:
        """A connection with its damage object, or None when the server has no DAMAGE."""
        try:
            dpy = Xlib.display.Display(self.display_name)
        except CONNECTION_ERRORS as exc:
            raise DisplayUnavailable(f"cannot connect to X display {self.display_name} ({describe(exc)}); "
                                     "is its X server running?") from exc
        try:
            dpy.set_error_handler(self._on_error)
            if not dpy.has_extension("DAMAGE"):
                dpy.close()
                return None
            dpy.damage_query_version()  # the server refuses DAMAGE requests from a client that has not asked
            self._damage = dpy.screen().root.damage_create(xdamage.DamageReportNonEmpty)
            self._notify = dpy.extension_event.DamageNotify
            dpy.damage_subtract(self._damage)
            dpy.sync()
        except CONNECTION_ERRORS as exc:
            close_quietly(dpy)
            raise went_away(self.display_name, exc) from exc
        return dpy

    def _drop(self) -> None:
        dpy, self._dpy = self._dpy, None
        close_quietly(dpy)

    def close(self) -> None:
        """Close the connection (a later call opens a new one)."""
        with self._lock:
            self._drop()

    def _read(self, dpy: Xlib.display.Display) -> bool:
        """Read what the server has sent without blocking; True when it held a damage report (the region
        is then emptied again, so the next drawing is reported)."""
        damaged = False
        while dpy.pending_events():
            event = dpy.next_event()
            if event.type & 0x7F == self._notify:
                damaged = True
        if damaged:
            dpy.damage_subtract(self._damage)
            dpy.flush()
        return damaged

    def wait_quiet(self, quiet: float, until: float) -> bool | None:
        """Block until no damage was reported for ``quiet`` s (True) or until the monotonic time
        ``until`` (False); None without DAMAGE. Raises DisplayUnavailable (see module doc)."""
        with self._lock:
            dpy = self._begin()
            if dpy is None:
                return None
            try:
                last = time.monotonic()
                while True:
                    now = time.monotonic()
                    if now - last >= quiet:
                        return True
                    if now >= until:
                        return False
                    ready, _, _ = select.select([dpy], [], [], min(last + quiet, until) - now)
                    if ready and self._read(dpy):
                        last = time.monotonic()
            except CONNECTION_ERRORS as exc:
                self._drop()
                raise went_away(self.display_name, exc) from exc

    def _begin(self) -> Xlib.display.Display | None:
        """The connection with an empty damage region and nothing left to read, or None without DAMAGE.

        A kept connection that turns out dead (the server restarted since the last wait; the failure
        was seen on another connection) is replaced at once, so a working server never fails a wait.
        """
        for _ in range(2):
            fresh = self._dpy is None
            if fresh:
                self._dpy = self._connect()
                if self._dpy is None:
                    return None
            dpy = self._dpy
            try:
                self._read(dpy)  # drawing from before this call
                dpy.damage_subtract(self._damage)
                dpy.flush()
                return dpy
            except CONNECTION_ERRORS as exc:
                self._drop()
                if fresh:
                    raise went_away(self.display_name, exc) from exc
        raise AssertionError("unreachable")  # pragma: no cover
