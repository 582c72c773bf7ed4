"""The model-space -> screen-space rule (scale by the image sent, round to nearest, add the crop
offset; bounds in model space), with the pinned cases."""

from __future__ import annotations

import pytest

from controller.run.mapping import Frame, ModelSpace, OutOfModelBounds, fit_size


def space(screen: tuple[int, int], image: tuple[int, int], crop: tuple[int, int, int, int] | None = None) -> ModelSpace:
    frame = Frame(*crop) if crop else Frame(0, 0, *screen)
    return ModelSpace(image[0], image[1], frame)


def test_1920x1080_sent_at_1280x720_scales_by_1_5():
    s = space((1920, 1080), (1280, 720))
    assert s.to_screen(640, 360) == (960, 540)
    x, y = s.to_screen(1279, 719)
    assert 0 <= x < 1920 and 0 <= y < 1080
    assert (x, y) == (1919, 1079)  # 1918.5 and 1078.5 round to nearest (halves up)


def test_crop_origin_is_added_after_scaling():
    s = space((1920, 1080), (640, 360), crop=(100, 50, 1280, 720))
    assert s.to_screen(10, 20) == (120, 90)


def test_portrait_round_to_nearest():
    s = space((1440, 3040), (606, 1280))
    # 414 * 1440/606 = 983.76 -> 984; 1069 * 3040/1280 = 2538.875 -> 2539
    assert s.to_screen(414, 1069) == (984, 2539)


@pytest.mark.parametrize("point", [(1800, 100), (1366, 768), (1366, 0), (0, 768), (-1, 5)])
def test_out_of_model_bounds_names_the_model_size(point):
    s = space((1920, 1080), (1366, 768))
    with pytest.raises(OutOfModelBounds) as info:
        s.to_screen(*point)
    assert "1366x768" in str(info.value)
    assert (info.value.width, info.value.height) == (1366, 768)


def test_last_model_pixel_is_accepted():
    s = space((1920, 1080), (1366, 768))
    x, y = s.to_screen(1365, 767)
    assert 0 <= x < 1920 and 0 <= y < 1080


def test_non_integer_coordinates_are_refused():
    s = space((1280, 800), (1280, 800))
    with pytest.raises(TypeError):
        s.to_screen(1.5, 2)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        s.to_screen(True, 2)  # type: ignore[arg-type]


def test_identity_when_the_image_is_the_screen():
    s = space((1280, 800), (1280, 800))
    assert s.to_screen(0, 0) == (0, 0)
    assert s.to_screen(1279, 799) == (1279, 799)


def test_upscaled_image_stays_inside_the_frame():
    s = space((100, 100), (300, 300), crop=(10, 10, 100, 100))
    assert s.to_screen(299, 299) == (109, 109)


def test_to_model_inverts_to_screen_on_grid_points():
    s = space((1920, 1080), (1280, 720))
    for mx, my in [(0, 0), (640, 360), (1278, 718), (2, 4)]:
        assert s.to_model(*s.to_screen(mx, my)) == (mx, my)


def test_fit_size_keeps_aspect_and_never_upscales():
    assert fit_size(1920, 1080, 1280, 800) == (1280, 720)
    assert fit_size(1440, 3040, 1280, 1280) == (606, 1280)
    assert fit_size(800, 600, 1280, 800) == (800, 600)
