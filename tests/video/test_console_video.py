"""The web console's ``/runs/{id}/video/{name}`` against hostile names and files: only ``run.webm``, a
regular file in the run's directory (no link followed, no FIFO waited on), at most the video cap, starting
as WebM does; byte ranges answered or refused; another site's page gets nothing; the report page's policy
lets the video in and nothing more. And the report without the console: what it says when the video is
missing, refused or was never made."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from controller.console.app import byte_range
from controller.console.auth import REPORT_CSP
from controller.report.html import render_report
from controller.run.record import RunRecord
from controller.run.shots import MAX_VIDEO_BYTES, check_video
from controller.run.video import VIDEO_FILE
from tests.console.conftest import Session, console, runs_dir, session  # noqa: F401 - fixtures

from .conftest import small_webm

RUN = "run-video"


VIDEO = {"file": VIDEO_FILE, "frames": 3, "fps": 2.0, "duration_s": 1.5, "size": [64, 48], "bytes": 1000}


def _record(runs: Path, run_id: str = RUN, video: dict | None = VIDEO) -> Path:
    """A finished record in ``runs/run_id`` with a ``video`` entry of ``video``'s fields (None: none)."""
    rec = RunRecord(runs, run_id)
    rec.write("run_started", task={"name": "video"}, mode="offline", model="scripted", image="local")
    if video is not None:
        rec.write("video", **video)
    rec.finish("passed", "ok")
    rec.close()
    return rec.dir


@pytest.fixture
def run_with_video(runs_dir: Path) -> tuple[Path, bytes]:
    directory = _record(runs_dir)
    return directory, small_webm(directory / VIDEO_FILE)


def test_the_video_is_served_whole_and_by_range(session, run_with_video):
    _, data = run_with_video
    whole = session.get(f"/runs/{RUN}/video/{VIDEO_FILE}")
    assert whole.status_code == 200 and whole.content == data
    assert whole.headers["content-type"] == "video/webm" and whole.headers["accept-ranges"] == "bytes"
    assert whole.headers["content-length"] == str(len(data))
    part = session.get(f"/runs/{RUN}/video/{VIDEO_FILE}", headers={"Range": "bytes=10-"})
    assert part.status_code == 206 and part.content == data[10:]
    assert part.headers["content-range"] == f"bytes 10-{len(data) - 1}/{len(data)}"


@pytest.mark.parametrize("name", [
    "record.jsonl", "shot-0001.png", "run.webm.part", "RUN.WEBM", "run.webm~", ".run.webm", "run.mkv",
    "%2e%2e", "..%2frecord.jsonl", "%2e%2e%2f%2e%2e%2fsecret.webm", "run.webm%00", "run.webm%0a",
    "run\u0661.webm", "a" * 300,
])
def test_a_name_outside_the_rule_is_refused(session, run_with_video, name):
    resp = session.get(f"/runs/{RUN}/video/{name}")
    assert resp.status_code == 404, (name, resp.status_code)
    if resp.headers.get("content-type", "").startswith("application/json"):
        assert resp.json()["error"]["code"] in ("unknown_video", "not_found")
    assert b"\x1a\x45\xdf\xa3" not in resp.content


def _hostile(directory: Path, kind: str, elsewhere: Path) -> None:
    """Put something other than a WebM of the run where ``run.webm`` is."""
    path = directory / VIDEO_FILE
    if kind == "link":
        small_webm(elsewhere)
        path.symlink_to(elsewhere)
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "folder":
        path.mkdir()
    elif kind == "not webm":
        path.write_bytes(b"<html>not a video</html>" * 10)
    elif kind == "matroska, not webm":
        path.write_bytes(b"\x1a\x45\xdf\xa3\x9fB\x86\x81\x01B\xf7\x81\x01B\xf2\x81\x04B\xf3\x81\x08B\x82\x88matroska")
    elif kind == "too large":
        with open(path, "wb") as fh:  # sparse: the size says more than the cap, the start says WebM
            fh.write(b"\x1a\x45\xdf\xa3\x9fB\x86\x81\x01B\xf7\x81\x01B\xf2\x81\x04B\xf3\x81\x08B\x82\x84webm")
            fh.truncate(MAX_VIDEO_BYTES + 1)


HOSTILE = ["link", "fifo", "folder", "not webm", "matroska, not webm", "too large"]


@pytest.mark.parametrize("kind", HOSTILE)
def test_a_file_that_is_not_the_runs_video_is_refused(session, runs_dir, tmp_path, kind):
    directory = _record(runs_dir)
    _hostile(directory, kind, tmp_path / "elsewhere.webm")
    resp = session.get(f"/runs/{RUN}/video/{VIDEO_FILE}", timeout=10)  # a FIFO never holds it
    assert resp.status_code == 404 and resp.json()["error"]["code"] == "unknown_video", kind
    page = session.get(f"/runs/{RUN}").text  # the report says why, and plays nothing
    assert "<video" not in page and "video run.webm not shown: " in page, kind


@pytest.mark.parametrize("kind", HOSTILE)
def test_the_standalone_report_shows_no_refused_video(runs_dir, tmp_path, kind):
    directory = _record(runs_dir)
    _hostile(directory, kind, tmp_path / "elsewhere.webm")
    _size, why = check_video(directory, VIDEO_FILE)
    page = render_report(directory)
    assert why and "<video" not in page and f"video run.webm not shown: {why}" in page


def test_another_sites_page_gets_no_video(session, run_with_video):
    for site in ("cross-site", "same-site"):
        resp = session.get(f"/runs/{RUN}/video/{VIDEO_FILE}", headers={"Sec-Fetch-Site": site, "Sec-Fetch-Dest": "video"})
        assert resp.status_code == 403 and resp.json()["error"]["code"] == "cross_site"


def test_the_report_page_lets_in_the_video_and_nothing_more(session, run_with_video):
    page = session.get(f"/runs/{RUN}")
    assert page.headers["content-security-policy"] == REPORT_CSP
    assert "media-src 'self'" in REPORT_CSP and "script-src" not in REPORT_CSP
    assert f'src="{session.server.auth.base}/runs/{RUN}/video/{VIDEO_FILE}"' in page.text


@pytest.mark.parametrize("header, expected", [
    (None, (0, 99)), ("bytes=0-", (0, 99)), ("bytes=10-19", (10, 19)), ("bytes=90-500", (90, 99)),
    ("bytes=-10", (90, 99)), ("bytes=-500", (0, 99)), ("BYTES=1-2", (1, 2)),
])
def test_a_byte_range_is_cut_to_the_file(header, expected):
    assert byte_range(header, 100) == expected


RANGES_REFUSED = ["bytes=100-", "bytes=5-2", "bytes=-0", "bytes=0-1,3-4", "items=0-1", "bytes=", "bytes=-", "bytes=a-b",
                  "bytes=\uff11-2", "bytes=1-2-3", "bytes= 1 - 2x", "bytes=" + "9" * 40 + "-"]


@pytest.mark.parametrize("header", RANGES_REFUSED)
def test_a_byte_range_outside_the_rule_is_refused(header):
    with pytest.raises(ValueError):
        byte_range(header, 100)


def test_the_route_answers_416_to_a_range_it_refuses(session, run_with_video):
    _, data = run_with_video
    for header in [h for h in RANGES_REFUSED if h.isascii() and h != "bytes=100-"] + [f"bytes={len(data)}-"]:
        resp = session.get(f"/runs/{RUN}/video/{VIDEO_FILE}", headers={"Range": header})
        assert resp.status_code == 416 and resp.headers["content-range"] == f"bytes */{len(data)}", header


def test_the_report_says_why_a_run_has_no_video(runs_dir):
    directory = _record(runs_dir, video={"fps": 2.0, "error": "no frame was grabbed <b>"})
    page = render_report(directory)
    assert "<video" not in page and "No video: no frame was grabbed &lt;b&gt;" in page
    assert 'id="video"' not in render_report(_record(runs_dir, "run-without", video=None))  # none asked


def test_a_run_whose_record_cannot_be_read_still_links_its_video(session, runs_dir):
    directory = runs_dir / "run-broken"
    directory.mkdir()
    (directory / "record.jsonl").write_text("not json\n")
    small_webm(directory / VIDEO_FILE)
    page = session.get("/runs/run-broken").text
    assert "The record cannot be read" in page
    assert f'href="{session.server.auth.base}/runs/run-broken/video/{VIDEO_FILE}"' in page
    assert session.get(f"/runs/run-broken/video/{VIDEO_FILE}").status_code == 200
