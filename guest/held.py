"""What the agent is holding down right now, and how to let go of everything.

Every XTEST press goes through :class:`Held`, which remembers it; :meth:`Held.release_all`
releases in reverse press order and then checks the server's own state (``QueryKeymap`` for
keys, ``QueryPointer`` for buttons 1-5) and releases anything still down, whoever pressed it.
"""

from __future__ import annotations

from Xlib import X
from Xlib.display import Display
from Xlib.ext import xtest

#: QueryPointer mask bit for buttons 1..5 (X protocol, Button1Mask = 1 << 8).
_BUTTON_MASKS = {1: X.Button1Mask, 2: X.Button2Mask, 3: X.Button3Mask, 4: X.Button4Mask,
                 5: X.Button5Mask}


class Held:
    """Ordered record of pressed keycodes and buttons for one connection."""

    def __init__(self) -> None:
        self._stack: list[tuple[str, int]] = []

    def key_down(self, dpy: Display, keycode: int) -> None:
        """XTEST KeyPress of ``keycode`` (queued; the caller flushes/syncs)."""
        self._press(dpy, X.KeyPress, ("key", keycode))

    def key_up(self, dpy: Display, keycode: int) -> None:
        """XTEST KeyRelease of ``keycode``."""
        self._release(dpy, X.KeyRelease, ("key", keycode))

    def button_down(self, dpy: Display, button: int) -> None:
        """XTEST ButtonPress of pointer button ``button`` (1-9)."""
        self._press(dpy, X.ButtonPress, ("button", button))

    def button_up(self, dpy: Display, button: int) -> None:
        """XTEST ButtonRelease of pointer button ``button``."""
        self._release(dpy, X.ButtonRelease, ("button", button))

    def _press(self, dpy: Display, event: int, item: tuple[str, int]) -> None:
        """Send the XTEST ``event`` for ``item``'s code and remember it as held."""
        xtest.fake_input(dpy, event, item[1])
        self._stack.append(item)

    def _release(self, dpy: Display, event: int, item: tuple[str, int]) -> None:
        """Send the XTEST ``event`` for ``item``'s code and forget its latest press."""
        xtest.fake_input(dpy, event, item[1])
        self._forget(item)

    def _forget(self, item: tuple[str, int]) -> None:
        for i in range(len(self._stack) - 1, -1, -1):
            if self._stack[i] == item:
                del self._stack[i]
                return

    def release_all(self, dpy: Display) -> None:
        """Release everything held (reverse order), then whatever the server still reports down.

        Ends with a round trip, so on return the server has processed every release. The server
        handles one client's requests in order, so each query's reply already reflects every release
        queued before it: two round trips (``QueryKeymap``, ``QueryPointer``), a third only when
        buttons were still down after the second.
        """
        while self._stack:
            kind, code = self._stack.pop()
            xtest.fake_input(dpy, X.KeyRelease if kind == "key" else X.ButtonRelease, code)
        keymap = dpy.query_keymap()
        for byte_index, bits in enumerate(keymap):
            if bits:
                for bit in range(8):
                    if bits & (1 << bit):
                        xtest.fake_input(dpy, X.KeyRelease, byte_index * 8 + bit)
        mask = dpy.screen().root.query_pointer().mask
        released = False
        for button, bit in _BUTTON_MASKS.items():
            if mask & bit:
                xtest.fake_input(dpy, X.ButtonRelease, button)
                released = True
        if released:
            dpy.sync()


def pressed_state(dpy: Display) -> tuple[list[int], int]:
    """Keycodes the server reports down, and the pointer's button mask."""
    keymap = dpy.query_keymap()
    keys = [i * 8 + b for i, bits in enumerate(keymap) for b in range(8) if bits & (1 << b)]
    return keys, dpy.screen().root.query_pointer().mask & 0x1F00
