"""What a replay keeps of the recorded run's questions and answers (controller.run.replay): a call that
carried pending safety checks is replayed with the same checks; what the recorded run was refused -- a
safety check (denied, timed out, made void by the screen, unanswered, withdrawn), a confirmation of an
action, an origin request, a sign-in request -- is refused again as the question opens, before a person
or an opt-in code is asked, through the real approval registry and the run's real approval callbacks;
what it was granted is asked again as in any run. A replay's summary shows steps replayed, not model
figures. Records are written with the record's own writer; the terminal's person is an ``Asker`` (a
callable answering yes) that notes being asked."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from openai.types.responses import ResponseComputerToolCall
from PIL import Image
from rich.console import Console

from controller.run.approvals import ActionGate, SafetyCheckApprover
from controller.run.entries import ComputerCall
from controller.run.record import RunRecord, read_entries, summarize, summary_table
from controller.run.registry import ApprovalRegistry
from controller.run.replay import BY_REPLAY, ReplayAnswers, ReplayError, build

ROOT = Path(__file__).resolve().parents[2]
CHECK = {"id": "sc_1", "code": "sensitive_action", "message": "The model wants to write a file."}


def png() -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (64, 40), (10, 120, 200)).save(out, "PNG")
    return out.getvalue()


def record(tmp_path: Path, lines: list[tuple[str, dict[str, Any]]], task: str = "approval-demo.toml",
           status: str = "failed", runner: str | None = None) -> Path:
    """A finished record: a screenshot, then ``lines`` (``("call", fields)`` writes a model response and
    a computer call with those fields; any other type is written as given), then ``run_finished``."""
    rec = RunRecord(tmp_path / "runs", f"run-{len(list((tmp_path).glob('runs/*')))}")
    rec.write("run_started", task={"name": "t", "source": str(ROOT / "tasks" / task), "sha256": None},
              mode="live", model="m", image="local", typed_text=True, runner=runner)
    rec.save_screenshot(png(), "image/png", image_size=(64, 40), frame=(0, 0, 64, 40), screen_size=(64, 40))
    for kind, fields in lines:
        if kind == "call":
            rec.write("model_response", response_id=f"resp_{fields['call_id']}", http_status=200)
            rec.write("computer_call", form="actions", **fields)
        else:
            rec.write(kind, **fields)
    rec.finish(status, "as recorded", final_message=None)
    rec.close()
    return rec.dir


def click(call_id: str, checks: list[dict[str, Any]] = ()) -> tuple[str, dict[str, Any]]:
    return "call", {"call_id": call_id, "actions": [{"type": "click", "x": 5, "y": 6, "button": "left"}],
                    "pending_checks": list(checks)}


def safety(decision: str, by: str, call_id: str = "call_b", message: str | None = None) -> tuple[str, dict[str, Any]]:
    return "approval", {"what": "safety_check", "decision": decision, "by": by, "call_id": call_id,
                        "codes": ["sensitive_action"], "check_ids": ["sc_1"], "message": message}


def sdk_call(call_id: str, checks: list[dict[str, Any]] = (CHECK,)) -> ResponseComputerToolCall:
    """The computer call as the SDK hands it to the approval callback (the replay's call ids)."""
    return ResponseComputerToolCall.model_validate({
        "type": "computer_call", "id": f"cu_{call_id}", "call_id": call_id, "status": "completed",
        "actions": [{"type": "type", "text": "echo approved > ~/Documents/approval.txt"}],
        "pending_safety_checks": list(checks)})


class Person:
    """The terminal's person (an ``Asker``): answers ``answer`` and notes each question."""

    def __init__(self, answer: str = "y") -> None:
        self.answer, self.asked = answer, []

    def __call__(self, question: str) -> str:
        self.asked.append(question)
        return self.answer


def answering(replay: Any, *, asker: Any = None, codes: tuple[str, ...] = ()) -> tuple[Any, list[Any], list[str]]:
    """The run's approval callback on a real registry with the replay's answers subscribed: ``(approver,
    decisions, cancels)``; ``cancels`` collects ``cancel_run``'s ``by`` (the registry is then closed as the
    runner's cancellation closes it)."""
    registry = ApprovalRegistry(5.0)
    decisions: list[Any] = []
    cancels: list[str] = []

    def cancel_run(by: str) -> None:
        cancels.append(by)
        registry.close(f"cancelled by {by}")

    answers = ReplayAnswers(replay, registry, cancel_run, approve_codes=codes)
    approver = SafetyCheckApprover(asker=asker, console=Console(file=io.StringIO()), registry=registry,
                                   on_decision=decisions.append)
    approver.answers = answers
    return approver, decisions, cancels


def test_a_call_with_safety_checks_is_replayed_with_the_same_checks(tmp_path):
    run = record(tmp_path, [click("call_a"), click("call_b", [CHECK]), safety("approved", "console")], status="passed")
    replay = build(run)
    assert "pending_safety_checks" not in replay.turns[0]
    assert replay.turns[1]["pending_safety_checks"] == [CHECK]
    assert replay.steps[1].safety.decision == "approved" and replay.steps[1].safety.granted
    assert replay.status == "passed"


@pytest.mark.parametrize("answers, recorded", [
    ([safety("denied", "no-approver", message="denied: no terminal")], "denied by no-approver"),
    ([safety("denied", "console")], "denied by console"),
    ([safety("denied", "timeout", message="no answer within 300s")], "denied by timeout"),
    ([safety("approved", "console"), safety("screen_changed", "agent")], "screen_changed by agent"),
    ([], "unanswered"),
])
def test_a_refused_safety_check_is_refused_again_before_anyone_is_asked(tmp_path, answers, recorded):
    """Whoever would answer yes -- a person on the terminal, an opt-in code -- is never reached."""
    run = record(tmp_path, [click("call_a"), click("call_b", [CHECK]), *answers])
    replay = build(run)
    for asker, codes in ((Person(), ()), (None, ("sensitive_action",)), (None, ())):
        approver, decisions, cancels = answering(replay, asker=asker, codes=codes)
        assert approver(sdk_call("call_0001")) is False
        [decision] = decisions
        assert (decision.decision, decision.by) == ("denied", BY_REPLAY)
        assert decision.message == f"as recorded: {recorded}"
        assert asker is None or asker.asked == []
        assert cancels == []


def test_a_withdrawn_safety_check_cancels_the_replayed_run_there(tmp_path):
    run = record(tmp_path, [click("call_a"), click("call_b", [CHECK]),
                            safety("withdrawn", "cancel", message="cancelled by SIGTERM")], status="cancelled")
    replay = build(run)
    person = Person()
    approver, decisions, cancels = answering(replay, asker=person, codes=("sensitive_action",))
    assert approver(sdk_call("call_0001")) is False
    assert cancels == [BY_REPLAY] and person.asked == []
    [decision] = decisions
    assert (decision.decision, decision.message) == ("withdrawn", "cancelled by replay")
    assert approver.answers.cancelled.text() == "withdrawn by cancel (cancelled by SIGTERM)"


def test_a_granted_safety_check_is_asked_again_as_in_any_run(tmp_path):
    run = record(tmp_path, [click("call_a"), click("call_b", [CHECK]), safety("approved", "console")], status="passed")
    replay = build(run)
    person = Person("y")
    approver, decisions, _ = answering(replay, asker=person)
    assert approver(sdk_call("call_0001")) is True and len(person.asked) == 1
    assert (decisions[0].decision, decisions[0].by) == ("approved", "terminal")
    approver, decisions, _ = answering(replay)  # nobody to ask
    assert approver(sdk_call("call_0001")) is False
    assert (decisions[0].decision, decisions[0].by) == ("denied", "no-approver")
    approver, decisions, _ = answering(replay, codes=("sensitive_action",))
    assert approver(sdk_call("call_0001")) is True
    assert (decisions[0].decision, decisions[0].by) == ("approved", "opt-in")
    approver, decisions, _ = answering(replay, codes=("other_code",))
    assert approver(sdk_call("call_0001")) is False and decisions[0].by == "no-approver"


def test_a_refused_confirmation_is_refused_at_its_step_after_the_granted_ones(tmp_path):
    """``--confirm-actions type``: step 1 typed twice (both confirmed), step 2's first type was denied."""
    typing = {"actions": [{"type": "type", "text": "ab", "text_length": 2},
                          {"type": "type", "text": "cd", "text_length": 2}]}
    action = lambda decision, by: ("approval", {"what": "action", "decision": decision, "by": by,  # noqa: E731
                                                "action": "type <2 chars>"})
    run = record(tmp_path, [("call", {"call_id": "call_a", **typing}), action("approved", "terminal"),
                            action("approved", "terminal"), ("call", {"call_id": "call_b", **typing}),
                            action("approved", "terminal"), action("denied", "terminal")])
    replay = build(run)
    assert replay.confirmed == {"type"}
    registry = ApprovalRegistry(5.0)
    answers = ReplayAnswers(replay, registry, lambda by: None)
    person = Person("y")
    gate = ActionGate(confirm=replay.confirmed, asker=person, console=Console(file=io.StringIO()),
                      registry=registry)
    typed = {"type": "type", "text": "ab"}
    answers.on_entry(ComputerCall(call_id="call_0000"))
    assert [gate(typed), gate(typed)] == [True, True] and len(person.asked) == 2
    answers.on_entry(ComputerCall(call_id="call_0001_wait_001"))  # the scripted model waits for step 2's screen
    answers.on_entry(ComputerCall(call_id="call_0001"))
    assert gate(typed) is True and len(person.asked) == 3  # as many as the record granted there
    assert gate(typed) is False and len(person.asked) == 3  # the one it refused: nobody asked
    [refused] = [r for r in registry.all() if r.state == "denied"]
    assert (refused.by, refused.reason) == (BY_REPLAY, "as recorded: denied by terminal")
    answers.on_entry(ComputerCall(call_id="call_0002"))
    assert gate(typed) is False and len(person.asked) == 3  # and at every later step


def test_refused_origin_requests_are_refused_again_and_approved_ones_asked(tmp_path):
    origin = lambda o, decision, by: ("approval", {"what": "origin_access", "decision": decision,  # noqa: E731
                                                   "by": by, "origin": o})
    run = record(tmp_path, [origin("http://a.test:8080", "denied", "terminal"),
                            origin("http://b.test:8080", "timeout", "timeout"),
                            origin("http://b.test:8080", "approved", "console"), click("call_a")])
    replay = build(run)
    registry = ApprovalRegistry(5.0)
    answers = ReplayAnswers(replay, registry, lambda by: None)
    try:
        a, _ = registry.mirror("oreq_a1", origin="http://a.test:8080", reason="ask")
        b1, _ = registry.mirror("oreq_b1", origin="http://b.test:8080", reason="ask")
        b2, _ = registry.mirror("oreq_b2", origin="http://b.test:8080", reason="ask")
        c, _ = registry.mirror("oreq_c1", origin="http://c.test:8080", reason="ask")
        for request in (a, b1):
            request._decided.wait(5)  # answered on the answers' own thread (the gateway's, in a run)
    finally:
        answers.stop()
    assert (a.state, a.by) == ("denied", BY_REPLAY)
    assert (b1.state, b1.by) == ("cancelled", BY_REPLAY)
    assert b2.pending and c.pending  # approved in the record, or never asked there: a person's to answer


def test_a_sign_in_the_recorded_run_did_not_complete_is_cancelled(tmp_path):
    def signin(outcome: str, by: str) -> tuple[str, dict[str, Any]]:
        return "sign_in", {"request_id": f"req_{outcome}", "origin": "http://signin-demo:8080", "outcome": outcome,
                           "by": by}
    run = record(tmp_path, [signin("submitted", "terminal"), signin("cancelled", "terminal"), click("call_a")],
                 task="sign-in-demo.toml")
    replay = build(run)
    assert replay.signs_in and replay.sign_in_origins == ["http://signin-demo:8080"]
    registry = ApprovalRegistry(5.0)
    ReplayAnswers(replay, registry, lambda by: None)
    form = dict(credential_origin="http://signin-demo:8080", fields=[{"id": "email", "label": "E-mail"}], options=[])
    first = registry.open_signin("sign in", **form)
    second = registry.open_signin("sign in", **form)
    assert first.pending
    assert (second.state, second.by, second.reason) == ("cancelled", BY_REPLAY, "as recorded: cancelled by terminal")


def test_a_record_whose_safety_checks_cannot_be_asked_again_is_refused(tmp_path):
    run = record(tmp_path, [click("call_a", [{"code": "sensitive_action"}])])
    with pytest.raises(ReplayError, match="cannot be asked again"):
        build(run)


def cli(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"}
    return subprocess.run([sys.executable, "-m", "controller.cli", "replay", *args], cwd=ROOT, env=env,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)


def test_a_sign_in_record_with_nobody_to_answer_is_refused_before_anything_starts(tmp_path):
    signin = ("sign_in", {"request_id": "req_1", "origin": "http://signin-demo:8080", "outcome": "submitted",
                          "by": "terminal"})
    run = record(tmp_path, [signin, ("call", {"call_id": "call_a", "actions": [{"type": "wait"}]})],
                 task="sign-in-demo.toml", status="passed")
    done = cli(str(run), "--runs-dir", str(tmp_path / "replays"))
    assert done.returncode == 2, done.stderr
    assert "signed in at http://signin-demo:8080" in done.stderr and "--sign-in FILE" in done.stderr
    loose = tmp_path / "loose.toml"
    loose.write_text('["http://signin-demo:8080"]\npassword = "x"\n')
    loose.chmod(0o644)
    done = cli(str(run), "--runs-dir", str(tmp_path / "replays"), "--sign-in", str(loose))
    assert done.returncode == 2 and "--sign-in:" in done.stderr and "chmod 600" in done.stderr, done.stderr
    assert not (tmp_path / "replays").exists() or not any((tmp_path / "replays").iterdir())


def test_a_task_file_is_not_written_for_a_record_refused_a_call(tmp_path):
    run = record(tmp_path, [click("call_a"), click("call_b", [CHECK]), safety("denied", "console")])
    written = tmp_path / "again.toml"
    done = cli(str(run), "--runs-dir", str(tmp_path / "replays"), "--write-task", str(written))
    assert done.returncode == 2 and "refused step 2" in done.stderr, done.stderr
    assert not written.exists()


def test_a_replays_summary_shows_the_steps_replayed_and_no_model_figures(tmp_path):
    lines = [click("call_0000"), ("action", {"call_id": "call_0000", "action": "click", "duration_ms": 3.0}),
             ("call", {"call_id": "call_0001_wait_001", "actions": [{"type": "wait"}]}),
             click("call_0001", [CHECK]), safety("denied", BY_REPLAY, "call_0001", "as recorded: denied by console")]
    for runner, replayed in (("replay", True), (None, False)):
        run = record(tmp_path, lines, runner=runner)
        s = summarize(read_entries(run))
        out = io.StringIO()
        Console(file=out, width=200).print(summary_table(read_entries(run)))
        text = out.getvalue()
        if replayed:
            assert s["replay"] == {"steps": 2, "performed": 1, "matched": 0, "diverged": 0}
            assert "2 recorded calls sent again, 1 performed; recorded screens (one a turn, the closing one too): " \
                   "0 matched, 0 diverged" in text
            assert "tokens" not in text and "model responses" not in text and "replay of t" in text
        else:
            assert s["replay"] is None and "tokens" in text and " model response" in text


@pytest.mark.parametrize("outcome, by, says", [
    ("no_approver", "no-approver", "sign-in at http://signin-demo:8080: no_approver by no-approver"),
    ("cancelled", "sign-in file", "sign-in at http://signin-demo:8080: cancelled by sign-in file"),
    ("timeout", "timeout", "sign-in at http://signin-demo:8080: timeout by timeout"),
])
def test_a_step_that_diverged_after_an_unanswered_sign_in_says_so(tmp_path, outcome, by, says):
    from controller.commands.replay import step_states

    signin = ("sign_in", {"request_id": "req_1", "origin": "http://signin-demo:8080", "outcome": "submitted",
                          "by": "terminal"})
    replay = build(record(tmp_path, [signin, ("call", {"call_id": "call_a", "actions": [{"type": "wait"}]})],
                          task="sign-in-demo.toml", status="passed"))
    replayed = [{"type": "sign_in", "request_id": "req_2", "origin": "http://signin-demo:8080", "outcome": outcome,
                 "by": by},
                {"type": "expectation", "turn": 0, "met": False, "reason": "deadline of 120s passed",
                 "unmet": [{"observed": "0.0% within 24"}]}]
    [(state, detail)] = step_states(replay, replayed)
    assert state == "diverged" and detail.startswith(says), detail
    assert "the recorded run's: submitted by terminal" in detail and detail.endswith("0.0% within 24")
    assert ("--sign-in FILE answers it" in detail) == (outcome == "no_approver")
