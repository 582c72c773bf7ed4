"""type, as key events: Return for newlines, unmapped characters bound before pressing, no held keys."""

from __future__ import annotations

SHIFT_MASK = 1
#: X servers start auto-repeat after a delay of hundreds of ms (Xvfb: 660 ms); stay far below.
MAX_HOLD_MS = 100


def presses(events):
    return [e for e in events if e["type"] == "KeyPress"]


def test_newlines_are_return_and_crlf_is_one_return(target, probe):
    events = probe.run_and_collect(target, [{"type": "type", "text": "a\r\nb\nc\rd\te"}])
    names = [e["keysym_name"] for e in presses(events)]
    assert names == ["a", "Return", "b", "Return", "c", "Return", "d", "Tab", "e"]
    assert "Linefeed" not in names


def test_unmapped_characters_arrive_as_their_keysym(target, probe):
    events = probe.run_and_collect(target, [{"type": "type", "text": "é日😀–ü"}])
    names = [e["keysym_name"] for e in presses(events) if e["keysym_name"] != "Shift_L"]
    assert names == ["eacute", "U+65E5", "U+1F600", "U+2013", "udiaeresis"]


def test_shifted_characters_are_typed_with_shift(target, probe):
    events = probe.run_and_collect(target, [{"type": "type", "text": "aA<>?"}])
    got = [(e["keysym_name"], bool(e["state"] & SHIFT_MASK)) for e in presses(events)
           if not e["keysym_name"].startswith("Shift")]
    assert got == [("a", False), ("A", True), ("less", False), ("greater", True), ("question", True)]


def test_no_key_is_held_while_typing(target, probe):
    text = "Held keys repeat: " + "xyz" * 100 + " é日"
    events = [e for e in probe.run_and_collect(target, [{"type": "type", "text": text}])
              if e["type"] in ("KeyPress", "KeyRelease")]
    down: dict[int, int] = {}
    for e in events:
        if e["type"] == "KeyPress":
            assert e["keycode"] not in down, f"keycode {e['keycode']} pressed twice without release (repeat)"
            down[e["keycode"]] = e["time"]
        else:
            assert e["time"] - down.pop(e["keycode"]) <= MAX_HOLD_MS
    assert not down
    letters = [e for e in presses(events) if not e["keysym_name"].startswith("Shift")]
    assert len(letters) == len(text)
