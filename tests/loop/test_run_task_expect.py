"""Screen expectations through a whole run on a local desktop (Xvfb + the real agent + xterm, no window
manager): the real SDK loop against the scripted server, the runner, the record, the console and the
summary. The terminal shows a red bar only a while after the script typed into it, so the scripted
model has to wait for it; when what it expects never comes, the run ends ``failed`` with the unmet
expectation in the record."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import pytest
from rich.console import Console

from controller.run.record import read_entries, summarize, summary_table
from controller.run.runner import RunOptions, run_task
from controller.run.tasks import FileCheck, Launch, Task
from tests.loop.local_sandbox import LocalSandbox

pytestmark = pytest.mark.skipif(not shutil.which("xterm"), reason="xterm is needed (apt-get install xterm)")

# xterm at (0,0) with its default font: once it reads a line, it waits 2 s, then prints a red bar
# (8 cells with a red background) on its second line, x 3..50, y 16..28 (screen px = model px here).
TERMINAL = Launch(app="terminal", args=["-e", "sh", "-c", r"read x; sleep 2; printf '\033[41m        \033[0m\n'; "
                                                           "sleep 600"])
WHITE_TERMINAL = {"kind": "color", "x": 100, "y": 100, "w": 200, "h": 100, "rgb": "#ffffff", "tolerance": 0}
RED_BAR = {"kind": "color", "x": 6, "y": 18, "w": 40, "h": 8, "rgb": "#cd0000", "tolerance": 24}
BAR_CHANGED = {"kind": "changed", "x": 6, "y": 18, "w": 40, "h": 8, "fraction": 0.9}


def _run(tmp_path: Path, *turns: dict):
    script = tmp_path / "script.jsonl"
    script.write_text("".join(json.dumps(t) + "\n" for t in turns))
    task = Task(name="expect", instructions="wait for the red bar", max_steps=5, launch=[TERMINAL],
                checks=[FileCheck(kind="file", path="~/Documents/seed.txt", match="text", value="seed")])
    out = io.StringIO()
    console = Console(file=out, width=200, force_terminal=False)
    with LocalSandbox() as sb:
        (sb.home / "Documents/seed.txt").write_text("seed\n")
        outcome = run_task(task, lambda t: sb, RunOptions(runs_dir=tmp_path / "runs", live=False, terminal=False,
                                                          script=script), console=console)
    return outcome, read_entries(outcome.record_dir), out.getvalue()


TYPE_GO = {"expect": [WHITE_TERMINAL],
           "actions": [{"type": "move", "x": 100, "y": 100}, {"type": "type", "text": "go\n"}]}


@pytest.mark.slow
def test_the_scripted_model_waits_until_the_screen_shows_what_the_turn_expects(tmp_path):
    outcome, entries, console = _run(tmp_path, TYPE_GO, {"expect": [RED_BAR, BAR_CHANGED], "message": "seen"})
    assert outcome.status == "passed", (outcome.reason, console)
    assert outcome.final_message == "seen"
    calls = [e for e in entries if e.type == "computer_call"]
    waits = [c for c in calls if c.call_id.startswith("call_0001_wait_")]
    # the bar comes 2 s after the typing: the screenshot after it cannot show it yet, so the model waited
    assert waits and all(c.actions == [{"type": "wait"}] and c.pending_checks == [] for c in waits)
    assert [c.call_id for c in calls] == ["call_0000"] + [f"call_0001_wait_{n:03d}" for n in
                                                             range(1, len(waits) + 1)]
    expectations = [e for e in entries if e.type == "expectation"]
    assert [(e.turn, e.met, e.waits) for e in expectations] == [(0, True, 0), (1, True, len(waits))]
    assert expectations[1].waited_s > 0 and len(expectations[1].expected) == 2
    # the task's max_steps (5) counts script turns: the waits did not use it up
    s = summarize(entries)
    assert s["steps"] == 2 + len(waits) and s["expectation_waits"] == len(waits)
    assert (s["expectations_met"], s["expectations_unmet"]) == (2, 0)
    assert f"screen: turn 1: 2 expectations met after {len(waits)} wait" in console
    # the screenshot the message turn was answered on shows the bar
    shots = [e for e in entries if e.type == "screenshot"]
    assert len(shots) == 2 + len(waits)


@pytest.mark.slow
def test_past_the_deadline_the_run_fails_with_the_unmet_expectation_in_the_record(tmp_path):
    green = {**RED_BAR, "rgb": "#00cd00"}  # never shown
    outcome, entries, console = _run(tmp_path, TYPE_GO,
                                     {"expect": [RED_BAR, green], "expect_timeout_s": 4,
                                      "actions": [{"type": "type", "text": "never typed"}]},
                                     {"message": "never said"})
    assert outcome.status == "failed" and outcome.exit_code == 1, outcome.reason
    assert outcome.reason.startswith("screen expectation unmet at turn 1 (deadline of 4s passed): color #00cd00")
    (failure,) = [e for e in entries if e.type == "expectation" and not e.met]
    assert failure.turn == 1 and failure.timeout_s == 4 and failure.waited_s >= 4
    assert failure.waits >= 2  # waited until the bar came (red held), and on for green
    (unmet,) = failure.unmet
    assert unmet.index == 1 and unmet.expectation["rgb"] == "#00cd00"
    assert unmet.expected == "color #00cd00 +-24 in >=90% of 40x8 at (6,18)"
    assert unmet.observed.startswith("0.0% within 24 of #00cd00 (most common #cd0000")
    # the scripted turn's actions never ran, the checks still did, and the record ends failed
    actions = [e for e in entries if e.type == "computer_call" and e.call_id == "call_0001"]
    assert actions == []
    assert [e.passed for e in entries if e.type == "check"] == [True]
    assert entries[-1].status == "failed" and entries[-1].reason == outcome.reason
    assert "screen expectation unmet: turn 1: deadline of 4s passed: expect[1] color #00cd00" in console
    s = summarize(entries)
    assert s["expectations_unmet"] == 1 and s["expectations_unmet_detail"][0]["unmet"][0]["index"] == 1
    table = Console(file=io.StringIO(), width=300, record=True)
    table.print(summary_table(entries))
    text = table.export_text()
    assert "1 turn met, 1 unmet" in text and "waits inserted)" in text
    assert "unmet turn 1: deadline of 4s passed: expect[1] color #00cd00" in text
