"""Keyboard input through XTEST: chords (``keypress``) and exact text (``type``).

Keycodes always come from the server's live keymap, read at the start of every keyboard action.
A keysym found at level 0 of a keycode is pressed alone; at level 1 with ``Shift_L`` around it, but a
keypad keysym at level 1 (``KP_1``) with Num Lock locked for the action instead: a keypad key gives its
second keysym with Num Lock (the core protocol's rule, and XKB's ``KEYPAD`` type), while Shift gives it
nothing in current keymaps.
A keysym not on the keymap (``é``, ``日``, emoji ...) is bound to a *spare* keycode (one with no
keysyms at all; two keysyms per keycode, levels 0 and 1) with ``ChangeKeyboardMapping``; the key is pressed only after a
round trip (``GetKeyboardMapping``) shows the server holds the new mapping, so every client gets its
``MappingNotify`` before the key event. Bindings are kept and reused across requests, and the
keycodes bound this way are listed in the root window property :data:`SPARE_PROPERTY`, so an agent
started later on the same X server (the server outlives agent restarts) takes them over as spares
instead of finding none left.

Text rules (``type``): ``\\r\\n``, ``\\r`` and ``\\n`` are one ``Return`` each; ``\\t`` is ``Tab``;
other control characters are refused; every other character is typed as its own keysym
(:func:`guest.keys.char_to_keysym`). Each key is released right after it is pressed, so nothing is
held long enough to auto-repeat. When one text needs more distinct unmapped characters than the
spare keycodes can hold, it is typed in chunks, and keycodes are bound anew between them. An X client
looks a keycode up in the keymap it holds when it gets to the event, so a keycode pressed since the
clients were last seen idle is bound anew only once (1) ``REBIND_SETTLE_S`` has passed since its last
press (what a responsive client needs to take the press in), and then (2) every X client has read all
the server sent it and the clients the keys may go to stay asleep (:func:`guest.xclients.wait_until_idle`),
so a client that lags further (a busy or emulated guest, a stopped process) gets its earlier presses
with the binding they were typed with. Part (2) waits at most :data:`REBIND_WAIT_S` in a request, counted
from its first such wait, and never past the request's deadline: a client that stays busy or stopped
that long does not hold typing up (:meth:`Keyboard.begin` starts a request); one whose socket still
holds what it held then is not waited for again until it reads. Where (2) cannot be known
(:class:`guest.xclients.Unknowable`, logged once), the rule is (1) alone. All the keycodes of one
binding that are consecutive change in one ``ChangeKeyboardMapping`` (one ``MappingNotify``: window
managers such as openbox grab their keys anew on each). This is the only wait in the keyboard path,
and only when bindings run out.

Keys mean what was named, whatever state the keyboard is in (:meth:`Keyboard.exact_state`, around
every ``keypress``, ``type`` and key held for a pointer action): before the first key the server's XKB
state (:mod:`guest.xkb`) is made neutral -- modifiers and groups locked (Caps Lock, Num Lock, Shift
Lock, a Level 3 or layout lock) or latched (sticky keys, ``ISO_*_Latch``) are cleared, and modifier keys
another client left down are released -- so a key arrives at the level chosen above in the first layout
(``KP_End`` is ``KP_End`` with Num Lock on; ``a`` is ``a`` with Caps Lock on). After the last key the
locks and latches are put back, with the action's own changes applied to them: a lock the action's keys
toggled (a ``keypress`` of ``CAPSLOCK``) is toggled from what it was, every other lock is as it was,
latches are as they were plus any the action left. Modifier keys released are not pressed again (a
request ends with nothing held). Without XKB (logged once) keys go as they are.

Requests are flushed to the server every :data:`FLUSH_EVERY` keys (python-xlib's send buffer grows
quadratically when requests pile up), and a ``deadline`` (monotonic seconds) is checked there: past it,
:class:`DeadlinePassed` is raised between two keys.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Iterator

from Xlib import XK, X, Xatom
from Xlib.display import Display
from Xlib.ext import xtest

from . import xclients, xkb
from .held import Held
from .keys import MODIFIER_KEYSYMS, char_to_keysym, is_keypad, keysym_name

log = logging.getLogger(__name__)

SHIFT_L = XK.string_to_keysym("Shift_L")
NUM_LOCK = XK.string_to_keysym("Num_Lock")
RETURN = XK.string_to_keysym("Return")
TAB = XK.string_to_keysym("Tab")
#: Longest a request waits, in all, for X clients to handle earlier key events before rebinding (seconds).
REBIND_WAIT_S = 5.0
#: Least time between a spare keycode's last press and binding it anew (seconds).
REBIND_SETTLE_S = 0.25
#: Lowest keycode the agent will use as a spare (keycode 8 is ignored by some toolkits).
MIN_SPARE_KEYCODE = 9
#: Root window property (CARDINAL list) naming the keycodes bound as spares on this X server.
SPARE_PROPERTY = "_DESKTOP_SANDBOX_SPARE_KEYCODES"
#: Keys typed between two flushes of the request buffer (and deadline checks).
FLUSH_EVERY = 64


class DeadlinePassed(Exception):
    """The request's deadline passed while typing; the keys before it were typed."""


class InvalidText(ValueError):
    """Text holding a control character that has no key (HTTP 400 ``invalid_action``)."""


def text_to_keysyms(text: str) -> list[int]:
    """Split ``text`` into the keysyms to type, applying the newline/tab rules above.

    Raises:
        InvalidText: a control character other than ``\\n``, ``\\r``, ``\\t``.
    """
    out: list[int] = []
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch == "\r":
            out.append(RETURN)
            if i + 1 < n and text[i + 1] == "\n":
                i += 1
        elif ch == "\n":
            out.append(RETURN)
        elif ch == "\t":
            out.append(TAB)
        elif ord(ch) < 0x20 or 0x7F <= ord(ch) < 0xA0:
            raise InvalidText(f"character U+{ord(ch):04X} at offset {i} cannot be typed")
        else:
            out.append(char_to_keysym(ch))
        i += 1
    return out


def _runs(keycodes: list[int], rows: dict[int, tuple[int, int]]) -> list[tuple[int, list[tuple[int, int]]]]:
    """``keycodes`` grouped into runs of consecutive ones: ``[(first keycode, [row, ...]), ...]``."""
    out: list[tuple[int, list[tuple[int, int]]]] = []
    for keycode in sorted(keycodes):
        if out and out[-1][0] + len(out[-1][1]) == keycode:
            out[-1][1].append(rows[keycode])
        else:
            out.append((keycode, [rows[keycode]]))
    return out


class Keymap:
    """Snapshot of the server's core keymap: keysym -> (keycode, needs Shift), rows, empty keycodes,
    and ``listed``: the keycodes :data:`SPARE_PROPERTY` names as bound spares."""

    def __init__(self, dpy: Display) -> None:
        prop = dpy.screen().root.get_full_property(dpy.get_atom(SPARE_PROPERTY), Xatom.CARDINAL)
        self.listed: set[int] = set(prop.value) if prop is not None else set()
        self.min_keycode = dpy.display.info.min_keycode
        self.max_keycode = dpy.display.info.max_keycode
        rows = dpy.get_keyboard_mapping(self.min_keycode, self.max_keycode - self.min_keycode + 1)
        self.rows: dict[int, tuple[int, ...]] = {}
        self.lookup: dict[int, tuple[int, bool]] = {}
        self.empty: list[int] = []
        for offset, row in enumerate(rows):
            self.rows[self.min_keycode + offset] = tuple(row)
        for level in (0, 1):
            for keycode, row in self.rows.items():
                if level < len(row) and row[level]:
                    self.lookup.setdefault(row[level], (keycode, level == 1))
        for keycode, row in self.rows.items():
            if not any(row) and keycode >= MIN_SPARE_KEYCODE:
                self.empty.append(keycode)


class Keyboard:
    """Presses keys on one display connection; remembers the spare keycodes it has bound.

    A spare keycode carries two bound keysyms: level 0 (pressed alone) and level 1 (pressed with
    Shift), so N spare keycodes hold 2N characters.
    """

    def __init__(self) -> None:
        # keycode -> (level-0 keysym, level-1 keysym) bound by us, least recently used first.
        self._bound: OrderedDict[int, tuple[int, int]] = OrderedDict()
        # keycode -> monotonic time of its last press (for the rebinding rule).
        self._pressed_at: dict[int, float] = {}
        # monotonic time before which every key event sent was seen handled by every X client.
        self._handled_up_to = 0.0
        # the current request's deadline, and the end of its budget for waiting on X clients
        self._deadline: float | None = None
        self._wait_until: float | None = None
        self._unknowable_logged = False
        # clients that had not read everything at the end of a wait: {socket inode: unread bytes then}
        self._not_reading: dict[int, int] = {}
        self._no_xkb_logged = False
        # modifiers the agent locked itself to reach a key's level (undone by restore)
        self._own_locks = 0

    def begin(self, deadline: float | None) -> None:
        """Start a request whose monotonic ``deadline`` (None: none) bounds every wait for X clients in
        it; the budget of :data:`REBIND_WAIT_S` starts again (module doc)."""
        self._deadline, self._wait_until = deadline, None

    def forget_bindings(self) -> None:
        """Drop remembered spare bindings (after a reconnect the server's keymap is fresh)."""
        self._bound.clear()

    # -- mapping -----------------------------------------------------------------------------
    def _spares(self, keymap: Keymap) -> list[int]:
        """Keycodes we may bind: empty ones, and ours whose row the server still holds (keycodes an
        earlier agent listed in :data:`SPARE_PROPERTY` become ours, least recently used)."""
        for keycode in sorted(keymap.listed - set(self._bound)):
            row = keymap.rows.get(keycode, ())
            if len(row) >= 2 and keycode >= MIN_SPARE_KEYCODE:
                self._bound[keycode] = (row[0], row[1])
                self._bound.move_to_end(keycode, last=False)
        spares = set(keymap.empty)
        for keycode, pair in list(self._bound.items()):
            if keymap.rows.get(keycode, ())[:2] == pair:
                spares.add(keycode)
            else:
                del self._bound[keycode]
        return sorted(spares)

    def bind(self, dpy: Display, keymap: Keymap, keysyms: list[int], protect: set[int],
             paired: bool = True) -> None:
        """Bind ``keysyms`` (none on the keymap) to spare keycodes (one keymap change for each run of
        consecutive keycodes), then sync.

        ``paired``: two keysyms per keycode (level 0 and level 1); otherwise one, on both levels.
        Keycodes holding a keysym in ``protect`` keep their binding. A keycode pressed since the X
        clients were last seen idle is bound anew only by the rule in the module doc. Raises
        ValueError when there are not enough spare keycodes.
        """
        spares = self._spares(keymap)
        candidates = [k for k in spares if k not in self._bound]
        candidates += [k for k, pair in self._bound.items() if not (set(pair) & protect)]  # LRU order
        step = 2 if paired else 1
        pairs = [keysyms[i:i + step] for i in range(0, len(keysyms), step)]
        if len(pairs) > len(candidates):
            raise ValueError("not enough spare keycodes for the unmapped characters")
        last_press = max((self._pressed_at.get(k, 0.0) for k in candidates[:len(pairs)] if k in self._bound),
                         default=0.0)
        self._await_clients(dpy, last_press)
        changed: list[int] = []
        for pair, keycode in zip(pairs, candidates):
            for old in self._bound.pop(keycode, ()):
                if keymap.lookup.get(old, (None,))[0] == keycode:
                    del keymap.lookup[old]
            row = (pair[0], pair[1] if len(pair) > 1 else pair[0])
            self._bound[keycode] = row
            keymap.rows[keycode] = row
            keymap.lookup[row[0]] = (keycode, False)
            if len(pair) > 1:
                keymap.lookup[row[1]] = (keycode, True)
            changed.append(keycode)
        # One request for each run of consecutive keycodes (spare keycodes lie scattered; rewriting the
        # keys between them through the core protocol would make the server derive their XKB types anew).
        for first, rows in _runs(changed, self._bound):
            dpy.change_keyboard_mapping(first, rows)
        if changed and not keymap.listed.issuperset(changed):
            keymap.listed.update(changed)
            dpy.screen().root.change_property(dpy.get_atom(SPARE_PROPERTY), Xatom.CARDINAL, 32,
                                              sorted(keymap.listed))
        if changed:
            # Round trip: the server has applied every ChangeKeyboardMapping once this returns,
            # and the MappingNotify events precede any key event sent afterwards.
            first = min(changed)
            rows = dpy.get_keyboard_mapping(first, max(changed) - first + 1)
            for keycode in changed:
                if tuple(rows[keycode - first][:2]) != self._bound[keycode]:
                    raise RuntimeError(f"the X server did not accept the binding of keycode {keycode}")

    def _await_clients(self, dpy: Display, last_press: float) -> None:
        """Before binding anew keycodes last pressed at ``last_press`` (monotonic s; 0: never): the rule in
        the module doc, ``REBIND_SETTLE_S`` after that press, then, unless the clients were seen idle
        since it, every X client seen idle within the request's budget."""
        if last_press <= 0.0:
            return
        dpy.sync()  # the presses have reached the server, which passed them on
        pause = last_press + REBIND_SETTLE_S - time.monotonic()
        if pause > 0:
            # (1) is a time on purpose: a client may read its events into a queue of its own and look them
            # up later (another thread, a toolkit's dispatch), which no state seen from outside shows;
            # (2) below is the condition wait for whatever lags past it.
            time.sleep(pause)
        if last_press <= self._handled_up_to:
            return
        now = time.monotonic()
        if self._wait_until is None:
            self._wait_until = now + REBIND_WAIT_S
            if self._deadline is not None:
                self._wait_until = min(self._wait_until, self._deadline)
        try:
            stuck = xclients.wait_until_idle(dpy, self._wait_until, self._not_reading)
        except xclients.Unknowable as exc:
            if not self._unknowable_logged:
                self._unknowable_logged = True
                log.warning("cannot see what X clients have handled (%s): spare keycodes are bound anew "
                            "%.2f s after their last press, however far a client lags", exc, REBIND_SETTLE_S)
            return
        if stuck is None:
            self._handled_up_to = now
        else:
            self._not_reading = stuck

    def touch(self, keycode: int) -> None:
        """Note a press of ``keycode`` (LRU order and the rebinding rule)."""
        if keycode in self._bound:
            self._bound.move_to_end(keycode)
            self._pressed_at[keycode] = time.monotonic()

    # -- pressing ----------------------------------------------------------------------------
    def _stroke(self, dpy: Display, held: Held, keymap: Keymap, keysym: int) -> None:
        keycode, shifted = keymap.lookup[keysym]
        self.touch(keycode)
        shift_kc = keymap.lookup[SHIFT_L][0] if shifted else None
        if shift_kc is not None:
            held.key_down(dpy, shift_kc)
        held.key_down(dpy, keycode)
        held.key_up(dpy, keycode)
        if shift_kc is not None:
            held.key_up(dpy, shift_kc)

    def type_keysyms(self, dpy: Display, held: Held, keysyms: list[int], deadline: float | None = None) -> None:
        """Type each keysym (press + release), binding unmapped ones to spare keycodes first, in the
        keyboard's neutral state (:meth:`exact_state`). Raises DeadlinePassed past ``deadline``."""
        with self.exact_state(dpy):
            self._type(dpy, held, Keymap(dpy), keysyms, deadline)

    @contextlib.contextmanager
    def exact_state(self, dpy: Display) -> Iterator[None]:
        """Run the body with the keyboard's state neutral (:meth:`neutralize`), then put its locks and
        latches back (:meth:`restore`). Nested use is cheap: the inner one finds the state neutral.
        Raises what the X connection raises; a failure to restore after the body failed is logged, the
        body's error propagates."""
        before = self.neutralize(dpy)
        ok = False
        try:
            yield
            ok = True
        finally:
            try:
                self.restore(dpy, before)
            except Exception:  # noqa: BLE001 - the body's own error is the one to report
                if ok:
                    raise
                log.warning("could not restore the keyboard's locks after a failed action", exc_info=True)

    def neutralize(self, dpy: Display) -> xkb.KeyState | None:
        """Make the keyboard's XKB state neutral (module doc): release modifier keys another client holds,
        clear locks and latches. Returns the state before, for :meth:`restore` (None: no XKB)."""
        try:
            before = xkb.get_state(dpy)
        except xkb.XkbUnavailable as exc:
            if not self._no_xkb_logged:
                self._no_xkb_logged = True
                log.warning("%s: keys go as they are, whatever lock the keyboard is in", exc)
            return None
        if before.base:
            self._release_modifier_keys(dpy)
        if not before.neutral:
            xkb.set_locks_and_latches(dpy, locked=0, latched=0, locked_group=0, latched_group=0)
        return before

    def restore(self, dpy: Display, before: xkb.KeyState | None) -> None:
        """Put back the locks and latches of ``before`` (what :meth:`neutralize` returned), with the
        changes the keys made since applied to them (module doc), then sync. A lock the agent set itself
        to reach a key's level (:meth:`_lock_for_level`) is not such a change: it goes."""
        own, self._own_locks = self._own_locks, 0
        if before is None or (before.neutral and not own):
            return
        after = xkb.get_state(dpy)
        locked = before.locked ^ (after.locked & ~own)
        latched = before.latched | after.latched
        locked_group = before.locked_group + after.locked_group
        latched_group = before.latched_group + after.latched_group
        if (locked, latched, locked_group, latched_group) != (after.locked, after.latched, after.locked_group,
                                                                after.latched_group):
            xkb.set_locks_and_latches(dpy, locked=locked, latched=latched, locked_group=locked_group,
                                      latched_group=latched_group)
        dpy.sync()

    @staticmethod
    def _release_modifier_keys(dpy: Display) -> None:
        """Release (XTEST) every key the server reports down that carries a modifier: keys another client
        left pressed (a request of the agent ends with nothing held)."""
        modifier_keys = {kc for row in dpy.get_modifier_mapping() for kc in row if kc}
        keymap = dpy.query_keymap()
        for byte_index, bits in enumerate(keymap):
            for bit in range(8):
                keycode = byte_index * 8 + bit
                if bits & (1 << bit) and keycode in modifier_keys:
                    xtest.fake_input(dpy, X.KeyRelease, keycode)

    def _type(self, dpy: Display, held: Held, keymap: Keymap, keysyms: list[int], deadline: float | None) -> None:
        start = 0
        while start < len(keysyms):
            end, needed, protect = self._chunk(keymap, keysyms, start)
            chunk = keysyms[start:end]
            if needed:
                self.bind(dpy, keymap, needed, protect)
            if SHIFT_L not in keymap.lookup:
                raise ValueError("the keymap has no Shift_L")
            for i, k in enumerate(chunk, 1):
                self._stroke(dpy, held, keymap, k)
                if i % FLUSH_EVERY == 0:
                    dpy.flush()
                    if deadline is not None and time.monotonic() >= deadline:
                        raise DeadlinePassed()
            dpy.flush()
            start = end
            if deadline is not None and start < len(keysyms) and time.monotonic() >= deadline:
                raise DeadlinePassed()
        dpy.sync()

    def _chunk(self, keymap: Keymap, keysyms: list[int], start: int) -> tuple[int, list[int], set[int]]:
        """The longest run of ``keysyms`` from ``start`` that can be typed with one binding: returns
        ``(end, needed, protect)``, ``needed`` the unmapped keysyms to bind (in order, once each) and
        ``protect`` the run's keysyms already on the keymap. A spare keycode holding a keysym the run
        uses keeps it (:meth:`bind`), so the needed keysyms must fit two to a keycode on the spare
        keycodes the run does not use. Raises ValueError when not even one unmapped keysym fits."""
        spares = set(self._spares(keymap))
        kept: set[int] = set()  # spare keycodes holding a keysym of the run
        needed: list[int] = []
        seen: set[int] = set()
        end = start
        while end < len(keysyms):
            k = keysyms[end]
            if k in keymap.lookup:
                keycode = keymap.lookup[k][0]
                if keycode in spares and keycode not in kept:
                    if (len(needed) + 1) // 2 > len(spares) - len(kept) - 1:
                        break
                    kept.add(keycode)
            elif k not in seen:
                if (len(needed) + 2) // 2 > len(spares) - len(kept):
                    break
                needed.append(k)
                seen.add(k)
            end += 1
        if end == start:
            raise ValueError("the keymap has no spare keycode for unmapped characters")
        return end, needed, {k for k in keysyms[start:end] if k in keymap.lookup}

    def chord_keycodes(self, dpy: Display, keysyms: list[int]) -> list[int]:
        """Keycodes to press, in order, for a chord of keysyms (binding unmapped ones).

        A keysym reachable only with Shift gets ``Shift_L`` inserted before it, unless the chord
        already holds a Shift. In a chord with a modifier, an upper-case ASCII letter means its
        key cap (``["CTRL", "A"]`` is Ctrl+a, not Ctrl+Shift+a).
        """
        keymap = Keymap(dpy)
        has_modifier = any(k in MODIFIER_KEYSYMS for k in keysyms)
        resolved: list[int] = []
        for k in keysyms:
            if has_modifier and 0x41 <= k <= 0x5A:
                k += 0x20
            resolved.append(k)
        missing = list(dict.fromkeys(k for k in resolved if k not in keymap.lookup))
        if missing:
            self.bind(dpy, keymap, missing, protect=set(resolved), paired=False)
        shift_names = {XK.string_to_keysym("Shift_L"), XK.string_to_keysym("Shift_R")}
        has_shift = any(k in shift_names for k in resolved)
        out: list[int] = []
        for k in resolved:
            keycode, shifted = keymap.lookup[k]
            if shifted and is_keypad(k) and self._lock_for_level(dpy, keymap, NUM_LOCK):
                shifted = False
            if shifted and not has_shift:
                out.append(keymap.lookup[SHIFT_L][0])
                has_shift = True
            self.touch(keycode)
            out.append(keycode)
        return list(dict.fromkeys(out))

    def _lock_for_level(self, dpy: Display, keymap: Keymap, lock_keysym: int) -> bool:
        """Lock the modifier of the key ``lock_keysym`` (``Num_Lock``) for the rest of this action, as the
        agent's own lock (:meth:`restore` undoes it): what gives a keypad key's second keysym (module
        doc). False, having done nothing, when the keymap has no such key or modifier, or the server no
        XKB."""
        keycode = keymap.lookup.get(lock_keysym, (None,))[0]
        rows = dpy.get_modifier_mapping() if keycode is not None else []
        mask = next((1 << index for index, row in enumerate(rows) if keycode in row), 0)
        if not mask:
            return False
        try:
            xkb.set_locks_and_latches(dpy, locked=xkb.get_state(dpy).locked | mask)
        except xkb.XkbUnavailable:
            return False
        self._own_locks |= mask
        return True

    def chord(self, dpy: Display, held: Held, keysyms: list[int]) -> None:
        """``keypress``: press every key in order, then release in reverse order; one chord, in the
        keyboard's neutral state (:meth:`exact_state`)."""
        with self.exact_state(dpy):
            keycodes = self.chord_keycodes(dpy, keysyms)
            for kc in keycodes:
                held.key_down(dpy, kc)
            for kc in reversed(keycodes):
                held.key_up(dpy, kc)
            dpy.sync()

    def hold(self, dpy: Display, held: Held, keysyms: list[int]) -> list[int]:
        """Press (and leave down) the keys of ``keysyms``; returns keycodes to release later. The caller
        holds :meth:`exact_state` around the hold and its release."""
        keycodes = self.chord_keycodes(dpy, keysyms)
        for kc in keycodes:
            held.key_down(dpy, kc)
        dpy.flush()
        return keycodes

    def unhold(self, dpy: Display, held: Held, keycodes: list[int]) -> None:
        """Release keys pressed by :meth:`hold`, in reverse order."""
        for kc in reversed(keycodes):
            held.key_up(dpy, kc)
        dpy.flush()


__all__ = ["Keyboard", "Keymap", "InvalidText", "DeadlinePassed", "text_to_keysyms", "keysym_name"]
