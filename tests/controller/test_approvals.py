"""Approvals: the terminal path on a real pseudo-terminal, no terminal => deny, opt-in codes, and the
before_action gate. Only an explicit yes approves; every decision is reported."""

from __future__ import annotations

import os
import re
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from openai.types.responses import ResponseComputerToolCall

from rich.console import Console

from controller.run.approvals import ActionGate, SafetyCheckApprover, describe_action

ROOT = Path(__file__).resolve().parents[2]

CALL = ResponseComputerToolCall.model_validate({
    "type": "computer_call", "id": "cu_1", "call_id": "call_1", "status": "completed",
    "actions": [{"type": "click", "x": 1, "y": 2, "button": "left"}, {"type": "type", "text": "hunter2"}],
    "pending_safety_checks": [{"id": "sc_1", "code": "irrelevant_domain", "message": "Off-task site."}],
})

CHILD = r"""
import sys
from openai.types.responses import ResponseComputerToolCall
from controller.run.approvals import SafetyCheckApprover, terminal_asker
call = ResponseComputerToolCall.model_validate({
    "type": "computer_call", "id": "cu_1", "call_id": "call_1", "status": "completed",
    "actions": [{"type": "click", "x": 1, "y": 2, "button": "left"}],
    "pending_safety_checks": [{"id": "sc_1", "code": "irrelevant_domain", "message": "Off-task site."}],
})
result = SafetyCheckApprover(asker=terminal_asker())(call)
print("RESULT", repr(result), flush=True)
"""


def _converse(child: str, argv: list[str], react: Any, done: bytes, pass_fds: tuple[int, ...] = ()) -> str:
    """Run ``python -c child argv...`` on a pseudo-terminal; after each read, ``react(out, master)`` may
    write to the terminal; stop once the output matches the regex ``done`` (or 30 s). Returns the output."""
    master, slave = os.openpty()
    env = dict(os.environ, PYTHONPATH=str(ROOT), TERM="dumb", COLUMNS="120")
    proc = subprocess.Popen([sys.executable, "-c", child, *argv], stdin=slave, stdout=slave, stderr=slave, env=env,
                            start_new_session=True, pass_fds=pass_fds)
    os.close(slave)
    out = b""
    deadline = time.monotonic() + 30
    try:
        while time.monotonic() < deadline and not re.search(done, out):
            ready, _, _ = select.select([master], [], [], 0.2)
            if ready:
                try:
                    chunk = os.read(master, 4096)
                except OSError:
                    break
                if not chunk:
                    break
                out += chunk
            react(out, master)
    finally:
        proc.wait(10)
        os.close(master)
    return out.decode(errors="replace")


def _run_in_pty(answer: str) -> str:
    answered: list[bool] = []

    def react(out: bytes, master: int) -> None:
        if not answered and b"[y/N]" in out:
            os.write(master, answer.encode() + b"\r")
            answered.append(True)

    return _converse(CHILD, [], react, rb"RESULT (True|False)")


@pytest.mark.parametrize("answer, expected", [("y", "True"), ("yes", "True"), ("n", "False"), ("", "False"),
                                               ("yess", "False")])
def test_terminal_asks_and_only_an_explicit_yes_approves(answer, expected):
    out = _run_in_pty(answer)
    assert "irrelevant_domain" in out and "Off-task site." in out and "click" in out
    assert f"RESULT {expected}" in out


def test_no_terminal_means_no_asker():
    out = subprocess.run([sys.executable, "-c", "from controller.run.approvals import terminal_asker;"
                          "print(terminal_asker() is None)"], stdin=subprocess.DEVNULL, capture_output=True,
                         text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)), check=True)
    assert out.stdout.strip() == "True"


def test_without_asker_the_answer_is_no_and_says_how_to_opt_in():
    decisions = []
    assert SafetyCheckApprover(asker=None, on_decision=decisions.append)(CALL) is False
    (d,) = decisions
    assert d.decision == "denied" and d.by == "no-approver" and "--approve-safety-check" in d.message


def test_opt_in_code_is_used_and_logged_only_for_matching_codes():
    decisions = []
    assert SafetyCheckApprover(asker=None, auto_codes={"irrelevant_domain"}, on_decision=decisions.append)(CALL) is True
    assert decisions[-1].by == "opt-in" and decisions[-1].codes == ["irrelevant_domain"]
    assert SafetyCheckApprover(asker=None, auto_codes={"other"}, on_decision=decisions.append)(CALL) is False


def test_truthy_but_not_yes_answers_deny():
    for answer in ("1", "true", "ok", "sure", " no "):
        assert SafetyCheckApprover(asker=lambda q, a=answer: a)(CALL) is False


def test_action_gate_asks_only_for_listed_types_and_step_mode_asks_for_all():
    asked = []
    gate = ActionGate(confirm={"type"}, asker=lambda q: asked.append(q) or "y")
    click, typing = CALL.actions
    assert gate(click) is True and asked == []
    assert gate(typing) is True and len(asked) == 1
    step = ActionGate(step=True, asker=lambda q: "n")
    assert step(click) is False
    assert ActionGate(asker=None).active is False and gate.active and step.active


def test_action_gate_without_terminal_denies_and_the_record_never_sees_typed_text():
    decisions = []
    gate = ActionGate(confirm={"type"}, asker=None, on_decision=decisions.append)
    assert gate(CALL.actions[1]) is False
    assert "hunter2" not in decisions[0].action and decisions[0].action == "type <7 chars>"
    assert describe_action(CALL.actions[1], redact=True) == "type <7 chars>"
    assert describe_action(CALL.actions[1]) == "type 'hunter2'"


HOSTILE = ResponseComputerToolCall.model_validate({
    "type": "computer_call", "id": "cu_2", "call_id": "[bold]call_2", "status": "completed",
    "actions": [{"type": "keypress", "keys": ["[/]"]}, {"type": "type", "text": "hunter2"}],
    "pending_safety_checks": [{"id": "sc_[/]", "code": "[/red]", "message": "[link=https://evil.test]click[/link] [/]"}],
})


@pytest.mark.parametrize("auto_codes, asker", [((), None), ({"[/red]"}, None), ((), lambda q: "n"),
                                               ({"[/red]"}, lambda q: "n")])
def test_model_text_is_shown_literally_never_as_console_markup(auto_codes, asker):
    """Call ids, codes, messages and keys come from the model: they must neither crash the display
    (rich raises on a stray closing tag) nor style it. Typed text is shown only to a person who is
    asked; unattended output (no terminal, or approved by opt-in) shows its length instead."""
    console = Console(record=True, width=200, force_terminal=False)
    result = SafetyCheckApprover(asker=asker, auto_codes=auto_codes, console=console)(HOSTILE)
    assert result is (bool(auto_codes))
    text = console.export_text()
    assert "[bold]call_2" in text and "[link=https://evil.test]click[/link] [/]" in text and "keypress [/]" in text
    person_asked = asker is not None and not auto_codes
    assert ("type 'hunter2'" in text) is person_asked, text
    assert ("type <7 chars>" in text) is not person_asked, text


def test_action_gate_shows_hostile_keys_literally():
    console = Console(record=True, width=200)
    assert ActionGate(confirm={"keypress"}, asker=None, console=console)(HOSTILE.actions[0]) is False
    assert "keypress [/]: denied" in console.export_text()


def test_a_check_without_a_code_is_never_approved_by_an_empty_opt_in():
    call = ResponseComputerToolCall.model_validate({
        "type": "computer_call", "id": "cu_3", "call_id": "call_3", "status": "completed",
        "actions": [{"type": "wait"}], "pending_safety_checks": [{"id": "sc_3", "code": None, "message": None}]})
    decisions = []
    assert SafetyCheckApprover(asker=None, auto_codes={"", "None"}, on_decision=decisions.append)(call) is False
    assert decisions[-1].decision == "denied"


def test_the_question_shows_model_text_escaped_so_nothing_hides_the_actions():
    """Safety check codes, ids, messages and the call id come from the model: a terminal escape in
    them (here: conceal, clear screen, title, bidi override) is shown as text, never acted on."""
    import io

    from rich.console import Console

    evil = "\x1b[8m\x1b[2J\x1b]0;t\x07\u202e"
    call = ResponseComputerToolCall.model_validate({
        "type": "computer_call", "id": "cu_1", "call_id": "call_1" + evil, "status": "completed",
        "actions": [{"type": "click", "x": 1, "y": 2, "button": "left"}],
        "pending_safety_checks": [{"id": "sc_1" + evil, "code": "c" + evil, "message": "Check this." + evil}],
    })
    out = io.StringIO()
    assert SafetyCheckApprover(asker=None, console=Console(file=out, width=300))(call) is False
    text = out.getvalue()
    assert "\x1b" not in text and "\u202e" not in text and "\x07" not in text
    assert text.count("\\x1b[8m") == 4 and "click" in text


@pytest.mark.parametrize("auto", [False, True])
def test_safety_checks_and_keys_are_shown_escaped_and_never_as_emoji_on_any_console(auto):
    """The attack: a check message that erases the line above, sets the title and prints its own
    "All checks passed" in green. Every code, id, message and key shows as text -- also the codes in
    the opt-in line -- on a console with rich's defaults (emoji codes on)."""
    import io

    from tests.controller.hostile_text import EVIL, SHOWN, assert_shown_safely

    call = ResponseComputerToolCall.model_validate({
        "type": "computer_call", "id": "cu_9", "call_id": "call_9" + EVIL, "status": "completed",
        "actions": [{"type": "keypress", "keys": [EVIL]}],
        "pending_safety_checks": [{"id": "sc_9" + EVIL, "code": EVIL, "message": EVIL}],
    })
    out = io.StringIO()
    approver = SafetyCheckApprover(asker=None, auto_codes={EVIL} if auto else (),
                                   console=Console(file=out, width=3000, force_terminal=False))
    assert approver(call) is auto
    assert_shown_safely(out.getvalue())
    assert out.getvalue().count(SHOWN) >= 3  # call id, check id, code, message (and the opted-in code)
    assert ("approved by opt-in" in out.getvalue()) is auto


def test_the_action_gate_shows_hostile_keys_escaped_and_never_as_emoji():
    import io

    from tests.controller.hostile_text import EVIL, assert_shown_safely

    out = io.StringIO()
    gate = ActionGate(confirm={"keypress"}, asker=None, console=Console(file=out, width=3000, force_terminal=False))
    assert gate({"type": "keypress", "keys": [EVIL]}) is False
    assert_shown_safely(out.getvalue())


CHILD_CALL = r"""
import datetime as dt, os, sys, threading
from openai.types.responses import ResponseComputerToolCall
from controller.run.approvals import OriginPrompter, SafetyCheckApprover, terminal_asker
from controller.run.registry import ApprovalRegistry
call = ResponseComputerToolCall.model_validate({
    "type": "computer_call", "id": "cu_1", "call_id": "call_1", "status": "completed",
    "actions": [{"type": "click", "x": 1, "y": 2, "button": "left"}],
    "pending_safety_checks": [{"id": "sc_1", "code": "irrelevant_domain", "message": "Off-task site."}],
})
registry = ApprovalRegistry()
"""
"""What the terminal children below start with: a computer call with one pending safety check, and the
run's approval registry."""

CONSOLE_CHILD = CHILD_CALL + r"""
registry.views.add("console")
def console_view():  # answers once the terminal is asking (the parent says so on stdin's sibling: argv)
    import os
    os.read(int(sys.argv[1]), 1)
    request = registry.pending()[0]
    registry.answer(request.id, sys.argv[2], by="console")
threading.Thread(target=console_view, daemon=True).start()
result = SafetyCheckApprover(asker=terminal_asker(), registry=registry)(call)
print("RESULT", repr(result), flush=True)
print("LEFT", repr(sys.stdin.readline()), flush=True)
"""


@pytest.mark.parametrize("answer, expected", [("approve", "True"), ("deny", "False")])
def test_a_console_answer_ends_the_terminal_prompt_and_leaves_its_input_alone(answer, expected):
    """The terminal and the console ask the same request: the console answers first, the terminal
    says so and stops asking; a line typed afterwards is not taken as an answer to anything."""
    go_r, go_w = os.pipe()
    stage: list[int] = [0]

    def react(out: bytes, master: int) -> None:
        if stage[0] == 0 and b"[y/N]" in out:
            os.write(go_w, b"x")  # the console answers now, while the terminal asks
            stage[0] = 1
        if stage[0] == 1 and re.search(rb"RESULT (True|False)\r?\n", out):  # the whole line: the echo cannot split it
            os.write(master, b"y\r")  # typed after the decision: must not approve anything
            stage[0] = 2

    try:
        text = _converse(CONSOLE_CHILD, [str(go_r), answer], react, rb"LEFT .*\r?\n", pass_fds=(go_r,))
    finally:
        os.close(go_r)
        os.close(go_w)
    assert f"answered in the console: {'approved' if answer == 'approve' else 'denied'}" in text, text
    assert f"RESULT {expected}" in text and "LEFT 'y\\n'" in text, text


ORIGIN_CHILD = r"""
import datetime as dt, sys
from controller.run.approvals import OriginPrompter, terminal_asker
from controller.run.registry import ApprovalRegistry
now = dt.datetime.now(dt.timezone.utc)
registry = ApprovalRegistry()
prompter = OriginPrompter(terminal_asker(), registry).start()
request, _ = registry.mirror("oreq_pty", origin="https://ex\x1b[2Jample.test:8443", reason="held \u202e here",
                             via="CONNECT", held=1, created_at=now.isoformat(),
                             deadline_at=(now + dt.timedelta(seconds=60)).isoformat())
registry.wait(request)
prompter.stop()
print("RESULT", request.state, request.by, flush=True)
"""


@pytest.mark.parametrize("typed, state", [("a", "approved"), ("approve", "approved"), ("d", "denied"),
                                          ("", "denied"), ("yess", "denied"), ("c", "cancelled"),
                                          ("cancel", "cancelled")])
def test_the_terminal_asks_about_an_origin_request_approve_deny_or_cancel(typed, state):
    answered: list[bool] = []

    def react(out: bytes, master: int) -> None:
        if not answered and b"[a/c/D]" in out:
            os.write(master, typed.encode() + b"\r")
            answered.append(True)

    text = _converse(ORIGIN_CHILD, [], react, rb"RESULT \w+ [\w ]+\r?\n")
    assert f"RESULT {state} terminal" in text, text
    # the origin and the gateway's reason, escaped: no escape sequence reaches the terminal
    assert "https://ex\\x1b[2Jample.test:8443" in text and "held \\u202e here" in text, text
    assert "\x1b[2J" not in text and "\u202e" not in text


SERIAL_CHILD = CHILD_CALL + r"""
asker = terminal_asker()
prompter = OriginPrompter(asker, registry).start()
now = dt.datetime.now(dt.timezone.utc)
mirrored = []
def gateway():  # an origin request arrives while the loop's own question is on the terminal
    os.read(int(sys.argv[1]), 1)
    mirrored.append(registry.mirror("oreq_serial", origin="https://late.test", reason="held",
                                    created_at=now.isoformat(),
                                    deadline_at=(now + dt.timedelta(seconds=60)).isoformat())[0])
    os.write(int(sys.argv[2]), b"m")
threading.Thread(target=gateway, daemon=True).start()
result = SafetyCheckApprover(asker=asker, registry=registry)(call)
os.read(int(sys.argv[3]), 1)  # the origin prompt is up now
asker.console.print("RESULT", repr(result))  # the run's own output, printed while the origin prompt waits
registry.wait(mirrored[0])
prompter.stop()
print("ORIGIN", mirrored[0].state, flush=True)
"""


def test_an_origin_request_arriving_during_the_loops_question_waits_its_turn_on_the_terminal():
    """Two threads ask on one terminal: the origin prompt is not printed into the middle of the safety
    check's question; it comes once that question has its answer, and each answer goes to its own.
    What the run prints meanwhile goes on its own line below the origin prompt, which is shown again."""
    go_r, go_w = os.pipe()
    done_r, done_w = os.pipe()
    up_r, up_w = os.pipe()
    stage: list[int] = [0]

    def react(out: bytes, master: int) -> None:
        if stage[0] == 0 and b"[y/N]" in out:
            os.write(go_w, b"x")  # the gateway's question arrives now
            stage[0] = 1
        elif stage[0] == 1 and select.select([done_r], [], [], 0)[0]:
            os.read(done_r, 1)  # it is in the registry (and with the prompter) now
            os.write(master, b"y\r")
            stage[0] = 2
        elif stage[0] == 2 and b"[a/c/D]" in out:
            os.write(up_w, b"x")  # the run prints a line while the origin prompt waits
            stage[0] = 3
        elif stage[0] == 3 and re.search(rb"RESULT True\r?\n.*\[a/c/D\] ", out, re.S):
            os.write(master, b"c\r")
            stage[0] = 4

    try:
        text = _converse(SERIAL_CHILD, [str(go_r), str(done_w), str(up_r)], react, rb"ORIGIN \w+\r?\n",
                         pass_fds=(go_r, done_w, up_r))
    finally:
        for fd in (go_r, go_w, done_r, done_w, up_r, up_w):
            os.close(fd)
    assert "RESULT True" in text and "ORIGIN cancelled" in text, text
    lines = text.splitlines()
    # the safety check's question and its answer, whole, before anything of the origin request
    assert "Approve these safety checks and run the call's actions? [y/N] y" in lines, lines
    assert text.index("[y/N] y") < text.index("late.test") < text.index("ORIGIN cancelled"), text
    # the run's line is a line of its own, never written into a prompt, and the prompt that got the
    # answer is whole
    assert "RESULT True" in lines, lines
    assert "Approve, deny or cancel? [a/c/D] c" in lines, lines


class _TypesOnFlush:
    """The terminal's output side for :func:`test_a_secret_typed_as_soon_as_its_question_shows_is_never_echoed`:
    writes go to the pty's slave; on the flush that puts the prompt on the screen, the 'person' (the
    master side) types the value at once, before the flush returns."""

    def __init__(self, slave: int, master: int, value: bytes) -> None:
        self.slave, self.master, self.value, self.typed = slave, master, value, False

    def write(self, text: str) -> int:
        return os.write(self.slave, text.encode())

    def flush(self) -> None:
        if not self.typed:
            self.typed = True
            os.write(self.master, self.value + b"\n")
            # the line discipline echoes (or not) as the bytes arrive: wait until they are readable
            deadline = time.monotonic() + 5
            while not select.select([self.slave], [], [], 0.05)[0]:
                assert time.monotonic() < deadline, "the typed line never reached the terminal"

    def isatty(self) -> bool:
        return True

    def fileno(self) -> int:
        return self.slave


def test_a_secret_typed_as_soon_as_its_question_shows_is_never_echoed():
    """A value typed the moment its prompt is on the screen: the echo is already off (the terminal
    showed only the question), and the line is read whole."""
    from controller.run.approvals import TerminalAsker

    master, slave = os.openpty()
    try:
        value = b"typed-at-once-4711"
        out = _TypesOnFlush(slave, master, value)
        stream = os.fdopen(os.dup(slave), "r", closefd=True)
        asker = TerminalAsker(Console(file=out, force_terminal=False, emoji=False, width=200), stream)
        got = asker.ask_until("Password (input hidden):", lambda: False, hint="", secret=True)
        assert got == value.decode()
        shown = b""
        while select.select([master], [], [], 0.2)[0]:
            shown += os.read(master, 65536)
        assert b"Password (input hidden):" in shown
        assert value not in shown, shown
    finally:
        os.close(master)
        os.close(slave)
