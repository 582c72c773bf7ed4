"""Every reader of a run record's screenshot files follows one rule (controller.run.shots): ``report``
(embedded and served pages), the web console's ``shots/`` route, the Agents API's screenshot events and
``replay``. A hostile record names, for its screenshot, an absolute path, a ``..`` path, a symlink out of
the run, a FIFO (no reader may hang on it), a PNG whose header says 12000x12000 px (never decoded), a
name with control characters: each reader refuses each one, at once, and shows the name escaped."""

from __future__ import annotations

import io
import json
import os
import struct
import threading
import zlib
from pathlib import Path
from typing import Any, Callable

import httpx
import pytest
from PIL import Image

from controller.agents_api.sessions import HubOptions, SessionHub
from controller.agents_api.store import Store
from controller.console.server import ConsoleServer
from controller.report import render_report
from controller.run import shots
from controller.run.record import RunRecord
from controller.run.replay import ReplayError, build

ROOT = Path(__file__).resolve().parents[2]
W, H = 64, 40
READ_LIMIT_S = 10.0
"""How long one reader may take on one hostile file (it should take milliseconds)."""


def png(size: tuple[int, int] = (W, H), color: tuple[int, int, int] = (10, 120, 200)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, color).save(out, "PNG")
    return out.getvalue()


def huge_png(side: int = 12000) -> bytes:
    """A valid 1-bit grey PNG of ``side`` x ``side`` px (144 Mpx at 12000): a few KiB of deflated
    zeros that would take hundreds of MiB decoded as RGB."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    row = b"\x00" * (1 + (side + 7) // 8)
    pixels = zlib.compressobj(9)
    data = b"".join(pixels.compress(row) for _ in range(side)) + pixels.flush()
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", side, side, 1, 0, 0, 0, 0))
            + chunk(b"IDAT", data) + chunk(b"IEND", b""))


OUTSIDE = png(color=(1, 2, 3))
"""A screenshot outside the run directory: no reader may return it."""

#: case -> what the record's ``file`` says (``{outside}``: the absolute path of a PNG outside the run)
CASES = {
    "absolute": "{outside}",
    "dotdot": "../shot-0001.png",
    "symlink": "shot-0002.png",
    "fifo": "shot-0003.png",
    "huge": "shot-0004.png",
    "control": "shot-0001.png\x1b[2J\n",
}


def hostile_run(tmp_path: Path, case: str) -> tuple[Path, str]:
    """A finished record in ``tmp_path/runs/run-<case>`` of one step whose screenshot entry names the
    hostile file of ``case``; returns the run directory and the name as recorded."""
    runs = tmp_path / "runs"
    runs.mkdir(exist_ok=True)
    outside = tmp_path / "outside.png"
    outside.write_bytes(OUTSIDE)
    (runs / "shot-0001.png").write_bytes(OUTSIDE)  # what "../shot-0001.png" would reach
    rec = RunRecord(runs, f"run-{case}")
    rec.write("run_started", task={"name": "t", "source": str(ROOT / "tasks" / "pickup.toml"), "sha256": None},
              mode="live", model="m", image="local", typed_text=True)
    (rec.dir / "shot-0001.png").write_bytes(png())
    (rec.dir / "shot-0002.png").symlink_to(outside)
    os.mkfifo(rec.dir / "shot-0003.png")
    (rec.dir / "shot-0004.png").write_bytes(huge_png())
    name = CASES[case].format(outside=outside)
    rec.write("screenshot", file=name, sha256="0" * 64, mime="image/png", image_size=(W, H),
              frame=(0, 0, W, H), screen_size=(W, H))
    rec.write("model_response", response_id="resp_1", http_status=200)
    rec.write("computer_call", call_id="call_1", form="actions",
              actions=[{"type": "click", "x": 5, "y": 6, "button": "left"}])
    rec.finish("passed", "done", final_message="done")
    rec.close()
    return rec.dir, name


def quickly(read: Callable[[], Any], fifo: Path) -> Any:
    """``read()`` in a thread; fails when it takes over :data:`READ_LIMIT_S` (a reader blocked on the
    FIFO is released afterwards by opening its other end)."""
    result: list[Any] = []

    def run() -> None:
        try:
            result.append(("ok", read()))
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            result.append(("raised", exc))

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(READ_LIMIT_S)
    if worker.is_alive():
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))  # lets the blocked reader go
        worker.join(READ_LIMIT_S)
        pytest.fail(f"the reader took over {READ_LIMIT_S:g} s on a screenshot file (blocked on a FIFO?)")
    kind, value = result[0]
    if kind == "raised":
        raise value
    return value


@pytest.mark.parametrize("case", list(CASES))
def test_read_shot_refuses_each_hostile_file_at_once(tmp_path, case):
    run, name = hostile_run(tmp_path, case)
    data, why = quickly(lambda: shots.read_shot(run, name), run / "shot-0003.png")
    assert data is None and why
    assert shots.read_shot(run, "shot-0001.png") == (png(), None)  # the run's own screenshot reads
    if case == "huge":
        assert "12000x12000 px" in why
    image, why = shots.load_shot(run, name)
    assert image is None and why


@pytest.mark.parametrize("case", list(CASES))
def test_replay_refuses_the_record_naming_the_screenshot(tmp_path, case):
    run, name = hostile_run(tmp_path, case)
    with pytest.raises(ReplayError) as refused:
        quickly(lambda: build(run), run / "shot-0003.png")
    message = str(refused.value)
    assert "cannot be read" in message and "\x1b" not in message and "\n" not in message
    if case == "control":
        assert "\\x1b[2J\\n" in message
    if case == "huge":
        assert "12000x12000 px" in message


@pytest.mark.parametrize("case", list(CASES))
def test_the_report_page_shows_the_screenshot_missing(tmp_path, case):
    run, _name = hostile_run(tmp_path, case)
    page = quickly(lambda: render_report(run), run / "shot-0003.png")
    assert "data:image" not in page and "not shown:" in page
    assert "\x1b" not in page
    served: list[str] = []
    quickly(lambda: render_report(run, embed_images=False, image_url=lambda n: served.append(n) or n),
            run / "shot-0003.png")
    # only a plain regular file is linked (its bytes are read, by the same rule, when it is served)
    assert served == (["shot-0004.png"] if case == "huge" else [])


@pytest.mark.parametrize("case", list(CASES))
def test_the_agents_api_sends_the_screenshot_event_without_an_image(tmp_path, case):
    run, name = hostile_run(tmp_path, case)
    hub = SessionHub(Store(tmp_path / "agents.db"), HubOptions(runs_dir=tmp_path / "runs"))
    try:
        assert hub.screenshot_url(os.path.join(run, "shot-0001.png")).startswith("data:image/jpeg;base64,")
        assert quickly(lambda: hub.screenshot_url(os.path.join(run, name)), run / "shot-0003.png") is None
    finally:
        hub.store.close()


def test_the_console_serves_no_hostile_screenshot(tmp_path):
    for case in CASES:
        hostile_run(tmp_path, case)
    runs = tmp_path / "runs"
    server = ConsoleServer(runs).start()
    try:
        with httpx.Client(base_url=server.base, timeout=READ_LIMIT_S) as client:
            assert client.get(server.url).status_code == 303
            run = "/runs/run-huge"
            assert client.get(f"{run}/shots/shot-0001.png").content == png()
            for name in ("shot-0002.png", "shot-0003.png", "shot-0004.png", "..%2Fshot-0001.png",
                         "shot-0001.png%1B"):
                answer = client.get(f"{run}/shots/{name}")
                assert answer.status_code == 404, (name, answer.status_code)
                assert answer.json()["error"]["code"] in ("unknown_shot", "not_found"), answer.text
            page = client.get(run)
            assert page.status_code == 200 and "\x1b" not in page.text
    finally:
        server.stop()


def recorded_run(tmp_path: Path, actions: list[dict[str, Any]], human: list[dict[str, Any]] = ()) -> Path:
    """A finished record of one computer call with ``actions`` (model px) on a readable screenshot,
    after a person's ``human`` actions (screen px) during a takeover."""
    rec = RunRecord(tmp_path / "runs", "run-actions")
    rec.write("run_started", task={"name": "t", "source": str(ROOT / "tasks" / "pickup.toml"), "sha256": None},
              mode="live", model="m", image="local", typed_text=True)
    rec.save_screenshot(png(), "image/png", image_size=(W, H), frame=(0, 0, W, H), screen_size=(W, H))
    for action in human:
        rec.write("takeover", control="human", by="console")
        rec.write("human_action", action="an action", input=action, by="console")
        rec.write("takeover", control="model", by="console")
    rec.write("model_response", response_id="resp_1", http_status=200)
    rec.write("computer_call", call_id="call_1", form="actions", actions=actions)
    rec.finish("passed", "done", final_message="done")
    rec.close()
    return rec.dir


@pytest.mark.parametrize("actions, why", [
    ([{"type": "teleport", "x": 5, "y": 6}], "unknown action type 'teleport'"),
    ([{"type": "click", "x": -5, "y": 6, "button": "left"}], "must not be negative"),
    ([{"type": "keypress", "keys": "ctrl+c"}], "keypress.keys"),
    ([], "actions must be a non-empty list"),
])
def test_a_record_whose_calls_cannot_be_sent_exits_2_before_anything_starts(tmp_path, actions, why):
    import subprocess
    import sys

    run = recorded_run(tmp_path, actions)
    done = subprocess.run([sys.executable, "-m", "controller.cli", "replay", str(run), "--runs-dir",
                           str(tmp_path / "replays")], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    assert "cannot replay" in done.stderr and why in done.stderr and "call_1" in done.stderr, done.stderr
    assert not (tmp_path / "replays").exists() or not any((tmp_path / "replays").iterdir())


@pytest.mark.parametrize("action, why", [
    ({"type": "wait"}, "a person may send"),
    ({"type": "click", "x": 3, "y": -1, "button": "left"}, "negative"),
    ({"type": "drag", "path": [{"x": 1}]}, "drag.path"),
])
def test_a_persons_action_that_cannot_be_performed_again_is_refused(tmp_path, action, why):
    run = recorded_run(tmp_path, [{"type": "click", "x": 5, "y": 6, "button": "left"}], human=[action])
    with pytest.raises(ReplayError, match="a person's action before the first step") as refused:
        build(run)
    assert why in str(refused.value)


def test_a_persons_typed_text_recorded_with_its_length_replays(tmp_path):
    typed = {"type": "type", "text_length": 5, "text": "hello"}
    run = recorded_run(tmp_path, [{"type": "click", "x": 5, "y": 6, "button": "left"}], human=[typed])
    assert build(run).human == {-1: [typed]}


def test_the_replays_closing_message_waits_for_what_the_scripts_last_turn_waited_for(tmp_path):
    """An offline record whose script's closing turn waited for the guest (a person's command that has
    run): the replay's closing message waits for the same, so its checks do not race the guest."""
    script = tmp_path / "t.offline.jsonl"
    green = {"kind": "color", "x": 1, "y": 2, "w": 3, "h": 4, "rgb": "#00cd00", "tolerance": 60, "fraction": 0.3}
    script.write_text(json.dumps({"actions": [{"type": "click", "x": 5, "y": 6, "button": "left"}]}) + "\n"
                      + json.dumps({"expect": [green], "expect_timeout_s": 30, "message": "done"}) + "\n")
    rec = RunRecord(tmp_path / "runs", "run-closing")
    rec.write("run_started", task={"name": "t", "source": str(ROOT / "tasks" / "pickup.toml"), "sha256": None},
              mode="offline", model="scripted", image="local", script=str(script))
    rec.write("model_response", response_id="resp_1", http_status=200)
    rec.write("computer_call", call_id="call_0000", form="actions",
              actions=[{"type": "click", "x": 5, "y": 6, "button": "left"}])
    rec.finish("passed", "done", final_message="done")
    rec.close()
    closing = build(rec.dir).turns[-1]
    assert closing["message"] == "done" and closing["expect"] == [green] and closing["expect_timeout_s"] >= 30
