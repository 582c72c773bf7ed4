"""Sign-in answers through the console's HTTP route (``POST /runs/{id}/approvals/{request_id}`` for a
``browser_authentication`` request): submit and cancel go to the registry, refusals are the structured
4xx without the value, the body is capped at :data:`controller.console.app.SIGNIN_MAX_BODY` (bigger
than the approvals' cap: values may take 120 KiB), the Guard's CSRF and Origin checks still apply, and
nothing of a value is answered, logged or printed -- not even when answering fails unexpectedly."""

from __future__ import annotations

import json
import logging

from controller.console.app import MAX_BODY, SIGNIN_MAX_BODY

ORIGIN = "http://signin-demo:8080"
SECRET = "pw-Route-Secret-73kx"
FIELDS = [{"id": "email", "label": "E-mail", "type": "email", "required": True, "kind": "email"},
          {"id": "password", "label": "Password", "type": "password", "required": True, "kind": "password"}]


def _error(resp) -> tuple[int, str, str]:
    error = resp.json()["error"]
    return resp.status_code, error["code"], error["message"]


def test_submit_and_refusals_carry_no_value(session, live, caplog, capfd):
    caplog.set_level(logging.DEBUG)
    request = live.registry.open_signin("Sign in", credential_origin=ORIGIN, fields=FIELDS, options=[])
    path = f"/runs/{live.run_id}/approvals/{request.id}"

    for body, code in (({"answer": "approve"}, "invalid_body"), (["submit"], "invalid_body"),
                       ({"action": "maybe"}, "invalid_answer"),
                       ({"action": "submit", "fields": [{"field_id": "pin", "value": SECRET}]}, "invalid_answer"),
                       ({"action": "submit", "fields": [{"field_id": "password", "value": SECRET}],
                         "selected_option": "x"}, "invalid_answer"),
                       ({"action": "submit", "fields": [{"field_id": "password", "value": SECRET}]}, "invalid_answer"),
                       ({"action": "submit", "fields": [{"field_id": "password", "value": 7}]}, "invalid_answer"),
                       ({"action": "submit", "fields": [{"field_id": "password", "value": SECRET}], "extra": SECRET},
                        "invalid_answer")):
        resp = session.post(path, body)
        assert resp.status_code == 400 and _error(resp)[1] == code, (body, resp.text)
        assert SECRET not in resp.text
    assert request.pending

    # the Guard's checks come first: no CSRF token, another Origin
    sent = {"action": "submit", "fields": [{"field_id": "email", "value": "a@b.test"},
                                           {"field_id": "password", "value": SECRET}]}
    assert _error(session.post(path, sent, drop=("X-CSRF-Token",)))[:2] == (403, "bad_csrf")
    assert _error(session.post(path, sent, headers={"Origin": "http://evil.example"}))[:2] == (403, "bad_origin")
    assert request.pending

    ok = session.post(path, sent)
    assert ok.status_code == 202 and SECRET not in ok.text, ok.text
    answered = ok.json()
    assert answered["state"] == "submitted" and answered["by"] == "console"
    assert answered["submitted_fields"] == ["email", "password"] and answered["credential_origin"] == ORIGIN
    again = session.post(path, sent)  # values are taken once
    assert _error(again)[:2] == (409, "already_decided") and SECRET not in again.text
    assert SECRET not in session.get(f"/runs/{live.run_id}/approvals").text
    assert live.registry.take_values(request) == [("email", "a@b.test"), ("password", SECRET)]
    logged = caplog.text + "".join(capfd.readouterr())
    assert SECRET not in logged


def test_cancel_and_the_other_kinds_stay_apart(session, live):
    request = live.registry.open_signin("Sign in", credential_origin=ORIGIN, fields=FIELDS, options=[])
    check = live.registry.open("safety_check", "Go on?")
    signin_path = f"/runs/{live.run_id}/approvals/{request.id}"
    check_path = f"/runs/{live.run_id}/approvals/{check.id}"
    approve = session.post(signin_path, {"answer": "approve"})  # an approve/deny body is not a sign-in answer
    assert _error(approve)[:2] == (400, "invalid_body")
    assert _error(session.post(check_path, {"action": "cancel"}))[:2] == (400, "invalid_body")
    assert check.pending and request.pending
    unknown = session.post(f"/runs/{live.run_id}/approvals/req_nope", {"action": "cancel"})
    assert _error(unknown)[:2] == (404, "unknown_request")

    cancelled = session.post(signin_path, {"action": "cancel"})
    assert cancelled.status_code == 202 and cancelled.json()["state"] == "cancelled"
    assert request.state == "cancelled" and request.by == "console"
    assert session.post(signin_path, {"action": "cancel"}).status_code == 202  # the same answer again
    late = session.post(signin_path, {"action": "submit", "fields": [{"field_id": "email", "value": "a@b.test"},
                                                                     {"field_id": "password", "value": SECRET}]})
    assert _error(late)[:2] == (409, "already_decided") and SECRET not in late.text
    assert live.registry.take_values(request) == []


def test_the_body_cap_fits_the_largest_submission(session, live):
    fields = [{"id": f"f{i}", "label": f"F{i}", "type": "password", "required": True, "kind": "password"}
              for i in range(6)]
    request = live.registry.open_signin("Sign in", credential_origin=ORIGIN, fields=fields, options=[])
    path = f"/runs/{live.run_id}/approvals/{request.id}"
    too_big = json.dumps({"action": "submit", "fields": [{"field_id": "f0", "value": "v" * (SIGNIN_MAX_BODY + 1)}]})
    resp = session.post(path, raw=too_big.encode())
    assert _error(resp)[:2] == (413, "too_large") and request.pending
    values = [(f"f{i}", chr(ord("a") + i) * 16000) for i in range(6)]
    body = json.dumps({"action": "submit", "fields": [{"field_id": k, "value": v} for k, v in values]}).encode()
    assert MAX_BODY < len(body) < SIGNIN_MAX_BODY  # bigger than any other answer may be
    ok = session.post(path, raw=body)
    assert ok.status_code == 202 and len(ok.content) < 4096, ok.text[:300]
    assert live.registry.take_values(request) == values


def test_an_unexpected_failure_logs_its_kind_only(session, live, caplog, capfd, monkeypatch):
    caplog.set_level(logging.DEBUG)
    request = live.registry.open_signin("Sign in", credential_origin=ORIGIN, fields=FIELDS, options=[])

    def broken(request_id, response, *, by):
        raise RuntimeError(f"broke on {response['fields'][0]['value']}")

    monkeypatch.setattr(live.registry, "answer_signin", broken)
    resp = session.post(f"/runs/{live.run_id}/approvals/{request.id}",
                        {"action": "submit", "fields": [{"field_id": "password", "value": SECRET}]})
    assert _error(resp)[:2] == (500, "internal_error") and SECRET not in resp.text
    assert "a sign-in answer failed: RuntimeError" in caplog.text
    logged = caplog.text + "".join(capfd.readouterr())
    assert SECRET not in logged
    assert request.pending
