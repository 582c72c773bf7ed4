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


# -- origin requests (kind origin_access): the gateway's questions --------------------------------------

def _iso(offset_s: float) -> str:
    import datetime as dt

    return (dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=offset_s)).isoformat(timespec="milliseconds")


def _origin(reg: ApprovalRegistry, rid: str = "oreq_abc", **kwargs):
    fields = dict(origin="https://example.test:443", reason="the guest asked", via="CONNECT", held=1,
                  created_at=_iso(0), deadline_at=_iso(25))
    fields.update(kwargs)
    return reg.mirror(rid, **fields)


@pytest.mark.parametrize("answer, state", [("approve", "approved"), ("deny", "denied"), ("cancel", "cancelled")])
def test_origin_request_answer_rows(answer, state):
    reg = ApprovalRegistry()
    req, new = _origin(reg)
    assert new and req.id == "oreq_abc" and req.kind == "origin_access" and req.pending
    assert reg.answer(req.id, answer, by="console").state == state  # 202
    assert reg.answer(req.id, answer, by="terminal").by == "console"  # the same again: accepted, unchanged
    for other in {"approve", "deny", "cancel"} - {answer}:
        with pytest.raises(AnswerRefused) as conflict:
            reg.answer(req.id, other, by="terminal")
        assert (conflict.value.status, conflict.value.code) == (409, "already_decided")
    with pytest.raises(AnswerRefused) as unknown:
        reg.answer("oreq_nope", answer, by="console")
    assert (unknown.value.status, unknown.value.code) == (404, "unknown_request")
    for bad in ("CANCEL", "yes", None, True, ["cancel"]):
        with pytest.raises(AnswerRefused) as invalid:
            reg.answer(req.id, bad, by="console")
        assert (invalid.value.status, invalid.value.code) == (400, "invalid_answer")


def test_cancel_answers_only_an_origin_request():
    reg = ApprovalRegistry()
    for kind in ("safety_check", "action"):
        req = reg.open(kind, "ok?")
        with pytest.raises(AnswerRefused) as invalid:
            reg.answer(req.id, "cancel", by="console")
        assert (invalid.value.status, invalid.value.code) == (400, "invalid_answer") and req.pending


def test_expired_and_withdrawn_origin_requests_refuse_every_answer():
    reg = ApprovalRegistry()
    expired, _ = _origin(reg, "oreq_exp")
    assert reg.resolve(expired.id, "expired", by="timeout")
    withdrawn, _ = _origin(reg, "oreq_wd")
    reg.withdraw_all("run cancelled")
    for answer in ("approve", "deny", "cancel"):
        with pytest.raises(AnswerRefused) as late:
            reg.answer(expired.id, answer, by="console")
        assert (late.value.status, late.value.code) == (409, "expired")
        with pytest.raises(AnswerRefused) as gone:
            reg.answer(withdrawn.id, answer, by="console")
        assert (gone.value.status, gone.value.code) == (409, "withdrawn")


def test_the_gateway_owns_an_origin_requests_deadline():
    """The deadline is the gateway's ``deadline_at`` (latency counts from its ``created_at``), and the
    registry never decides the request at it: a wait goes on until the gateway decides (or the run is
    cancelled)."""
    reg = ApprovalRegistry(timeout_s=0.1)  # --approval-timeout does not apply to origin requests
    req, _ = _origin(reg, created_at=_iso(-2), deadline_at=_iso(-0.5))
    assert req.deadline_s == pytest.approx(1.5, abs=0.01) and req.seconds_left() == 0
    assert req.deadline_at is not None and req.as_json()["deadline_at"] == req.deadline_at
    polls = {"n": 0}

    def cancelled() -> bool:
        polls["n"] += 1
        if polls["n"] == 5:
            reg.resolve(req.id, "expired", by="timeout", reason="the gateway's deadline passed")
        return False

    assert reg.wait(req, cancelled).state == "expired" and polls["n"] >= 5
    assert req.latency_ms >= 2000  # from the gateway's created_at
    live, _ = _origin(reg, "oreq_live", created_at=_iso(0), deadline_at=_iso(25))
    assert 24 < live.seconds_left() <= 25 and live.deadline_s == pytest.approx(25, abs=0.01)


def test_mirroring_is_idempotent_and_checks_what_the_gateway_says():
    reg = ApprovalRegistry()
    heard: list[str] = []
    reg.subscribe(lambda r: heard.append(r.state))
    first, new = _origin(reg, origin="https://e\x1b[2J.test", reason="r\u202eeason")
    again, repeated = _origin(reg)
    assert new and not repeated and again is first and heard == ["pending"]
    assert "\x1b" not in first.origin and "\u202e" not in first.origin_reason
    for bad in ("req_abc", "oreq_", "oreq_a/b", "oreq_" + "a" * 129, "oreq_a b"):
        with pytest.raises(ValueError):
            reg.mirror(bad, origin="https://a.test", reason="r")
    with pytest.raises(ValueError):
        _origin(reg, "oreq_naive", deadline_at="2030-01-01T00:00:00")
    assert reg.resolve(first.id, "approved", by="terminal") and not reg.resolve(first.id, "denied", by="console")
    assert (first.state, first.by) == ("approved", "terminal") and not reg.resolve("oreq_unknown", "denied", by="x")
    with pytest.raises(ValueError):
        reg.resolve(first.id, "pending", by="x")  # type: ignore[arg-type]
    reg.close("run ended")
    late, _ = _origin(reg, "oreq_late")
    assert late.state == "withdrawn" and late.reason == "run ended"


def test_an_answer_the_gateway_does_not_take_leaves_the_request_pending():
    """``forward`` is how an answer reaches the gateway; a forward that refuses (as the gateway does when
    it cannot be reached) stands in for one here, for the registry's own rule: nothing is decided then.
    The real gateway's answers and refusals: tests/controller/test_origins.py."""
    reg = ApprovalRegistry()
    sent: list[tuple[str, str]] = []

    def forward(answer: str, by: str) -> None:
        sent.append((answer, by))
        raise AnswerRefused(502, "gateway_unavailable", "the gateway did not answer")

    req, _ = _origin(reg, forward=forward)
    with pytest.raises(AnswerRefused) as refused:
        reg.answer(req.id, "approve", by="console")
    assert (refused.value.status, refused.value.code) == (502, "gateway_unavailable")
    assert req.pending and sent == [("approve", "console")]
