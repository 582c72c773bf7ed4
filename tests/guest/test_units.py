"""Pure parts of the agent: key names, text rules, drag interpolation, scaling, PNG writer,
and release-in-finally on a real display when an action fails half-way."""

from __future__ import annotations

import io

import pytest
from PIL import Image

from guest import keys, png
from guest.actions import ActionError, Executor, prepare
from guest.capture import Capture, scaled_size
from guest.display import DisplayConnection
from guest.held import pressed_state
from guest.keyboard import InvalidText, text_to_keysyms
from guest.pointer import interpolate


@pytest.mark.parametrize("name,keysym", [
    ("ENTER", 0xFF0D), ("enter", 0xFF0D), ("Return", 0xFF0D), ("PgDn", 0xFF56), ("ArrowUp", 0xFF52),
    ("F24", 0xFFD5), ("Control_R", 0xFFE4), ("control_r", 0xFFE4), ("+", 0x2B), ("META", 0xFFEB),
    ("日", 0x10065E5), ("A", 0x41), ("XF86AudioMute", 0x1008FF12),
])
def test_resolve(name, keysym):
    assert keys.resolve(name) == keysym


@pytest.mark.parametrize("name", ["", "Bogus", "ctrl+c", "\x01", "F36"])
def test_resolve_unknown(name):
    with pytest.raises(keys.UnknownKey):
        keys.resolve(name)


def test_text_rules():
    r, t = 0xFF0D, 0xFF09
    assert text_to_keysyms("a\r\nb\nc\rd\te") == [0x61, r, 0x62, r, 0x63, r, 0x64, t, 0x65]
    assert text_to_keysyms("\r\n\r\n") == [r, r]
    assert text_to_keysyms("-é日") == [0x2D, 0xE9, 0x10065E5]
    with pytest.raises(InvalidText):
        text_to_keysyms("a\x1bb")


def test_interpolate_visits_every_point_in_small_steps():
    path = [(0, 0), (100, 0), (100, 37), (3, 3)]
    pts = interpolate(path, step=8)
    assert pts[0] == (0, 0) and pts[-1] == (3, 3)
    for p in path:
        assert p in pts
    assert all(max(abs(a[0] - b[0]), abs(a[1] - b[1])) <= 8 for a, b in zip(pts, pts[1:]))


@pytest.mark.parametrize("size,bounds,want", [
    ((1280, 800), (None, None), (1280, 800)), ((1280, 800), (640, None), (640, 400)),
    ((1280, 800), (None, 200), (320, 200)), ((1280, 800), (2000, 2000), (1280, 800)),
    ((1280, 800), (1, 1), (1, 1)), ((200, 100), (100, 100), (100, 50)),
])
def test_scaled_size(size, bounds, want):
    assert scaled_size(*size, *bounds) == want


def test_png_writer_is_lossless():
    img = Image.new("RGB", (37, 11))
    img.putdata([((i * 7) % 256, (i * 13) % 256, (i * 29) % 256) for i in range(37 * 11)])
    out = Image.open(io.BytesIO(png.encode_image(img)))
    assert out.format == "PNG" and out.mode == "RGB" and out.tobytes() == img.tobytes()


def test_validation_reports_the_index():
    with pytest.raises(ActionError) as err:
        prepare([{"type": "wait"}, {"type": "move", "x": 10, "y": 800}], (1280, 800))
    assert (err.value.code, err.value.index) == ("out_of_bounds", 1)
    with pytest.raises(ActionError) as err:
        prepare([{"type": "type", "text": 5}], (1280, 800))
    assert (err.value.code, err.value.index) == ("invalid_action", 0)
    assert len(prepare([{"type": "click", "x": 0, "y": 0, "button": "left"},
                        {"type": "click", "x": 1279, "y": 799, "button": "right"}], (1280, 800))) == 2


class FailingHalfway(Executor):
    """An executor whose second action presses keys and a button, then fails."""

    def _execute(self, dpy, held, item, *rest):
        if item.action.type == "move":
            kc = dpy.keysym_to_keycode(0xFFE1)  # Shift_L
            held.key_down(dpy, kc)
            held.key_down(dpy, dpy.keysym_to_keycode(0x61))
            held.button_down(dpy, 1)
            dpy.sync()
            assert pressed_state(dpy)[0], "keys should be down before the failure"
            raise ValueError("injected failure")
        return super()._execute(dpy, held, item, *rest)


def test_release_in_finally_when_an_action_fails(xvfb):
    conn = DisplayConnection(xvfb.display)
    capture = Capture(xvfb.display)
    ex = FailingHalfway(conn, capture)
    with pytest.raises(ActionError) as err:
        ex.run([{"type": "keypress", "keys": ["x"]}, {"type": "move", "x": 5, "y": 5},
                {"type": "keypress", "keys": ["y"]}])
    assert err.value.index == 1
    with conn.session() as dpy:
        assert pressed_state(dpy) == ([], 0)
    conn.drop()
    capture.close()


def test_png_from_bgrx_is_lossless():
    w, h = 13, 7
    pixels = bytes((i * 37 + c * 11) % 256 if c < 3 else 0 for i in range(w * h) for c in range(4))
    out = Image.open(io.BytesIO(png.encode_bgrx(pixels, w, h)))
    want = bytes(b for i in range(w * h) for b in (pixels[4 * i + 2], pixels[4 * i + 1], pixels[4 * i]))
    assert out.mode == "RGB" and out.size == (w, h) and out.tobytes() == want


@pytest.mark.parametrize("action", [
    {"type": "click", "x": True, "y": 5, "button": "left"},
    {"type": "move", "x": "5", "y": 5},
    {"type": "double_click", "x": 5, "y": False},
    {"type": "scroll", "x": 5, "y": 5, "scroll_x": 0, "scroll_y": "300"},
    {"type": "drag", "path": [{"x": 1, "y": 1}, {"x": True, "y": 2}]},
])
def test_coordinates_and_deltas_must_be_json_integers(action):
    # A boolean or a numeric string is a client bug: it must not become a click at (1, y).
    with pytest.raises(ActionError) as err:
        prepare([action], (1280, 800))
    assert (err.value.code, err.value.index) == ("invalid_action", 0)


@pytest.mark.parametrize("name", [
    "Terminate_Server", "SlowKeys_Enable", "StickyKeys_Enable", "AccessX_Enable", "MouseKeys_Enable",
    "Pointer_EnableKeys", "Pointer_Drag1", "Pointer_Button1", "XF86Switch_VT_1", "XF86Ungrab",
    "XF86ClearGrab", "XF86LogWindowTree", "Next_Virtual_Screen",
])
def test_keysyms_that_control_the_x_server_are_refused(name):
    for action in ({"type": "keypress", "keys": ["ctrl", name]},
                   {"type": "click", "x": 1, "y": 1, "button": "left", "keys": [name]}):
        with pytest.raises(ActionError) as err:
            prepare([{"type": "wait"}, action], (1280, 800))
        assert (err.value.status, err.value.code, err.value.index) == (400, "invalid_action", 1)
        assert err.value.extra["key"] == name


@pytest.mark.parametrize("name", ["ISO_Left_Tab", "ISO_Level3_Shift", "Caps_Lock", "Num_Lock", "XF86AudioMute",
                                  "dead_acute"])
def test_ordinary_xkb_keysyms_stay_allowed(name):
    # ISO_* and dead_* keysyms sit in the 0xfe00 block next to the refused ranges: each resolves and passes.
    keysym = keys.resolve(name)
    assert not keys.is_server_control(keysym)
    [prepared] = prepare([{"type": "keypress", "keys": ["ctrl", name]}], (1280, 800))
    assert prepared.keysyms[-1] == keysym


def test_a_name_that_only_starts_like_a_server_keysym_is_unknown_not_refused():
    # "Pointer" is no keysym (the Pointer_* ones are refused): it is an unknown key, not a server command.
    with pytest.raises(ActionError) as err:
        prepare([{"type": "keypress", "keys": ["Pointer"]}], (1280, 800))
    assert (err.value.code, err.value.extra["key"]) == ("unknown_key", "Pointer")


@pytest.mark.parametrize("name,chord", [("ctrl+c", '["ctrl", "c"]'), ("CTRL+SHIFT+T", '["CTRL", "SHIFT", "T"]')])
def test_a_chord_written_as_one_string_is_refused_with_the_list_form(name, chord):
    with pytest.raises(ActionError) as err:
        prepare([{"type": "keypress", "keys": [name]}], (100, 100))
    assert (err.value.code, err.value.extra["key"]) == ("unknown_key", name)
    assert chord in err.value.message
