"""keypress and type mean the keys and text named, whatever state the keyboard is in: Caps Lock, Shift
Lock, Num Lock, a Level 3 (AltGr) lock, a modifier left latched, a modifier key another client holds
down. The probe logs what an application makes of each key event (libX11's ``XLookupString`` on the
server's keymap, and the event's modifier state); the keyboard's XKB state is read before and after:
locks and latches the desktop had are there again after the action, a lock the action toggled is
toggled."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from Xlib import X

from .test_keys import presses

MODIFIER_NAMES = {"Shift_L", "Shift_R", "Control_L", "Control_R", "Alt_L", "Alt_R", "ISO_Level3_Shift",
                  "Num_Lock", "Caps_Lock"}
CORE_MODS = 0xFF
"""The modifier bits of an event's state (buttons and group above them)."""


@pytest.fixture
def keyboard(desktop, probe) -> Iterator:
    """``keyboard(**change)``: the keyboard's XKB state after ``change`` (``desktop.key_state``); every
    lock and latch is cleared after the test, and nothing is left pressed."""
    if desktop.key_state() is None:
        pytest.skip("the desktop's keyboard state is not observable from here")
    yield desktop.key_state
    state = desktop.key_state(locked=0, latched=0, locked_group=0, latched_group=0)
    assert state["locked"] == 0 and state["latched"] == 0


def typed(probe, target, actions) -> list[tuple[str, int]]:
    """(lookup, modifier state) of each key press the actions caused that is not a modifier key."""
    events = presses(probe.run_and_collect(target, actions))
    assert all(e.get("lookup") is not None for e in events), f"the probe's XLookupString gave nothing: {events}"
    return [(e["lookup"], e["state"] & CORE_MODS) for e in events if e["lookup"] not in MODIFIER_NAMES]


LETTERS = [{"type": "keypress", "keys": ["a"]}, {"type": "keypress", "keys": ["A"]},
           {"type": "type", "text": "aB1 z"}]
LETTERS_SEEN = ["a", "A", "a", "B", "1", "space", "z"]


@pytest.mark.parametrize("lock", [X.LockMask, X.ShiftMask], ids=["caps_lock", "shift_lock"])
def test_letters_mean_the_case_named_with_caps_or_shift_lock_on(target, probe, keyboard, lock):
    assert keyboard(locked=lock)["locked"] == lock
    got = typed(probe, target, LETTERS)
    # exactly the modifiers of the keys named: Shift with "A" and "B", nothing else
    assert got == [(name, X.ShiftMask if name in ("A", "B") else 0) for name in LETTERS_SEEN]
    assert keyboard()["locked"] == lock  # the lock the desktop had is on again


def test_keypad_keys_mean_the_key_named_with_num_lock_on(target, probe, keyboard):
    target.run([{"type": "keypress", "keys": ["Num_Lock"]}])  # the model turns Num Lock on
    num_lock = keyboard()["locked"]
    assert num_lock, "Num_Lock locked no modifier"
    got = typed(probe, target, [{"type": "keypress", "keys": ["KP_1"]}, {"type": "keypress", "keys": ["KP_End"]},
                                {"type": "keypress", "keys": ["KP_Enter"]}, {"type": "type", "text": "12"}])
    # KP_1 is the keypad key's Num Lock level, KP_End its level without: each with only what selects it
    assert got == [("KP_1", num_lock), ("KP_End", 0), ("KP_Enter", 0), ("1", 0), ("2", 0)]
    assert keyboard()["locked"] == num_lock
    target.run([{"type": "keypress", "keys": ["Num_Lock"]}])  # and off again: its own toggle still works
    assert keyboard()["locked"] == 0


@pytest.mark.parametrize("latch", [X.ShiftMask, X.ControlMask, X.Mod1Mask], ids=["shift", "control", "alt"])
def test_a_latched_modifier_does_not_reach_the_keys_and_stays_latched(target, probe, keyboard, latch):
    # as sticky keys, an ISO_*_Latch key or another client leave it: it would apply to the next key
    assert keyboard(latched=latch)["latched"] == latch
    got = typed(probe, target, [{"type": "keypress", "keys": ["c"]}, {"type": "type", "text": "b"}])
    assert got == [("c", 0), ("b", 0)]
    assert keyboard()["latched"] == latch


def test_a_level3_lock_does_not_reach_a_chord(target, probe, keyboard):
    level3 = X.Mod5Mask  # ISO_Level3_Shift's modifier on the default keymap (AltGr)
    assert keyboard(locked=level3)["locked"] == level3
    got = typed(probe, target, [{"type": "keypress", "keys": ["ctrl", "a"]}, {"type": "keypress", "keys": ["e"]}])
    assert got == [("a", X.ControlMask), ("e", 0)]
    assert keyboard()["locked"] == level3


@pytest.mark.parametrize("held", ["Shift_L", "Control_L", "ISO_Level3_Shift"])
def test_a_modifier_key_another_client_holds_is_let_go_first(target, probe, keyboard, desktop, held):
    from guest.keys import resolve

    state = keyboard(press=[resolve(held)])
    assert state["base"], f"{held} pressed elsewhere set no modifier"
    got = typed(probe, target, [{"type": "keypress", "keys": ["x"]}, {"type": "type", "text": "y"}])
    assert got == [("x", 0), ("y", 0)]
    assert keyboard()["base"] == 0  # released, as every request leaves nothing held


def test_a_lock_the_action_toggles_is_toggled_from_what_it_was(target, probe, keyboard):
    assert keyboard(locked=X.LockMask | X.Mod5Mask)["locked"] == X.LockMask | X.Mod5Mask
    target.run([{"type": "keypress", "keys": ["CAPSLOCK"]}])
    assert keyboard()["locked"] == X.Mod5Mask  # Caps Lock off, the other lock as it was
    target.run([{"type": "keypress", "keys": ["CAPSLOCK"]}])
    assert keyboard()["locked"] == X.LockMask | X.Mod5Mask
