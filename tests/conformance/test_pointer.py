"""click, double_click, move, drag, scroll, held keys and bounds — as a real X client sees them."""

from __future__ import annotations

import pytest

from .harness import TargetError

SHIFT_MASK, CONTROL_MASK, BUTTON1_MASK = 1, 4, 256
#: Toolkits treat two clicks closer than this as a double click (GTK default 400 ms).
DOUBLE_CLICK_MS = 400


def buttons(events):
    return [(e["type"], e["button"], e["x"], e["y"]) for e in events if e["type"] in ("ButtonPress", "ButtonRelease")]


def refused_and_nothing_sent(target, probe, actions) -> TargetError:
    """Run ``actions``, which must be refused, and return the refusal once it is proven that no input event
    at all reached the probe for it: between a sentinel move before and another after the request, the
    probe logged nothing but the second sentinel's motion (a clamped or partial move would show)."""
    w, h = target.screen_size
    probe.run_and_collect(target, [])  # every earlier event is logged; the pointer rests on a sentinel
    after = (w - 11, h - 5)  # neither of run_and_collect's own sentinels, so moving there makes motion
    mark = probe.mark()
    with pytest.raises(TargetError) as err:
        target.run(actions)
    probe.run_and_collect(target, [], sentinel=after)
    events = probe.input_events(mark)
    assert [(e["type"], e.get("x"), e.get("y")) for e in events] == [("MotionNotify", *after)], events
    return err.value


@pytest.mark.parametrize("name,number", [("left", 1), ("wheel", 2), ("right", 3), ("back", 8), ("forward", 9)])
def test_click_buttons(target, probe, name, number):
    events = probe.run_and_collect(target, [{"type": "click", "x": 321, "y": 123, "button": name}])
    assert buttons(events) == [("ButtonPress", number, 321, 123), ("ButtonRelease", number, 321, 123)]
    assert all(not e["synthetic"] for e in events)


def test_double_click_is_two_quick_pairs_at_one_point(target, probe):
    events = probe.run_and_collect(target, [{"type": "double_click", "x": 200, "y": 150}])
    assert buttons(events) == [("ButtonPress", 1, 200, 150), ("ButtonRelease", 1, 200, 150)] * 2
    times = [e["time"] for e in events if e["type"] == "ButtonPress"]
    assert times[1] - times[0] < DOUBLE_CLICK_MS


def test_move(target, probe):
    events = probe.run_and_collect(target, [{"type": "move", "x": 640, "y": 400}])
    assert events and (events[-1]["type"], events[-1]["x"], events[-1]["y"]) == ("MotionNotify", 640, 400)
    assert buttons(events) == []


@pytest.mark.parametrize("x,y", [(0, 0), ("W-1", "H-1"), (0, "H-1"), ("W-1", 0)])
def test_corner_coordinates_are_valid(target, probe, x, y):
    w, h = target.screen_size
    x = w - 1 if x == "W-1" else x
    y = h - 1 if y == "H-1" else y
    events = probe.run_and_collect(target, [{"type": "click", "x": x, "y": y, "button": "left"}])
    assert buttons(events) == [("ButtonPress", 1, x, y), ("ButtonRelease", 1, x, y)]


@pytest.mark.parametrize("x,y", [("W", 0), (0, "H"), (-1, 10), (10, -1), ("W", "H")])
@pytest.mark.parametrize("kind", ["click", "move", "scroll", "drag"])
def test_outside_the_screen_is_out_of_bounds_and_sends_nothing(target, probe, x, y, kind):
    w, h = target.screen_size
    x = w if x == "W" else x
    y = h if y == "H" else y
    action = {"click": {"type": "click", "x": x, "y": y, "button": "left"},
              "move": {"type": "move", "x": x, "y": y},
              "scroll": {"type": "scroll", "x": x, "y": y, "scroll_x": 0, "scroll_y": 100},
              "drag": {"type": "drag", "path": [{"x": 5, "y": 5}, {"x": x, "y": y}]}}[kind]
    assert refused_and_nothing_sent(target, probe, [action]).code == "out_of_bounds"


def test_drag_interpolates_and_visits_every_point(target, probe):
    path = [(100, 100), (400, 100), (400, 300), (150, 320)]
    events = probe.run_and_collect(target, [{"type": "drag", "path": [{"x": x, "y": y} for x, y in path]}])
    kinds = [e["type"] for e in events]
    press = kinds.index("ButtonPress")
    release = kinds.index("ButtonRelease")
    assert (events[press]["x"], events[press]["y"], events[press]["button"]) == (100, 100, 1)
    assert (events[release]["x"], events[release]["y"]) == (150, 320)
    motion = [(e["x"], e["y"]) for e in events[press + 1:release] if e["type"] == "MotionNotify"]
    assert all(e["state"] & BUTTON1_MASK for e in events[press + 1:release] if e["type"] == "MotionNotify")
    for point in path[1:]:
        assert point in motion, f"path point {point} not visited"
    steps = [(100, 100), *motion]
    gaps = [max(abs(a[0] - b[0]), abs(a[1] - b[1])) for a, b in zip(steps, steps[1:])]
    assert len(motion) >= 20 and max(gaps) <= 16, "drag must move in small steps, not jump"


def test_drag_with_held_key(target, probe):
    events = probe.run_and_collect(target, [{"type": "drag", "path": [{"x": 50, "y": 400}, {"x": 90, "y": 400}],
                                             "keys": ["ctrl"]}])
    press = next(e for e in events if e["type"] == "ButtonPress")
    assert press["state"] & CONTROL_MASK
    assert all(e["state"] & CONTROL_MASK for e in events if e["type"] == "MotionNotify"
               and events.index(e) > events.index(press))
    assert [e["keysym_name"] for e in events if e["type"].startswith("Key")] == ["Control_L", "Control_L"]


@pytest.mark.parametrize("kind", ["click", "double_click", "move", "scroll"])
def test_keys_are_held_during_pointer_actions(target, probe, kind):
    action = {"type": kind, "x": 222, "y": 111, "keys": ["shift"]}
    if kind == "click":
        action["button"] = "left"
    if kind == "scroll":
        action.update(scroll_x=0, scroll_y=100)
    events = probe.run_and_collect(target, [action])
    key = [(e["type"], e["keysym_name"]) for e in events if e["type"].startswith("Key")]
    assert key == [("KeyPress", "Shift_L"), ("KeyRelease", "Shift_L")]
    first_press = next(i for i, e in enumerate(events) if e["type"] == "KeyPress")
    last_release = next(i for i, e in enumerate(events) if e["type"] == "KeyRelease")
    inside = events[first_press + 1:last_release]
    assert inside, "the pointer action must happen while the key is down"
    assert all(e["state"] & SHIFT_MASK for e in inside)
    if kind != "move":
        assert any(e["type"] == "ButtonPress" for e in inside)


def test_scroll_moves_pointer_first_then_wheel(target, probe):
    events = probe.run_and_collect(target, [{"type": "scroll", "x": 700, "y": 500, "scroll_x": 0, "scroll_y": 300}])
    first_button = next(i for i, e in enumerate(events) if e["type"] == "ButtonPress")
    assert any(e["type"] == "MotionNotify" and (e["x"], e["y"]) == (700, 500) for e in events[:first_button])
    wheel = buttons(events)
    assert wheel and all(b[1] == 5 and (b[2], b[3]) == (700, 500) for b in wheel)


@pytest.mark.parametrize("sx,sy,button", [(0, 1, 5), (0, -1, 4), (1, 0, 7), (-1, 0, 6), (0, 2000, 5), (-450, 0, 6)])
def test_scroll_direction_and_at_least_one_click(target, probe, sx, sy, button):
    events = probe.run_and_collect(target, [{"type": "scroll", "x": 10, "y": 10, "scroll_x": sx, "scroll_y": sy}])
    presses = [b for b in buttons(events) if b[0] == "ButtonPress"]
    assert presses and {b[1] for b in presses} == {button}
    assert len(presses) == len([b for b in buttons(events) if b[0] == "ButtonRelease"])


def test_zero_scroll_sends_no_wheel_click(target, probe):
    events = probe.run_and_collect(target, [{"type": "scroll", "x": 10, "y": 10, "scroll_x": 0, "scroll_y": 0}])
    assert buttons(events) == []


def test_bigger_scroll_gives_more_clicks(target, probe):
    small = probe.run_and_collect(target, [{"type": "scroll", "x": 10, "y": 10, "scroll_x": 0, "scroll_y": 100}])
    big = probe.run_and_collect(target, [{"type": "scroll", "x": 10, "y": 10, "scroll_x": 0, "scroll_y": 1000}])
    assert len(buttons(big)) > len(buttons(small)) > 0


def test_invalid_action_is_refused(target, probe):
    for bad in ({"type": "click", "x": 1, "button": "left"}, {"type": "teleport", "x": 1, "y": 1},
                {"type": "click", "x": 1, "y": 1, "button": "thumb"},
                {"type": "drag", "path": [{"x": 1, "y": 1}]},
                {"type": "keypress", "keys": []}):
        with pytest.raises(TargetError) as err:
            target.run([bad])
        assert err.value.code == "invalid_action", bad
