"""Responses computer actions: validation and execution under one input lock.

The action schema (types, fields, units, limits) is :mod:`wire.actions`; requests are read in its
agent form (``wire.actions.ACTION_ADAPTER``: unknown fields ignored, ``button`` defaults to
``"left"``, scroll amounts to 0). Here: ``click {x,y,button,keys?}``, ``double_click {x,y,keys?}``,
``drag {path:[{x,y}...],keys?}``, ``keypress {keys}``, ``move {x,y,keys?}``,
``scroll {x,y,scroll_x,scroll_y,keys?}``, ``type {text}``, ``wait {}``, ``screenshot {}``.
Coordinates are screen pixels; (0, 0) and (W-1, H-1) are valid, anything outside is
``out_of_bounds``. Coordinates and scroll deltas must be JSON integers (``true``, ``"5"`` and
``5.0`` are ``invalid_action``, never read as numbers). Keys that command the X server rather than
applications (:func:`guest.keys.is_server_control`) are ``invalid_action`` naming the ``key``. Each
action type runs in its handler, ``Executor._do_<type>``; importing this module fails when a type of
the schema has none.

A request is validated completely before the first event is sent (schema, key names, text,
coordinates), so a bad action anywhere in it sends nothing. Then the actions run in order while the
input lock is held; a failing action stops the rest. Whatever happens, every key and button is
released (reverse press order, then anything the server still reports down) before the request
returns.

Timeouts: a request waits at most ``busy_timeout`` seconds (default :data:`BUSY_TIMEOUT_S`) for the
input lock, then fails with 409 ``busy``.

``wait`` (the settle rule): it returns ``settled`` True at the first moment the X server has reported
no drawing anywhere on the screen for :data:`WAIT_QUIET_S` (0.1 s), counted from the start of the
``wait`` or from the last report, whichever is later (DAMAGE extension, :mod:`guest.damage`); so a
screen that does not change settles after exactly the quiet window, and one that keeps drawing does
not settle. It returns False at :data:`WAIT_CAP_S` (``--wait-cap``) or at the request deadline, if
either comes first. Pointer motion alone is no change. Only when the X server has no DAMAGE extension
does it fall back to comparing whole frames, grabbed every :data:`WAIT_POLL_S`, until they are
unchanged for :data:`FRAME_QUIET_S` (0.3 s; polling sees a change only up to a poll late, and misses
one undone between two polls, so the window is longer). Why 0.1 s (``--wait-quiet`` changes it):
measured on the guest desktop (the demo page in Firefox, xterm, openbox) on a busy 2-core host, the
first drawing after an input came 4-61 ms after the input request returned, and drawing that belongs
together (a progress bar, a page repaint, a window raise and its redraw) paused at most 35 ms; 0.1 s
is above both with room, and keeps a settled step on an idle screen near 0.1 s. The limit is the
same as any quiet window's: an app that pauses longer than it mid-change settles early (with the
host overloaded by other work we saw a 104 ms reaction and a 188 ms pause inside a progress bar).

Once it holds the lock, a request runs for at most ``request_timeout`` seconds (default
:data:`REQUEST_TIMEOUT_S`): a ``wait`` ends at that deadline, ``type`` stops between keys, and no
further action starts; the request then fails with 400 ``timeout`` giving the ``index`` of the first
action not (fully) run and ``executed``, the number run in full. So no request keeps the input (and
every other client) waiting for long, whatever it holds.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from pydantic import ValidationError

from wire.actions import (ACTION_ADAPTER, ACTION_TYPES, MAX_PATH_POINTS, MAX_TEXT_CHARS, MODELS, BaseAction, Type,
                          Wait, first_outside)
from wire.screen_match import ScreenBinding, as_encoded, compare_crops

from . import keys as keynames
from . import pointer
from .capture import BadCapture, Capture, to_image
from .damage import DamageWatch
from .display import DisplayConnection, DisplayUnavailable
from .held import Held
from .keyboard import DeadlinePassed, InvalidText, Keyboard, text_to_keysyms

BUSY_TIMEOUT_S = 5.0
WAIT_CAP_S = 5.0
REQUEST_TIMEOUT_S = 20.0
WAIT_QUIET_S = 0.1
FRAME_QUIET_S = 0.3
WAIT_POLL_S = 0.05
MAX_ACTIONS = 500


class ActionError(Exception):
    """A request failure with its HTTP status, error ``code``, message and action ``index``."""

    def __init__(self, status: int, code: str, message: str, index: int | None = None, **extra: Any) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.index, self.extra = status, code, message, index, extra

    def body(self) -> dict[str, Any]:
        """JSON body ``{"error": {"code", "message", "index"?, ...}}``."""
        err: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.index is not None:
            err["index"] = self.index
        err.update(self.extra)
        return {"error": err}


class Prepared:
    """One validated action: the model plus resolved keysyms / text keysyms / points."""

    def __init__(self, action: BaseAction, keysyms: list[int], text: list[int], points: list[tuple[int, int]]):
        self.action, self.keysyms, self.text, self.points = action, keysyms, text, points
        self.last = False
        """True for the request's last action: its closing X round trip can be left to the release
        check that follows it (:meth:`guest.held.Held.release_all` ends with round trips)."""


def prepare(raw_actions: Any, screen: tuple[int, int]) -> list[Prepared]:
    """Validate a whole request against the ``screen`` size (W, H); send nothing.

    Raises:
        ActionError: 400 ``invalid_action`` / ``unknown_key`` / ``out_of_bounds`` with ``index``.
    """
    if not isinstance(raw_actions, list):
        raise ActionError(400, "invalid_action", "'actions' must be a list")
    if len(raw_actions) > MAX_ACTIONS:
        raise ActionError(400, "invalid_action", f"at most {MAX_ACTIONS} actions per request")
    out: list[Prepared] = []
    width, height = screen
    for index, raw in enumerate(raw_actions):
        try:
            action = ACTION_ADAPTER.validate_python(raw)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first.get("loc", ()))
            raise ActionError(400, "invalid_action", f"{where}: {first.get('msg')}".strip(": "), index) from None
        keysyms: list[int] = []
        names = getattr(action, "keys", None) or []
        for name in names:
            try:
                keysym = keynames.resolve(name)
            except keynames.UnknownKey as exc:
                message = str(exc)
                if len(name) > 1 and "+" in name.strip("+"):
                    chord = [part for part in name.split("+") if part]
                    message += f"; a chord is a list of keys, e.g. {json.dumps(chord)}"
                raise ActionError(400, "unknown_key", message, index, key=exc.name) from None
            if keynames.is_server_control(keysym):
                raise ActionError(400, "invalid_action", f"key {name!r} commands the X server and is refused",
                                  index, key=name)
            keysyms.append(keysym)
        text: list[int] = []
        if isinstance(action, Type):
            try:
                text = text_to_keysyms(action.text)
            except InvalidText as exc:
                raise ActionError(400, "invalid_action", str(exc), index) from None
        outside = first_outside(action, (width, height))
        if outside is not None:
            x, y = outside
            raise ActionError(
                400, "out_of_bounds",
                f"({x}, {y}) is outside the {width}x{height} screen (valid: 0..{width - 1}, 0..{height - 1})",
                index,
            )
        out.append(Prepared(action, keysyms, text, action.points()))
    return out


QUICK_TYPES = frozenset(kind for kind, model in MODELS.items() if model.quick)
"""Action types that send a bounded handful of X requests (``wire.actions.BaseAction.quick``)."""
QUICK_MAX_ACTIONS = 8
"""Most actions in a request :func:`quick` accepts."""


def quick(raw_actions: Any) -> bool:
    """True for a request of at most :data:`QUICK_MAX_ACTIONS` actions, each a dict whose ``type`` is
    in :data:`QUICK_TYPES`: one that runs in a few X round trips (a click: about 0.3 ms on an idle
    server). Only the types are looked at; validation is :func:`prepare`'s."""
    return (isinstance(raw_actions, list) and 0 < len(raw_actions) <= QUICK_MAX_ACTIONS
            and all(isinstance(a, dict) and a.get("type") in QUICK_TYPES for a in raw_actions))


@dataclass(frozen=True)
class Outcome:
    """What a request did: ``executed`` actions run in full; ``settled`` the result of its last
    ``wait`` (True: the screen settled by the rule in the module doc; False: the wait cap or the
    request deadline came first), None when the request held no ``wait``."""

    executed: int
    settled: bool | None = None
    then: Any = None
    """What the request's ``then`` callable returned (:meth:`Executor.execute`), else None."""


class Executor:
    """Runs validated actions on one display under the input lock (see module doc)."""

    def __init__(self, conn: DisplayConnection, capture: Capture, *, busy_timeout: float = BUSY_TIMEOUT_S,
                 wait_cap: float = WAIT_CAP_S, wait_quiet: float = WAIT_QUIET_S,
                 frame_quiet: float = FRAME_QUIET_S, request_timeout: float = REQUEST_TIMEOUT_S,
                 damage: DamageWatch | None = None) -> None:
        self.conn = conn
        self.capture = capture
        self.damage = damage if damage is not None else DamageWatch(conn.name)
        self.frame_quiet = frame_quiet
        self.keyboard = Keyboard()
        self.busy_timeout = busy_timeout
        self.wait_cap = wait_cap
        self.request_timeout = request_timeout
        self.wait_quiet = wait_quiet
        self._lock = threading.Lock()

    def _acquire(self) -> None:
        if not self._lock.acquire(timeout=self.busy_timeout):
            raise ActionError(409, "busy", f"another request held the input for more than {self.busy_timeout:g} s")

    def run(self, raw_actions: Any) -> int:
        """Validate and execute a request; returns the number of actions executed (see :meth:`execute`)."""
        return self.execute(raw_actions).executed

    def execute(self, raw_actions: Any, then: Callable[[], Any] | None = None,
                expect: ScreenBinding | None = None) -> Outcome:
        """Validate and execute a request; returns its :class:`Outcome`.

        ``then``: called once every action ran and every key and button is released, while the input
        lock is still held (so no other request's input comes in between); what it returns is the
        outcome's ``then``. Not called when the request fails. ``expect``: the screen must still show
        what a person approved (:meth:`check_screen`), checked under the input lock after validation
        and before the first action.

        Raises:
            ActionError: 400 (validation, ``timeout``), 409 ``busy``, 409 ``screen_changed`` (nothing ran).
            DisplayUnavailable: the X server went away (503).
        """
        self._acquire()
        return self._execute_locked(raw_actions, then, expect)

    def try_execute(self, raw_actions: Any, then: Callable[[], Any] | None = None,
                    expect: ScreenBinding | None = None) -> Outcome | None:
        """:meth:`execute` for a request that is quick to run, when the input lock is free right now;
        None, having done nothing, when the lock is held or the request is not quick
        (:func:`quick`; one with ``expect`` never is: the grab and compare take milliseconds). Never
        waits for the lock, so the agent can run it on its event loop."""
        if expect is not None or not quick(raw_actions) or not self._lock.acquire(blocking=False):
            return None
        return self._execute_locked(raw_actions, then, None)

    def check_screen(self, expect: ScreenBinding) -> None:
        """Raise 409 ``screen_changed`` unless the screen still matches ``expect`` by the comparison rule
        (:mod:`wire.screen_match`): ``expect.frame`` grabbed, scaled to ``expect.size`` as screenshots
        are (:func:`guest.capture.to_image`), compared in ``expect.regions`` with its crops. The error
        carries ``executed`` 0 and each region's ``changed`` share. A binding that cannot be read is
        400 ``invalid_request``."""
        try:
            if not (0 < expect.size[0] <= expect.frame[2] and 0 < expect.size[1] <= expect.frame[3]):
                raise ValueError(f"size {expect.size[0]}x{expect.size[1]} is not the frame's "
                                 f"{expect.frame[2]}x{expect.frame[3]} or a downscale of it")
            reference = expect.reference()
        except ValueError as exc:
            raise ActionError(400, "invalid_request", f"expect_screen: {exc}") from None
        try:
            raw, frame, _screen = self.capture.grab(tuple(expect.frame))
        except BadCapture as exc:
            raise ActionError(400, "invalid_request", f"expect_screen: {exc}") from None
        current = as_encoded(to_image(raw, frame, expect.size), expect.jpeg_quality)
        result = compare_crops(reference, current, list(expect.regions), expect.rule)
        if not result.matched:
            raise ActionError(409, "screen_changed", f"the screen changed where the approved actions land: "
                              f"{result.summary()}", 0, executed=0,
                              regions=[{**r.region.model_dump(), "changed": r.changed} for r in result.regions])

    def _execute_locked(self, raw_actions: Any, then: Callable[[], Any] | None,
                        expect: ScreenBinding | None = None) -> Outcome:
        """The body of :meth:`execute`, entered with the input lock held; releases it."""
        settled: bool | None = None
        try:
            deadline = time.monotonic() + self.request_timeout
            self.keyboard.begin(deadline)
            info = self.conn.info()
            prepared = prepare(raw_actions, (info.width, info.height))
            if prepared:
                prepared[-1].last = True
            if expect is not None:
                self.check_screen(expect)
            held = Held()
            try:
                for index, item in enumerate(prepared):
                    if time.monotonic() >= deadline:
                        raise self._timeout(index)
                    if isinstance(item.action, Wait):
                        # Uses the damage connection (or the capture's); the X lock stays free.
                        settled = self.wait_stable(deadline)
                        continue
                    with self.conn.session() as dpy:
                        try:
                            self._execute(dpy, held, item, deadline)
                        except DeadlinePassed:
                            raise self._timeout(index) from None
                        except ValueError as exc:
                            raise ActionError(400, "invalid_action", str(exc), index) from None
            finally:
                self._release_all(held)
            return Outcome(len(prepared), settled, then() if then is not None else None)
        finally:
            self._lock.release()

    def _timeout(self, index: int) -> ActionError:
        return ActionError(400, "timeout", f"the request ran past its {self.request_timeout:g} s deadline; "
                           f"action {index} and later were not (fully) run", index, executed=index)

    def _release_all(self, held: Held) -> None:
        try:
            with self.conn.session() as dpy:
                held.release_all(dpy)
        except DisplayUnavailable:
            pass  # the server is gone, and with it every pressed key

    def hold_keys(self, keysyms: list[int], seconds: float) -> None:
        """Hold ``keysyms`` down for ``seconds`` under the input lock, then release every key and button
        (as every action request ends): the browser driver's ``hold_keys`` member. Raises ActionError 409
        ``busy``, DisplayUnavailable."""
        self._acquire()
        held = Held()
        before = None
        try:
            with self.conn.session() as dpy:
                before = self.keyboard.neutralize(dpy)  # the keys mean the keys named, whatever the locks
                self.keyboard.hold(dpy, held, keysyms)
                dpy.sync()
            # The hold itself: the member asks for keys down for this long (not a wait for a condition).
            time.sleep(seconds)
        finally:
            self._release_all(held)
            try:
                with self.conn.session() as dpy:
                    self.keyboard.restore(dpy, before)
            except DisplayUnavailable:
                pass  # the server is gone, and with it its keyboard state
            finally:
                self._lock.release()

    def release(self) -> None:
        """Release every key and button the server reports down (``POST /v1/release``)."""
        self._acquire()
        try:
            with self.conn.session() as dpy:
                Held().release_all(dpy)
        finally:
            self._lock.release()

    def handler(self, kind: str) -> Callable[[Any, Held, Prepared, float | None], None]:
        """The method that runs actions of type ``kind`` (``_do_<kind>``), called with the X display,
        the held-input tracker, the prepared action and the request's monotonic deadline. Raises
        LookupError for a type this executor cannot run."""
        method = getattr(self, f"_do_{kind}", None)
        if not callable(method):
            raise LookupError(f"no handler for action type {kind!r}")
        return method

    def _execute(self, dpy: Any, held: Held, item: Prepared, deadline: float | None = None) -> None:
        """Run one prepared action (not ``wait``) on ``dpy``; ``keys`` of an action with points are held
        during it and released after."""
        run = self.handler(item.action.type)
        kb = self.keyboard
        if not (item.points and item.keysyms):
            run(dpy, held, item, deadline)
            return
        with kb.exact_state(dpy):  # the held keys mean the keys named, whatever lock the keyboard is in
            modifiers = kb.hold(dpy, held, item.keysyms)
            run(dpy, held, item, deadline)
            kb.unhold(dpy, held, modifiers)
            dpy.sync()

    def _do_click(self, dpy: Any, held: Held, item: Prepared, deadline: float | None) -> None:
        x, y = item.points[0]
        pointer.click(dpy, held, x, y, pointer.BUTTONS[item.action.button],  # type: ignore[attr-defined]
                      sync=not item.last)

    def _do_double_click(self, dpy: Any, held: Held, item: Prepared, deadline: float | None) -> None:
        x, y = item.points[0]
        pointer.click(dpy, held, x, y, 1, count=2, sync=not item.last)

    def _do_drag(self, dpy: Any, held: Held, item: Prepared, deadline: float | None) -> None:
        pointer.drag(dpy, held, item.points)

    def _do_keypress(self, dpy: Any, held: Held, item: Prepared, deadline: float | None) -> None:
        self.keyboard.chord(dpy, held, item.keysyms)

    def _do_move(self, dpy: Any, held: Held, item: Prepared, deadline: float | None) -> None:
        x, y = item.points[0]
        pointer.move(dpy, x, y)
        if not item.last:
            dpy.sync()

    def _do_scroll(self, dpy: Any, held: Held, item: Prepared, deadline: float | None) -> None:
        x, y = item.points[0]
        action = item.action
        pointer.scroll(dpy, held, x, y, action.scroll_x, action.scroll_y)  # type: ignore[attr-defined]

    def _do_type(self, dpy: Any, held: Held, item: Prepared, deadline: float | None) -> None:
        self.keyboard.type_keysyms(dpy, held, item.text, deadline)

    def _do_wait(self, dpy: Any, held: Held, item: Prepared, deadline: float | None) -> None:
        """Never reached through :meth:`_execute`: :meth:`execute` runs ``wait`` without the X lock."""
        self.wait_stable(deadline)

    def _do_screenshot(self, dpy: Any, held: Held, item: Prepared, deadline: float | None) -> None:
        """Nothing to send: the caller fetches the image with ``GET /v1/screenshot``."""

    def wait_stable(self, deadline: float | None = None) -> bool:
        """Block until the screen settles (the rule in the module doc), or ``wait_cap`` s passed, or the
        monotonic ``deadline`` (the request's) is reached.

        Returns True when the screen settled, False at the cap or deadline. Raises DisplayUnavailable.
        """
        start = time.monotonic()
        until = min(start + self.wait_cap, deadline if deadline is not None else float("inf"))
        settled = self.damage.wait_quiet(self.wait_quiet, until)
        if settled is not None:
            return settled
        return self._wait_frames(start, until)

    def _wait_frames(self, start: float, until: float) -> bool:
        """The fallback without DAMAGE: frames unchanged for ``frame_quiet`` s."""
        last, _, _ = self.capture.grab()
        last_change = start
        while True:
            now = time.monotonic()
            if now - last_change >= self.frame_quiet:
                return True
            if now >= until:
                return False
            # Poll interval of the frame-comparison fallback (no DAMAGE on this server): the condition is
            # the screen unchanged for frame_quiet, bounded by the cap and the request's deadline.
            time.sleep(min(WAIT_POLL_S, max(0.0, until - now)))
            frame, _, _ = self.capture.grab()
            if frame != last:
                last, last_change = frame, time.monotonic()


_UNHANDLED = [kind for kind in ACTION_TYPES if not callable(getattr(Executor, f"_do_{kind}", None))]
if _UNHANDLED:
    raise ImportError(f"guest.actions.Executor has no handler for action type(s) {', '.join(_UNHANDLED)}")

__all__ = ["ActionError", "Executor", "Outcome", "prepare", "DisplayUnavailable", "MAX_PATH_POINTS",
           "MAX_TEXT_CHARS"]
