"""A run record's steps (controller.model.steps): which entries belong to which step, on hand-built
records -- a computer call with the screenshot after it, a browser call, a denied approval, network
decisions and a person's takeover between steps, a record cut short -- and that every entry but the
run's own lands in exactly one step, in record order."""

from __future__ import annotations

from typing import Any

from controller.model.steps import OPENING, Step, steps
from controller.run.entries import (
    Action, Approval, BrowserCall, BrowserResult, Check, ComputerCall, Expectation, HumanAction, ModelResponse,
    Network, NetworkLog, RunFinished, RunStarted, Screenshot, Takeover, TaskRef,
)

CLICK = {"type": "click", "x": 5, "y": 6, "button": "left"}


def stamped(*entries: Any) -> list[Any]:
    """The entries as a record holds them: each with its ``ts``, one second apart."""
    return [e.model_copy(update={"ts": f"2030-01-01T00:{n // 60:02d}:{n % 60:02d}.000+00:00"})
            for n, e in enumerate(entries)]


def shot(n: int, call_id: str | None = None) -> Screenshot:
    return Screenshot(file=f"shot-{n:04d}.png", sha256="0" * 64, mime="image/png", image_size=(64, 40),
                      frame=(0, 0, 64, 40), call_id=call_id)


def call(call_id: str, checks: list[dict[str, Any]] | None = None) -> ComputerCall:
    return ComputerCall(call_id=call_id, form="actions", actions=[CLICK], pending_checks=checks or [])


def files(entries: Any) -> list[str]:
    return [e.file for e in entries]


def kinds(step: Step) -> list[str]:
    return [e.type for e in step.entries]


STARTED = RunStarted(task=TaskRef(name="t"), mode="offline")


def test_a_computer_call_with_its_screenshot():
    """The call is chosen on the first screenshot (the opening's) and the screenshot after its actions
    is the step's; the next step is chosen on that one."""
    record = stamped(STARTED, shot(1), ModelResponse(response_id="r1", http_status=200), call("call_a"),
                     Action(call_id="call_a", action="click", duration_ms=3.0),
                     Action(call_id="call_a", action="screenshot", duration_ms=9.0), shot(2, "call_a"),
                     ModelResponse(response_id="r2", http_status=200, text="done"),
                     RunFinished(status="passed", final_message="done"))
    opening, first, last = steps(record)
    assert (opening.n, opening.opening, opening.ok, files(opening.screenshots)) == (OPENING, True, False,
                                                                                   ["shot-0001.png"])
    assert (first.n, first.response.response_id, first.ok) == (1, "r1", True)
    assert [c.call_id for c in first.calls] == ["call_a"] and first.call_ids == {"call_a"}
    assert first.shown is record[1]  # the screen the model chose the click on
    assert [a.action for a in first.actions] == ["click", "screenshot"]
    assert files(first.screenshots) == ["shot-0002.png"] and first.attempted == {"call_a"}
    assert [(e.type, s.file) for e, s in first.screens()] == [
        ("computer_call", "shot-0001.png"), ("action", "shot-0001.png"), ("action", "shot-0001.png"),
        ("screenshot", "shot-0001.png")]
    assert (last.n, last.entries, last.shown) == (2, (), record[6])  # its answer chosen on the screen after


def test_a_browser_call_belongs_to_its_step_with_the_image_it_returned():
    record = stamped(STARTED, ModelResponse(response_id="r1", http_status=200), shot(1, "call_b"),
                     BrowserCall(step=1, call_id="call_b", member="screenshot", ok=True,
                                 result=BrowserResult(kind="image"), screenshot="shot-0001.png"),
                     BrowserCall(step=1, call_id="call_c", member="click", ok=False, error="stale_ref"),
                     ModelResponse(response_id="r2", http_status=200))
    first, second = steps(record)  # nothing before the first response: no opening
    assert first.n == 1 and [b.call_id for b in first.browser_calls] == ["call_b", "call_c"]
    assert files(first.screenshots) == [first.browser_calls[0].screenshot] == ["shot-0001.png"]
    assert first.calls == () and first.attempted == frozenset()  # browser calls are not computer calls
    assert first.shown is None and second.shown is record[2]


def test_a_denied_approval_belongs_to_the_step_of_the_call_it_names():
    """A decision naming a call goes to that call's step, even written after the next response; one
    naming no call (a confirmation of an action) stays where it was written; an opt-in is the opening's."""
    denied = Approval(what="safety_check", decision="denied", by="console", call_id="call_a", codes=["x"])
    confirmed = Approval(what="action", decision="approved", by="terminal", action="click (5, 6)")
    late_opt_in = Approval(what="opt-in", decision="approved", by="command line", codes=["y"])
    approved = Approval(what="safety_check", decision="approved", by="console", call_id="call_b")
    record = stamped(STARTED, ModelResponse(http_status=200), call("call_a", [{"id": "sc_1", "code": "x"}]),
                     ModelResponse(http_status=200), call("call_b", [{"id": "sc_2", "code": "x"}]), denied, confirmed,
                     late_opt_in, approved, RunFinished(status="failed", reason="denied"))
    opening, first, second = steps(record)
    assert opening.entries == opening.approvals == (record[7],) and record[7].codes == late_opt_in.codes
    assert first.approvals == (record[5],) and kinds(first) == ["computer_call", "approval"]
    assert second.approvals == (record[6], record[8])
    assert first.attempted == frozenset()  # denied: nothing of call_a was released
    assert second.attempted == {"call_b"}  # approved: its actions were released, whatever ran of them


def test_network_decisions_between_steps_belong_to_the_step_they_were_read_in():
    record = stamped(STARTED, Network(seq=1, origin="http://a.test", decision="deny", reason="quiet"),
                     ModelResponse(http_status=200), call("call_a"), Action(call_id="call_a", action="click"),
                     Network(seq=2, origin="http://b.test", decision="allow"), shot(1, "call_a"),
                     Network(seq=3, origin="http://c.test", decision="deny"), ModelResponse(http_status=200),
                     Network(seq=4, origin="http://d.test", decision="allow"),
                     NetworkLog(complete=True, decisions=4), RunFinished(status="passed"))
    opening, first, second = steps(record)
    assert [n.seq for n in opening.network] == [1] and kinds(opening) == ["network"]
    assert [n.seq for n in first.network] == [2, 3]  # during the call, and after its screenshot
    assert [n.seq for n in second.network] == [4]
    assert not any(e.type == "network_log" for s in (opening, first, second) for e in s.entries)  # the run's own


def test_a_human_takeover_between_steps_follows_the_step_it_came_after():
    """Control changes hands at a step boundary: after step 1's actions, before the screenshot step 2 is
    chosen on, which shows what the person did."""
    record = stamped(STARTED, shot(1), ModelResponse(http_status=200), call("call_a"),
                     Action(call_id="call_a", action="click"), Takeover(control="human"),
                     HumanAction(action="type <5 chars>", input={"type": "type", "text_length": 5}),
                     Takeover(control="model"), Action(call_id="call_a", action="screenshot"), shot(2, "call_a"),
                     ModelResponse(http_status=200), call("call_b"), RunFinished(status="passed"))
    _opening, first, second = steps(record)
    assert [(e.type, getattr(e, "control", None)) for e in first.human] == [
        ("takeover", "human"), ("human_action", None), ("takeover", "model")]
    assert second.human == () and second.shown is record[9]  # the screen after the person's typing
    assert [(e.type, s.file) for e, s in first.screens() if e.type in ("takeover", "human_action")] == [
        ("takeover", "shot-0001.png"), ("human_action", "shot-0001.png"), ("takeover", "shot-0001.png")]


def test_a_record_cut_short_has_the_steps_it_got_to():
    """No ``run_finished``: a failed request is a step that is not ok; an expectation is the step it held
    back (the next), or, with none after it, the one it was written in; the last call never ran."""
    waited = Expectation(turn=1, met=True)
    unmet = Expectation(turn=2, met=False, reason="deadline of 3s passed")
    record = stamped(STARTED, shot(1), ModelResponse(http_status=500, error={"message": "busy"}),
                     ModelResponse(http_status=200), call("call_a"), Action(call_id="call_a", action="click"),
                     shot(2, "call_a"), waited, ModelResponse(http_status=200), call("call_b"), unmet)
    _opening, failed, first, last = steps(record)
    assert (failed.n, failed.ok, failed.entries) == (1, False, ())
    assert first.expectations == () and last.expectations == (record[7], record[10])
    assert [s.file for e, s in last.screens() if e.type == "expectation"] == ["shot-0002.png"] * 2
    assert (last.n, last.call_ids, last.attempted) == (3, {"call_b"}, frozenset())
    assert steps(record[:1]) == [] and steps([]) == []


def test_an_expectation_naming_a_call_belongs_to_that_calls_step():
    record = stamped(STARTED, ModelResponse(http_status=200), call("call_0000"),
                     Expectation(turn=1, call_id="call_0001", met=True), ModelResponse(http_status=200),
                     Expectation(turn=2, call_id="call_0000", met=True), call("call_0001"))
    first, second = steps(record)
    assert first.expectations == (record[5],) and second.expectations == (record[3],)


def test_every_entry_but_the_runs_own_is_in_exactly_one_step_in_record_order():
    record = stamped(STARTED, shot(1), Approval(what="opt-in", decision="approved", by="command line", codes=["x"]),
                     ModelResponse(http_status=200), call("call_a"), Action(call_id="call_a", action="click"),
                     Approval(what="origin_access", decision="timeout", by="timeout", origin="http://a.test"),
                     shot(2, "call_a"), Check(kind="file", passed=True),
                     Network(origin="http://a.test", decision="deny"), ModelResponse(http_status=200), Action(call_id="call_a", action="click", error="late"),
                     Takeover(control="human"), Takeover(control="model"), NetworkLog(complete=True),
                     RunFinished(status="passed"))
    found = steps(record)
    held = [id(e) for s in found for e in s.entries] + [id(s.response) for s in found if s.response is not None]
    assert sorted(held) == sorted(id(e) for e in record if e.type not in ("run_started", "run_finished", "check",
                                                                          "network_log"))
    position = {id(e): n for n, e in enumerate(record)}
    for step in found:
        assert [position[id(e)] for e in step.entries] == sorted(position[id(e)] for e in step.entries)
    assert [a.error for a in found[1].actions] == [None, "late"]  # a failed click of call_a, written later
