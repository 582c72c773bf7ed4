"""Screen expectations (controller/offline/expectations.py): the pixel checks on real PNG images, the strict
schema with one-line errors, and the reference in docs/ARCHITECTURE.md rendered from the schema."""

from __future__ import annotations

import base64
import io
import re
from pathlib import Path

import pytest
from PIL import Image, ImageDraw

from controller.offline import expectations as ex

ROOT = Path(__file__).resolve().parents[2]


def png(image: Image.Image) -> Image.Image:
    """``image`` after a real PNG round trip (what the scripted server decodes from a data URL)."""
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    url = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
    return ex.decode_image(url)


def form(text_width: int = 0, selected: bool = False) -> Image.Image:
    """A 320x200 page: beige background, a white box at (40,40 200x60) with a dark border; dark 'text'
    ``text_width`` px wide inside it; the box blue when ``selected``."""
    img = Image.new("RGB", (320, 200), "#f4f1ea")
    draw = ImageDraw.Draw(img)
    draw.rectangle((40, 40, 239, 99), fill="#1d5fd1" if selected else "#ffffff",
                   outline="#1d5fd1" if selected else "#23395d", width=3)
    if text_width:
        draw.rectangle((60, 60, 60 + text_width - 1, 79), fill="#ffffff" if selected else "#222222")
    return png(img)


def parse(*expect: dict, **extra) -> ex.TurnExpectations:
    parsed = ex.parse_turn({"expect": list(expect), **extra})
    assert parsed is not None
    return parsed


def test_color_holds_on_the_matching_share_of_the_region():
    (box_white,) = parse({"kind": "color", "x": 50, "y": 50, "w": 100, "h": 40, "rgb": "#ffffff"}).expect
    assert ex.check(box_white, form()).held
    # 50x20 dark px in the 100x40 region: 75% white < 90%
    outcome = ex.check(box_white, form(text_width=50))
    assert not outcome.held and outcome.share == pytest.approx(0.75)
    assert "75.0% within 16 of #ffffff" in outcome.observed and "most common #ffffff 75%" in outcome.observed
    (lenient,) = parse({"kind": "color", "x": 50, "y": 50, "w": 100, "h": 40, "rgb": "#FFFFFF",
                        "fraction": 0.75}).expect
    assert ex.check(lenient, form(text_width=50)).held


def test_color_tolerance_is_per_channel():
    img = png(Image.new("RGB", (10, 10), (100, 150, 200)))
    near = {"kind": "color", "x": 0, "y": 0, "w": 10, "h": 10, "rgb": "#6e96c8", "tolerance": 10}  # (110,150,200)
    assert ex.check(parse(near).expect[0], img).held
    assert not ex.check(parse({**near, "tolerance": 9}).expect[0], img).held
    assert not ex.check(parse({**near, "rgb": "#6496d3"}).expect[0], img).held  # blue off by 11


def test_not_color_sees_text_on_a_plain_background():
    (text,) = parse({"kind": "not_color", "x": 50, "y": 50, "w": 180, "h": 40, "rgb": "#ffffff",
                     "fraction": 0.1}).expect
    assert not ex.check(text, form()).held
    assert not ex.check(text, form(text_width=20)).held  # 400 of 7200 px = 5.6%
    held = ex.check(text, form(text_width=60))  # 1200 of 7200 px = 16.7%
    assert held.held and held.share == pytest.approx(1200 / 7200)


def test_selection_colour_tells_selected_from_unselected():
    (blue,) = parse({"kind": "color", "x": 45, "y": 45, "w": 10, "h": 50, "rgb": "#1d5fd1"}).expect
    assert not ex.check(blue, form(text_width=60)).held
    assert ex.check(blue, form(text_width=60, selected=True)).held


def test_changed_compares_with_the_baseline_region():
    (changed,) = parse({"kind": "changed", "x": 50, "y": 50, "w": 180, "h": 40}).expect
    before, after = form(), form(text_width=30)
    assert not ex.check(changed, before, before).held
    outcome = ex.check(changed, after, before)
    assert outcome.held and outcome.share == pytest.approx(600 / 7200)
    # a change outside the region does not count
    (elsewhere,) = parse({"kind": "changed", "x": 250, "y": 120, "w": 60, "h": 60}).expect
    assert not ex.check(elsewhere, after, before).held
    # nor does one within the tolerance
    faint = png(Image.new("RGB", (320, 200), "#f0ede6"))  # 4 below #f4f1ea in every channel
    assert not ex.check(elsewhere, faint, png(Image.new("RGB", (320, 200), "#f4f1ea"))).held


def test_impossible_regions_say_so_instead_of_waiting():
    (outside,) = parse({"kind": "color", "x": 300, "y": 0, "w": 21, "h": 10, "rgb": "#ffffff"}).expect
    outcome = ex.check(outside, form())
    assert not outcome.held and not outcome.possible and "outside the 320x200 image" in outcome.observed
    (changed,) = parse({"kind": "changed", "x": 0, "y": 0, "w": 10, "h": 10}).expect
    assert not ex.check(changed, form(), None).possible
    assert not ex.check(changed, form(), png(Image.new("RGB", (100, 100)))).possible


def test_jpeg_and_rgba_screenshots_are_read_as_rgb():
    for fmt, mode in (("JPEG", "RGB"), ("PNG", "RGBA")):
        buf = io.BytesIO()
        Image.new(mode, (20, 20), (29, 95, 209) + ((255,) if mode == "RGBA" else ())).save(buf, format=fmt)
        mime = "jpeg" if fmt == "JPEG" else "png"
        img = ex.decode_image(f"data:image/{mime};base64," + base64.b64encode(buf.getvalue()).decode())
        assert img.mode == "RGB"
        assert ex.check(parse({"kind": "color", "x": 0, "y": 0, "w": 20, "h": 20, "rgb": "#1d5fd1"}).expect[0],
                        img).held


@pytest.mark.parametrize("url", ["https://x/y.png", "data:image/png;base64,@@", "data:image/png;base64,AAAA"])
def test_undecodable_screenshots_are_value_errors(url):
    with pytest.raises(ValueError, match="screenshot"):
        ex.decode_image(url)


@pytest.mark.parametrize("turn, why", [
    ({"expect": [{"kind": "colour", "x": 0, "y": 0, "w": 1, "h": 1, "rgb": "#ffffff"}]}, "'colour'"),
    ({"expect": [{"kind": "color", "x": 0, "y": 0, "w": 1, "h": 1, "rgb": "#ffffff", "colour": 1}]},
     "expect[0].colour: unknown key"),
    ({"expect": [{"kind": "color", "x": 0, "y": 0, "w": 1, "h": 1, "rgb": "white"}]}, "expect[0].rgb"),
    ({"expect": [{"kind": "color", "x": 0, "y": 0, "w": 1, "h": 1}]}, "expect[0].rgb: required"),
    ({"expect": [{"kind": "changed", "x": 0, "y": 0, "w": 1, "h": 1, "rgb": "#ffffff"}]}, "expect[0].rgb: unknown"),
    ({"expect": [{"kind": "color", "x": "0", "y": 0, "w": 1, "h": 1, "rgb": "#ffffff"}]}, "expect[0].x"),
    ({"expect": [{"kind": "color", "x": 0, "y": 0, "w": 0, "h": 1, "rgb": "#ffffff"}]}, "expect[0].w"),
    ({"expect": [{"kind": "color", "x": 0, "y": 0, "w": 1, "h": 1, "rgb": "#ffffff", "tolerance": 256}]},
     "expect[0].tolerance"),
    ({"expect": [{"kind": "color", "x": 0, "y": 0, "w": 1, "h": 1, "rgb": "#ffffff", "fraction": 0}]},
     "expect[0].fraction"),
    ({"expect": [{"kind": "color", "x": 0, "y": 0, "w": 1, "h": 1, "rgb": "#ffffff", "fraction": True}]},
     "expect[0].fraction"),
    ({"expect": []}, "expect"),
    ({"expect": {"kind": "changed"}}, "expect"),
    ({"expect_timeout_s": 5}, "expect: required"),
    ({"expect": [{"kind": "changed", "x": 0, "y": 0, "w": 1, "h": 1}], "expect_timeout_s": 0}, "expect_timeout_s"),
    ({"expect": [{"kind": "changed", "x": 0, "y": 0, "w": 1, "h": 1}], "expect_timeout_s": 601}, "expect_timeout_s"),
])
def test_bad_expectations_are_one_line_errors_naming_the_field(turn, why):
    with pytest.raises(ValueError) as info:
        ex.parse_turn(turn)
    message = str(info.value)
    assert why in message and "\n" not in message


def test_defaults_and_description():
    parsed = parse({"kind": "not_color", "x": 1, "y": 2, "w": 3, "h": 4, "rgb": "#ABCDEF"})
    assert parsed.expect_timeout_s == ex.DEFAULT_TIMEOUT_S
    (e,) = parsed.expect
    assert (e.tolerance, e.fraction) == (16, 0.05)
    assert ex.describe(e) == "not_color #abcdef +-16 in >=5% of 3x4 at (1,2)"
    assert ex.parse_turn({"actions": [{"type": "wait"}]}) is None


def test_the_architecture_doc_carries_the_reference_rendered_from_the_schema():
    doc = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    block = re.search(r"<!-- expect-reference:start -->\n(.*?)<!-- expect-reference:end -->", doc, re.S)
    assert block, "docs/ARCHITECTURE.md lost its expect-reference block"
    assert block.group(1) == ex.reference_markdown(), "run: python -m controller.offline.expectations, paste into the doc"
    assert f"{ex.MAX_WAITS_PER_TURN} waits" in doc and f"up to {ex.MAX_WAITS_PER_TURN} per turn" in doc
    for model in ex.KINDS:
        for name in model.model_fields:
            assert f"`{name}`" in block.group(1)


def test_expectation_entries_print_literally_with_control_characters_escaped():
    from rich.console import Console

    from controller.run.progress import RunPrinter
    from controller.run.record import summary_table

    hostile = {"type": "expectation", "turn": 2, "met": False, "reason": "deadline of 1s passed", "waits": 3,
               "unmet": [{"index": 0, "kind": "color", "expected": "color [red]x[/red]",
                          "observed": "evil\x1b[2J\nnext line"}]}
    out = Console(file=io.StringIO(), width=300, force_terminal=False, record=True)
    RunPrinter(out)(hostile)
    RunPrinter(out)({"type": "expectation", "turn": 1, "met": True, "waits": 2, "waited_s": 1.25,
                     "expected": ["a", "b"]})
    out.print(summary_table([hostile]))
    text = out.export_text()
    assert "\x1b" not in text and "evil\\x1b[2J\\nnext line" in text
    assert "screen expectation unmet: turn 2: deadline of 1s passed: expect[0] color [red]x[/red]" in text
    assert "screen: turn 1: 2 expectations met after 2 waits (1.25s)" in text
    assert "unmet turn 2: deadline of 1s passed: expect[0] color [red]x[/red]" in text  # markup shown literally
