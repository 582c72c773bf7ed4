"""The redaction rule (controller/redaction.py): which regions a picture is filled with (every region held at
any time during its grab), how a screen px box maps into a picture of another frame and size, and that the
fill holds in PNG and JPEG. The end-to-end runs are tests/loop/test_redaction_typing.py and
tests/docker/test_signin.py."""

from __future__ import annotations

import base64
import io

import pytest
from PIL import Image

from controller.agent_client import AgentError
from controller.redaction import FILL, MAX_REGIONS, Redactor, hold_for_typing, image_boxes, paint
from controller.run.browser_driver import BrowserDriverError, GuestBrowserDriver
from controller.run.registry import ApprovalRegistry
from tests.controller.test_agent_client_hostile import SHOT_HEADERS, Peer, hostile  # noqa: F401 - a fixture
from tests.controller.test_agent_client_hostile import Request as HostileRequest
from tests.controller.test_browser_driver import _png as _browser_png
from tests.controller.test_browser_driver import _rules, fake  # noqa: F401 - a fixture
from tests.controller.test_signin_answers import PAGE as SIGNIN_PAGE
from tests.controller.test_signin_answers import SUBMIT as SIGNIN_SUBMIT
from tests.controller.test_signin_answers import FakeAgent as SignInAgent
from tests.controller.test_signin_answers import _answer_with
from tests.controller.test_signin_answers import _flow as _signin_flow


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _picture(fmt: str, size=(320, 200)) -> bytes:
    image = Image.new("RGB", size, (200, 180, 40))
    for x in range(0, size[0], 7):  # some detail, so a JPEG's blocks are not flat
        for y in range(size[1]):
            image.putpixel((x, y), (255, 255, 255))
    out = io.BytesIO()
    image.save(out, format=fmt)
    return out.getvalue()


def test_a_grab_gets_every_region_held_at_any_time_during_it():
    clock = Clock()
    redactor = Redactor(clock=clock)
    before = redactor.mark()  # a grab under way ...
    clock.now += 1
    region = redactor.hold("sign_in")  # ... when the fill began
    clock.now += 1
    redactor.release(region)
    clock.now += 1
    assert redactor.boxes(before, (1280, 800)) == [(0, 0, 1280, 800)]
    assert redactor.boxes(redactor.mark(), (1280, 800)) == []  # a grab begun after the release: nothing


def test_a_typing_region_stays_and_holding_it_again_adds_nothing():
    said = []
    redactor = Redactor(on_hold=lambda why, box: said.append((why, box)))
    redactor.hold("typing", (10, 20, 300, 200))
    redactor.hold("typing", (10, 20, 300, 200))
    assert said == [("typing", (10, 20, 300, 200))]
    assert redactor.held() == [("typing", (10, 20, 300, 200))]


@pytest.mark.parametrize("why, box", [("later", None), ("typing", (0, 0, 0, 10)), ("typing", (0, 0, 1.5, 2)),
                                      ("typing", (True, 0, 4, 4)), ("typing", (1, 2, 3))])
def test_a_bad_reason_or_box_is_refused(why, box):
    with pytest.raises(ValueError):
        Redactor().hold(why, box)


def test_past_the_limit_the_whole_screen_is_held():
    redactor = Redactor()
    for n in range(MAX_REGIONS):
        redactor.hold("typing", (n, 0, 5, 5))
    redactor.hold("typing", (0, 1, 5, 5))
    assert ("typing", None) in redactor.held()


@pytest.mark.parametrize("box, frame, size, expected", [
    ((100, 100, 50, 20), (0, 0, 1280, 800), (1280, 800), [(96, 96, 64, 32)]),  # widened to 16 px blocks
    ((100, 100, 50, 20), (0, 0, 2560, 1600), (1280, 800), [(48, 48, 32, 16)]),  # scaled by half, outward
    ((100, 100, 50, 20), (90, 95, 200, 100), (200, 100), [(0, 0, 64, 32)]),  # a crop: shifted, cut at 0
    ((0, 0, 10, 10), (500, 500, 100, 100), (100, 100), []),  # outside the frame
    ((0, 0, 1280, 800), (0, 0, 1280, 800), (1000, 625), [(0, 0, 1000, 625)]),  # cut to the image
])
def test_boxes_map_outward_into_the_picture(box, frame, size, expected):
    assert image_boxes([box], frame, size) == expected


@pytest.mark.parametrize("fmt, mime", [("PNG", "image/png"), ("JPEG", "image/jpeg")])
def test_the_fill_holds_in_the_encoded_picture(fmt, mime):
    data = paint(_picture(fmt), mime, [(32, 16, 64, 48)], size=(320, 200))
    with Image.open(io.BytesIO(data)) as image:
        assert image.format == fmt
        pixels = image.convert("RGB")
        inside = [pixels.getpixel((x, y)) for x in range(32, 96) for y in range(16, 64)]
        outside = pixels.getpixel((200, 150))
    assert max(max(abs(c - f) for c, f in zip(p, FILL)) for p in inside) <= 2
    assert outside != FILL


def test_no_boxes_leaves_the_bytes_and_a_bad_picture_is_refused():
    data = _picture("PNG")
    assert paint(data, "image/png", [], size=(320, 200)) is data
    with pytest.raises(ValueError):
        paint(b"\x89PNG not really", "image/png", [(0, 0, 16, 16)], size=(320, 200))
    with pytest.raises(ValueError):
        paint(data, "image/gif", [(0, 0, 16, 16)], size=(320, 200))


class _Agent:
    """Stands for the agent client's focus query only (no X display is needed to decide what is held)."""

    def __init__(self, box=None, fails=False) -> None:
        self.redactor = Redactor()
        self._box, self._fails = box, fails

    def focus_box(self):
        if self._fails:
            raise RuntimeError("404 not_found")
        return self._box


def test_typing_holds_the_focused_window_or_else_the_whole_screen():
    agent = _Agent(box=(5, 6, 70, 80))
    hold_for_typing(agent, {"type": "click", "x": 1, "y": 1, "button": "left"})
    assert agent.redactor.held() == []
    hold_for_typing(agent, {"type": "type", "text": "x"})
    assert agent.redactor.held() == [("typing", (5, 6, 70, 80))]
    for unknown in (_Agent(box=None), _Agent(fails=True)):
        hold_for_typing(unknown, {"type": "keypress", "keys": ["A"]})
        assert unknown.redactor.held() == [("typing", None)]


# -- a hostile guest's pictures ------------------------------------------------------------------------
def _bomb(size=(9000, 9000)) -> bytes:
    """A PNG of ``size`` px in one bit a pixel: a few KiB that decode to 3 bytes a pixel once filled."""
    out = io.BytesIO()
    Image.new("1", size).save(out, format="PNG")
    return out.getvalue()


def test_a_picture_whose_header_is_not_the_size_declared_is_refused_before_its_pixels_are_decoded():
    data = _picture("PNG")
    assert paint(data, "image/png", [(0, 0, 16, 16)], size=(320, 200)) != data
    with pytest.raises(ValueError, match="9000x9000"):
        paint(_bomb(), "image/png", [(0, 0, 16, 16)], size=(320, 200))
    with pytest.raises(ValueError):  # a JPEG's bytes under the PNG's type: not decoded as whatever they are
        paint(_picture("JPEG"), "image/png", [(0, 0, 16, 16)], size=(320, 200))


def test_a_guest_answering_a_pixel_bomb_while_a_region_is_held_gets_bad_response_not_the_memory(hostile):
    """The agent client fills held regions by decoding the guest's picture: one whose own header says
    81 M px while the answer's ``X-Image-Size`` says 64x40 is refused before a pixel is decoded."""
    bomb = _bomb()

    def behaviour(peer: Peer, req: HostileRequest) -> None:
        peer.answer(200, bomb, SHOT_HEADERS)

    h = hostile(behaviour)
    h.client.redactor.hold("sign_in")
    error = h.refused(lambda: h.client.screenshot(max_width=64, max_height=40), "bad_response")
    assert "9000x9000" in error.message


def test_a_browser_image_whose_viewport_is_unknown_is_filled_whole_while_a_region_is_held(fake):
    """Where a tab's viewport lies on the screen is what maps a held box into the browser's image; an
    answer without it (the agent could not read the window's metrics) cannot place the box, so all of the
    image is filled."""
    driver = GuestBrowserDriver(fake.client, rules=_rules())
    fake.answer = lambda m, a: (200, {"result": _browser_png(640, 240), "target": None, "viewport": None})
    fake.client.redactor.hold("typing", (900, 600, 100, 50))  # a window that, placed at 0,0, misses the image
    image = driver.call("screenshot", {"tab_id": None})
    data = base64.b64decode(image["image_url"].split("base64,")[1])
    with Image.open(io.BytesIO(data)) as opened:
        assert opened.convert("RGB").getextrema() == ((0, 0), (0, 0), (0, 0))


def test_a_browser_image_larger_than_the_largest_screen_is_refused(fake):
    driver = GuestBrowserDriver(fake.client, rules=_rules())
    bomb = {"type": "input_image", "image_url": "data:image/png;base64," + base64.b64encode(_bomb((9000, 9000))).decode(),
            "detail": "original"}
    fake.answer = lambda m, a: (200, {"result": bomb, "target": None,
                                      "viewport": {"x": 0, "y": 100, "width": 1280, "height": 480}})
    fake.client.redactor.hold("sign_in")
    with pytest.raises(BrowserDriverError, match="larger than"):
        driver.call("screenshot", {"tab_id": None})


# -- a sign-in fill whose answer never came ----------------------------------------------------------------
class _CutFill(SignInAgent):
    """The sign-in flow's test double of the agent (tests/controller/test_signin_answers.py), here with the
    agent client's redactor, whose fill call is cut before its answer (a run cancelled mid-fill, the call's
    deadline): the guest may still be typing the values. ``then``: what asking for the page again gets (an
    answer of the agent's, which takes its browser's calls one at a time, says the fill is over)."""

    def __init__(self, then: str) -> None:
        super().__init__()
        self.redactor = Redactor()
        self.then = then

    def signin_fill(self, fill):
        self.fills.append(fill)
        raise AgentError(0, "interrupted", "POST /v1/browser/signin: the run is stopping")

    def signin_page(self):
        self.page_calls += 1
        if self.page_calls == 1:
            return SIGNIN_PAGE
        if self.then == "cut":
            raise AgentError(0, "interrupted", "GET /v1/browser/signin: the run is stopping")
        return None


@pytest.mark.parametrize("then, held", [("cut", [("sign_in", None)]), ("answered", [])])
def test_a_fill_cut_before_its_answer_keeps_the_screen_held_until_the_agent_is_heard_from_again(then, held):
    reg, entries, agent = ApprovalRegistry(timeout_s=10), [], _CutFill(then)
    _answer_with(reg, SIGNIN_SUBMIT)
    _signin_flow(agent, reg, entries)()
    assert [e.outcome for e in entries] == ["error"]
    assert agent.redactor.held() == held


def test_a_sign_in_region_still_held_is_let_go_when_the_run_ends(tmp_path):
    from controller.run.record import RunRecord
    from controller.run.runner import _record_redactions

    agent = _CutFill("cut")
    record = RunRecord(tmp_path, "run")
    run_ended = _record_redactions(agent, record)
    agent.redactor.hold("sign_in")
    agent.redactor.hold("typing", (0, 0, 10, 10))  # a takeover's: the view lets it go (LiveRun.finish)
    run_ended()
    record.close()
    assert agent.redactor.held() == [("typing", (0, 0, 10, 10))]


def test_the_whole_screen_is_the_whole_picture_whatever_screen_size_the_guest_claims(hostile):
    """A whole-screen region (a sign-in fill) fills all of a picture even when the answer's ``X-Screen-Size``
    says the screen is 1x1 px: the frame the picture shows is part of the screen, whatever it claims."""
    def behaviour(peer: Peer, req: HostileRequest) -> None:
        out = io.BytesIO()
        Image.new("RGB", (64, 40), (30, 60, 90)).save(out, "PNG")
        peer.answer(200, out.getvalue(), {**SHOT_HEADERS, "X-Screen-Size": "1x1"})

    h = hostile(behaviour)
    h.client.redactor.hold("sign_in")
    shot = h.client.screenshot(max_width=64, max_height=40)
    with Image.open(io.BytesIO(shot.data)) as image:
        assert image.convert("RGB").getextrema() == ((0, 0), (0, 0), (0, 0))
