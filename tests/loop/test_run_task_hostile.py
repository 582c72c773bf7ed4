"""run_task with bad input on a local desktop (Xvfb + the real agent, no window manager): whatever goes
wrong, the record is complete (run_started ... run_finished), the sandbox is torn down, typed text
never enters the record, and only a task whose checks all passed counts as passed."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from controller.run.record import read_entries
from controller.run.runner import RunOptions, run_task
from controller.run.tasks import FileCheck, Launch, Task
from tests.loop.local_sandbox import LocalSandbox

SECRET = "s3cret-Passw0rd"


def _task(**update) -> Task:
    base = Task(name="hostile", instructions="x",
                checks=[FileCheck(kind="file", path="~/Documents/seed.txt", match="text", value="seed")])
    return base.model_copy(update=update)


def _script(tmp_path: Path, *turns: dict) -> Path:
    path = tmp_path / "script.jsonl"
    path.write_text("".join(json.dumps(t) + "\n" for t in turns))
    return path


def _run(tmp_path: Path, task: Task, script: Path, **options):
    with LocalSandbox() as sb:
        (sb.home / "Documents/seed.txt").write_text("seed\n")
        asker = options.pop("asker", None)
        outcome = run_task(task, lambda t: sb, RunOptions(runs_dir=tmp_path / "runs", live=False, script=script,
                                                          **options), asker=asker)
        agent_pid = sb.agent_proc.proc.pid if sb.agent_proc else None
    entries = read_entries(outcome.record_dir)
    assert entries[0].type == "run_started" and entries[-1].type == "run_finished"
    assert entries[-1].status == outcome.status
    assert sb.agent_proc is None and sb._agent is None  # closed by the runner
    if agent_pid is not None:
        with pytest.raises(ProcessLookupError):
            os.kill(agent_pid, 0)
    return outcome, entries


def test_launch_of_an_app_outside_the_allowlist_is_an_error_with_a_complete_record(tmp_path):
    task = _task(launch=[Launch(app="rm", args=["-rf", "/"])])
    script = _script(tmp_path, {"message": "done"})
    outcome, entries = _run(tmp_path, task, script)
    assert outcome.status == "error" and outcome.exit_code == 1
    assert "rm" in outcome.reason and "400" in outcome.reason, outcome.reason
    assert [e for e in entries if e.type == "model_response"] == []  # the model was never asked


def test_a_task_without_checks_never_passes(tmp_path):
    task = Task.model_construct(**{**_task().__dict__, "checks": []})  # bypasses the loader's refusal
    outcome, entries = _run(tmp_path, task, _script(tmp_path, {"message": "done"}))
    assert outcome.status == "failed" and "no checks" in outcome.reason
    assert outcome.exit_code == 1


def test_point_outside_the_model_image_stops_the_run_and_names_the_model_size(tmp_path):
    script = _script(tmp_path, {"actions": [{"type": "move", "x": 10, "y": 10},
                                            {"type": "click", "x": 1280, "y": 5, "button": "left"}]},
                     {"message": "done"})
    outcome, entries = _run(tmp_path, _task(), script)
    assert outcome.status == "error" and "1280x800 model image" in outcome.reason, outcome.reason
    actions = [e for e in entries if e.type == "action"]
    assert [a.action for a in actions] == ["move", "click"]
    assert actions[0].error is None and "outside the 1280x800" in actions[1].error
    assert [c.passed for c in entries if c.type == "check"] == [True]  # verification still ran


def test_a_script_that_never_answers_stops_at_max_steps(tmp_path):
    script = _script(tmp_path, *[{"actions": [{"type": "wait"}]}] * 5)
    outcome, entries = _run(tmp_path, _task(max_steps=3), script)
    assert outcome.status == "error" and "max_steps" in outcome.reason, outcome.reason
    assert len([e for e in entries if e.type == "model_response"]) == 3


def test_typed_text_never_enters_the_record_nor_the_unattended_approval_display(tmp_path, capsys):
    script = _script(
        tmp_path,
        {"actions": [{"type": "type", "text": SECRET}]},
        {"actions": [{"type": "click", "x": 5, "y": 5, "button": "left"}, {"type": "type", "text": SECRET}],
         "pending_safety_checks": [{"id": "sc_1", "code": "sensitive_action", "message": "Sign-in."}]},
        {"message": "done"},
    )
    outcome, entries = _run(tmp_path, _task(), script)
    assert outcome.status == "failed" and "approv" in outcome.reason  # nobody to ask: denied
    calls = [e for e in entries if e.type == "computer_call"]
    assert calls[0].actions == [{"type": "type", "text_length": len(SECRET)}]
    record_text = (outcome.record_dir / "record.jsonl").read_text()
    assert SECRET not in record_text
    shown = capsys.readouterr()
    assert SECRET not in shown.out + shown.err
    assert f"type <{len(SECRET)} chars>" in shown.out + shown.err  # the display says that text would be typed


def test_typed_text_is_shown_to_a_person_who_is_asked(tmp_path):
    asked: list[str] = []

    def asker(question: str) -> str:
        asked.append(question)
        return "n"

    script = _script(tmp_path, {"actions": [{"type": "type", "text": SECRET}]}, {"message": "done"})
    outcome, entries = _run(tmp_path, _task(), script, asker=asker, confirm_actions=["type"])
    assert outcome.status == "failed" and asked and SECRET in asked[0]
    assert SECRET not in (outcome.record_dir / "record.jsonl").read_text()


def test_markup_in_the_model_message_and_guest_files_cannot_break_the_run(tmp_path):
    """A final message or an observed file holding console markup ('[/]' makes rich raise) is text."""
    task = _task(checks=[FileCheck(kind="file", path="~/Documents/seed.txt", match="text", value="seed"),
                         FileCheck(kind="file", path="~/Documents/markup.txt", match="text", value="x")])
    script = _script(tmp_path, {"message": "[/] done [link=https://evil.test]x[/link]"})
    with LocalSandbox() as sb:
        (sb.home / "Documents/seed.txt").write_text("seed\n")
        (sb.home / "Documents/markup.txt").write_text("[/bold] [/]\n")
        outcome = run_task(task, lambda t: sb, RunOptions(runs_dir=tmp_path / "runs", live=False, terminal=False,
                                                          script=script))
    assert outcome.status == "failed" and outcome.reason == "1 of 2 checks failed", outcome.reason
    assert outcome.final_message.startswith("[/] done")
    assert read_entries(outcome.record_dir)[-1].type == "run_finished"


class _HostileSandbox(LocalSandbox):
    """A local desktop whose gateway log holds hostile decisions and whose teardown fails quoting a
    container's output, as a backend's would."""

    def decision_log(self) -> list[dict]:
        from tests.controller.hostile_text import EVIL

        return [{"ts": "2030-01-01T00:00:00+00:00", "origin": EVIL, "decision": "deny", "reason": EVIL}]

    failed_once = False

    def close(self) -> None:
        from tests.controller.hostile_text import EVIL

        super().close()
        if not self.failed_once:  # the runner's teardown fails; the test's own exit does not
            self.failed_once = True
            raise RuntimeError("gateway exited; last output:\n" + EVIL)


@pytest.mark.parametrize("last", ["message", "agent_error"])
def test_no_text_from_the_model_the_guest_or_the_gateway_reaches_the_console_raw(tmp_path, last):
    """One run, every source of hostile text at once: the model (safety-check code and message, key
    names, its final message), the guest (a file's content in a check, the agent's refusal of a key),
    the gateway's log (origin, reason) and a teardown error quoting a container's output. The console
    (rich's defaults: emoji codes on) shows none of it raw; the summary table follows the same rule."""
    import io

    from rich.console import Console

    from tests.controller.hostile_text import EVIL, assert_shown_safely
    from wire.actions import MAX_KEY_NAME_CHARS

    turns = [{"actions": [{"type": "click", "x": 5, "y": 5, "button": "left"}],
              "pending_safety_checks": [{"id": "sc_1", "code": EVIL, "message": EVIL}]}]
    if last == "message":
        turns.append({"message": EVIL})
    else:
        # a key name as long as the schema takes, holding both ends of EVIL (the guest refuses it: unknown_key)
        turns.append({"actions": [{"type": "keypress", "keys": [EVIL[:MAX_KEY_NAME_CHARS - 16] + EVIL[-16:]]}]})
    task = _task(checks=[FileCheck(kind="file", path="~/Documents/page.txt", match="text", value="x")])
    out = io.StringIO()
    with _HostileSandbox() as sb:
        (sb.home / "Documents/page.txt").write_text(EVIL)
        outcome = run_task(task, lambda t: sb, RunOptions(runs_dir=tmp_path / "runs", live=False, terminal=False,
                                                          approve_codes=[EVIL], script=_script(tmp_path, *turns)),
                           console=Console(file=out, width=400, force_terminal=False))
    shown = out.getvalue()
    assert outcome.status in ("failed", "error") and "teardown: gateway exited" in shown, shown
    assert "network deny :warning:" in shown and "approved by opt-in" in shown
    if last == "agent_error":
        assert "keypress :warning:" in shown and "unknown_key" in shown, shown
    for line in shown.splitlines():
        assert not any(c in line for c in ("\x1b", "\x07", "\x08", "\r", "\u202e", "\u2066", "\u200b", "\u26a0")), line
    assert_shown_safely(shown)
