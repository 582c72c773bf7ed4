"""The screen comparison rule (wire/screen_match.py) on drawn screens: a button moved 80 px is a change
where the click lands, a clock elsewhere is not, nor a caret's blink or a JPEG re-encode; the crops the
agent is sent compare as the whole screenshot does."""

from __future__ import annotations

import io

import pytest
from PIL import Image, ImageDraw

from wire.screen_match import (MatchRule, Region, as_encoded, compare, compare_crops, decode_crop, encode_crop,
                               regions_for)

RULE = MatchRule()


def screen(button_x: int = 600, clock: str = "12:00:00", caret: bool = False) -> Image.Image:
    img = Image.new("RGB", (1280, 800), "#f4f4f4")
    d = ImageDraw.Draw(img)
    d.rectangle((button_x, 400, button_x + 100, 436), fill="#1d5fd1")
    d.text((button_x + 20, 410), "Pay 10", fill="#ffffff")
    d.rectangle((400, 300, 700, 330), outline="#888888", fill="#ffffff")
    if caret:
        d.line((420, 304, 420, 326), fill="#000000", width=1)
    d.text((1180, 10), clock, fill="#000000")
    return img


def test_a_button_moved_80_px_is_a_change_where_the_click_lands():
    regions = regions_for([(650, 418)], (1280, 800), RULE)
    result = compare(screen(), screen(button_x=680), regions, RULE)
    assert not result.matched and result.worst().changed > 0.2, result.summary()


def test_a_clock_elsewhere_and_the_same_button_match():
    regions = regions_for([(650, 418)], (1280, 800), RULE)
    assert compare(screen(clock="12:00:00"), screen(clock="12:00:07"), regions, RULE).matched


def test_a_caret_blink_in_the_clicked_field_matches():
    regions = regions_for([(420, 315)], (1280, 800), RULE)
    assert compare(screen(caret=False), screen(caret=True), regions, RULE).matched


@pytest.mark.parametrize("quality", [40, 60, 85])
def test_a_jpeg_screenshot_matches_the_same_screen_encoded_alike(quality):
    """The approved screenshot was a JPEG: the agent encodes what it grabbed the same way, and an
    unchanged screen matches; a moved button still does not."""
    out = io.BytesIO()
    screen().save(out, format="JPEG", quality=quality)
    shown = Image.open(io.BytesIO(out.getvalue())).convert("RGB")
    regions = regions_for([(650, 418), (420, 315)], (1280, 800), RULE)
    assert compare(shown, as_encoded(screen(), quality), regions, RULE).matched
    assert not compare(shown, as_encoded(screen(button_x=680), quality), regions, RULE).matched


def test_a_white_field_moved_on_an_off_white_page_is_a_change():
    """Low contrast (white on #f4f1ea, at most 21 apart in a channel): the default tolerance sees it."""
    def page(top: int) -> Image.Image:
        img = Image.new("RGB", (640, 400), "#f4f1ea")
        ImageDraw.Draw(img).rectangle((200, top, 500, top + 36), fill="#ffffff", outline="#c8c8c8")
        return img
    regions = regions_for([(350, 118)], (640, 400), RULE)
    assert compare(page(100), page(100), regions, RULE).matched
    assert not compare(page(100), page(180), regions, RULE).matched


def test_a_stricter_rule_refuses_what_the_default_lets_through():
    strict = MatchRule(max_changed=0.0, tolerance=0)
    regions = regions_for([(420, 315)], (1280, 800), strict)
    assert not compare(screen(caret=False), screen(caret=True), regions, strict).matched


def test_regions_are_clipped_deduplicated_and_fall_back_to_the_pointer():
    assert regions_for([(0, 0)], (100, 100), RULE) == [Region(x=0, y=0, w=25, h=25)]
    assert regions_for([(50, 50), (50, 50)], (100, 100), RULE) == [Region(x=26, y=26, w=49, h=49)]
    assert regions_for([], (100, 100), RULE, fallback=(99, 99)) == [Region(x=75, y=75, w=25, h=25)]
    # no point at all: the whole image, in squares of at most 513 px
    assert regions_for([], (100, 100), RULE) == [Region(x=0, y=0, w=100, h=100)]
    assert [(r.x, r.y, r.w, r.h) for r in regions_for([], (1280, 800), RULE)] == [
        (0, 0, 513, 513), (513, 0, 513, 513), (1026, 0, 254, 513),
        (0, 513, 513, 287), (513, 513, 513, 287), (1026, 513, 254, 287)]


def test_the_whole_screen_compared_in_squares_lets_a_clock_through_and_not_a_new_page():
    regions = regions_for([], (1280, 800), RULE)
    assert compare(screen(clock="12:00:00"), screen(clock="12:00:07"), regions, RULE).matched
    other = Image.new("RGB", (1280, 800), "#202020")
    assert not compare(screen(), other, regions, RULE).matched
    assert regions_for([(100, 5)], (100, 100), RULE) == []  # outside: nothing to compare


def test_screens_of_another_size_never_match_they_are_refused():
    with pytest.raises(ValueError, match="cannot compare"):
        compare(screen(), screen().resize((640, 400)), [], RULE)


def test_the_crops_sent_to_the_agent_compare_as_the_whole_screenshot():
    regions = regions_for([(650, 418), (420, 315)], (1280, 800), RULE)
    before, after = screen(), screen(button_x=680)
    crops = [decode_crop(encode_crop(before, r)) for r in regions]
    assert compare_crops(crops, after, regions, RULE) == compare(before, after, regions, RULE)
    assert compare_crops(crops, before, regions, RULE).matched


@pytest.mark.parametrize("bad", [42, "not base64!", "aGVsbG8=", ""])
def test_a_crop_that_is_not_a_png_is_refused(bad):
    with pytest.raises(ValueError):
        decode_crop(bad)
