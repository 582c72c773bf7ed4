"""The viewport: ``scroll`` (every direction), ``scroll_to`` and ``hover`` on the tall page (it notes its
scroll offsets and the hover in its text), ``screenshot`` (an image of the viewport, not of the
document's top) and ``zoom`` (the region asked for, in the screenshot's coordinates)."""

from __future__ import annotations

from .harness import element, near, pixel

BLUE, RED, GREEN, YELLOW = (0, 0, 255), (255, 0, 0), (0, 160, 0), (255, 255, 0)


def test_scroll_moves_the_viewport_each_way(browser, site):
    browser.goto(site.base + "/tall")
    browser.ok("scroll", direction="down", amount=700)
    browser.wait_text("y reached 700")
    browser.ok("scroll", direction="right", amount=300)
    browser.wait_text("x reached 300")
    browser.ok("scroll", direction="left", amount=300)
    browser.ok("scroll", direction="up", amount=700)
    browser.wait_text("back at top")
    assert "y reached 1000" not in browser.text()


def test_screenshot_shows_the_viewport_not_the_documents_top(browser, site):
    browser.goto(site.base + "/tall")
    top = browser.ok("screenshot").images[0]
    assert near(pixel(top, 0.5, 0.5), BLUE), pixel(top, 0.5, 0.5)
    browser.ok("scroll", direction="down", amount=1000)
    browser.wait_text("y reached 1000")
    scrolled = browser.ok("screenshot").images[0]
    assert scrolled.size == top.size
    for fx, fy in [(0.1, 0.05), (0.5, 0.5), (0.9, 0.95)]:
        assert near(pixel(scrolled, fx, fy), RED), (fx, fy, pixel(scrolled, fx, fy))


def test_scroll_to_and_hover_bring_the_element_into_view(browser, site):
    report = browser.goto(site.base + "/tall")
    bottom = element(report, "Bottom button")["ref"]
    browser.ok("scroll_to", target=bottom)
    browser.wait_text("y reached 4000")
    browser.ok("scroll", direction="up", amount=10_000)
    browser.wait_text("back at top")
    browser.ok("hover", target=bottom)
    browser.wait_text("hovered")
    assert "bottom clicked" not in browser.text()


def test_screenshot_and_zoom_show_the_regions_asked_for(browser, site):
    browser.goto(site.base + "/quads")
    shot = browser.ok("screenshot").images[0]
    for (fx, fy), colour in {(0.25, 0.25): BLUE, (0.75, 0.25): RED, (0.25, 0.75): GREEN, (0.75, 0.75): YELLOW}.items():
        assert near(pixel(shot, fx, fy), colour), (fx, fy, pixel(shot, fx, fy))
    w, h = shot.size
    for region, colour in [([0, 0, 40, 40], BLUE), ([w - 40, 0, w, 40], RED), ([0, h - 40, 40, h], GREEN),
                           ([w - 40, h - 40, w, h], YELLOW)]:
        zoomed = browser.ok("zoom", region=region).images[0]
        for fx, fy in [(0.1, 0.1), (0.5, 0.5), (0.9, 0.9)]:
            assert near(pixel(zoomed, fx, fy), colour), (region, fx, fy, pixel(zoomed, fx, fy))
    across = browser.ok("zoom", region=[w // 2 - 40, 10, w // 2 + 40, 50]).images[0]  # over the blue/red edge
    assert near(pixel(across, 0.2, 0.5), BLUE) and near(pixel(across, 0.8, 0.5), RED), \
        (pixel(across, 0.2, 0.5), pixel(across, 0.8, 0.5))
    assert abs(across.width / across.height - 2) < 0.05, across.size  # the region's shape, 80 x 40
