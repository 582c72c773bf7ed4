"""The approval registry on its own: one decision per request whoever answers first, the answer
semantics, the deadline, withdrawal, and closing (cancellation) with no answer slipping in between."""

from __future__ import annotations

import threading

import pytest

from controller.run.registry import AnswerRefused, ApprovalRegistry


def test_answer_semantics():
    reg = ApprovalRegistry()
    req = reg.open("action", "Run click?", actions=["click (1,2) left"])
    assert reg.answer(req.id, "approve", by="console").approved
    assert reg.answer(req.id, "approve", by="terminal").by == "console"  # the same answer again: accepted
    with pytest.raises(AnswerRefused) as conflict:
        reg.answer(req.id, "deny", by="terminal")
    assert (conflict.value.status, conflict.value.code) == (409, "already_decided")
    with pytest.raises(AnswerRefused) as unknown:
        reg.answer("req_nope", "deny", by="console")
    assert (unknown.value.status, unknown.value.code) == (404, "unknown_request")
    for bad in ("APPROVE", "yes", True, None, ["approve"], "approve "):
        with pytest.raises(AnswerRefused) as invalid:
            reg.answer(req.id, bad, by="console")
        assert (invalid.value.status, invalid.value.code) == (400, "invalid_answer")


def test_many_answers_at_once_make_one_decision():
    for _ in range(50):
        reg = ApprovalRegistry()
        req = reg.open("safety_check", "ok?")
        barrier = threading.Barrier(8)
        accepted: list[str] = []

        def answer(value: str) -> None:
            barrier.wait()
            try:
                reg.answer(req.id, value, by=value)
                accepted.append(value)
            except AnswerRefused as exc:
                assert exc.status == 409

        threads = [threading.Thread(target=answer, args=("approve" if i % 2 else "deny",)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert set(accepted) == {req.by} and req.state == ("approved" if req.by == "approve" else "denied")


def test_the_deadline_denies_and_cancel_withdraws():
    reg = ApprovalRegistry(timeout_s=0.2)
    late = reg.wait(reg.open("action", "a?"))
    assert late.state == "denied" and late.by == "timeout" and late.latency_ms >= 200
    flag = {"set": False}
    gone = reg.wait(reg.open("action", "b?"), cancelled=lambda: flag.__setitem__("set", True) or flag["set"])
    assert gone.state == "withdrawn" and not gone.approved
    with pytest.raises(AnswerRefused) as refused:
        reg.answer(gone.id, "approve", by="console")
    assert (refused.value.status, refused.value.code) == (409, "withdrawn")
    with pytest.raises(ValueError):
        ApprovalRegistry(timeout_s=0)


def test_close_sets_the_flag_and_withdraws_with_no_answer_between():
    """The console's Cancel: the run's flag and the withdrawal happen under one lock, so an answer
    racing the cancel is either decided before both or refused; a question asked later is withdrawn."""
    for _ in range(100):
        reg = ApprovalRegistry()
        req = reg.open("safety_check", "ok?")
        cancelled = {"at": None}
        barrier = threading.Barrier(2)
        outcome: list[str] = []

        def approve() -> None:
            barrier.wait()
            try:
                reg.answer(req.id, "approve", by="console")
                outcome.append("approved-before" if cancelled["at"] is None else "approved-after")
            except AnswerRefused:
                outcome.append("refused")

        t = threading.Thread(target=approve)
        t.start()
        barrier.wait()
        reg.close("run cancelled", then=lambda: cancelled.__setitem__("at", req.state))
        t.join()
        assert outcome[0] != "approved-after"
        assert (req.state, cancelled["at"]) in (("withdrawn", "pending"), ("approved", "approved"))
    later = reg.open("action", "after?")
    assert later.state == "withdrawn" and later.reason == "run cancelled"


def test_text_from_the_model_is_escaped_and_views_hear_every_change():
    reg = ApprovalRegistry()
    heard: list[str] = []
    stop = reg.subscribe(lambda r: heard.append(r.state))
    req = reg.open("safety_check", "q\x1b[2J", checks=[{"id": "i", "code": "c\u202e", "message": "m\u2028x"}])
    assert "\x1b" not in req.question and "\u202e" not in req.checks[0]["code"]
    assert "\u2028" not in req.checks[0]["message"]
    reg.answer(req.id, "deny", by="console")
    stop()
    reg.open("action", "unheard")
    assert heard == ["pending", "denied"]
    snap = reg.snapshot()
    assert [r["question"] for r in snap["pending"]] == ["unheard"] and snap["version"] == 3
