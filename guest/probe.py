"""Event-logging probe window, for conformance tests of any driver that reaches this display.

``python -m guest probe --log FILE [--display :99]`` opens an override-redirect window covering the
whole screen, gives it the input focus and appends one JSON object per line to FILE, flushed per
event, so a test can read the log while the probe runs (locally, or through ``GET /v1/files``
when the probe was started with ``POST /v1/launch``). Every line has ``t``: the probe's
``time.monotonic()`` (seconds) when it wrote the line, so a test can compare the times of lines with
each other (not with clocks outside the probe's machine). Lines:

- ``{"type": "ready", "width", "height", "window", "state"}`` once the window is mapped and has been
  given the input focus (``state``: the modifier and button mask the server reports then, so a test
  can check that no lock or button is left on from an earlier one);
- ``FocusIn`` / ``FocusOut``: ``mode``, ``detail`` (the X protocol's names, e.g. ``NotifyNormal``,
  ``NotifyNonlinear``) and, for ``FocusOut``, ``to``: the window that holds the focus now with its
  ``WM_CLASS`` (``to_class``), so a test that sees no key events can say where they went;
- ``KeyPress`` / ``KeyRelease``: ``keycode``, ``keysym`` (the probe's own lookup at the level the
  Shift state selects), ``keysym_name``, ``state`` (modifier mask), ``synthetic`` (SendEvent flag),
  ``time`` (server ms), and what an application makes of the event: ``lookup`` (the name of the keysym
  libX11's ``XLookupString`` gives for its keycode and state, by the server's XKB keymap: Caps Lock,
  Shift Lock, Num Lock and levels applied as toolkits apply them) and ``text`` (the Latin-1 text it
  gives); both None where libX11 cannot be loaded;
- ``ButtonPress`` / ``ButtonRelease``: ``button``, ``x``, ``y``, ``state``, ``synthetic``, ``time``;
- ``MotionNotify``: ``x``, ``y``, ``state``, ``synthetic``, ``time``;
- ``MappingNotify``: ``first_keycode``, ``count`` (the probe refreshes its keymap on each);
- ``{"type": "frame", "n"}`` for each frame ``--animate S`` draws (``n`` counts from 1), written once
  the X server has drawn it (after a round trip), so gaps between frame lines are gaps in the drawing
  the server saw: a test can tell an animation that stalled (the probe not scheduled, under load) from
  one that kept changing the screen;
- ``{"type": "animation_done"}`` when ``--animate S`` ends;
- ``{"type": "error", "message"}`` as the last line when the probe ends on an error (for example
  when the X connection breaks), so a test that sees no events can say why.

A button press on the probe gives it the input focus again (click-to-focus, as a managed window
would get from the window manager; the probe is override-redirect, so no window manager does it).

``--pattern`` paints :data:`PATTERN` (solid rectangles of known colours, screen px) so screenshots
can be checked pixel by pixel. ``--animate S`` repaints the window in alternating colours every
``ANIMATE_PERIOD_S`` for S seconds after ``ready`` (to test waiting for a stable screen).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import select
import signal
import sys
import time

from Xlib import X, display

from .keys import keysym_name

_EVENT_NAMES = {X.KeyPress: "KeyPress", X.KeyRelease: "KeyRelease", X.ButtonPress: "ButtonPress",
                X.ButtonRelease: "ButtonRelease", X.MotionNotify: "MotionNotify", X.FocusIn: "FocusIn",
                X.FocusOut: "FocusOut"}
_FOCUS_MODES = {X.NotifyNormal: "NotifyNormal", X.NotifyGrab: "NotifyGrab", X.NotifyUngrab: "NotifyUngrab",
                X.NotifyWhileGrabbed: "NotifyWhileGrabbed"}
_FOCUS_DETAILS = {X.NotifyAncestor: "NotifyAncestor", X.NotifyVirtual: "NotifyVirtual",
                  X.NotifyInferior: "NotifyInferior", X.NotifyNonlinear: "NotifyNonlinear",
                  X.NotifyNonlinearVirtual: "NotifyNonlinearVirtual", X.NotifyPointer: "NotifyPointer",
                  X.NotifyPointerRoot: "NotifyPointerRoot", X.NotifyDetailNone: "NotifyDetailNone"}


#: (x, y, w, h, 0xRRGGBB) rectangles painted by ``--pattern``, in screen px.
PATTERN: list[tuple[int, int, int, int, int]] = [
    (0, 0, 64, 48, 0x123456),
    (64, 0, 64, 48, 0xFEDCBA),
    (128, 0, 64, 48, 0x010203),
    (192, 0, 64, 48, 0xFF00FF),
    (300, 200, 200, 100, 0x00FF00),
    (500, 200, 3, 3, 0xABCDEF),
]
ANIMATE_PERIOD_S = 0.04


class _XLookup:
    """libX11's ``XLookupString`` on a connection of its own (the keymap libX11 reads from the server,
    opened anew after a ``MappingNotify``): the keysym and text an application gets from a key event."""

    class _KeyEvent(ctypes.Structure):
        _fields_ = [("type", ctypes.c_int), ("serial", ctypes.c_ulong), ("send_event", ctypes.c_int),
                    ("display", ctypes.c_void_p), ("window", ctypes.c_ulong), ("root", ctypes.c_ulong),
                    ("subwindow", ctypes.c_ulong), ("time", ctypes.c_ulong), ("x", ctypes.c_int),
                    ("y", ctypes.c_int), ("x_root", ctypes.c_int), ("y_root", ctypes.c_int),
                    ("state", ctypes.c_uint), ("keycode", ctypes.c_uint), ("same_screen", ctypes.c_int),
                    ("pad", ctypes.c_long * 24)]

    def __init__(self, display_name: str) -> None:
        self.name = display_name.encode()
        self.dpy: int | None = None
        try:
            self.lib = ctypes.CDLL(ctypes.util.find_library("X11") or "libX11.so.6")
        except OSError:
            self.lib = None
            return
        self.lib.XOpenDisplay.restype = ctypes.c_void_p
        self.lib.XOpenDisplay.argtypes = [ctypes.c_char_p]
        self.lib.XCloseDisplay.argtypes = [ctypes.c_void_p]
        self.lib.XLookupString.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int,
                                           ctypes.POINTER(ctypes.c_ulong), ctypes.c_void_p]

    def stale(self) -> None:
        """The keymap changed: look up with a fresh connection from now on."""
        if self.dpy:
            self.lib.XCloseDisplay(self.dpy)
        self.dpy = None

    def lookup(self, etype: int, keycode: int, state: int) -> tuple[str | None, str | None]:
        """(keysym name, text) for a key event, or (None, None) without libX11."""
        if self.lib is None:
            return None, None
        if not self.dpy:
            self.dpy = self.lib.XOpenDisplay(self.name)
            if not self.dpy:
                return None, None
        event = self._KeyEvent(type=etype, display=self.dpy, state=state, keycode=keycode, same_screen=1)
        buffer = ctypes.create_string_buffer(64)
        keysym = ctypes.c_ulong(0)
        count = self.lib.XLookupString(ctypes.byref(event), buffer, len(buffer), ctypes.byref(keysym), None)
        name = keysym_name(keysym.value) if keysym.value else None
        return name, buffer.raw[:max(count, 0)].decode("latin-1")


def run_probe(display_name: str, log_path: str, *, pattern: bool = False, animate: float = 0.0) -> int:
    """Run the probe until killed (SIGTERM/SIGINT) or the X connection closes; returns 0."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    dpy = display.Display(display_name)
    screen = dpy.screen()
    width, height = screen.width_in_pixels, screen.height_in_pixels
    win = screen.root.create_window(
        0, 0, width, height, 0, screen.root_depth, X.InputOutput, X.CopyFromParent,
        background_pixel=screen.white_pixel, override_redirect=True,
        event_mask=(X.KeyPressMask | X.KeyReleaseMask | X.ButtonPressMask | X.ButtonReleaseMask
                    | X.PointerMotionMask | X.StructureNotifyMask | X.ExposureMask | X.FocusChangeMask),
    )
    win.set_wm_name("desktop-sandbox probe")
    win.map()
    log = open(log_path, "a", encoding="utf-8", buffering=1)

    def emit(record: dict) -> None:
        record["t"] = round(time.monotonic(), 6)
        log.write(json.dumps(record, separators=(",", ":")) + "\n")
        log.flush()

    colormap = screen.default_colormap
    gcs: dict[int, object] = {}

    def fill(rgb: int, x: int, y: int, w: int, h: int) -> None:
        gc = gcs.get(rgb)
        if gc is None:
            pixel = colormap.alloc_color(((rgb >> 16) & 0xFF) * 257, ((rgb >> 8) & 0xFF) * 257,
                                         (rgb & 0xFF) * 257).pixel
            gc = gcs[rgb] = win.create_gc(foreground=pixel)
        win.fill_rectangle(gc, x, y, w, h)

    def paint() -> None:
        if pattern:
            for x, y, w, h, rgb in PATTERN:
                fill(rgb, x, y, w, h)
        dpy.flush()

    def focus_holder() -> tuple[int, str | None]:
        """(window id, WM_CLASS class or None) of the window holding the input focus (0: none,
        1: PointerRoot)."""
        focus = dpy.get_input_focus().focus
        wid = focus if isinstance(focus, int) else focus.id
        if wid in (X.NONE, X.PointerRoot):
            return wid, None
        try:
            cls = focus.get_wm_class()
        except Exception:  # noqa: BLE001 - the window may be gone already
            cls = None
        return wid, cls[1] if cls else None

    xlookup = _XLookup(display_name)
    ready = False
    animate_until = 0.0
    frame = 0
    try:
        while True:
            if animate_until:
                now = time.monotonic()
                if now >= animate_until:
                    animate_until = 0.0
                    fill(0xFFFFFF, 0, 0, width, height)
                    paint()
                    dpy.sync()
                    emit({"type": "animation_done"})
                elif not dpy.pending_events():
                    select.select([dpy.fileno()], [], [], ANIMATE_PERIOD_S)
                    if not dpy.pending_events():
                        frame += 1
                        fill(0xFF0000 if frame % 2 else 0x0000FF, 0, 0, width, height)
                        dpy.sync()  # drawn by the server before the line says so
                        emit({"type": "frame", "n": frame})
                        continue
            ev = dpy.next_event()
            etype = ev.type
            if etype == X.MapNotify and not ready:
                win.raise_window()
                dpy.set_input_focus(win, X.RevertToParent, X.CurrentTime)
                dpy.sync()
                paint()
                dpy.sync()
                ready = True
                state = screen.root.query_pointer().mask
                emit({"type": "ready", "width": width, "height": height, "window": win.id, "state": state})
                if animate > 0:
                    animate_until = time.monotonic() + animate
            elif etype == X.Expose and ev.count == 0:
                paint()
            elif etype == X.MappingNotify:
                dpy.refresh_keyboard_mapping(ev)
                xlookup.stale()
                emit({"type": "MappingNotify", "first_keycode": ev.first_keycode, "count": ev.count})
            elif etype in (X.KeyPress, X.KeyRelease):
                shifted = bool(ev.state & X.ShiftMask)
                keysym = dpy.keycode_to_keysym(ev.detail, 1 if shifted else 0)
                if shifted and keysym == X.NoSymbol:
                    keysym = dpy.keycode_to_keysym(ev.detail, 0)
                lookup, text = xlookup.lookup(etype, ev.detail, ev.state)
                emit({"type": _EVENT_NAMES[etype], "keycode": ev.detail, "keysym": keysym,
                      "keysym_name": keysym_name(keysym) if keysym else None, "state": ev.state,
                      "synthetic": bool(ev.send_event), "time": ev.time, "lookup": lookup, "text": text})
            elif etype in (X.FocusIn, X.FocusOut):
                record = {"type": _EVENT_NAMES[etype], "mode": _FOCUS_MODES.get(ev.mode, ev.mode),
                          "detail": _FOCUS_DETAILS.get(ev.detail, ev.detail)}
                if etype == X.FocusOut:
                    record["to"], record["to_class"] = focus_holder()
                emit(record)
            elif etype in (X.ButtonPress, X.ButtonRelease):
                if etype == X.ButtonPress:
                    dpy.set_input_focus(win, X.RevertToParent, ev.time)
                emit({"type": _EVENT_NAMES[etype], "button": ev.detail, "x": ev.event_x, "y": ev.event_y,
                      "state": ev.state, "synthetic": bool(ev.send_event), "time": ev.time})
            elif etype == X.MotionNotify:
                emit({"type": "MotionNotify", "x": ev.event_x, "y": ev.event_y, "state": ev.state,
                      "synthetic": bool(ev.send_event), "time": ev.time})
    except (SystemExit, KeyboardInterrupt):
        return 0
    except Exception as exc:  # noqa: BLE001 - the X server went away, or a bug: say which, then end
        try:
            emit({"type": "error", "message": f"{type(exc).__name__}: {exc}"})
        except Exception:  # noqa: BLE001 - the log itself is gone
            pass
        return 0
    finally:
        log.close()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(run_probe(os.environ.get("DISPLAY", ":99"), sys.argv[1]))
