"""keypress: key names, chords, right-hand modifiers, unknown names — as a real X client sees them."""

from __future__ import annotations

import pytest

from .test_pointer import refused_and_nothing_sent

SHIFT_MASK, CONTROL_MASK, MOD1_MASK = 1, 4, 8

#: (name as a model writes it, keysym name the window must receive)
KEY_NAMES = [
    ("ENTER", "Return"), ("return", "Return"), ("Return", "Return"),
    ("ESC", "Escape"), ("escape", "Escape"), ("TAB", "Tab"), ("SPACE", "space"),
    ("BACKSPACE", "BackSpace"), ("DELETE", "Delete"), ("DEL", "Delete"), ("INSERT", "Insert"),
    ("HOME", "Home"), ("END", "End"),
    ("PAGEUP", "Prior"), ("PGUP", "Prior"), ("PAGE_UP", "Prior"), ("Prior", "Prior"),
    ("PAGEDOWN", "Next"), ("PGDN", "Next"), ("PAGE_DOWN", "Next"), ("Next", "Next"),
    ("LEFT", "Left"), ("ARROWLEFT", "Left"), ("Left", "Left"),
    ("RIGHT", "Right"), ("ArrowRight", "Right"), ("UP", "Up"), ("ARROWUP", "Up"),
    ("DOWN", "Down"), ("arrowdown", "Down"),
    ("F1", "F1"), ("f5", "F5"), ("F12", "F12"), ("F13", "F13"), ("F24", "F24"),
    ("CTRL", "Control_L"), ("CONTROL", "Control_L"), ("ALT", "Alt_L"), ("OPTION", "Alt_L"),
    ("SHIFT", "Shift_L"), ("CMD", "Super_L"), ("SUPER", "Super_L"), ("META", "Super_L"), ("WIN", "Super_L"),
    ("Control_R", "Control_R"), ("Shift_R", "Shift_R"), ("Alt_R", "Alt_R"),
    ("+", "plus"), ("a", "a"), ("z", "z"), ("7", "7"), ("<", "less"), (">", "greater"), ("/", "slash"),
    ("KP_Enter", "KP_Enter"), ("Caps_Lock", "Caps_Lock"), ("XF86AudioMute", "XF86AudioMute"),
    ("é", "eacute"),
]


def presses(events):
    return [e for e in events if e["type"] == "KeyPress"]


def key_events(events):
    return [e for e in events if e["type"] in ("KeyPress", "KeyRelease")]


def test_key_names_reach_the_window_as_the_right_keysym(target, probe):
    actions = [{"type": "keypress", "keys": [name]} for name, _ in KEY_NAMES]
    # Caps_Lock toggles a lock: press it a second time to leave the keyboard as it was.
    actions.append({"type": "keypress", "keys": ["Caps_Lock"]})
    events = probe.run_and_collect(target, actions)
    # Shifted characters ("+", ">") come with an extra Shift_L press; compare without those.
    got = [e["keysym_name"] for e in presses(events) if e["keysym_name"] != "Shift_L"]
    assert got == [want for _, want in KEY_NAMES if want != "Shift_L"] + ["Caps_Lock"]
    assert any(e["keysym_name"] == "Shift_L" for e in presses(events))
    assert all(not e["synthetic"] for e in events), "events must come from XTEST, not SendEvent"


@pytest.mark.parametrize("keys", [["NoSuchKey"], ["ctrl", "NoSuchKey"], ["ctrl", ""], ["ctrl+c"]])
def test_unknown_key_is_refused_and_nothing_is_pressed(target, probe, keys):
    err = refused_and_nothing_sent(target, probe, [{"type": "keypress", "keys": keys}])
    assert err.code == "unknown_key"
    assert keys[-1] in err.message


def test_unknown_key_in_held_keys_of_click_is_refused(target, probe):
    # Not even the click's move to (10, 10) may happen before the key name is checked.
    err = refused_and_nothing_sent(target, probe, [{"type": "click", "x": 10, "y": 10, "button": "left",
                                                     "keys": ["Hyperdrive"]}])
    assert err.code == "unknown_key"


def test_chord_presses_in_order_and_releases_in_reverse(target, probe):
    events = key_events(probe.run_and_collect(target, [{"type": "keypress", "keys": ["ctrl", "shift", "t"]}]))
    kinds = [(e["type"], e["keysym_name"]) for e in events]
    assert [k for k in kinds if k[0] == "KeyPress"] == [
        ("KeyPress", "Control_L"), ("KeyPress", "Shift_L"), ("KeyPress", "T")]
    # All three are down together: the letter arrives with Control and Shift in its state.
    letter = events[2]
    assert letter["type"] == "KeyPress" and letter["state"] & (CONTROL_MASK | SHIFT_MASK) == CONTROL_MASK | SHIFT_MASK
    releases = [e["keycode"] for e in events if e["type"] == "KeyRelease"]
    assert releases == [e["keycode"] for e in events if e["type"] == "KeyPress"][::-1]
    assert [e["type"] for e in events] == ["KeyPress"] * 3 + ["KeyRelease"] * 3


def test_uppercase_letter_in_a_modifier_chord_means_the_key_cap(target, probe):
    events = key_events(probe.run_and_collect(target, [{"type": "keypress", "keys": ["CTRL", "A"]}]))
    assert [e["keysym_name"] for e in presses(events)] == ["Control_L", "a"]
    assert presses(events)[1]["state"] & SHIFT_MASK == 0


def test_single_shifted_character_gets_shift(target, probe):
    events = key_events(probe.run_and_collect(target, [{"type": "keypress", "keys": ["A"]},
                                                        {"type": "keypress", "keys": ["+"]}]))
    letters = [e for e in presses(events) if e["keysym_name"] in ("A", "plus")]
    assert [e["keysym_name"] for e in letters] == ["A", "plus"]
    assert all(e["state"] & SHIFT_MASK for e in letters)


@pytest.mark.parametrize("right,left", [("Control_R", "Control_L"), ("Shift_R", "Shift_L"), ("Alt_R", "Alt_L")])
def test_right_hand_modifier_presses_only_that_side(target, probe, right, left):
    events = key_events(probe.run_and_collect(target, [{"type": "keypress", "keys": [right, "x"]}]))
    names = [e["keysym_name"] for e in presses(events)]
    assert names[0] == right and left not in names
    assert names[-1] in ("x", "X")
    mask = {"Control_R": CONTROL_MASK, "Shift_R": SHIFT_MASK, "Alt_R": MOD1_MASK}[right]
    assert presses(events)[-1]["state"] & mask
