"""Recorded web origins on the controller's side (:mod:`controller.run.web`): a recording folder is read
only by its validated index and bodies named by their SHA-256 (a body whose hash is not its name, a
symlink, an index naming paths: the whole recording refused); the task's ``[record] web`` and ``[offline]
web``; the recording read back from a gateway that answers hostile shapes; ``replay --write-task``
carrying the recording beside the task it writes."""

from __future__ import annotations

import hashlib
import http.server
import json
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from controller.gateway.web import WebResponse
from controller.run.record import RunRecord, read_entries
from controller.run.tasks import TaskError, load_task
from controller.run.web import CANCELLED_BUDGET_S, INDEX, RunWeb, WebRecordingError, load_recording, write_recording

PAGE = b"<html>page v1</html>"


def response(body: bytes = PAGE, **fields) -> WebResponse:
    data = {"method": "GET", "url": "http://web.test:8080/page", "origin": "http://web.test:8080",
            "address": "172.30.0.5", "status": 200, "headers": [("content-type", "text/html")],
            "sha256": hashlib.sha256(body).hexdigest(), "bytes": len(body), **fields}
    return WebResponse.model_validate(data)


def recording(tmp_path: Path, body: bytes = PAGE) -> Path:
    return write_recording(tmp_path / "web", [response(body)], {hashlib.sha256(body).hexdigest(): body})


def test_a_recording_written_reads_back_verified(tmp_path):
    folder = recording(tmp_path)
    loaded = load_recording(folder)
    assert [r.url for r in loaded.responses] == ["http://web.test:8080/page"]
    assert loaded.bodies == {hashlib.sha256(PAGE).hexdigest(): PAGE}
    assert loaded.origins == ["http://web.test:8080"] and loaded.bytes == len(PAGE)
    assert sorted(p.name for p in folder.iterdir()) == sorted([INDEX, hashlib.sha256(PAGE).hexdigest()])


def test_a_body_whose_hash_is_not_its_name_refuses_the_recording(tmp_path):
    folder = recording(tmp_path)
    (folder / hashlib.sha256(PAGE).hexdigest()).write_bytes(PAGE.replace(b"v1", b"v9"))
    with pytest.raises(WebRecordingError) as caught:
        load_recording(folder)
    assert caught.value.code == "hash_mismatch"


def test_a_symlinked_or_missing_body_refuses_the_recording(tmp_path):
    folder = recording(tmp_path)
    name = hashlib.sha256(PAGE).hexdigest()
    (tmp_path / "elsewhere").write_bytes(PAGE)
    (folder / name).unlink()
    with pytest.raises(WebRecordingError) as caught:
        load_recording(folder)
    assert caught.value.code == "missing"
    (folder / name).symlink_to(tmp_path / "elsewhere")
    with pytest.raises(WebRecordingError) as caught:
        load_recording(folder)
    assert caught.value.code == "bad_body" and "symlink" in caught.value.message


@pytest.mark.parametrize("change, needle", [
    ({"sha256": "../../etc/passwd"}, "sha256"),
    ({"sha256": "/etc/" + "a" * 59}, "sha256"),
    ({"url": "http://web.test:8080/\u00e9"}, "url"),
    ({"origin": "http://elsewhere.test"}, "origin"),
    ({"headers": [["set-cookie", "a=b"]]}, "headers"),
    ({"status": 304}, "status"),
    ({"method": "POST"}, "method"),
    ({"path": "/etc/passwd"}, "path"),
])
def test_names_in_the_index_are_validated_never_used_as_paths(tmp_path, change, needle):
    folder = recording(tmp_path)
    line = {**response().model_dump(mode="json"), **change}
    (folder / INDEX).write_text(json.dumps(line) + "\n")
    (tmp_path / "etc").mkdir()
    with pytest.raises(WebRecordingError) as caught:
        load_recording(folder)
    assert caught.value.code == "bad_index" and needle in caught.value.message, caught.value.message


def test_an_index_that_is_not_strict_json_or_is_a_symlink_is_refused(tmp_path):
    folder = recording(tmp_path)
    index = folder / INDEX
    text = index.read_text().strip()
    index.write_text(text[:-1] + ', "status": 404}\n')  # a duplicate key: two readers could see two answers
    with pytest.raises(WebRecordingError, match="bad_index"):
        load_recording(folder)
    index.unlink()
    (tmp_path / "index.jsonl").write_text(text + "\n")
    index.symlink_to(tmp_path / "index.jsonl")
    with pytest.raises(WebRecordingError, match="symlink"):
        load_recording(folder)
    with pytest.raises(WebRecordingError) as caught:
        load_recording(tmp_path / "nothing-here")
    assert caught.value.code == "missing"


def test_a_body_larger_than_its_index_says_is_refused_before_it_is_read_whole(tmp_path):
    folder = recording(tmp_path)
    (folder / hashlib.sha256(PAGE).hexdigest()).write_bytes(PAGE * 1000)
    with pytest.raises(WebRecordingError) as caught:
        load_recording(folder)
    assert caught.value.code == "too_large"


def test_an_index_whose_responses_disagree_on_a_body_size_is_refused(tmp_path):
    folder = recording(tmp_path)
    first = response().model_dump(mode="json")
    lying = {**first, "url": "http://web.test:8080/other", "bytes": first["bytes"] + 1000}
    (folder / INDEX).write_text(json.dumps(first) + "\n" + json.dumps(lying) + "\n")
    with pytest.raises(WebRecordingError) as caught:
        load_recording(folder)
    assert caught.value.code == "bad_index" and ":2:" in caught.value.message, caught.value.message


def test_writing_a_recording_replaces_links_planted_in_its_folder_never_follows_them(tmp_path):
    """``replay --write-task`` writes into a folder that may exist already: a body's or the index's name
    planted there as a symlink is replaced, its target left as it was."""
    folder = tmp_path / "again.web"
    folder.mkdir()
    outside = tmp_path / "outside"
    outside.write_bytes(b"precious")
    sha = hashlib.sha256(PAGE).hexdigest()
    (folder / sha).symlink_to(outside)
    (folder / INDEX).symlink_to(outside)
    write_recording(folder, [response()], {sha: PAGE})
    assert outside.read_bytes() == b"precious"
    assert not (folder / sha).is_symlink() and not (folder / INDEX).is_symlink()
    assert load_recording(folder).bodies == {sha: PAGE}
    assert sorted(p.name for p in folder.iterdir()) == sorted([INDEX, sha])


def test_a_recording_is_served_with_caps_that_hold_it(tmp_path):
    """A recording that verifies is one the gateway takes: a body over the recording caps' defaults
    (the limits a recording on disk is held to are higher) raises the serving caps to fit it."""
    from controller.gateway.web import DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_TOTAL_BYTES

    big = b"b" * (DEFAULT_MAX_BODY_BYTES + 1)
    web = RunWeb("serve", load_recording(recording(tmp_path, big)))
    assert web.config.max_body_bytes >= len(big) and web.config.max_total_bytes >= len(big)
    small = RunWeb("serve", load_recording(recording(tmp_path / "small")))
    assert (small.config.max_body_bytes, small.config.max_total_bytes) == (DEFAULT_MAX_BODY_BYTES,
                                                                           DEFAULT_MAX_TOTAL_BYTES)


TASK = """
name = "t"
instructions = "x"
[[checks]]
kind = "file"
path = "~/a"
match = "text"
value = "a"
"""


def test_the_task_fields(tmp_path):
    task = tmp_path / "t.toml"
    task.write_text(TASK + '[record]\nweb = true\n[offline]\nscript = "s.jsonl"\nweb = "t.web"\n')
    loaded = load_task(task)
    assert loaded.record.web is True and loaded.offline_web_path() == tmp_path / "t.web"
    task.write_text(TASK + '[record]\nweb = "yes"\n')
    with pytest.raises(TaskError, match="record.web"):
        load_task(task)
    task.write_text(TASK + '[offline]\nscript = "s.jsonl"\nweb = ""\n')
    with pytest.raises(TaskError, match="offline.web"):
        load_task(task)
    task.write_text(TASK)
    assert load_task(task).offline_web_path() is None


class HostileGateway:
    """A test double of the gateway's control API (``/v1/web``): the real gateway never answers with
    wrong shapes, so answers a hostile gateway could give are served by this one. ``state``: what ``GET
    /v1/web`` answers (``raw`` bytes when set); ``bodies``: what each body's URL answers."""

    def __init__(self) -> None:
        self.state: dict = {}
        self.raw: bytes | None = None
        self.bodies: dict[str, bytes] = {}
        self.stall = False  # bodies answered only once ``released`` (a gateway that never answers)
        self.released = threading.Event()
        double = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _send(self, status: int, body: bytes, kind: str = "application/json") -> None:
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_PUT(self):
                self.rfile.read(int(self.headers.get("Content-Length", "0")))
                self._send(200, json.dumps({**double.state, "responses": []}).encode())

            def do_GET(self):
                if self.path == "/v1/web":
                    self._send(200, double.raw if double.raw is not None else json.dumps(double.state).encode())
                    return
                sha = self.path.rsplit("/", 1)[-1]
                if double.stall:
                    double.released.wait(60)
                if sha in double.bodies:
                    self._send(200, double.bodies[sha], "application/octet-stream")
                else:
                    self._send(404, b'{"error": {"code": "unknown_body", "message": "no"}}')

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.sandbox = SimpleNamespace(gateway_control_url=f"http://127.0.0.1:{self.server.server_address[1]}",
                                       gateway_control_token="token")

    def close(self) -> None:
        self.released.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def hostile():
    double = HostileGateway()
    yield double
    double.close()


def state(*responses: WebResponse, **extra) -> dict:
    return {"mode": "record", "max_body_bytes": 1 << 20, "max_total_bytes": 1 << 24,
            "responses": [r.model_dump(mode="json") for r in responses], "skipped": {"tunnel": 1}, "bytes": 0,
            "bodies": 0, **extra}


def collect(hostile: HostileGateway, tmp_path: Path):
    web = RunWeb("record")
    web.start(hostile.sandbox)
    record = RunRecord(tmp_path / "runs", "run")
    web.finish(record)
    record.close()
    [entry] = [e for e in read_entries(record.path) if e.type == "web_recording"]
    return entry, record.dir / "web"


def test_bodies_a_hostile_gateway_serves_wrong_are_left_out(hostile, tmp_path):
    good, lying, short = response(), response(b"other", url="http://web.test:8080/b"), response(b"x" * 10, url="http://web.test:8080/c")
    resized = response(url="http://web.test:8080/d", bytes=len(PAGE) + 5)  # good's body, another size
    hostile.state = state(good, lying, short, resized)
    hostile.bodies = {good.sha256: PAGE, lying.sha256: b"not other", short.sha256: b"x" * 11}
    entry, folder = collect(hostile, tmp_path)
    assert (entry.complete, entry.responses, entry.bytes) == (True, 1, len(PAGE))
    assert entry.skipped == {"tunnel": 1, "unverified": 3}
    assert sorted(p.name for p in folder.iterdir()) == sorted([INDEX, good.sha256])
    assert load_recording(folder).bodies == {good.sha256: PAGE}


def test_a_cancelled_run_stops_reading_a_stalled_recording_within_seconds(hostile, tmp_path):
    """A signal ends the run within seconds: once it is cancelled, a gateway that never answers a body
    holds the reading back for at most the short budget, and what was not read is left out, counted."""
    first, second = response(), response(b"two", url="http://web.test:8080/two")
    hostile.state = state(first, second)
    hostile.bodies = {first.sha256: PAGE, second.sha256: b"two"}
    hostile.stall = True
    web = RunWeb("record")
    web.start(hostile.sandbox)
    record = RunRecord(tmp_path / "runs", "run")
    began = time.monotonic()
    entry = web.finish(record, cancelled=lambda: True)
    took = time.monotonic() - began
    record.close()
    assert took < CANCELLED_BUDGET_S + 5, took  # not the 30 s a call may take, nor the 180 s of the reading
    assert entry.complete and entry.responses == 0 and entry.skipped == {"tunnel": 1, "unverified": 2}


@pytest.mark.parametrize("answer, needle", [
    (lambda: {**state(response()), "extra": 1}, "extra"),
    (lambda: {**state(response()), "skipped": {"because": 1}}, "skipped"),
    (lambda: {**state(response()), "skipped": {"tunnel": -5}}, "skipped"),
    (lambda: {**state(), "responses": [{**response().model_dump(mode="json"), "sha256": "../x"}]}, "sha256"),
    (lambda: b'{"mode": "record", "mode": "off"}', "not JSON"),
    (lambda: b"[" * 100_000, "not JSON"),
    (lambda: b" " * (9 * 1024 * 1024), "too_large"),
])
def test_a_malformed_answer_is_an_incomplete_recording_never_trusted(hostile, tmp_path, answer, needle):
    hostile.state = state()
    given = answer()
    if isinstance(given, bytes):
        hostile.raw = given
        web = RunWeb("record")
        web.start(hostile.sandbox)
    else:
        web = RunWeb("record")
        web.start(hostile.sandbox)
        hostile.state = given
    record = RunRecord(tmp_path / "runs", "run")
    web.finish(record)
    record.close()
    [entry] = [e for e in read_entries(record.path) if e.type == "web_recording"]
    assert entry.complete is False and needle in entry.error, entry.error
    assert not (record.dir / "web").exists()


def test_write_task_carries_the_recording_beside_the_task(tmp_path):
    from controller.commands.replay import write_task

    source = tmp_path / "orig.toml"
    source.write_text(TASK + '[offline]\nscript = "orig.jsonl"\n')
    script = tmp_path / "replay.jsonl"
    script.write_text('{"message": "done"}\n')
    replay = SimpleNamespace(task_source=source, record_dir=tmp_path / "runs" / "r")
    (tmp_path / "suite").mkdir()
    written = write_task(replay, script, tmp_path / "suite" / "again.toml", load_recording(recording(tmp_path)))
    task = load_task(written)
    assert task.offline_web_path() == tmp_path / "suite" / "again.web"
    assert load_recording(task.offline_web_path()).bodies == {hashlib.sha256(PAGE).hexdigest(): PAGE}
