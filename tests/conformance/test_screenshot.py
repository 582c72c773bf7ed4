"""Screenshots: exact colours, crop, downscale keeping aspect, JPEG quality, frame metadata."""

from __future__ import annotations

import pytest

from guest.probe import PATTERN

from .harness import TargetError


@pytest.fixture(scope="module")
def pattern(desktop, target):
    p = desktop.start_probe(pattern=True)
    target.run([{"type": "wait"}])
    yield p
    p.stop()


def rgb(value: int) -> tuple[int, int, int]:
    return (value >> 16) & 0xFF, (value >> 8) & 0xFF, value & 0xFF


def test_png_colours_are_exact(target, pattern):
    shot = target.screenshot("png")
    assert shot.mime == "image/png"
    assert shot.screen_size == target.screen_size
    assert shot.frame == (0, 0, *target.screen_size)
    assert shot.image.size == target.screen_size
    image = shot.image.convert("RGB")
    for x, y, w, h, colour in PATTERN:
        for px, py in ((x, y), (x + w - 1, y + h - 1), (x + w // 2, y + h // 2)):
            assert image.getpixel((px, py)) == rgb(colour), (px, py)
    assert image.getpixel((900, 700)) == (255, 255, 255)


def test_crop_returns_that_frame_in_screen_pixels(target, pattern):
    x, y, w, h, colour = PATTERN[4]
    shot = target.screenshot("png", crop=(x - 10, y - 5, w + 20, h + 10))
    assert shot.frame == (x - 10, y - 5, w + 20, h + 10)
    assert shot.image.size == (w + 20, h + 10)
    image = shot.image.convert("RGB")
    assert image.getpixel((10, 5)) == rgb(colour)
    assert image.getpixel((9, 5)) == (255, 255, 255)
    assert image.getpixel((10 + w - 1, 5 + h - 1)) == rgb(colour)
    assert image.getpixel((10 + w, 5 + h)) == (255, 255, 255)


def test_crop_at_the_corner_and_one_pixel(target, pattern):
    w, h = target.screen_size
    assert target.screenshot("png", crop=(w - 1, h - 1, 1, 1)).image.size == (1, 1)
    shot = target.screenshot("png", crop=(0, 0, 1, 1))
    assert shot.image.convert("RGB").getpixel((0, 0)) == rgb(PATTERN[0][4])


@pytest.mark.parametrize("crop", [(-1, 0, 10, 10), (0, 0, 0, 10), ("W-5", 0, 10, 10), (0, "H", 1, 1)])
def test_crop_outside_the_screen_is_refused(target, pattern, crop):
    w, h = target.screen_size
    crop = tuple(w - 5 if v == "W-5" else h if v == "H" else v for v in crop)
    with pytest.raises(TargetError):
        target.screenshot("png", crop=crop)


@pytest.mark.parametrize("max_width,max_height", [(640, None), (None, 400), (500, 500), (1000, 200), (4000, 4000)])
def test_downscale_keeps_aspect_and_never_upscales(target, pattern, max_width, max_height):
    w, h = target.screen_size
    shot = target.screenshot("png", max_width=max_width, max_height=max_height)
    iw, ih = shot.image.size
    scale = min(1.0, (max_width or w) / w, (max_height or h) / h)
    assert abs(iw - w * scale) <= 1 and abs(ih - h * scale) <= 1
    assert iw <= (max_width or w) and ih <= (max_height or h)
    assert shot.frame == (0, 0, w, h)


def test_crop_then_downscale(target, pattern):
    shot = target.screenshot("png", crop=(300, 200, 200, 100), max_width=100)
    assert shot.frame == (300, 200, 200, 100)
    assert shot.image.size == (100, 50)
    assert shot.image.convert("RGB").getpixel((50, 25)) == rgb(PATTERN[4][4])


def test_jpeg_and_quality(target, pattern):
    low = target.screenshot("jpeg", quality=10)
    high = target.screenshot("jpeg", quality=95)
    assert low.mime == high.mime == "image/jpeg"
    assert low.image.format == "JPEG" and low.image.size == target.screen_size
    assert len(low.data) < len(high.data)
    r, g, b = high.image.convert("RGB").getpixel((400, 250))
    assert abs(r - 0) + abs(g - 255) + abs(b - 0) < 30


def test_screenshot_reflects_the_screen_now(target, desktop, pattern):
    before = target.screenshot("png", crop=(0, 0, 64, 48)).image.convert("RGB").getpixel((5, 5))
    assert before == rgb(PATTERN[0][4])
    pattern.stop()
    try:
        shot = target.screenshot("png", crop=(0, 0, 64, 48))
        assert shot.image.convert("RGB").getpixel((5, 5)) != before
    finally:
        new = desktop.start_probe(pattern=True)
        pattern.pid, pattern.log_path = new.pid, new.log_path
        target.run([{"type": "wait"}])
