"""Recorded web origins in the commands (docs/replay.md): ``replay --write-task`` into a folder that does
not exist yet (made, as ``--runs-dir``, ``--json`` and ``--junit`` make theirs) or cannot be written
(refused, exit 2, before any sandbox starts), the written task serving its ``[offline] web`` and
recording nothing; ``run-suite`` verifying each task's ``[offline] web`` before anything starts; the
terminal line's counts before its folder; ``report`` (table, ``--json``, ``--html``) showing the
recording, every string escaped."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import typer
from PIL import Image
from rich.console import Console

from controller.commands.replay import replay_run, without_record_web
from controller.gateway.web import WebResponse
from controller.report import render_report
from controller.run.bus import follow_entries
from controller.run.progress import WIDTH, RunPrinter
from controller.run.record import RunRecord, summarize, summary_table
from controller.run.tasks import load_task
from controller.run.web import write_recording
from tests.controller.hostile_text import EVIL, RAW
from tests.controller.test_cli import _offline_cli, _refused
from tests.controller.test_report_html import Page

PAGE = b"<html>page v1</html>"
ORIGIN = "http://web.test:8080"

TASK = """name = "web-task"
instructions = "Fetch the page."

[[checks]]
kind = "file"
path = "~/page.txt"
match = "text"
value = "page v1"

[record]
typed_text = true
web = true   # keep the pages
video = false

[offline]
script = "orig.offline.jsonl"
"""


def recording(folder: Path) -> Path:
    """A web recording of one page in ``folder``."""
    sha = hashlib.sha256(PAGE).hexdigest()
    return write_recording(folder, [WebResponse.model_validate(
        {"method": "GET", "url": f"{ORIGIN}/page", "origin": ORIGIN, "address": "172.30.0.5", "status": 200,
         "headers": [("content-type", "text/html")], "sha256": sha, "bytes": len(PAGE)})], {sha: PAGE})


def recorded_run(tmp_path: Path) -> Path:
    """A finished record of one click on a screenshot, run from a task with ``[record] web = true``, its
    web recording beside it (``runs/<id>/web``)."""
    (tmp_path / "task").mkdir()
    source = tmp_path / "task" / "web-task.toml"
    source.write_text(TASK)
    (tmp_path / "task" / "orig.offline.jsonl").write_text(json.dumps({"message": "done"}) + "\n")
    rec = RunRecord(tmp_path / "runs", "run-web")
    rec.write("run_started", task={"name": "web-task", "source": str(source), "sha256": None},
              mode="offline", model="scripted", image="local", typed_text=True)
    shot = tmp_path / "shot.png"
    Image.new("RGB", (64, 40), (10, 120, 200)).save(shot)
    rec.save_screenshot(shot.read_bytes(), "image/png", image_size=(64, 40), frame=(0, 0, 64, 40),
                        screen_size=(64, 40))
    rec.write("model_response", response_id="resp_1", http_status=200)
    rec.write("computer_call", call_id="call_0000", form="actions",
              actions=[{"type": "click", "x": 5, "y": 6, "button": "left"}])
    rec.finish("passed", "done", final_message="done")
    rec.close()
    recording(rec.dir / "web")
    return rec.dir


class SandboxWouldStart(Exception):
    """Raised by :func:`opener`: the replay got as far as starting its sandbox."""


def opener(backend, image_tag, **options):  # noqa: ANN001, ANN201
    """The replay's sandbox opener, called once every input is checked: stops the replay there (a test
    double: what comes after is the run loop, which other tests run on real sandboxes)."""
    raise SandboxWouldStart()


def replay(tmp_path: Path, run: Path, write_task: Path) -> None:
    replay_run(run, image_tag=None, backend="docker", runs_dir=tmp_path / "replays", write_task_to=write_task,
               opener=opener, terminal=False, offline_web=True)


def test_write_task_into_a_folder_not_made_yet_makes_it_and_the_task_serves_without_recording(tmp_path):
    run = recorded_run(tmp_path)
    written = tmp_path / "suite" / "new" / "again.toml"
    with pytest.raises(SandboxWouldStart):
        replay(tmp_path, run, written)
    assert sorted(p.name for p in written.parent.iterdir()) == ["again.offline.jsonl", "again.toml", "again.web"]
    task = load_task(written)
    assert task.offline_web_path() == written.parent / "again.web"
    # served from its [offline] web, the written task records nothing; the rest of [record] as it was
    assert (task.record.web, task.record.typed_text, task.record.video) == (False, True, False)
    text = written.read_text()
    assert "keep the pages" not in text and 'script = "again.offline.jsonl"' in text
    assert "orig.offline.jsonl" not in text


@pytest.mark.parametrize("stem", ['quote"d', "back\\slash", "new\nline", "del\x7f"])
def test_write_task_names_its_files_in_toml_strings_whatever_the_name_holds(tmp_path, stem):
    """A task file named with a quote, a backslash, a line break or DEL is still one valid task naming its
    own script and recording (the names are TOML strings, the comment lines stay comments)."""
    run = recorded_run(tmp_path)
    written = tmp_path / "suite" / f"{stem}.toml"
    with pytest.raises(SandboxWouldStart):
        replay(tmp_path, run, written)
    task = load_task(written)
    assert task.offline_web_path() == written.parent / f"{stem}.web"
    assert task.offline.script == f"{stem}.offline.jsonl"


@pytest.mark.parametrize("where", ["a folder", "under a file"])
def test_write_task_where_no_task_can_be_written_is_refused_before_any_sandbox_starts(tmp_path, capsys, where):
    run = recorded_run(tmp_path)
    if where == "a folder":
        written = tmp_path / "suite"
        written.mkdir()
    else:
        (tmp_path / "plain-file").write_text("x")
        written = tmp_path / "plain-file" / "again.toml"
    with pytest.raises(typer.Exit) as done:
        replay(tmp_path, run, written)
    assert done.value.exit_code == 2
    said = capsys.readouterr().err
    assert f"--write-task {written}" in said and "Traceback" not in said, said
    assert ("name the task file" if where == "a folder" else "cannot write the task file in the folder") in said


@pytest.mark.parametrize("text, kept", [
    ('[record]\nweb = true\n', '[record]\n'),
    ('[record]\ntyped_text = true\n"web" = true # why\nvideo = true\n\n[[checks]]\nweb = 1\n',
     '[record]\ntyped_text = true\nvideo = true\n\n[[checks]]\nweb = 1\n'),
    ('[ record ]  # the run\n  web=false\n[network]\nweb = "x"\n', '[ record ]  # the run\n[network]\nweb = "x"\n'),
    ('[network]\nmode = "deny-all"\n', '[network]\nmode = "deny-all"\n'),
])
def test_only_the_record_tables_web_key_is_dropped(text, kept):
    assert without_record_web(text) == kept


def test_run_suite_refuses_a_task_whose_web_recording_does_not_verify_before_anything_starts(tmp_path):
    folder = tmp_path / "suite"
    folder.mkdir()
    (folder / "t.offline.jsonl").write_text(json.dumps({"message": "done"}) + "\n")
    (folder / "t.toml").write_text(TASK.replace("orig.offline.jsonl", "t.offline.jsonl") + 'web = "t.web"\n')
    body = recording(folder / "t.web") / hashlib.sha256(PAGE).hexdigest()
    body.write_bytes(PAGE.replace(b"v1", b"v9"))
    out = _offline_cli("run-suite", str(folder), "--offline", "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path)
    _refused(out, f"cannot use task {folder / 't.toml'}", "[offline] web", "hash_mismatch")
    assert not (tmp_path / "runs").exists()
    body.unlink()
    (folder / "t.web" / "index.jsonl").unlink()
    (folder / "t.web").rmdir()
    out = _offline_cli("run-suite", str(folder), "--offline", "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path)
    _refused(out, "[offline] web", "no web recording folder there")


SERVED = {"mode": "serve", "source": "/very/long/" + "path/" * 30 + "web", "origins": [ORIGIN], "responses": 2,
          "bytes": 12 * 1024, "served": 3, "missing": 1, "complete": True}


def test_the_terminal_line_keeps_the_counts_and_cuts_the_folder(tmp_path):
    console = Console(record=True, width=200, force_terminal=False)
    rec = RunRecord(tmp_path, "r")
    follow_entries(rec.bus, RunPrinter(console), name="terminal")
    rec.write("web_recording", **SERVED)
    rec.write("web_recording", mode="record", dir="web", origins=[ORIGIN], responses=3, bytes=2048,
              skipped={"tunnel": 2, "too_large": 1}, complete=False, error="x" * 300)
    rec.close()
    served, kept = console.export_text().splitlines()
    assert served.startswith("web served 3 answers, denied 1 not in it (holds 2 responses, 12 KiB); from /very/long"), \
        served
    assert len(served) <= WIDTH and served.endswith("…")
    assert kept.startswith("web kept 3 responses of 1 origin(s) (2 KiB); not kept: too_large 1, tunnel 2; "
                           "incomplete: xxx"), kept


def hostile_run(tmp_path: Path) -> RunRecord:
    """A finished record whose ``web_recording`` line has hostile text in every string a page or a
    tampered record could put there."""
    rec = RunRecord(tmp_path, "run-web")
    rec.write("run_started", task={"name": "t"}, mode="offline", model="scripted", image="local")
    rec.write("web_recording", mode="serve", source=f"/recordings/{EVIL}<script>", origins=[f"{ORIGIN}{EVIL}"],
              responses=2, bytes=4096, served=3, missing=1, skipped={f"<b>{EVIL}": 4, "tunnel": 2},
              complete=False, error=f"gateway said {EVIL}<script>")
    rec.finish("passed", "done")
    rec.close()
    return rec


def test_report_shows_the_web_recording_as_the_video_is_shown_escaped(tmp_path):
    rec = hostile_run(tmp_path)
    web = summarize(json.loads(line) for line in rec.path.read_text().splitlines())["web"]
    assert (web["mode"], web["served"], web["missing"], web["responses"], web["bytes"]) == ("serve", 3, 1, 2, 4096)
    console = Console(record=True, width=200, force_terminal=False, emoji=False)
    console.print(summary_table(json.loads(line) for line in rec.path.read_text().splitlines()))
    table = console.export_text()
    assert "web (serve)" in table and "served 3 answers, denied 1 not in it (holds 2 responses, 4 KiB)" in table
    assert not [c for c in RAW if c in table], table

    out = _offline_cli("report", str(rec.dir), "--json", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["web"]["skipped"] == {f"<b>{EVIL}": 4, "tunnel": 2}

    page = Page(html := render_report(rec.dir))
    (section,) = page.find("section", id="web")
    shown = " ".join(section["text"].split())
    assert "Mode serve" in shown and "3 answers served" in shown and "1 request(s) not in it denied" in shown
    assert "it holds 2 responses, 4096 bytes" in shown and "tunnel 2" in shown and "Incomplete: gateway said" in shown
    assert "<script" not in html and "&lt;b&gt;:warning:" in html
    assert not [c for c in RAW if c in html]
