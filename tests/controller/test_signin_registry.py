"""Sign-in requests (``browser_authentication``) in the approval registry: the hosted sessions' answer
rules (``004``) enforced by :meth:`ApprovalRegistry.answer_signin`, values taken once and never shown
(not in a refusal, the request's JSON, its repr or the registry's snapshot), and the usual decisions:
cancel, withdrawal, closing, conflicts."""

from __future__ import annotations

import json
import threading

import pytest

from controller.run.registry import SIGN_IN, AnswerRefused, ApprovalRegistry
from wire.browser import MAX_SUBMIT_BYTES, MAX_VALUE_CHARS

SECRET = "S3cr3t-VALUE-xyz"
OTHER = "0ther-S3cr3t-VALUE-abc"

FIELDS = [
    {"id": "email", "label": "E-mail", "type": "email", "required": True, "kind": "email"},
    {"id": "password", "label": "Password", "type": "password", "required": True, "kind": "password"},
    {"id": "otp", "label": "One-time code", "type": "text", "required": True, "kind": "code"},
]
OPTIONS = [
    {"id": "pw", "label": "Sign in with a password", "field_ids": ["email", "password"]},
    {"id": "code", "label": "Email me a code", "field_ids": ["email", "otp"]},
]
PLAIN_FIELDS = [
    {"id": "email", "label": "E-mail", "type": "email", "required": True, "kind": "email"},
    {"id": "password", "label": "Password", "type": "password", "required": True, "kind": "password"},
    {"id": "otp", "label": "Code (if you have one)", "type": "text", "required": False, "kind": "code"},
]


def _with_options(reg: ApprovalRegistry):
    return reg.open_signin("The page asks you to sign in", credential_origin="https://login.example",
                           fields=FIELDS, options=OPTIONS)


def _plain(reg: ApprovalRegistry, fields=PLAIN_FIELDS):
    return reg.open_signin("The page asks you to sign in", credential_origin="https://login.example",
                           fields=fields, options=[])


def _submit(fields, option=None):
    answer = {"action": "submit", "fields": [{"field_id": i, "value": v} for i, v in fields]}
    if option is not None:
        answer["selected_option"] = option
    return answer


def _no_secret_anywhere(refused: AnswerRefused) -> None:
    """Neither the refusal nor anything chained to it (the pydantic error it came from) shows a value."""
    seen, exc = [], refused
    while exc is not None and len(seen) < 5:
        seen.append(exc)
        exc = exc.__cause__ or exc.__context__
    for exc in seen:
        for text in (str(exc), repr(exc), getattr(exc, "message", ""), json.dumps(getattr(exc, "as_json", dict)())):
            assert SECRET not in text and OTHER not in text, text
    assert "S3cr3t" not in refused.message


BIG = "é" * MAX_VALUE_CHARS  # 6 bytes of JSON each (\u00e9): two such values pass MAX_SUBMIT_BYTES


@pytest.mark.parametrize("make, answer, needle", [
    # with options: selected_option required, one of them, and only its fields
    (_with_options, _submit([("email", SECRET), ("password", OTHER)]), "selected_option must be one of"),
    (_with_options, _submit([("email", SECRET), ("password", OTHER)], "sms"), "selected_option must be one of"),
    (_with_options, _submit([("email", SECRET), ("otp", OTHER)], "pw"), "field otp is not a field"),
    (_with_options, _submit([("email", SECRET)], "pw"), "field password is required"),
    (_with_options, _submit([("email", SECRET), ("password", "")], "pw"), "fields.1.value"),
    # without options: no selected_option, at least one field, required fields given and non-empty
    (_plain, _submit([("email", SECRET), ("password", OTHER)], "pw"), "no options"),
    (_plain, {"action": "submit", "fields": []}, "give at least one field"),
    (_plain, {"action": "submit"}, "give at least one field"),
    (_plain, _submit([("email", SECRET)]), "field password is required"),
    (_plain, _submit([("email", SECRET), ("password", "")]), "fields.1.value"),
    (_plain, _submit([("email", SECRET), ("password", OTHER), ("username", SECRET)]), "field username is not"),
    (_plain, _submit([("email", SECRET), ("password", OTHER), ("email", SECRET)]), "each field may be given once"),
    (_plain, _submit([("email", SECRET), ("password", OTHER)] + [(f"f{n}", SECRET) for n in range(5)]), "at most 6"),
    (_plain, _submit([("email", SECRET), ("password", SECRET + "x" * (MAX_VALUE_CHARS + 1 - len(SECRET)))]),
     "fields.1.value"),
    (_plain, _submit([("email", SECRET + BIG[len(SECRET):]), ("password", SECRET + BIG[len(SECRET):])]),
     f"more than {MAX_SUBMIT_BYTES} bytes"),
    (_plain, _submit([("bad id!", SECRET), ("password", OTHER)]), "fields.0.field_id"),
    (_plain, {"action": "submit", "fields": [{"field_id": "email", "value": SECRET, "note": OTHER}]}, "fields.0"),
    (_plain, {"action": "submit", "fields": [{"field_id": "email", "value": 12345}]}, "fields.0.value"),
    (_plain, {"action": "submit", "fields": SECRET}, "fields"),
    (_plain, {**_submit([("email", SECRET), ("password", OTHER)]), "note": SECRET}, "action, fields and selected_option"),
    (_plain, {**_submit([("email", SECRET), ("password", OTHER)]), "type": "safety_check"}, "type must be"),
    (_plain, {"action": "approve", "fields": [{"field_id": "email", "value": SECRET}]}, "action"),
    (_plain, SECRET, "action"),
])
def test_answer_rules_refuse_with_400_naming_the_rule_never_the_value(make, answer, needle):
    reg = ApprovalRegistry()
    req = make(reg)
    with pytest.raises(AnswerRefused) as refused:
        reg.answer_signin(req.id, answer, by="console")
    assert (refused.value.status, refused.value.code) == (400, "invalid_answer")
    assert needle in refused.value.message, refused.value.message
    _no_secret_anywhere(refused.value)
    # nothing of the refused answer stays: still pending, no values, nothing submitted
    assert req.state == "pending" and req.submitted_fields == [] and req.selected_option is None
    assert reg.take_values(req) == []
    for text in (json.dumps(req.as_json()), repr(req), json.dumps(reg.snapshot())):
        assert SECRET not in text and OTHER not in text


def test_limits_are_inclusive():
    """A value of exactly MAX_VALUE_CHARS characters, and one value of 96 KiB of JSON, are taken."""
    reg = ApprovalRegistry()
    req = _plain(reg)
    longest = SECRET + "x" * (MAX_VALUE_CHARS - len(SECRET))
    reg.answer_signin(req.id, _submit([("email", SECRET), ("password", longest)]), by="console")
    assert req.state == "submitted"
    assert reg.take_values(req) == [("email", SECRET), ("password", longest)]
    req = _plain(reg, fields=PLAIN_FIELDS[:1])
    reg.answer_signin(req.id, _submit([("email", BIG)]), by="console")
    assert req.state == "submitted"


def test_a_submit_with_options_takes_the_chosen_option_and_its_fields():
    reg = ApprovalRegistry()
    req = _with_options(reg)
    seen = []
    reg.subscribe(lambda r: seen.append(json.dumps(r.as_json())))
    decided = reg.answer_signin(req.id, _submit([("email", SECRET), ("otp", OTHER)], "code"), by="console")
    assert decided is req
    assert (req.state, req.by, req.selected_option, req.submitted_fields) == ("submitted", "console", "code",
                                                                               ["email", "otp"])
    assert not req.pending and not req.approved and req.decided_at and req.latency_ms is not None
    # the views, the request's JSON and repr, and the snapshot never carry a value, before or after taking
    for text in (*seen, json.dumps(req.as_json()), repr(req), json.dumps(reg.snapshot()),
                 json.dumps([r.as_json() for r in reg.all()])):
        assert SECRET not in text and OTHER not in text
    assert reg.take_values(req) == [("email", SECRET), ("otp", OTHER)]
    assert reg.take_values(req) == []  # taken once
    assert req.submitted_fields == ["email", "otp"]


def test_a_submit_without_options_may_leave_optional_fields_out():
    reg = ApprovalRegistry()
    req = _plain(reg)
    reg.answer_signin(req.id, _submit([("password", OTHER), ("email", SECRET)]), by="terminal")
    assert (req.state, req.selected_option, req.submitted_fields) == ("submitted", None, ["password", "email"])
    assert reg.take_values(req) == [("password", OTHER), ("email", SECRET)]


def test_the_snapshot_shows_a_pending_sign_in_request_without_values():
    reg = ApprovalRegistry()
    req = _with_options(reg)
    pending = reg.snapshot()["pending"]
    assert [p["id"] for p in pending] == [req.id]
    shown = pending[0]
    assert shown["kind"] == SIGN_IN and shown["credential_origin"] == "https://login.example"
    assert [f["id"] for f in shown["fields"]] == ["email", "password", "otp"]
    assert shown["options"][1] == {"id": "code", "label": "Email me a code", "field_ids": ["email", "otp"]}
    assert shown["selected_option"] is None and shown["submitted_fields"] == []
    assert "credential_origin" not in reg.open("action", "Run click?").as_json()  # other kinds keep their shape


def test_a_second_submit_after_a_submit_is_409_and_changes_nothing():
    reg = ApprovalRegistry()
    req = _plain(reg)
    reg.answer_signin(req.id, _submit([("email", SECRET), ("password", SECRET)]), by="console")
    for answer in (_submit([("email", OTHER), ("password", OTHER)]),   # values are taken once: even the same
                   _submit([("email", SECRET), ("password", SECRET)]),  # submit again is a conflict
                   {"action": "cancel"}):
        with pytest.raises(AnswerRefused) as conflict:
            reg.answer_signin(req.id, answer, by="terminal")
        assert (conflict.value.status, conflict.value.code) == (409, "already_decided")
        _no_secret_anywhere(conflict.value)
    assert (req.state, req.by) == ("submitted", "console")
    assert reg.take_values(req) == [("email", SECRET), ("password", SECRET)]


def test_cancel_decides_and_a_later_submit_is_409():
    reg = ApprovalRegistry()
    req = _with_options(reg)
    assert reg.answer_signin(req.id, {"action": "cancel"}, by="console").state == "cancelled"
    assert reg.answer_signin(req.id, {"action": "cancel"}, by="terminal").by == "console"  # the same again: accepted
    with pytest.raises(AnswerRefused) as conflict:
        reg.answer_signin(req.id, _submit([("email", SECRET), ("password", OTHER)], "pw"), by="terminal")
    assert (conflict.value.status, conflict.value.code) == (409, "already_decided")
    _no_secret_anywhere(conflict.value)
    assert req.state == "cancelled" and req.submitted_fields == [] and reg.take_values(req) == []


def test_plain_answers_do_not_decide_a_sign_in_request_and_sign_in_answers_no_other():
    reg = ApprovalRegistry()
    req = _plain(reg)
    for answer in ("approve", "deny", "cancel"):
        with pytest.raises(AnswerRefused) as invalid:
            reg.answer(req.id, answer, by="console")
        assert (invalid.value.status, invalid.value.code) == (400, "invalid_answer")
    assert req.pending
    action = reg.open("action", "Run click?")
    with pytest.raises(AnswerRefused) as invalid:
        reg.answer_signin(action.id, _submit([("email", SECRET)]), by="console")
    assert (invalid.value.status, invalid.value.code) == (400, "invalid_answer")
    assert action.pending
    with pytest.raises(AnswerRefused) as unknown:
        reg.answer_signin("req_nope", {"action": "cancel"}, by="console")
    assert (unknown.value.status, unknown.value.code) == (404, "unknown_request")


def test_withdraw_all_and_close_withdraw_a_pending_sign_in_request():
    reg = ApprovalRegistry()
    first = _plain(reg)
    assert reg.withdraw_all("run cancelled") == [first]
    assert (first.state, first.by, first.reason) == ("withdrawn", "cancel", "run cancelled")
    with pytest.raises(AnswerRefused) as conflict:
        reg.answer_signin(first.id, _submit([("email", SECRET), ("password", OTHER)]), by="console")
    assert (conflict.value.status, conflict.value.code) == (409, "withdrawn")
    _no_secret_anywhere(conflict.value)

    second = _with_options(reg)
    waiter = threading.Thread(target=reg.wait, args=(second,))
    waiter.start()
    assert reg.close("run ended") == [second]
    waiter.join(5)
    assert not waiter.is_alive() and second.state == "withdrawn"
    with pytest.raises(AnswerRefused) as conflict:
        reg.answer_signin(second.id, {"action": "cancel"}, by="console")
    assert conflict.value.code == "withdrawn"
    late = _plain(reg)  # opened after closing: withdrawn at once
    assert (late.state, late.reason) == ("withdrawn", "run ended")
    assert reg.take_values(first) == reg.take_values(second) == reg.take_values(late) == []


def test_a_pending_sign_in_request_is_denied_at_its_deadline():
    reg = ApprovalRegistry(timeout_s=0.05)
    req = _plain(reg)
    assert reg.wait(req).state == "denied" and req.by == "timeout"


def test_labels_and_reason_are_escaped_in_the_json():
    reg = ApprovalRegistry()
    req = reg.open_signin("Sign in\x1b[2J\nnow", credential_origin="https://login.example\r\n\x07",
                          fields=[{"id": "email", "label": "E-mail\x1b[31m\n\u202e", "type": "email",
                                   "required": True, "kind": "email"}],
                          options=[{"id": "pw", "label": "Pass\x00word\r", "field_ids": ["email"]}])
    shown = req.as_json()
    texts = [shown["question"], shown["credential_origin"], shown["fields"][0]["label"], shown["options"][0]["label"]]
    for text in texts:
        assert not any(ch in text for ch in "\x1b\n\r\x07\x00\u202e"), text
    assert shown["fields"][0]["label"].startswith("E-mail") and "\\" in shown["fields"][0]["label"]
    assert shown["options"][0]["label"].startswith("Pass")


def test_concurrent_answers_decide_once_and_the_values_are_the_accepted_ones():
    """Twenty views answer at once (submits with different values, and cancels): one answer decides,
    every other gets 409 but a cancel of the request a cancel decided (the same answer again is accepted
    and changes nothing), and the values held are exactly the deciding submit's (none when a cancel won)."""
    for _round in range(20):
        reg = ApprovalRegistry()
        req = _plain(reg)
        taken: list[tuple[str, object]] = []
        start = threading.Barrier(20)

        def answer(n: int) -> None:
            response = {"action": "cancel"} if n % 5 == 0 else _submit([("email", f"v{n}"), ("password", f"v{n}")])
            start.wait(5)
            try:
                reg.answer_signin(req.id, response, by=f"view{n}")
                taken.append((f"view{n}", response))
            except AnswerRefused as refused:
                assert refused.status == 409
        threads = [threading.Thread(target=answer, args=(n,)) for n in range(20)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        [decided] = [response for view, response in taken if view == req.by]
        again = [response for view, response in taken if view != req.by]
        assert all(r == {"action": "cancel"} for r in again) and (not again or req.state == "cancelled"), taken
        assert (decided["action"], req.state) in (("cancel", "cancelled"), ("submit", "submitted"))
        values = reg.take_values(req)
        if req.state == "cancelled":
            assert values == []
        else:
            n = req.by.removeprefix("view")
            assert values == [("email", f"v{n}"), ("password", f"v{n}")]


