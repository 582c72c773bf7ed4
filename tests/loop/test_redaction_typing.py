"""What a person types during a takeover stays out of every picture (controller/redaction.py): the run's
console view types into the desktop's terminal exactly as the console's HTTP handler does
(:meth:`controller.run.live.LiveRun.human_action`); the window the keys went to is filled in the live
view's frames until control goes back to the model, the record says so, and the typed value is in no file
of the run. A grab through another agent client (no
regions held there) shows the typing really was on the screen, so the fill is what hides it. Real local
desktop (Xvfb + openbox + xterm + the agent), the real SDK loop against the scripted server."""

from __future__ import annotations

import datetime as _dt
import time
from pathlib import Path
from typing import Any

import av
import pytest
from PIL import ImageChops

from controller.agent_client import AgentClient
from controller.run.live import LiveRun
from controller.run.record import read_entries
from controller.run.runner import RunOptions, run_task, watching
from controller.run.shots import load_shot
from controller.run.tasks import load_task
from controller.run.video import VideoSettings
from tests.loop.local_sandbox import LocalSandbox
from tests.loop.pictures import filled, region, rgb
from tests.loop.test_run_task_views import View, _wait_state, wait_pending
from tests.require import require_commands

ROOT = Path(__file__).resolve().parents[2]
PLANTED = "qz7-planted-4417"

pytestmark = pytest.mark.slow


def _type_in_takeover(live: LiveRun, sb: LocalSandbox, raw: AgentClient, text: str) -> tuple[Any, Any]:
    """Take over, type ``text`` into the focused window as the console does, and wait until a grab through
    ``raw`` (no region held there) shows the keys echoed there: ``(box held, raw picture after)``."""
    _wait_state(live, "running")
    live.take_over()
    _wait_state(live, "human")
    before = rgb(raw.screenshot().data)
    live.human_action({"type": "type", "text": text})
    (_why, box), = sb.agent.redactor.held()
    deadline = time.monotonic() + 15
    while True:  # the terminal echoes the keys: the raw screen changes inside the window
        after = rgb(raw.screenshot().data)
        if ImageChops.difference(region(before, box), region(after, box)).getbbox() is not None:
            return box, after
        assert time.monotonic() < deadline, "the typed keys never showed on the screen"


def _run_watched(sb: LocalSandbox, tmp_path: Path, act) -> Any:
    """The approval demo on ``sb`` with a video at 10 fps, ``act`` acting on its LiveRun as the console does."""
    view = View(act)
    task = load_task(ROOT / "tasks" / "approval-demo.toml")
    outcome = run_task(task, lambda t: sb, RunOptions(runs_dir=tmp_path, live=False, terminal=False,
                                                      video=VideoSettings(fps=10)),
                       views=[watching(view)])
    view.join()
    return outcome


def test_what_a_person_types_is_filled_in_every_picture_until_control_goes_back(tmp_path):
    require_commands("X", "openbox", "xterm", install="apt-get install openbox xterm")
    seen: dict[str, Any] = {}
    boxes: list[Any] = []

    with LocalSandbox(openbox=True) as sb:
        raw = AgentClient(sb.agent_proc.base_url, sb.agent_proc.token)  # no region is ever held on this one

        def act(live: LiveRun) -> None:
            box, after = _type_in_takeover(live, sb, raw, PLANTED)
            boxes.append(box)
            seen["raw"], seen["frame"] = after, rgb(live.frame())
            typed = time.monotonic()
            n = 0
            while time.monotonic() - typed < 1.5:  # the person moves the pointer a while: every frame filled
                n += 1
                live.human_action({"type": "move", "x": 100 + n, "y": 100})
                seen.setdefault("frames", []).append(rgb(live.frame()))
            live.resume()
            live.registry.answer(wait_pending(live).id, "deny", by="console")

        outcome = _run_watched(sb, tmp_path, act)
        raw.close()

    box = boxes[0]
    assert box is not None and box[2] > 100 and box[3] > 50, box  # the terminal's window, not the whole screen
    assert not filled(region(seen["raw"], box))  # the typing was on the screen ...
    assert filled(region(seen["frame"], box))  # ... and the console's live view shows the fill there
    assert all(filled(region(frame, box)) for frame in seen["frames"])
    entries = read_entries(outcome.record_dir)
    types = [e.type for e in entries]
    assert [(e.why, e.box) for e in entries if e.type == "redaction"] == [("typing", box)]
    start = types.index("redaction")
    assert types[start - 1:start + 2] == ["takeover", "redaction", "human_action"], types
    end = types.index("takeover", start)
    # held until control went back: the model's next screenshot shows what the person left (docs/video.md)
    assert all(e.redacted is None for e in entries if e.type == "screenshot")
    # the video: every frame grabbed while the typing region was held shows the fill there
    video = next(e for e in entries if e.type == "video")
    zero = _dt.datetime.fromisoformat(video.started_at)
    held_from = _dt.datetime.fromisoformat(entries[start].ts) + _dt.timedelta(seconds=0.15)
    held_to = _dt.datetime.fromisoformat(entries[end].ts) - _dt.timedelta(seconds=0.15)
    inside = 0
    with av.open(str(outcome.record_dir / video.file)) as container:
        stream = container.streams.video[0]
        for frame in container.decode(stream):
            when = zero + _dt.timedelta(seconds=float(frame.pts * stream.time_base))
            if held_from <= when <= held_to:
                inside += 1
                x, y, w, h = box
                assert filled(region(frame.to_image().convert("RGB"), (x + 8, y + 8, w - 16, h - 16))), when
    assert inside >= 3, (inside, video)
    for file in (p for p in outcome.record_dir.rglob("*") if p.is_file()):
        assert PLANTED.encode() not in file.read_bytes(), file


def test_a_run_cancelled_during_a_takeover_keeps_the_typing_filled_to_its_end(tmp_path):
    """Cancelled instead of resumed (held "until Resume or the run's end"): the loop that waited for the
    person still takes its screenshot on the way out, and the video grabs until the run settles; both come
    after the cancel and show the fill where the keys went."""
    require_commands("X", "openbox", "xterm", install="apt-get install openbox xterm")
    boxes: list[Any] = []

    with LocalSandbox(openbox=True) as sb:
        raw = AgentClient(sb.agent_proc.base_url, sb.agent_proc.token)  # no region is ever held on this one

        def act(live: LiveRun) -> None:
            boxes.append(_type_in_takeover(live, sb, raw, PLANTED)[0])
            live.cancel()  # no Resume: control never goes back to the model

        outcome = _run_watched(sb, tmp_path, act)
        raw.close()

    assert outcome.status == "cancelled"
    box = boxes[0]
    x, y, w, h = box
    inner = (x + 8, y + 8, w - 16, h - 16)
    entries = read_entries(outcome.record_dir)
    start = next(n for n, e in enumerate(entries) if e.type == "redaction")
    after = [e for e in entries[start:] if e.type == "screenshot"]
    for shot in after:  # a screenshot taken after the keys went (the loop's on its way out) shows the fill
        assert shot.redacted and tuple(box) in [tuple(b) for b in shot.redacted], shot
        image, why = load_shot(outcome.record_dir, shot.file)
        assert image is not None, why
        assert filled(region(image, inner, tuple(shot.frame))), shot.file
    video = next(e for e in entries if e.type == "video")
    assert video.file, video
    zero = _dt.datetime.fromisoformat(video.started_at)
    held_from = _dt.datetime.fromisoformat(entries[start].ts) + _dt.timedelta(seconds=0.05)
    with av.open(str(outcome.record_dir / video.file)) as container:
        stream = container.streams.video[0]
        for frame in container.decode(stream):
            when = zero + _dt.timedelta(seconds=float(frame.pts * stream.time_base))
            if when >= held_from:  # every frame from the keys to the video's end (it ends as the run settles)
                assert filled(region(frame.to_image().convert("RGB"), inner)), when
