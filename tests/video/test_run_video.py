"""The pickup task (tasks/pickup.toml, offline) run with ``run-task --video`` in Docker, end to end: the
record's ``video`` entry, the WebM file read back with PyAV, the model's actions drawn where they landed,
the HTML report playing it in Debian's chromium (opened as a file), the web console serving and playing it
through its login; a run cancelled half way still leaves a video that plays; and the Python API's
``Sandbox.start(video=True)`` records one too."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from controller.model.marks import COLORS
from controller.run.bus import follow_entries
from controller.run.entries import RunFinished, Video
from controller.run.record import read_entries
from controller.run.runner import RunOptions, run_task
from controller.run.tasks import load_task
from controller.run.video import VIDEO_FILE, VideoSettings
from tests.require import require_browser

from .conftest import decode

pytestmark = [pytest.mark.docker, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
TASK = ROOT / "tasks" / "pickup.toml"


def _opener(docker_client: Any, image: str, labels: dict[str, str], started: list[Any]) -> Any:
    from controller.sandbox.docker import DockerOptions, DockerSandbox

    def open_(task: Any) -> Any:
        sandbox = DockerSandbox.start(task.sandbox_spec(), DockerOptions(image=image, extra_labels=labels),
                                      client=docker_client)
        started.append(sandbox)
        return sandbox

    return open_


@dataclass
class Ran:
    """A run as a test reads it: its verdict and its record's folder."""

    status: str
    reason: str
    record_dir: Path


@pytest.fixture(scope="module")
def runs(docker_client, desktop_image, test_labels, readable_dir) -> dict[str, Ran]:
    """The pickup run by ``desktop-sandbox run-task --offline --video`` (a process, as a person runs it;
    runs/<id> readable by chromium's user), and the same task through :func:`run_task` cancelled by a
    view once its third screenshot is in the record."""
    env = {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "COLUMNS")}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run([sys.executable, "-m", "controller.cli", "run-task", str(TASK), "--offline", "--video",
                           "--image", desktop_image, "--runs-dir", str(readable_dir)], cwd=ROOT, env=env,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300, check=False)
    record = Path(done.stdout.strip().splitlines()[-1]) if done.stdout.strip() else None
    assert record is not None and record.is_file(), (done.returncode, done.stderr[-2000:])
    finished = read_entries(record)[-1]
    passed = Ran(finished.status, finished.reason, record.parent)

    started: list[Any] = []
    open_ = _opener(docker_client, desktop_image, test_labels, started)

    def cancel_at_third_shot(run: Any) -> None:
        shots: list[Any] = []

        def on_entry(entry: Any) -> None:
            if getattr(entry, "type", None) == "screenshot":
                shots.append(entry)
                if len(shots) == 3:
                    run.cancel_by_view("test")

        follow_entries(run.bus, on_entry, name="cancel-at-third-shot")

    try:
        outcome = run_task(load_task(TASK), open_, RunOptions(runs_dir=readable_dir, live=False, terminal=False,
                                                              video=VideoSettings()), views=[cancel_at_third_shot])
    finally:
        for sandbox in started:
            sandbox.close()
    return {"passed": passed, "cancelled": Ran(outcome.status, outcome.reason, outcome.record_dir)}


def _video_entry(record_dir: Path) -> tuple[Video, RunFinished]:
    entries = read_entries(record_dir)
    assert isinstance(entries[-1], RunFinished) and isinstance(entries[-2], Video), [e.type for e in entries[-3:]]
    assert [e.type for e in entries].count("video") == 1
    return entries[-2], entries[-1]


def test_the_pickup_run_with_video_writes_a_webm_that_decodes(runs):
    outcome = runs["passed"]
    assert outcome.status == "passed", outcome.reason
    entry, finished = _video_entry(outcome.record_dir)
    assert entry.file == VIDEO_FILE and entry.error is None and entry.limit is None and entry.dropped == 0
    path = outcome.record_dir / VIDEO_FILE
    assert entry.bytes == path.stat().st_size and path.read_bytes()[:4] == b"\x1a\x45\xdf\xa3"
    video = decode(path)
    assert video["codec"] == "vp9" and video["frames"] == entry.frames > 0
    assert video["size"] == tuple(entry.size) == (1280, 800)  # the screen, at most 1280 px a side
    gaps = [b - a for a, b in zip(video["pts_ms"], video["pts_ms"][1:-1])]  # the last: grabbed as the run ends
    assert min(gaps) >= 500 - 10, gaps  # 2 frames a second at most
    # the video lasts from the sandbox being up to the run's end: longer than the loop, shorter than the run
    assert finished.timings["loop"] < entry.duration_s < finished.wall_s
    assert abs(video["duration_s"] - entry.duration_s) <= 0.1
    assert entry.grab_ms is not None and entry.grab_errors == 0


def test_the_model_actions_are_drawn_where_they_landed(runs):
    """A click of the scripted model (model px are screen px in this task: 1280x800 both) has its ring in the
    click's colour on a frame of the video, at that point."""
    outcome = runs["passed"]
    entries = read_entries(outcome.record_dir)
    clicks = [a for e in entries if e.type == "computer_call" for a in e.actions if a.get("type") == "click"]
    assert clicks
    video = decode(outcome.record_dir / VIDEO_FILE)
    target = tuple(int(COLORS["click"][i:i + 2], 16) for i in (1, 3, 5))

    def ring_at(image: Any, click: dict[str, Any]) -> bool:
        return all(abs(a - b) <= 60 for a, b in zip(image.getpixel((click["x"] + 15, click["y"])), target))

    drawn = [c for c in clicks if any(ring_at(img, c) for img in video["images"])]
    assert drawn, clicks


def _play(page: Any) -> dict[str, Any]:
    """Play the page's ``video.run`` (muted: no gesture needed) and wait until its time has run 0.3 s;
    read from the page's DOM by the browser driver, not by a script of the page (it has none and its policy
    allows none)."""
    state = "(() => { const v = document.querySelector('video.run'); return v ? {ready: v.readyState, " \
            "duration: v.duration, width: v.videoWidth, error: v.error && v.error.code, time: v.currentTime} : null; })()"
    deadline = time.monotonic() + 20
    while (page.evaluate(state) or {}).get("ready", 0) < 1 and time.monotonic() < deadline:
        page.wait_for_timeout(50)  # poll interval of a bounded wait (the page may run no script of ours)
    page.evaluate("(() => { const v = document.querySelector('video.run'); v.muted = true; v.play(); })()")
    while (page.evaluate(state) or {}).get("time", 0) < 0.3 and time.monotonic() < deadline:
        page.wait_for_timeout(50)
    return page.evaluate(state)


def test_the_html_report_plays_the_video_beside_it(runs):
    require_browser()
    from playwright.sync_api import sync_playwright

    from controller.chromium import launch
    from controller.report.html import write_report

    outcome = runs["passed"]
    entry, _ = _video_entry(outcome.record_dir)
    page_path = write_report(outcome.record_dir)
    text = page_path.read_text()
    assert '<video class="run" controls preload="metadata" src="run.webm"' in text
    with sync_playwright() as playwright:
        browser = launch(playwright)
        try:
            page = browser.new_page()
            refused: list[str] = []
            page.on("console", lambda m: refused.append(m.text) if "Content Security Policy" in m.text else None)
            page.goto(page_path.as_uri())
            state = _play(page)
        finally:
            browser.close()
    assert state["error"] is None and state["width"] == 1280, state
    assert abs(state["duration"] - entry.duration_s) <= 0.1 and state["time"] >= 0.3, state
    assert not refused


def test_the_console_serves_and_plays_the_video_of_a_finished_run(runs, readable_dir):
    require_browser()
    from playwright.sync_api import sync_playwright

    from controller.chromium import launch
    from controller.console.server import ConsoleServer
    from tests.console.conftest import Session

    outcome = runs["passed"]
    run_id = outcome.record_dir.name
    data = (outcome.record_dir / VIDEO_FILE).read_bytes()
    server = ConsoleServer(readable_dir).start()
    try:
        session = Session(server)
        page = session.get(f"/runs/{run_id}").text
        url = f"/runs/{run_id}/video/{VIDEO_FILE}"
        assert f'src="{server.auth.base}{url}"' in page
        whole = session.get(url)
        assert whole.status_code == 200 and whole.content == data and whole.headers["content-type"] == "video/webm"
        part = session.get(url, headers={"Range": "bytes=4-103"})
        assert part.status_code == 206 and part.content == data[4:104]
        assert part.headers["content-range"] == f"bytes 4-103/{len(data)}"
        tail = session.get(url, headers={"Range": "bytes=-10"})
        assert tail.status_code == 206 and tail.content == data[-10:]
        past = session.get(url, headers={"Range": f"bytes={len(data)}-"})
        assert past.status_code == 416 and past.headers["content-range"] == f"bytes */{len(data)}"
        assert httpx.get(server.base + url).status_code == 401  # no session: nothing
        session.close()
    finally:
        server.stop()
    server = ConsoleServer(readable_dir).start()  # its login, once, for the browser
    try:
        with sync_playwright() as playwright:
            browser = launch(playwright)
            try:
                tab = browser.new_page()
                tab.goto(server.url_for_run(run_id))
                assert tab.url == f"{server.base}/runs/{run_id}"
                state = _play(tab)
            finally:
                browser.close()
    finally:
        server.stop()
    assert state["error"] is None and state["width"] == 1280 and state["time"] >= 0.3, state


def test_a_cancelled_run_still_leaves_a_video_that_plays(runs):
    outcome = runs["cancelled"]
    assert outcome.status == "cancelled", outcome.reason
    entry, _ = _video_entry(outcome.record_dir)
    assert entry.file == VIDEO_FILE and entry.frames > 0
    video = decode(outcome.record_dir / VIDEO_FILE)
    assert video["frames"] == entry.frames and abs(video["duration_s"] - entry.duration_s) <= 0.1


def test_the_python_api_records_the_video_of_its_run(desktop_image, test_labels, tmp_path):
    from desktop_sandbox import Sandbox

    with Sandbox.start(apps=["terminal"], image=desktop_image, runs_dir=tmp_path, video=True,
                       options={"extra_labels": test_labels}) as sb:
        shot = sb.screenshot()
        sb.click(shot.width // 2, shot.height - 40)
        sb.type("echo video\n")
        sb.wait()
        record_dir = sb.record_dir
    entry, _ = _video_entry(record_dir)
    assert entry.file == VIDEO_FILE and entry.frames > 0 and entry.error is None
    video = decode(record_dir / VIDEO_FILE)
    assert video["frames"] == entry.frames and video["size"] == (1280, 800)
