"""The X keyboard extension's (XKB) keyboard state: read it and set its locks and latches.

python-xlib has no XKB module; the three requests the agent needs are defined here on its request
machinery (``XKBproto.h``: ``XkbUseExtension``, ``XkbGetState``, ``XkbLatchLockState``), always for the
core keyboard. The state is the server's, shared by every client: the modifiers locked (Caps Lock is
the ``Lock`` modifier locked, Num Lock usually ``Mod2``, a Shift Lock ``Shift``, a Level 3 lock ``Mod5``)
and latched (they apply to the next key only, as sticky keys or an ``ISO_*_Latch`` key leave them), the
base modifiers of keys held down, and the keyboard group (layout) locked or latched.

Modifier masks are the core protocol's (``Xlib.X.ShiftMask`` ... ``Mod5Mask``), one byte.
"""

from __future__ import annotations

from dataclasses import dataclass

from Xlib.display import Display
from Xlib.protocol import rq

EXTENSION = "XKEYBOARD"
USE_CORE_KBD = 0x0100
"""``XkbUseCoreKbd``: the device spec of the core keyboard."""
ALL_MODS = 0xFF


class XkbUnavailable(RuntimeError):
    """The X server has no XKB extension (or refused to speak it to this connection)."""


@dataclass(frozen=True)
class KeyState:
    """The core keyboard's XKB state: modifier masks ``locked``, ``latched``, ``base`` (keys held) and
    ``effective`` (what a key event carries); keyboard groups ``locked_group``, ``latched_group`` and
    ``group`` (the effective one, 0 = the first layout)."""

    effective: int
    base: int
    latched: int
    locked: int
    group: int
    locked_group: int
    latched_group: int

    @property
    def neutral(self) -> bool:
        """Nothing locked or latched: a key means its first group's level that Shift alone selects."""
        return not (self.locked or self.latched or self.locked_group or self.latched_group)


class _UseExtension(rq.ReplyRequest):
    _request = rq.Struct(rq.Card8("opcode"), rq.Opcode(0), rq.RequestLength(),
                         rq.Card16("wanted_major"), rq.Card16("wanted_minor"))
    _reply = rq.Struct(rq.Pad(1), rq.Card8("supported"), rq.Card16("sequence_number"), rq.Pad(4),
                       rq.Card16("server_major"), rq.Card16("server_minor"), rq.Pad(20))


class _GetState(rq.ReplyRequest):
    _request = rq.Struct(rq.Card8("opcode"), rq.Opcode(4), rq.RequestLength(),
                         rq.Card16("device_spec"), rq.Pad(2))
    _reply = rq.Struct(rq.Pad(1), rq.Card8("device_id"), rq.Card16("sequence_number"), rq.Pad(4),
                       rq.Card8("mods"), rq.Card8("base_mods"), rq.Card8("latched_mods"), rq.Card8("locked_mods"),
                       rq.Card8("group"), rq.Card8("locked_group"), rq.Int16("base_group"),
                       rq.Int16("latched_group"), rq.Card8("compat_state"), rq.Card8("grab_mods"),
                       rq.Card8("compat_grab_mods"), rq.Card8("lookup_mods"), rq.Card8("compat_lookup_mods"),
                       rq.Pad(1), rq.Card16("ptr_btn_state"), rq.Pad(6))


class _LatchLockState(rq.Request):
    _request = rq.Struct(rq.Card8("opcode"), rq.Opcode(5), rq.RequestLength(),
                         rq.Card16("device_spec"), rq.Card8("affect_mod_locks"), rq.Card8("mod_locks"),
                         rq.Card8("lock_group"), rq.Card8("group_lock"), rq.Card8("affect_mod_latches"),
                         rq.Card8("mod_latches"), rq.Pad(1), rq.Card8("latch_group"), rq.Int16("group_latch"))


_OPCODE_ATTRIBUTE = "_desktop_sandbox_xkb_opcode"
"""Attribute of a connection's protocol display holding XKB's major opcode once ``XkbUseExtension`` was
answered on it (None: the server has no XKB)."""


def _opcode(dpy: Display) -> int:
    """XKB's major opcode on ``dpy``, saying ``XkbUseExtension`` first on a new connection (the server
    refuses XKB requests before it). Raises :class:`XkbUnavailable`."""
    if not hasattr(dpy.display, _OPCODE_ATTRIBUTE):
        info = dpy.query_extension(EXTENSION)
        opcode = info.major_opcode if info is not None and info.present else None
        if opcode is not None:
            reply = _UseExtension(display=dpy.display, opcode=opcode, wanted_major=1, wanted_minor=0)
            if not reply.supported:
                opcode = None
        setattr(dpy.display, _OPCODE_ATTRIBUTE, opcode)
    opcode = getattr(dpy.display, _OPCODE_ATTRIBUTE)
    if opcode is None:
        raise XkbUnavailable("the X server has no XKB extension")
    return opcode


def get_state(dpy: Display) -> KeyState:
    """The core keyboard's XKB state (one round trip). Raises :class:`XkbUnavailable`."""
    r = _GetState(display=dpy.display, opcode=_opcode(dpy), device_spec=USE_CORE_KBD)
    return KeyState(effective=r.mods, base=r.base_mods, latched=r.latched_mods, locked=r.locked_mods,
                    group=r.group, locked_group=r.locked_group, latched_group=r.latched_group)


def set_locks_and_latches(dpy: Display, *, locked: int | None = None, latched: int | None = None,
                          locked_group: int | None = None, latched_group: int | None = None) -> None:
    """Set the core keyboard's locked and latched modifiers (masks; the whole byte) and its locked and
    latched group, each one given (None: left as it is). Queued: the caller flushes or syncs. The
    server applies it as a key's action would (indicators, ``XkbStateNotify``). Raises
    :class:`XkbUnavailable`."""
    _LatchLockState(display=dpy.display, opcode=_opcode(dpy), device_spec=USE_CORE_KBD,
                    affect_mod_locks=ALL_MODS if locked is not None else 0, mod_locks=locked or 0,
                    lock_group=locked_group is not None, group_lock=locked_group or 0,
                    affect_mod_latches=ALL_MODS if latched is not None else 0, mod_latches=latched or 0,
                    latch_group=latched_group is not None, group_latch=latched_group or 0)
