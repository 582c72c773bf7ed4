"""Benchmark: what a run's video costs, and which grab it takes, on the Docker backend, in one run.

``desktop-sandbox bench --video [--runs 5] [--grabs 40] [--task tasks/pickup.toml] [--image TAG]
[--runs-dir DIR] [--json FILE]`` (or ``python -m controller.bench_video ...``).

- **grabs**: each grab a video may take (:data:`controller.run.video.GRAB_SOURCES`: ``jpeg``, the
  console's live-screen path, and ``png``) ``--grabs`` times, interleaved, at the video's frame size, on
  three screens (:func:`grab_costs`: the task's page and terminal, the terminal scrolling text, a
  photo-like page): the agent call (the guest's grab and encode, the bytes through the relay), the
  controller's decode of the image, and the bytes; p50/p95 in ms.
- **runs**: the task's offline run end to end by ``run-task`` (a process each, as a person runs it: a
  fresh sandbox, ready, the scripted loop, checks, teardown, the record) without and with ``--video``,
  ``--runs`` of each, interleaved (none, video, none, ...): the wall time's median per kind (the process's
  and the record's ``wall_s``) and its ratio to the run without a video, the loop phase's too, and what
  the videos held: frames encoded, grabs a second taken (the measured frame rate: frames, unchanged and
  dropped grabs over the video's duration), encoded frames a second, dropped frames, file size.

Target: a run with the video (the grab it takes, :data:`controller.run.video.GRAB_SOURCE`) within
:data:`TARGET_RATIO` of the run without, the process's wall time at the median. Not a test: figures depend on the host
and what else runs on it.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from controller.bench_sampling import interleave, percentiles

LABEL = "desktop-sandbox.bench"
REPO = Path(__file__).resolve().parents[1]
TARGET_RATIO = 1.15
"""Most a run with its video may take, as a multiple of the same run without (wall time, medians)."""
KINDS = ("none", "video")
"""The runs compared: without a video, and with one (``run-task --video``)."""
RUN_TIMEOUT_S = 600.0
"""Longest one run may take."""


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _options(image: str) -> Any:
    from controller.sandbox.docker import DockerOptions

    return DockerOptions(image=image, extra_labels={LABEL: "video"})


PHOTO_PAGE = ("data:text/html,<body style='margin:0'><canvas id=c width=1280 height=800></canvas><script>"
              "var c=document.getElementById('c').getContext('2d'),d=c.createImageData(1280,800);"
              "for(var y=0;y<800;y++)for(var x=0;x<1280;x++){var i=(y*1280+x)*4;"
              "d.data[i]=128+100*Math.sin(x/37+y/91)+20*Math.random();d.data[i+1]=128+100*Math.sin(y/23)+20*Math.random();"
              "d.data[i+2]=128+100*Math.cos((x+y)/61)+20*Math.random();d.data[i+3]=255}c.putImageData(d,0,0)</script>")
"""A page of smooth colour with grain: what a photo costs an image codec."""
NOISE_COMMAND = "while :; do head -c 3000 /dev/urandom | base64; done\n"
"""Typed into the task's terminal: text scrolling as fast as the terminal draws it."""


def _sample(agent: Any, size: tuple[int, int], grabs: int) -> dict[str, Any]:
    """Each grab of :data:`controller.run.video.GRAB_SOURCES` of ``agent``'s screen ``grabs`` times,
    interleaved: ``{"call_ms", "decode_ms"}`` percentiles and ``bytes`` (median) per grab."""
    from PIL import Image

    from controller.run.video import GRAB_SOURCES

    sizes: dict[str, list[int]] = {name: [] for name in GRAB_SOURCES}
    shots: dict[str, bytes] = {}

    def grab(name: str) -> Any:
        source = GRAB_SOURCES[name]

        def call(_i: int) -> None:
            shot = agent.screenshot(format=source.format, quality=source.quality, max_width=size[0],
                                    max_height=size[1])
            sizes[name].append(len(shot.data))
            shots[name] = shot.data
        return call

    def decode(name: str) -> Any:
        def call(_i: int) -> None:
            with Image.open(io.BytesIO(shots[name]), formats=[GRAB_SOURCES[name].pillow]) as img:
                img.convert("RGB")
        return call

    calls = interleave({name: (grab(name), grabs) for name in GRAB_SOURCES}, warmup=2)
    decodes = interleave({name: (decode(name), grabs) for name in GRAB_SOURCES}, warmup=1)
    return {name: {"call_ms": percentiles(calls[name]), "decode_ms": percentiles(decodes[name]),
                   "bytes": int(statistics.median(sizes[name]))} for name in GRAB_SOURCES}


def _changed(agent: Any, what: str, timeout: float = 60.0) -> None:
    """Wait (bounded) until two screenshots of ``agent`` in a row differ: the screen is busy."""
    deadline = time.monotonic() + timeout
    before = agent.screenshot(format="jpeg").data
    while agent.screenshot(format="jpeg").data == before:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: the screen did not change within {timeout:g} s")


def grab_costs(task_file: Path, image: str, grabs: int) -> dict[str, Any]:
    """The grabs of :data:`controller.run.video.GRAB_SOURCES` on three screens, at the video's frame size
    (1280x800): ``pickup`` (one sandbox of the task, its apps launched and ready: a page and a terminal),
    ``scrolling text`` (the same, its terminal printing random text) and, where Debian's chromium runs
    here, ``photo`` (:data:`PHOTO_PAGE` on a local desktop: Xvfb and the agent, no container).
    Per screen and grab :func:`_sample`."""
    from controller.run.ready import wait_ready
    from controller.run.tasks import load_task
    from controller.run.video import frame_size
    from controller.sandbox.docker import DockerSandbox
    from controller.sandbox.guest import GUEST_HOME

    task = load_task(task_file)
    size = frame_size((task.screen.width, task.screen.height), 1280)
    out: dict[str, Any] = {}
    with DockerSandbox.start(task.sandbox_spec(), _options(image)) as sandbox:
        agent = sandbox.agent
        for launch in task.launch:
            agent.launch(launch.app, launch.args)
        wait_ready(agent, task, getattr(sandbox, "guest_home", None) or GUEST_HOME, 90.0)
        out["pickup"] = _sample(agent, size, grabs)
        agent.actions([{"type": "click", "x": size[0] // 2, "y": size[1] - 100, "button": "left"},
                       {"type": "type", "text": NOISE_COMMAND}])
        _changed(agent, "the terminal")
        out["scrolling text"] = _sample(agent, size, grabs)
    photo = _photo_costs(size, grabs)
    if photo is not None:
        out["photo"] = photo
    return out


def _photo_costs(size: tuple[int, int], grabs: int) -> dict[str, Any] | None:
    """:func:`_sample` of :data:`PHOTO_PAGE` in Debian's chromium on a local desktop; None when chromium
    or Xvfb is not here."""
    import shutil

    from controller import chromium
    from controller.agent_client import AgentClient
    from guest.localrun import AgentProcess, Xvfb

    if chromium.unavailable() or shutil.which("Xvfb") is None:
        _say("photo: skipped (Debian's chromium or Xvfb is not here)")
        return None
    top = Path(tempfile.mkdtemp(prefix="bench-video-photo-"))
    xvfb = Xvfb(size[0], size[1], 24).start()
    try:
        agent = AgentProcess(xvfb.display, apps=chromium.channel_app(top)).start()
        try:
            with AgentClient(agent.base_url, agent.token, timeout=30) as client:
                client.launch("chromium", [PHOTO_PAGE])
                deadline = time.monotonic() + 60
                while len(client.screenshot(format="png").data) < 1_000_000:  # the page drawn
                    if time.monotonic() > deadline:
                        raise RuntimeError("photo: the page was not drawn within 60 s")
                return _sample(client, size, grabs)
        finally:
            agent.stop()
    finally:
        xvfb.stop()
        shutil.rmtree(top, ignore_errors=True)


def run_costs(task_file: Path, image: str, runs: int, runs_dir: Path) -> dict[str, Any]:
    """``runs`` offline runs of the task by ``run-task`` (a process each, as a person runs it) of each of
    :data:`KINDS`, interleaved; per kind the process's and the record's wall seconds, the loop phase's,
    statuses, and for the videos what they held."""
    from controller.run.record import read_entries

    env = {k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"}
    env["PYTHONPATH"] = str(REPO)
    found: dict[str, dict[str, list[Any]]] = {
        k: {"wall_s": [], "record_wall_s": [], "loop_s": [], "status": [], "video": []} for k in KINDS}
    for i in range(runs):
        for kind in KINDS:
            argv = [sys.executable, "-m", "controller.cli", "run-task", str(task_file), "--offline", "--image", image,
                    "--runs-dir", str(runs_dir), *(["--video"] if kind == "video" else [])]
            started = time.monotonic()
            done = subprocess.run(argv, cwd=REPO, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                  timeout=RUN_TIMEOUT_S, check=False)
            wall = time.monotonic() - started
            lines = done.stdout.strip().splitlines()
            record = Path(lines[-1]) if lines else None
            entries = read_entries(record) if record is not None and record.is_file() else []
            finished = entries[-1] if entries and entries[-1].type == "run_finished" else None
            row = found[kind]
            row["wall_s"].append(round(wall, 3))
            row["record_wall_s"].append(finished.wall_s if finished else None)
            row["loop_s"].append((finished.timings or {}).get("loop") if finished else None)
            row["status"].append(finished.status if finished else f"exit {done.returncode}")
            video = next((e for e in entries if e.type == "video"), None)
            if video is not None:
                row["video"].append(video.as_json())
            _say(f"run {i + 1}/{runs} {kind}: {row['status'][-1]} in {wall:.2f} s"
                 + (f", {video.frames} frames" if video is not None else ""))
    return {kind: _summary(row, found["none"]) for kind, row in found.items()}


def _median(values: list[Any]) -> float | None:
    known = [v for v in values if v is not None]
    return round(statistics.median(known), 3) if known else None


def _summary(row: dict[str, list[Any]], base: dict[str, list[Any]]) -> dict[str, Any]:
    """One kind's runs: medians and their ratios to ``base`` (the runs without a video), the videos' figures."""
    out: dict[str, Any] = {"wall_s": row["wall_s"], "status": row["status"]}
    for name in ("wall_s", "record_wall_s", "loop_s"):
        mine, theirs = _median(row[name]), _median(base[name])
        out[f"{name}_p50"] = mine
        out[f"{name}_ratio"] = round(mine / theirs, 3) if mine is not None and theirs else None
    videos = row["video"]
    if videos:
        timed = [v for v in videos if v["duration_s"]]
        out.update(
            frames_p50=_median([v["frames"] for v in videos]),
            grabs_per_s=_median([(v["frames"] + v["unchanged"] + v["dropped"]) / v["duration_s"] for v in timed]),
            frames_per_s=_median([v["frames"] / v["duration_s"] for v in timed]),
            dropped=sum(v["dropped"] for v in videos),
            grab_ms_p50=_median([v["grab_ms"] for v in videos]),
            bytes_p50=_median([v["bytes"] for v in videos]),
            duration_s_p50=_median([v["duration_s"] for v in videos]),
            files=[v["file"] for v in videos])
    return out


def run(task_file: Path, image: str, grabs: int, runs: int, runs_dir: Path) -> dict[str, Any]:
    """Both sections (module docstring) and the checks."""
    from controller.run.video import GRAB_SOURCE

    _say(f"grabs: {grabs} of each kind on one sandbox of {task_file.name}")
    grab = grab_costs(task_file, image, grabs) if grabs else {}
    _say(f"runs: {runs} of each of {', '.join(KINDS)}, interleaved")
    runs_report = run_costs(task_file, image, runs, runs_dir) if runs else {}
    video = runs_report.get("video", {})
    checks = {"grabs_measured": bool(grab) or not grabs}
    if runs:
        checks.update({
            "every_run_passed": all(s == "passed" for row in runs_report.values() for s in row["status"]),
            "every_video_written": bool(video.get("files")) and all(video["files"]),
            f"video_within_{round((TARGET_RATIO - 1) * 100)}pct": (video.get("wall_s_ratio") or 99) <= TARGET_RATIO,
        })
    return {"task": task_file.name, "grab_source": GRAB_SOURCE, "grabs": grab, "runs": runs_report,
            "target_ratio": TARGET_RATIO, "checks": checks}


def render_lines(report: dict[str, Any]) -> list[str]:
    """The report as the lines printed."""
    lines = []
    for screen, grabs in report["grabs"].items():
        for name, g in grabs.items():
            lines.append(f"grab {name} of {screen}: call p50 {g['call_ms']['p50']} ms (p95 {g['call_ms']['p95']}), "
                         f"decode p50 {g['decode_ms']['p50']} ms (p95 {g['decode_ms']['p95']}), {g['bytes']} bytes")
    for kind, r in report["runs"].items():
        line = (f"run {kind}: wall p50 {r['wall_s_p50']} s (x{r['wall_s_ratio']}; the record's {r['record_wall_s_p50']} "
                f"s, x{r['record_wall_s_ratio']}), loop p50 {r['loop_s_p50']} s (x{r['loop_s_ratio']}), "
                f"{r['status'].count('passed')}/{len(r['status'])} passed")
        if "frames_p50" in r:
            line += (f"; video: {r['frames_p50']} frames, {r['grabs_per_s']} grabs/s, {r['frames_per_s']} frames/s "
                     f"encoded, {r['dropped']} dropped, grab {r['grab_ms_p50']} ms, {r['bytes_p50']} bytes, "
                     f"{r['duration_s_p50']} s")
        lines.append(line)
    lines.append("checks: " + ", ".join(f"{k} {'ok' if v else 'FAILED'}" for k, v in report["checks"].items()))
    return lines


def main(argv: list[str] | None = None) -> dict[str, Any]:
    from controller.sandbox.docker import DEFAULT_IMAGE

    parser = argparse.ArgumentParser(prog="desktop-sandbox bench --video", description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="runs of each kind (0: skip)")
    parser.add_argument("--grabs", type=int, default=40, help="grabs of each kind (0: skip)")
    parser.add_argument("--task", type=Path, default=REPO / "tasks" / "pickup.toml")
    parser.add_argument("--image", default=DEFAULT_IMAGE)
    parser.add_argument("--runs-dir", type=Path, default=None, help="where the runs' records go (default: a "
                                                                    "temporary folder)")
    parser.add_argument("--json", help="also write the report to this file")
    ns = parser.parse_args(argv)
    runs_dir = ns.runs_dir or Path(tempfile.mkdtemp(prefix="bench-video-"))
    report = run(ns.task.resolve(), ns.image, ns.grabs, ns.runs, runs_dir)
    for line in render_lines(report):
        print(line)
    if ns.json:
        Path(ns.json).write_text(json.dumps(report, indent=2), encoding="utf-8")
    return report


if __name__ == "__main__":
    result = main()
    sys.exit(0 if all(result["checks"].values()) else 1)
