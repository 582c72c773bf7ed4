"""SandboxDriver.bind_next: an approval's screen binding compares where the approved actions land, in the
image it is bound to (the model's screenshot, or a new one a question is asked again on, of another size),
and binds the whole screenshot when an action touches no point and none was acted on before. Pure
driver logic: no agent call is made (the images are drawn here)."""

from __future__ import annotations

import io

from PIL import Image, ImageDraw

from controller.run.driver import SandboxDriver, SentScreenshot
from controller.run.mapping import Frame, ModelSpace
from wire.screen_match import MatchRule


def shot(size: tuple[int, int], mark: tuple[int, int]) -> SentScreenshot:
    """A PNG screenshot of the whole 1280x800 screen at ``size``, a black dot at ``mark`` (its px)."""
    img = Image.new("RGB", size, "#ffffff")
    ImageDraw.Draw(img).ellipse((mark[0] - 3, mark[1] - 3, mark[0] + 3, mark[1] + 3), fill="#000000")
    out = io.BytesIO()
    img.save(out, format="PNG")
    return SentScreenshot(out.getvalue(), "image/png", size, Frame(0, 0, 1280, 800), (1280, 800))


def driver() -> SandboxDriver:
    d = SandboxDriver(agent=None)  # type: ignore[arg-type]
    d.bind_rule = MatchRule()
    d.model_space = ModelSpace(640, 400, Frame(0, 0, 1280, 800))  # the model sees the screen at half size
    return d


def test_the_points_are_mapped_to_the_image_the_binding_is_made_on():
    d = driver()
    click = {"type": "click", "x": 320, "y": 200, "button": "left"}  # model px: (640, 400) on the screen
    on_model = d.bind_next([click], shot((640, 400), (320, 200)))
    assert (on_model.regions[0].x + 24, on_model.regions[0].y + 24) == (320, 200)
    full = d.bind_next([click], shot((1280, 800), (640, 400)))  # asked again on a full-size screenshot
    assert (full.regions[0].x + 24, full.regions[0].y + 24) == (640, 400)
    assert full.size == (1280, 800)


def test_typing_with_no_point_yet_binds_the_whole_screenshot():
    d = driver()
    binding = d.bind_next([{"type": "type", "text": "x"}], shot((640, 400), (10, 10)))
    assert binding is not None and sum(r.w * r.h for r in binding.regions) == 640 * 400
