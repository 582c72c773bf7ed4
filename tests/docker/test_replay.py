"""``desktop-sandbox replay`` end to end in Docker: a recorded offline pickup run replays step by step on a
fresh sandbox (every step matched, the checks passed, exit 0) and as a task file of its own
(``--write-task``); the same record replayed against a changed page (the form drawn 80 px lower) diverges
at its first step with both crops in the HTML report and exits 1; a run in which a person took over and
typed replays the person's actions as such (``human_action`` lines ``by: replay``) and passes."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from controller.run.record import read_entries
from controller.run.runner import RunOptions, run_task, watching
from controller.run.tasks import load_task

ROOT = Path(__file__).resolve().parents[2]
TASKS = ROOT / "tasks"

pytestmark = [pytest.mark.docker, pytest.mark.slow]


def replay(record_dir: Path, desktop_image: str, runs: Path, *extra: str) -> subprocess.CompletedProcess:
    """The real command line; no API key in its environment."""
    env = {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY",)}
    env.update(PYTHONPATH=str(ROOT), COLUMNS="200")
    return subprocess.run([sys.executable, "-m", "controller.cli", "replay", str(record_dir), "--image", desktop_image,
                           "--runs-dir", str(runs), *extra], cwd=ROOT, env=env, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=300)


def rows(output: str) -> list[str]:
    """The state column of the per-step table, in order."""
    found = []
    for line in output.splitlines():
        cells = [c.strip() for c in line.split("│") if c.strip()]
        if len(cells) >= 3 and cells[0].isdigit() and cells[2] in ("matched", "diverged", "not reached"):
            found.append(cells[2])
    return found


def task_copy(tmp_path: Path) -> Path:
    """tasks/pickup.toml and its script copied under ``tmp_path`` (so a test may change the task later)."""
    folder = tmp_path / "task"
    folder.mkdir()
    shutil.copy(TASKS / "pickup.toml", folder / "pickup.toml")
    shutil.copy(TASKS / "pickup.offline.jsonl", folder / "pickup.offline.jsonl")
    return folder / "pickup.toml"


def test_a_recorded_pickup_run_replays_step_by_step(task_sandbox, desktop_image, tmp_path):
    outcome = run_task(load_task(TASKS / "pickup.toml"), task_sandbox,
                       RunOptions(runs_dir=tmp_path / "recorded", live=False, terminal=False))
    assert outcome.status == "passed", outcome.reason
    written = tmp_path / "suite" / "pickup-replay.toml"
    written.parent.mkdir()
    done = replay(outcome.record_dir, desktop_image, tmp_path / "replays", "--write-task", str(written))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert rows(done.stdout + done.stderr) == ["matched"] * 6, done.stdout[-3000:]
    assert "6 of 6 steps matched; checks: 3 of 3 passed; run passed" in done.stderr
    # the replay's record: each step waited for the recorded screen (a matches expectation per region)
    record = Path(done.stdout.strip().splitlines()[-1])
    entries = read_entries(record)
    expectations = [e for e in entries if e.type == "expectation"]
    assert len(expectations) == 7 and all(e.met for e in expectations)
    assert all(any("matches the recorded screen" in x for x in e.expected) for e in expectations[:6])
    # and the closing message waited for what the script's closing turn waited for (cat has printed)
    assert not any("matches the recorded screen" in x for x in expectations[6].expected)
    # the task file it wrote loads, with its own offline script beside it
    task = load_task(written)
    assert task.offline_script_path() == written.parent / "pickup-replay.offline.jsonl"
    from controller.offline.script import load_script

    assert len(load_script(task.offline_script_path())) == 7


def test_a_changed_page_diverges_at_the_first_step_with_both_crops(task_sandbox, desktop_image, tmp_path):
    task_file = task_copy(tmp_path)
    outcome = run_task(load_task(task_file), task_sandbox,
                       RunOptions(runs_dir=tmp_path / "recorded", live=False, terminal=False))
    assert outcome.status == "passed", outcome.reason
    # the page changes: the form is drawn 80 px lower than when the run was recorded
    text = task_file.read_text()
    changed = text.replace('args = ["http://127.0.0.1:8080/"]', 'args = ["http://127.0.0.1:8080/?shift=80"]')
    assert changed != text
    task_file.write_text(changed)
    done = replay(outcome.record_dir, desktop_image, tmp_path / "replays", "--step-timeout", "3")
    output = done.stdout + done.stderr
    assert done.returncode == 1, output[-3000:]
    assert "changed since the run was recorded" in done.stderr
    assert rows(output) == ["diverged"] + ["not reached"] * 5, output[-3000:]
    record = Path(done.stdout.strip().splitlines()[-1])
    [exp] = [e for e in read_entries(record) if e.type == "expectation"]
    assert not exp.met and "matches" in [u.kind for u in exp.unmet]
    assert exp.timeout_s < 30, exp  # the step gave up after --step-timeout (times the slowness factor)
    report = subprocess.run([sys.executable, "-m", "controller.cli", "report", str(record.parent), "--html"],
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    page = Path(report.stdout.strip().splitlines()[-1]).read_text()
    assert 'alt="recorded region' in page and 'alt="replayed region' in page


TAKEOVER_TASK = r"""
name = "takeover-replay"
instructions = "Focus the terminal."
max_steps = 4

[[launch]]
app = "terminal"
args = ["-T", "Terminal", "-fa", "DejaVu Sans Mono", "-fs", "11",
        "-e", "bash", "-c", 'mkdir -p ~/.cache && touch ~/.cache/terminal-ready && cd && exec env PS1="sandbox:\w\$ " bash --norc -i']

[[ready]]
file = "~/.cache/terminal-ready"
timeout_s = 60

[network]
mode = "deny-all"

[record]
typed_text = true

[[checks]]
kind = "file"
path = "~/Documents/human.txt"
match = "text"
value = "typed by a person"

[offline]
script = "takeover.offline.jsonl"
"""

TAKEOVER_SCRIPT = (
    '{"expect": [{"kind": "not_color", "x": 3, "y": 603, "w": 150, "h": 16, "rgb": "#ffffff", "tolerance": 48, '
    '"fraction": 0.1}], "actions": [{"type": "click", "x": 640, "y": 590, "button": "left"}]}\n'
    '{"expect": [{"kind": "color", "x": 3, "y": 603, "w": 150, "h": 16, "rgb": "#00cd00", "tolerance": 60, '
    '"fraction": 0.3}], "message": "the terminal has the focus"}\n')
"""The model's second turn waits until the person's command has run: it ends by painting the terminal
green (\\e[42m, then clear), so the checks never race the shell."""


def test_a_takeover_replays_the_persons_actions(task_sandbox, desktop_image, tmp_path):
    folder = tmp_path / "task"
    folder.mkdir()
    (folder / "takeover.toml").write_text(TAKEOVER_TASK)
    (folder / "takeover.offline.jsonl").write_text(TAKEOVER_SCRIPT)
    command = "mkdir -p ~/Documents && echo typed by a person > ~/Documents/human.txt && printf '\\e[42m' && clear\n"
    problems: list[str] = []

    def person(view) -> None:
        """The console's take-over, as a person would use it: the model stops at its first step's
        screenshot, the person types a command in the focused terminal, then hands back."""
        try:
            deadline = time.monotonic() + 120
            while view.state != "human":
                if time.monotonic() > deadline or view.state == "finished":
                    problems.append(f"the run never paused for the person (state {view.state})")
                    return
                time.sleep(0.05)
            view.human_action({"type": "type", "text": command})
            view.resume()
        except Exception as exc:  # noqa: BLE001 - reported by the test
            problems.append(f"{type(exc).__name__}: {exc}")

    def on_live(view) -> None:
        view.take_over()
        threading.Thread(target=person, args=(view,), daemon=True).start()

    outcome = run_task(load_task(folder / "takeover.toml"), task_sandbox,
                       RunOptions(runs_dir=tmp_path / "recorded", live=False, terminal=False), views=[watching(on_live)])
    assert not problems, problems
    assert outcome.status == "passed", outcome.reason
    recorded = read_entries(outcome.record_dir)
    [typed] = [e for e in recorded if e.type == "human_action"]
    assert typed.input == {"type": "type", "text_length": len(command), "text": command}
    done = replay(outcome.record_dir, desktop_image, tmp_path / "replays")
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-3000:]
    assert "(1 actions of a person)" in done.stderr and rows(output) == ["matched"]
    entries = read_entries(Path(done.stdout.strip().splitlines()[-1]))
    kinds = [(e.type, getattr(e, "control", None) or e.by) for e in entries if e.type in ("takeover", "human_action")]
    assert kinds == [("takeover", "human"), ("human_action", "replay"), ("takeover", "model")]
    # ... between the step's actions and its screenshot
    order = [e.type for e in entries if e.type in ("computer_call", "takeover", "screenshot")]
    assert order[order.index("computer_call"):][:4] == ["computer_call", "takeover", "takeover", "screenshot"]


def test_a_record_without_typed_text_is_refused_before_anything_starts(tmp_path):
    """A live-shaped record (a model's call with typed text, not an offline script's): refused, exit 2,
    saying how to record one that replays."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "record.jsonl").write_text(
        '{"ts": "2026-01-01T00:00:00.000+00:00", "type": "run_started", "format": 6, "task": {"name": "t", '
        f'"source": "{TASKS / "pickup.toml"}", "sha256": null}}, "mode": "live"}}\n'
        '{"ts": "2026-01-01T00:00:01.000+00:00", "type": "computer_call", "call_id": "call_x", "form": "actions", '
        '"actions": [{"type": "type", "text_length": 5}], "pending_checks": []}\n')
    done = subprocess.run([sys.executable, "-m", "controller.cli", "replay", str(run), "--runs-dir", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "--record-typed-text" in done.stderr, done.stderr
