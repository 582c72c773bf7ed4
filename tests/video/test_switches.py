"""Where a video is asked for: ``--video`` on run-task, run-suite (each run's command line) and replay, a
task's ``[record] video = true``, ``RunOptions.video``; none by default. The run ends with the ``video``
entry whatever happened first (here: a sandbox that never started)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from controller.cli import app
from controller.run.record import read_entries
from controller.run.runner import Run, RunOptions, run_task
from controller.run.tasks import TaskError, load_task
from controller.run.video import VideoSettings
from controller.suite import PlannedRun, SuiteOptions, run_command

ROOT = Path(__file__).resolve().parents[2]


def _task(tmp_path: Path, record: str) -> Path:
    text = (ROOT / "tasks" / "pickup.toml").read_text(encoding="utf-8").replace(
        'script = "pickup.offline.jsonl"', f'script = "{ROOT / "tasks" / "pickup.offline.jsonl"}"')
    path = tmp_path / "task.toml"
    path.write_text(text + record, encoding="utf-8")
    return path


@pytest.mark.parametrize("command", ["run-task", "run-suite", "replay"])
def test_the_commands_take_video(command):
    result = CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0 and "--video" in result.output


def test_each_run_of_a_suite_with_video_is_run_task_with_video():
    planned = PlannedRun(0, "pickup", Path("/t/pickup.toml"), 1)
    assert run_command(planned, SuiteOptions(video=True, cli=["ds"]))[-1] == "--video"
    assert "--video" not in run_command(planned, SuiteOptions(cli=["ds"]))


def test_a_task_asks_for_a_video_in_its_record_table(tmp_path):
    assert load_task(_task(tmp_path, "\n[record]\nvideo = true\n")).record.video is True
    assert load_task(ROOT / "tasks" / "pickup.toml").record.video is False
    with pytest.raises(TaskError, match="video"):
        load_task(_task(tmp_path, '\n[record]\nvideo = "yes"\n'))


def test_which_settings_a_run_takes(tmp_path):
    plain, asked = load_task(ROOT / "tasks" / "pickup.toml"), load_task(_task(tmp_path, "\n[record]\nvideo = true\n"))
    mine = VideoSettings(fps=5, max_edge=640)
    taken = []
    for task, options in ((plain, RunOptions(runs_dir=tmp_path / "a")), (asked, RunOptions(runs_dir=tmp_path / "b")),
                          (plain, RunOptions(runs_dir=tmp_path / "c", video=mine))):
        run = Run(task, options)
        taken.append(run.video_settings)
        run.record.close()
    assert taken[0] is None and taken[1] == VideoSettings() and taken[2] is mine


def test_a_run_whose_sandbox_never_started_says_why_it_has_no_video(tmp_path):
    def no_sandbox(_task):
        raise RuntimeError("no engine here")

    outcome = run_task(load_task(ROOT / "tasks" / "pickup.toml"), no_sandbox,
                       RunOptions(runs_dir=tmp_path, live=False, terminal=False, video=VideoSettings()))
    entries = read_entries(outcome.record_dir)
    assert outcome.status == "error" and [e.type for e in entries][-2:] == ["video", "run_finished"]
    assert entries[-2].file is None and entries[-2].error == "the run ended before its sandbox was up"
    assert not (outcome.record_dir / "run.webm").exists()
