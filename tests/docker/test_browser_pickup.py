"""The pickup booking with the SDK's structured browser tools, end to end in Docker
(``tasks/browser-pickup.toml``): the offline scripted model's ``browser_*`` function calls through the
SDK's ``BrowserToolset`` and ``ResponsesToolRunner``, the agent's chromium over its DevTools pipe, the
booking verified from the demo app's own database; every call a ``browser_call`` line in the record.
A script that books the wrong date fails on the check, not in the loop."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from controller.run.record import read_entries
from controller.run.runner import RunOptions, run_task
from controller.run.tasks import load_task

ROOT = Path(__file__).resolve().parents[2]
TASKS = ROOT / "tasks"

pytestmark = [pytest.mark.docker, pytest.mark.slow]


def test_browser_pickup_passes_with_browser_calls_only(task_sandbox, tmp_path):
    outcome = run_task(load_task(TASKS / "browser-pickup.toml"), task_sandbox,
                       RunOptions(runs_dir=tmp_path, live=False, terminal=False))
    entries = read_entries(outcome.record_dir)
    calls = [e for e in entries if e.type == "browser_call"]
    assert outcome.status == "passed", (outcome.reason, calls[-3:])
    assert [c["passed"] for c in outcome.checks] == [True]
    members = [c.member for c in calls]
    assert members[0] == "read_page" and "wait_for" in members and members[-1] == "get_page_text"
    assert [c.member for c in calls if c.member in ("type", "click")] == ["type", "type", "click", "type", "click"]
    assert all(c.ok for c in calls), [c for c in calls if not c.ok]
    assert not [e for e in entries if e.type == "computer_call"]  # no pixels were needed
    typed = json.dumps([c.as_json() for c in calls if c.member == "type"])
    assert "Ada Lovelace" not in typed and "2 boxes of books" not in typed  # typed text: its length only


def test_a_wrong_browser_script_fails_on_the_check(task_sandbox, tmp_path):
    text = (TASKS / "browser-pickup.offline.jsonl").read_text()
    wrong = text.replace('"2030-05-17"', '"2030-05-18"')
    assert wrong != text
    script = tmp_path / "wrong.jsonl"
    script.write_text(wrong)
    outcome = run_task(load_task(TASKS / "browser-pickup.toml"), task_sandbox,
                       RunOptions(runs_dir=tmp_path, live=False, terminal=False, script=script))
    assert outcome.status == "failed", outcome.reason
    [check] = outcome.checks
    assert not check["passed"] and "2030-05-18" in json.dumps(check["observed"])
