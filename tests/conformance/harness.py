"""Conformance harness: the thing under test (a *target*) and the desktop that observes it.

A **target** is anything that performs Responses computer actions on an X desktop in screen pixels:
the guest agent over HTTP (:class:`AgentTarget`), a controller-side ComputerDriver, another backend.
It needs only::

    screen_size: tuple[int, int]                       # (W, H) screen px
    run(actions: list[dict]) -> None                   # raise TargetError(code, index) on refusal
    screenshot(format="png", quality=None, max_width=None, max_height=None, crop=None) -> Shot
    release() -> None                                  # nothing left pressed afterwards

The **desktop** observes what real X clients received. :class:`AgentDesktop` starts clients through
the agent's ``/v1/launch`` (allowlisted ``probe`` = ``python -m guest probe`` and ``terminal`` =
``xterm``) and reads their output through ``/v1/files``, so it works wherever an agent runs;
``pressed()`` reads the server's key map and pointer buttons over a direct X connection when the
display is reachable from the test (``None`` otherwise).

To run the suite on your own driver, write a factory ``make_target(desktop) -> target`` and pass
``--conformance-target=package.module:make_target`` to pytest.
"""

from __future__ import annotations

import io
import json
import os
import signal
import time
from dataclasses import dataclass
from typing import Any, Callable, Protocol

from PIL import Image

from controller.agent_client import AgentClient, AgentError


class TargetError(Exception):
    """A refused action: ``code`` (contract 1 error code) and ``index`` of the failing action."""

    def __init__(self, code: str, message: str = "", index: int | None = None, status: int | None = None):
        super().__init__(f"{code}: {message}")
        self.code, self.message, self.index, self.status = code, message, index, status


@dataclass
class Shot:
    """A screenshot: decoded ``image``, ``mime``, ``screen_size`` (W, H) and ``frame`` (x, y, w, h)."""

    image: Image.Image
    mime: str
    screen_size: tuple[int, int]
    frame: tuple[int, int, int, int]
    data: bytes


class Target(Protocol):
    """What the conformance suite drives (see module doc)."""

    screen_size: tuple[int, int]

    def run(self, actions: list[dict[str, Any]]) -> None: ...

    def screenshot(self, format: str = "png", quality: int | None = None, max_width: int | None = None,
                   max_height: int | None = None, crop: tuple[int, int, int, int] | None = None) -> Shot: ...

    def release(self) -> None: ...


class AgentTarget:
    """The guest agent over HTTP as a conformance target."""

    def __init__(self, client: AgentClient) -> None:
        self.client = client
        info = client.display()
        self.screen_size = (info["width"], info["height"])

    def run(self, actions: list[dict[str, Any]]) -> None:
        try:
            self.client.actions(actions)
        except AgentError as exc:
            raise TargetError(exc.code, exc.message, exc.index, exc.status) from exc

    def screenshot(self, format: str = "png", quality: int | None = None, max_width: int | None = None,
                   max_height: int | None = None, crop: tuple[int, int, int, int] | None = None) -> Shot:
        try:
            s = self.client.screenshot(format, quality, max_width, max_height, crop)
        except AgentError as exc:
            raise TargetError(exc.code, exc.message, exc.index, exc.status) from exc
        image = Image.open(io.BytesIO(s.data))
        image.load()
        assert image.size == s.image_size, (image.size, s.image_size)
        return Shot(image, s.mime, s.screen_size, s.frame, s.data)

    def release(self) -> None:
        self.client.release()


def poll(predicate: Callable[[], Any], timeout: float = 10.0, interval: float = 0.02, what: str = "condition") -> Any:
    """Call ``predicate`` until it returns something truthy; return it, or fail after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


class Probe:
    """A running ``python -m guest probe`` and its JSONL event log."""

    def __init__(self, desktop: "AgentDesktop", pid: int, log_path: str) -> None:
        self.desktop, self.pid, self.log_path = desktop, pid, log_path
        self._flip = False

    def events(self) -> list[dict[str, Any]]:
        """Every complete line logged so far."""
        try:
            data = self.desktop.read_file(self.log_path)
        except AgentError as exc:
            if exc.code == "not_found":
                return []
            raise
        text = data.decode()
        if not text.endswith("\n"):
            text = text[: text.rfind("\n") + 1]
        return [json.loads(line) for line in text.splitlines() if line]

    def mark(self) -> int:
        """Number of events so far (pass to :meth:`since`)."""
        return len(self.events())

    def since(self, mark: int) -> list[dict[str, Any]]:
        return self.events()[mark:]

    def wait_for(self, predicate: Callable[[list[dict[str, Any]]], bool], mark: int = 0,
                 timeout: float = 10.0) -> list[dict[str, Any]]:
        """Events after ``mark`` once ``predicate(events)`` holds; past ``timeout`` s (times the
        desktop's ``time_scale``), fails saying what the probe is doing (:meth:`diagnosis`)."""
        try:
            return poll(lambda: (lambda ev: ev if predicate(ev) else None)(self.since(mark)),
                        timeout * self.desktop.time_scale, what="probe events")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; {self.diagnosis(mark)}") from None

    def focus_lost(self, events: list[dict[str, Any]] | None = None) -> dict[str, Any] | None:
        """The ``FocusOut`` after which the probe has not had the keyboard focus back, else None.

        Focus events with detail ``NotifyPointer`` (about the window under the pointer when the focus
        is PointerRoot) and grab/ungrab transitions do not move the focus and are passed over.
        """
        lost = None
        for e in self.events() if events is None else events:
            if e["type"] not in ("FocusIn", "FocusOut") or e.get("detail") == "NotifyPointer":
                continue
            if e.get("mode") in ("NotifyGrab", "NotifyUngrab"):
                continue
            lost = e if e["type"] == "FocusOut" else None
        return lost

    def diagnosis(self, mark: int = 0) -> str:
        """Why a test may have seen no events: the probe's liveness, error line, keyboard focus and
        the events after ``mark``."""
        events = self.events()
        parts = [f"probe pid {self.pid} {'running' if self.desktop.alive(self.pid) else 'NOT running'}"]
        errors = [e for e in events if e["type"] == "error"]
        if errors:
            parts.append(f"probe error: {errors[-1]['message']}")
        lost = self.focus_lost(events)
        if lost is not None:
            parts.append(f"the probe lost the keyboard focus to window {lost.get('to')} "
                         f"(class {lost.get('to_class')!r}, {lost.get('mode')}/{lost.get('detail')})")
        tail = events[mark:][-5:]
        parts.append(f"{len(events) - mark} event(s) since the mark, last: {tail}")
        return "; ".join(parts)

    def check_ready_state(self, timeout: float = 5.0) -> None:
        """Fail unless the probe starts from a known state: it has the keyboard focus (its
        ``FocusIn`` arrived) and the server reported no button down and no Lock (Caps Lock) on."""
        try:
            poll(lambda: any(e["type"] == "FocusIn" for e in self.events()) and self.focus_lost() is None,
                 timeout * self.desktop.time_scale, what="the probe to get the keyboard focus")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; {self.diagnosis()}") from None
        ready = next(e for e in self.events() if e["type"] == "ready")
        state = ready.get("state", 0)
        assert state & 0xFF02 == 0, f"probe started with buttons down or Lock on: state {state:#x}"

    def input_events(self, mark: int) -> list[dict[str, Any]]:
        """Key, button and motion events after ``mark``."""
        kinds = {"KeyPress", "KeyRelease", "ButtonPress", "ButtonRelease", "MotionNotify"}
        return [e for e in self.since(mark) if e["type"] in kinds]

    def run_and_collect(self, target: Target, actions: list[dict[str, Any]],
                        sentinel: tuple[int, int] | None = None, timeout: float = 10.0) -> list[dict[str, Any]]:
        """Run ``actions``, then a ``move`` to ``sentinel``; return the input events in between.

        The sentinel motion is the last event the probe logs for this call, so every event the
        actions caused has been logged when it appears.
        """
        w, h = target.screen_size
        # Alternate between two sentinel points so the sentinel move always produces motion.
        self._flip = not self._flip
        sx, sy = sentinel or ((w - 7, h - 5) if self._flip else (w - 9, h - 5))
        keyboard = any(a.get("type") in ("type", "keypress") for a in actions)
        if keyboard and self.focus_lost() is not None:
            raise AssertionError(f"the probe does not have the keyboard focus; {self.diagnosis()}")
        mark = self.mark()
        target.run(actions)
        target.run([{"type": "move", "x": sx, "y": sy}])
        events = self.wait_for(lambda ev: any(e["type"] == "MotionNotify" and (e["x"], e["y"]) == (sx, sy)
                                              for e in ev), mark, timeout)
        if keyboard and self.focus_lost(events) is not None:
            raise AssertionError(f"the probe lost the keyboard focus during the actions; {self.diagnosis(mark)}")
        out = [e for e in events if e["type"] in
               {"KeyPress", "KeyRelease", "ButtonPress", "ButtonRelease", "MotionNotify"}]
        last = max(i for i, e in enumerate(out) if e["type"] == "MotionNotify" and (e["x"], e["y"]) == (sx, sy))
        return out[:last]

    def stop(self) -> None:
        self.desktop.kill(self.pid)


class TextSink:
    """An ``xterm`` running ``cat > FILE``: what arrives in FILE is exactly what was typed."""

    def __init__(self, desktop: "AgentDesktop", pid: int, path: str, geometry: tuple[int, int, int, int]) -> None:
        self.desktop, self.pid, self.path, self.geometry = desktop, pid, path, geometry

    def content(self) -> str:
        try:
            return self.desktop.read_file(self.path).decode("utf-8")
        except AgentError as exc:
            if exc.code == "not_found":
                return ""
            raise

    def focus(self, target: Target) -> None:
        """Click inside the terminal, then wait until it has the keyboard: the window manager gives the
        focus when it gets to the click, which on a slow guest comes after the agent's answer (keys
        typed before then go to whatever had the focus)."""
        x, y, w, h = self.geometry
        target.run([{"type": "click", "x": x + w // 2, "y": y + h // 2, "button": "left"}])
        if self.desktop.focused_class() is not None:
            # PointerRoot: no window manager; the keys go to the window under the pointer, just clicked on
            poll(lambda: (lambda c: "XTerm" in c or c == "PointerRoot")(self.desktop.focused_class() or ""),
                 10 * self.desktop.time_scale, what="the terminal to have the keyboard focus")

    def type_and_read(self, target: Target, text: str, expected: str, timeout: float = 20.0) -> str:
        """Type ``text`` + Enter; return what reached the file (compare with ``expected`` + ``\\n``)."""
        before = len(self.content())
        self.focus(target)
        target.run([{"type": "type", "text": text + "\n"}])
        want = len(expected) + 1
        try:
            return poll(lambda: (lambda c: c[before:] if len(c) - before >= want else None)(self.content()),
                        timeout * self.desktop.time_scale, what="typed text in the terminal")
        except AssertionError:
            return self.content()[before:]

    def stop(self) -> None:
        """Stop the terminal and wait until the window manager has let go of its window.

        The process is gone once it is reaped, but a window manager handles the window's end later
        (it unmanages it and may move the keyboard focus then): a probe started by the next module
        could get the focus first and lose it to that late move. So this waits until no window of
        class ``XTerm`` is in the window manager's client list (``_NET_CLIENT_LIST``)."""
        self.desktop.kill(self.pid)
        poll(lambda: self.desktop.managed_windows("XTerm") == 0, 10 * self.desktop.time_scale,
             what="the window manager to let go of the terminal's window")


MANAGED_WINDOWS = (
    "import sys\n"
    "from Xlib import X, Xatom, display, error\n"
    "d = display.Display(sys.argv[1])\n"
    "root = d.screen().root\n"
    "prop = root.get_full_property(d.intern_atom('_NET_CLIENT_LIST'), Xatom.WINDOW)\n"
    "n = 0\n"
    "for w in (prop.value if prop else []):\n"
    "    try:\n"
    "        cls = d.create_resource_object('window', w).get_wm_class()\n"
    "    except error.XError:\n"
    "        cls = None  # listed, already destroyed: the window manager has not let go yet\n"
    "    n += cls is None or sys.argv[2] in cls\n"
    "print(n)\n"
)
"""Prints how many windows in the window manager's client list have WM_CLASS ``argv[2]`` (or are
already destroyed); 0 without a window manager (no list). Runs where the display is reachable."""

FOCUSED_CLASS = (
    "import sys\n"
    "from Xlib import display, error\n"
    "d = display.Display(sys.argv[1])\n"
    "w = d.get_input_focus().focus\n"
    "root = d.screen().root\n"
    "found = 'PointerRoot' if w == 1 or (not isinstance(w, int) and w.id == root.id) else ''\n"
    "while not isinstance(w, int) and not found:  # an int: None or PointerRoot\n"
    "    try:\n"
    "        found = ' '.join(w.get_wm_class() or ())\n"
    "        tree = w.query_tree()\n"
    "    except error.XError:\n"
    "        break\n"
    "    w = tree.parent if tree.parent and tree.parent.id != tree.root.id else 0\n"
    "print(found)\n"
)
"""Prints the WM_CLASS (instance and class) of the window that has the keyboard focus, or of its
nearest ancestor that has one; ``PointerRoot`` when the keys go to the window under the pointer (the
focus is PointerRoot or the root window: no window manager set one); an empty line when the focus is
on no window. Runs where the display is reachable."""


KEY_STATE = (
    "import json, sys\n"
    "from dataclasses import asdict\n"
    "from Xlib import X, display\n"
    "from Xlib.ext import xtest\n"
    "from guest import xkb\n"
    "d = display.Display(sys.argv[1])\n"
    "change = json.loads(sys.argv[2])\n"
    "for keysym in change.pop('press', []):\n"
    "    xtest.fake_input(d, X.KeyPress, d.keysym_to_keycode(keysym))\n"
    "if change:\n"
    "    xkb.set_locks_and_latches(d, **change)\n"
    "d.sync()\n"
    "print(json.dumps(asdict(xkb.get_state(d))))\n"
)
"""Changes the keyboard's state as another X client would (``argv[2]``, JSON: the arguments of
:func:`guest.xkb.set_locks_and_latches`, and ``press``: keysyms to press through XTEST and leave down),
then prints the XKB state (:class:`guest.xkb.KeyState` as JSON). Runs where the display is reachable."""


class AgentDesktop:
    """Observation side of the suite for an agent: launch probe/xterm, read files, read key state.

    ``workdir`` must be under the agent's ``--files-root``; ``display`` (optional) is the X display
    name reachable from the test process, used by :meth:`pressed` and :meth:`kill` (local pids).
    ``time_scale``: how much slower than a local desktop the guest is (a VM under plain emulation: 5,
    the sandbox's own factor); every deadline of the harness is multiplied by it.
    """

    time_scale: float = 1.0

    def __init__(self, client: AgentClient, workdir: str, display: str | None = None) -> None:
        self.client, self.workdir, self.display = client, workdir, display
        self._count = 0
        self._x = None

    def _path(self, stem: str) -> str:
        self._count += 1
        return os.path.join(self.workdir, f"{stem}-{os.getpid()}-{self._count}")

    def read_file(self, path: str) -> bytes:
        return self.client.read_file(path)

    def alive(self, pid: int) -> bool:
        """Whether a client started through the agent still runs (same machine: signal 0)."""
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True

    def kill(self, pid: int, timeout: float = 10.0) -> None:
        """Stop a client started through the agent (same machine: a signal to its pid) and wait
        until the agent has reaped it."""
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            return

        poll(lambda: not self.alive(pid), timeout * self.time_scale, what=f"process {pid} to exit")

    def start_probe(self, *, pattern: bool = False, animate: float = 0.0, timeout: float = 15.0) -> Probe:
        """Launch the probe window and wait for its ``ready`` line."""
        log = self._path("probe") + ".jsonl"
        args = ["--log", log]
        if pattern:
            args.append("--pattern")
        if animate:
            args += ["--animate", str(animate)]
        pid = self.client.launch("probe", args)
        probe = Probe(self, pid, log)
        probe.wait_for(lambda ev: any(e["type"] == "ready" for e in ev), timeout=timeout)
        return probe

    def start_text_sink(self, timeout: float = 15.0) -> TextSink:
        """Launch ``xterm -e sh -c 'cat > FILE'`` at a fixed place and wait until it runs."""
        path = self._path("typed") + ".txt"
        geometry = (0, 0, 6 * 120 + 4, 13 * 24 + 4)
        pid = self.client.launch("terminal", [
            "-geometry", "120x24+0+0", "-fa", "", "-fn", "fixed", "-u8",
            "-e", "sh", "-c", 'stty -echo; exec cat > "$1"', "sink", path,
        ])
        poll(lambda: self._exists(path), timeout * self.time_scale, what="the terminal to start")
        return TextSink(self, pid, path, geometry)

    def _exists(self, path: str) -> bool:
        try:
            self.read_file(path)
            return True
        except AgentError:
            return False

    def press_elsewhere(self) -> int:
        """Press ``Shift_L`` and button 1 through XTEST from an X client of the desktop's own (not
        the target), and leave them down; returns Shift_L's keycode. Needs :meth:`pressed` to work."""
        from Xlib import X
        from Xlib import display as xdisplay
        from Xlib.ext import xtest

        other = xdisplay.Display(self.display)
        try:
            shift = other.keysym_to_keycode(0xFFE1)
            xtest.fake_input(other, X.KeyPress, shift)
            xtest.fake_input(other, X.ButtonPress, 1)
            other.sync()
        finally:
            other.close()
        return shift

    def key_state(self, **change: Any) -> dict[str, int] | None:
        """The keyboard's XKB state after ``change`` (:data:`KEY_STATE`: locks and latches set, keys
        pressed, by an X client of the desktop's own, not the target), as a dict of
        :class:`guest.xkb.KeyState`'s fields; None when the display is not reachable from here."""
        if not self.display:
            return None
        import subprocess
        import sys

        out = subprocess.run([sys.executable, "-c", KEY_STATE, self.display, json.dumps(change)],
                             capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)

    def managed_windows(self, wm_class: str) -> int:
        """How many windows of ``wm_class`` the window manager still manages (:data:`MANAGED_WINDOWS`);
        0 when the display is not reachable from here (nothing to wait for then)."""
        if not self.display:
            return 0
        import subprocess
        import sys

        out = subprocess.run([sys.executable, "-c", MANAGED_WINDOWS, self.display, wm_class], capture_output=True,
                             text=True, timeout=30)
        return int(out.stdout) if out.returncode == 0 else 1

    def focused_class(self) -> str | None:
        """WM_CLASS of the window with the keyboard focus (:data:`FOCUSED_CLASS`), or None when the
        display is not reachable from here."""
        if not self.display:
            return None
        import subprocess
        import sys

        out = subprocess.run([sys.executable, "-c", FOCUSED_CLASS, self.display], capture_output=True, text=True,
                             timeout=30)
        return out.stdout.strip() if out.returncode == 0 else ""

    def pressed(self) -> tuple[list[int], int] | None:
        """(keycodes down, pointer button mask) from the X server, or None if unreachable."""
        if not self.display:
            return None
        from Xlib import display as xdisplay

        from guest.held import pressed_state

        if self._x is None:
            self._x = xdisplay.Display(self.display)
        return pressed_state(self._x)

    def close(self) -> None:
        if self._x is not None:
            self._x.close()
            self._x = None
