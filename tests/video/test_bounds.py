"""A run's video kept within its bounds (controller.run.video), on a real desktop whose screen changes all
the time (the noise app: every grab differs, none compresses well): the frame rate asked, at most 10 a
second, and the time between frames; the frame size; the duration cap; the file-size cap; frames dropped
rather than waited for; settings out of bounds refused with their code; an image from the guest that is not
what was asked refused before it is decoded."""

from __future__ import annotations

import io
import time

import pytest
from PIL import Image

from controller.agent_client import AgentScreenshot
from controller.model.marks import COLORS, overlay
from controller.run.bus import ActionSent, RunBus
from controller.run.video import (
    MAX_FPS, VIDEO_FILE, FrameQueue, VideoRecorder, VideoSettings, VideoSettingsError, frame_size,
)
from controller.run.video_marks import draw_overlay
from tests.conformance.harness import poll

from .conftest import decode


def _record(agent, directory, settings, until, what, bus=None, timeout=60.0):
    """A recorder on ``agent`` until ``until(recorder)`` holds, then finished: its ``video`` entry."""
    recorder = VideoRecorder(agent, (1280, 800), directory, bus or RunBus(), settings).start()
    try:
        poll(lambda: until(recorder), timeout=timeout, what=what)
    finally:
        entry = recorder.finish()
    return entry


@pytest.mark.parametrize("fields, field", [
    ({"fps": MAX_FPS + 0.5}, "fps"), ({"fps": 0}, "fps"), ({"fps": float("nan")}, "fps"),
    ({"max_edge": 10}, "max_edge"), ({"max_duration_s": -1}, "max_duration_s"),
    ({"max_bytes": 1000}, "max_bytes"), ({"max_bytes": 2**40}, "max_bytes"), ({"grab": "gif"}, "grab"),
    ({"audio": True}, "audio"),
])
def test_settings_out_of_bounds_are_refused_naming_the_field(fields, field):
    with pytest.raises(VideoSettingsError) as caught:
        VideoSettings(**fields)
    assert caught.value.code == "invalid_video_settings"
    assert str(caught.value).startswith(f"video {field}: ")


def test_the_frame_size_is_the_screen_scaled_down_to_even_sides():
    assert frame_size((1280, 800), 1280) == (1280, 800)
    assert frame_size((1280, 800), 640) == (640, 400)
    assert frame_size((1921, 1081), 1280) == (1280, 720)
    assert frame_size((1921, 1081), 1000) == (1000, 562)
    assert frame_size((800, 1280), 1280) == (800, 1280)  # never scaled up
    assert frame_size((7, 5), 1280) == (6, 4)


def test_at_most_the_frame_rate_asked_and_the_size_asked(noisy, tmp_path):
    entry = _record(noisy.client, tmp_path, VideoSettings(fps=MAX_FPS, max_edge=640),
                    lambda r: r.frames >= 20, "20 frames")
    assert entry.file == VIDEO_FILE and entry.error is None and entry.limit is None
    video = decode(tmp_path / VIDEO_FILE)
    assert video["codec"] == "vp9" and video["frames"] == entry.frames >= 20
    assert video["size"] == tuple(entry.size) == (640, 400)
    gaps = [b - a for a, b in zip(video["pts_ms"], video["pts_ms"][1:-1])]  # the last: taken as the run ends
    assert min(gaps) >= 1000 / MAX_FPS - 10, gaps  # never faster than asked (a late grab is not made up for)
    assert entry.frames <= video["pts_ms"][-1] / 1000 * MAX_FPS + 2
    assert entry.bytes == (tmp_path / VIDEO_FILE).stat().st_size


def test_nothing_is_grabbed_past_the_duration_cap(noisy, tmp_path):
    entry = _record(noisy.client, tmp_path, VideoSettings(fps=MAX_FPS, max_edge=320, max_duration_s=1.0),
                    lambda r: r.cut >= 5, "5 frame times past the cap")
    assert entry.limit == "duration" and entry.cut >= 5 and entry.frames >= 5
    video = decode(tmp_path / VIDEO_FILE)
    assert video["pts_ms"][-1] <= 1000
    assert entry.duration_s <= 1.0 + 1 / MAX_FPS and video["duration_s"] <= 1.0 + 1 / MAX_FPS + 0.01


def test_no_frame_is_added_past_the_byte_cap_and_the_file_still_plays(noisy, tmp_path):
    cap = 256 * 1024
    entry = _record(noisy.client, tmp_path, VideoSettings(fps=MAX_FPS, max_bytes=cap, max_edge=640),
                    lambda r: r.limit == "bytes" and r.cut >= 3, "the byte cap")
    size = (tmp_path / VIDEO_FILE).stat().st_size
    assert entry.limit == "bytes" and entry.bytes == size <= cap
    video = decode(tmp_path / VIDEO_FILE)
    assert video["frames"] == entry.frames >= 2 and video["size"] == (640, 400)


def test_a_full_queue_drops_frames_at_once():
    queue = FrameQueue(2)
    started = time.monotonic()
    offered = [queue.offer(n) for n in range(50)]
    assert offered == [True, True] + [False] * 48 and queue.dropped == 48
    assert time.monotonic() - started < 1.0  # never waits for the encoder
    assert [queue.take(0.01), queue.take(0.01), queue.take(0.01)] == [0, 1, None]


def test_an_action_is_drawn_in_its_colour_and_typed_text_is_never_in_the_overlay():
    image = Image.new("RGB", (1280, 800), (128, 128, 128))
    drawn = overlay([(1, {"type": "click", "x": 400, "y": 300, "button": "left"}),
                     (2, {"type": "type", "text_length": 6})], (1280, 800))
    out = draw_overlay(image, drawn)
    assert image.getpixel((400, 300)) == (128, 128, 128)  # the frame given is not changed
    red, green, blue = int(COLORS["click"][1:3], 16), int(COLORS["click"][3:5], 16), int(COLORS["click"][5:7], 16)
    assert out.getpixel((400, 300)) == (red, green, blue)  # the click's centre dot
    assert out.getpixel((400 + 15, 300)) == (red, green, blue)  # its ring
    assert [n["label"] for n in drawn["notes"]] == ["2 typed 6 chars"]
    assert out.getpixel((5, 795)) != (128, 128, 128)  # the strip of labels without a point, along the bottom


class LyingGuest:
    """A test double of a guest whose screenshots are not what was asked (a real agent never answers so;
    a guest that was taken over may): a PNG for a JPEG, then a JPEG larger than the frame asked for."""

    def __init__(self) -> None:
        self.calls = 0

    def screenshot(self, **_: object) -> AgentScreenshot:
        self.calls += 1
        out = io.BytesIO()
        if self.calls % 2:
            Image.new("RGB", (64, 40)).save(out, "PNG")
        else:
            Image.new("RGB", (2000, 1300)).save(out, "JPEG")
        return AgentScreenshot(out.getvalue(), "image/jpeg", (1280, 800), (0, 0, 1280, 800), (1280, 800))


def test_an_image_that_is_not_the_one_asked_for_is_refused_before_it_is_decoded(tmp_path):
    guest = LyingGuest()
    entry = _record(guest, tmp_path, VideoSettings(fps=MAX_FPS), lambda r: r.grab_errors >= 4, "4 refused grabs")
    assert entry.file is None and entry.frames == 0 and entry.grab_errors >= 4
    assert entry.error.startswith(f"no frame was kept: {entry.grab_errors} grabs failed or were refused (the last: ")
    assert "not a JPEG" in entry.error or "2000x1300 px, larger than the 1280x800 asked" in entry.error
    assert not (tmp_path / VIDEO_FILE).exists()


def test_the_marks_follow_the_actions_sent(noisy, tmp_path):
    """An action published on the run's bus (screen px) is drawn on the frames grabbed after it, not before."""
    bus = RunBus()
    sent: list[int] = []

    def click_then_frames(recorder):
        if recorder.frames >= 2 and not sent:
            sent.append(recorder.frames)
            bus.publish(ActionSent({"type": "click", "x": 640, "y": 400, "button": "left"}))
        return recorder.frames >= sent[0] + 4 if sent else False

    entry = _record(noisy.client, tmp_path, VideoSettings(fps=MAX_FPS), click_then_frames, "4 frames after a click",
                    bus=bus)
    video = decode(tmp_path / VIDEO_FILE)
    target = tuple(int(COLORS["click"][i:i + 2], 16) for i in (1, 3, 5))

    def marked(image):  # the click's ring, 15 px right of its point (the codec shifts colours a little)
        return all(abs(a - b) <= 60 for a, b in zip(image.getpixel((655, 400)), target))

    flags = [marked(img) for img in video["images"]]
    assert entry.frames == len(flags) and any(flags) and not any(flags[:sent[0]]), (sent, flags)


class SuddenNoise:
    """A test double of a guest whose screen is flat grey for its first grabs, then pixel noise (a video
    playing, a hostile page): the worst case for the byte cap, a frame many times larger than any before
    it. A real desktop shows the same, only without a grab to start it on."""

    def __init__(self, flat: int = 3) -> None:
        self.calls, self.flat = 0, flat

    def screenshot(self, max_width: int = 1280, max_height: int = 800, **_: object) -> AgentScreenshot:
        import os

        self.calls += 1
        size = (max_width, max_height)
        image = (Image.new("RGB", size, (120, 120, 120)) if self.calls <= self.flat
                 else Image.frombytes("RGB", size, os.urandom(size[0] * size[1] * 3)))
        out = io.BytesIO()
        image.save(out, "JPEG", quality=80)
        return AgentScreenshot(out.getvalue(), "image/jpeg", (1280, 800), (0, 0, 1280, 800), size)


@pytest.mark.parametrize("flat, cap", [
    (3, 256 * 1024),  # one frame far larger than every one before it
    (0, 2 * 1024 * 1024),  # many large frames: the muxer holds a cluster (up to 5 MiB) before it writes it
])
def test_no_frame_is_added_past_the_byte_cap_however_large_it_is(tmp_path, flat, cap):
    guest = SuddenNoise(flat)
    entry = _record(guest, tmp_path, VideoSettings(fps=MAX_FPS, max_bytes=cap),
                    lambda r: r.limit == "bytes", "the byte cap")
    size = (tmp_path / VIDEO_FILE).stat().st_size
    assert entry.limit == "bytes" and entry.bytes == size <= cap, (entry, size)
    video = decode(tmp_path / VIDEO_FILE)
    assert video["frames"] == entry.frames >= 1 and video["size"] == (1280, 800)


def test_a_first_frame_over_the_byte_cap_leaves_no_file_and_says_why(tmp_path):
    cap = 256 * 1024  # a frame of pixel noise at 1280x800 is larger
    entry = _record(SuddenNoise(0), tmp_path, VideoSettings(fps=MAX_FPS, max_bytes=cap),
                    lambda r: r.limit == "bytes", "the byte cap")
    assert entry.file is None and entry.frames == 0 and entry.bytes == 0
    assert entry.error == f"the first frame alone would take the file past its {cap} byte cap"
    assert not (tmp_path / VIDEO_FILE).exists()


class Shades:
    """A test double of a guest whose screen is one flat grey, a shade lighter at each grab (every grab
    is a new frame, each cheap to encode)."""

    def __init__(self) -> None:
        self.calls = 0

    def screenshot(self, max_width: int = 1280, max_height: int = 800, **_: object) -> AgentScreenshot:
        self.calls += 1
        out = io.BytesIO()
        Image.new("RGB", (max_width, max_height), (self.calls % 256,) * 3).save(out, "JPEG", quality=80)
        return AgentScreenshot(out.getvalue(), "image/jpeg", (1280, 800), (0, 0, 1280, 800), (max_width, max_height))


def test_a_cancelled_run_waits_for_a_stalled_encoder_only_briefly_and_keeps_what_was_encoded(tmp_path, monkeypatch):
    """An encoder stalled on a frame (a test double of a slow one: its ``add`` waits for the test) while
    the run is cancelled during the finish: the finish returns after the cancelled budget, not the whole
    timeout, says why, and the frames encoded before the stall still make a file that plays."""
    import threading

    import controller.run.video as video

    monkeypatch.setattr(video, "CANCELLED_FINISH_S", 0.5)
    monkeypatch.setattr(video, "GRAB_JOIN_S", 0.5)
    stall, stalled = threading.Event(), threading.Event()
    add = video._Output.add

    def slow_add(self, image, pts_ms, max_bytes):
        if self.container is not None and pts_ms >= 300:  # two frames at 10 a second, then stalled
            stalled.set()
            stall.wait(30)
        return add(self, image, pts_ms, max_bytes)

    monkeypatch.setattr(video._Output, "add", slow_add)
    recorder = VideoRecorder(Shades(), (1280, 800), tmp_path, RunBus(), VideoSettings(fps=MAX_FPS, max_edge=320)).start()
    try:
        assert stalled.wait(30), "the encoder never reached the stalled frame"
        cancel = threading.Event()
        threading.Timer(0.3, cancel.set).start()  # the signal comes while the finish waits
        began = time.monotonic()
        entry = recorder.finish(timeout=60, cancelled=cancel.is_set)
        took = time.monotonic() - began
    finally:
        stall.set()
    assert took < 0.3 + 0.5 + 0.5 + 2.0, took  # the cancelled budget and the join after the abort, not 60 s
    assert entry.error and entry.error.startswith("the encoder did not finish within"), entry.error
    recorder._encoder.join(10)
    assert decode(tmp_path / VIDEO_FILE)["frames"] >= 2
