"""Answering sign-in requests without a person at the terminal: the ``--sign-in FILE`` rules
(:func:`read_signin_file`: private, regular, small TOML of origin -> strings), the answer a table gives
(:func:`answer_from_table`), :class:`SignInFile` answering registry requests end to end, and the driver's
:class:`SignInFlow` against a test double of the agent (no browser runs here)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from controller.agent_client import AgentError
from controller.run.entries import SignIn
from controller.run.registry import ApprovalRegistry
from controller.run.signin import (MAX_SIGNIN_FILE_BYTES, SignInFile, SignInFileError, SignInFlow,
                                   answer_from_table, check_signin_file, read_signin_file)
from controller.text import clean
from wire.browser import FillRequest, FillResult, SignInField, SignInForm, SignInOption, SignInPage

SECRET = "S3cr3t-VALUE-xyz"
CODE = "C0de-VALUE-987"
ORIGIN = "https://login.example"
GOOD_TOML = f'["{ORIGIN}"]\nmethod = "password"\nemail = "me@example.com"\npassword = "{SECRET}"\n'


def _file(tmp_path: Path, text: str | bytes, mode: int = 0o600, name: str = "signin.toml") -> Path:
    path = tmp_path / name
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    path.chmod(mode)
    return path


def _refused(path: Path, needle: str) -> str:
    for read in (read_signin_file, check_signin_file):
        with pytest.raises(SignInFileError) as refused:
            read(path)
        message = str(refused.value)
        assert needle in message and str(path) in message, message
        assert SECRET not in message and "S3cr3t" not in message, message
        chained = [refused.value.__cause__, refused.value.__context__]
        assert not any(SECRET in f"{exc!s} {exc!r}" for exc in chained if exc is not None), chained
    return message


# -- read_signin_file -------------------------------------------------------------------------------
def test_a_private_file_reads_as_tables_of_strings(tmp_path):
    for mode in (0o600, 0o400):
        path = _file(tmp_path, GOOD_TOML, mode)
        assert read_signin_file(path) == {ORIGIN: {"method": "password", "email": "me@example.com", "password": SECRET}}
        check_signin_file(path)


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o620, 0o602])
def test_a_file_group_or_others_can_read_or_write_is_refused_naming_the_mode(tmp_path, mode):
    message = _refused(_file(tmp_path, GOOD_TOML, mode), f"mode {mode:04o}")
    assert "group or others" in message and "chmod 600" in message


def test_a_symlink_is_not_followed(tmp_path):
    target = _file(tmp_path, GOOD_TOML, 0o600, "real.toml")
    link = tmp_path / "signin.toml"
    link.symlink_to(target)
    _refused(link, "cannot open")


def test_a_directory_is_refused(tmp_path):
    (tmp_path / "dir").mkdir(mode=0o700)
    _refused(tmp_path / "dir", "not a regular file")


def test_a_missing_file_is_refused(tmp_path):
    _refused(tmp_path / "absent.toml", "cannot open")


@pytest.mark.parametrize("text", [
    f'["{ORIGIN}"]\npassword = {SECRET}\n',              # not TOML (an unquoted value)
    f'["{ORIGIN}"]\npassword = "{SECRET}\n',             # an unterminated string
    f'["{ORIGIN}"]\npassword = "{SECRET}"\n'.encode("utf-16"),  # not UTF-8
])
def test_a_file_that_is_not_utf8_toml_is_refused(tmp_path, text):
    _refused(_file(tmp_path, text), "not UTF-8 TOML")



def test_a_file_that_is_not_utf8_keeps_no_value_in_the_refusal(tmp_path):
    _refused(_file(tmp_path, f'["{ORIGIN}"]\npassword = "{SECRET}\xff"\n'.encode("latin-1")), "not UTF-8 TOML")


@pytest.mark.parametrize("text", [
    f'["{ORIGIN}"]\npassword = "{SECRET}"\nremember = true\n',
    f'["{ORIGIN}"]\npassword = "{SECRET}"\nretries = 3\n',
    f'["{ORIGIN}"]\npassword = ["{SECRET}"]\n',
    f'["{ORIGIN}".nested]\npassword = "{SECRET}"\n',
    f'password = "{SECRET}"\n',                          # a value outside any origin's table
])
def test_a_table_value_that_is_not_a_string_is_refused(tmp_path, text):
    _refused(_file(tmp_path, text), "expected tables of strings")


def test_a_file_over_64_kib_is_refused_and_64_kib_is_read(tmp_path):
    head = GOOD_TOML + "# "
    exact = head + "x" * (MAX_SIGNIN_FILE_BYTES - len(head) - 1) + "\n"
    assert len(exact.encode()) == MAX_SIGNIN_FILE_BYTES
    assert read_signin_file(_file(tmp_path, exact))[ORIGIN]["password"] == SECRET
    _refused(_file(tmp_path, exact + "\n", name="big.toml"), f"larger than {MAX_SIGNIN_FILE_BYTES} bytes")


# -- answer_from_table -------------------------------------------------------------------------------
FIELDS = [
    {"id": "user", "label": "E-mail", "type": "email", "required": True, "kind": "email"},
    {"id": "pass", "label": "Password", "type": "password", "required": True, "kind": "password"},
    {"id": "otp", "label": "Code", "type": "text", "required": True, "kind": "code"},
]
OPTIONS = [
    {"id": "pw", "label": "Sign in with a password", "field_ids": ["user", "pass"]},
    {"id": "mailcode", "label": "Email me a one-time code", "field_ids": ["user", "otp"]},
]


def _request(reg: ApprovalRegistry, fields=FIELDS, options=OPTIONS):
    return reg.open_signin("sign in", credential_origin=ORIGIN, fields=fields, options=options)


@pytest.mark.parametrize("method, option", [("pw", "pw"), ("MAILCODE", "mailcode"), ("password", "pw"),
                                            ("One-Time", "mailcode"), ("  code ", "mailcode")])
def test_the_option_is_chosen_by_id_or_a_word_of_its_label(method, option):
    reg = ApprovalRegistry()
    req = _request(reg)
    table = {"method": method, "email": "me@example.com", "password": SECRET, "code": CODE}
    answer = answer_from_table(req, table)
    assert answer["action"] == "submit" and answer["selected_option"] == option
    wanted = {"pw": ["user", "pass"], "mailcode": ["user", "otp"]}[option]
    assert [f["field_id"] for f in answer["fields"]] == wanted
    reg.answer_signin(req.id, answer, by="sign-in file")  # the registry takes what the table gave
    assert req.state == "submitted" and req.submitted_fields == wanted


def test_fields_are_filled_by_id_first_then_by_kind():
    reg = ApprovalRegistry()
    req = _request(reg, options=[])
    answer = answer_from_table(req, {"email": "by-kind@example.com", "user": "by-id@example.com",
                                     "password": SECRET, "code": CODE})
    assert answer == {"action": "submit", "fields": [{"field_id": "user", "value": "by-id@example.com"},
                                                     {"field_id": "pass", "value": SECRET},
                                                     {"field_id": "otp", "value": CODE}]}
    assert "selected_option" not in answer


def test_an_optional_field_without_a_value_is_left_out():
    reg = ApprovalRegistry()
    fields = [FIELDS[0], FIELDS[1], {**FIELDS[2], "required": False}]
    req = _request(reg, fields=fields, options=[])
    answer = answer_from_table(req, {"email": "me@example.com", "password": SECRET})
    assert [f["field_id"] for f in answer["fields"]] == ["user", "pass"]
    reg.answer_signin(req.id, answer, by="sign-in file")
    assert req.state == "submitted"


@pytest.mark.parametrize("options, table", [
    (OPTIONS, {"email": "me@example.com", "password": SECRET}),                       # no method
    (OPTIONS, {"method": "sms", "email": "me@example.com", "password": SECRET}),      # no option matches
    (OPTIONS, {"method": "", "email": "me@example.com", "password": SECRET}),
    (OPTIONS, {"method": "pw", "email": "me@example.com"}),                           # required password missing
    (OPTIONS, {"method": "pw", "email": "me@example.com", "password": ""}),           # an empty value is no value
    ([], {"email": "me@example.com", "code": CODE}),                                  # required password missing
    ([], {}),
])
def test_a_table_that_cannot_answer_cancels(options, table):
    reg = ApprovalRegistry()
    req = _request(reg, options=options)
    assert answer_from_table(req, table) == {"action": "cancel"}


def test_all_fields_optional_and_none_given_cancels():
    reg = ApprovalRegistry()
    req = _request(reg, fields=[{**FIELDS[2], "required": False}], options=[])
    assert answer_from_table(req, {"email": "me@example.com"}) == {"action": "cancel"}



def test_an_option_named_by_its_id_wins_over_a_label_that_contains_the_word():
    reg = ApprovalRegistry()
    req = _request(reg, options=[{"id": "sms", "label": "Text me a code", "field_ids": ["otp"]},
                                 {"id": "code", "label": "Use an authenticator app", "field_ids": ["otp"]}])
    assert answer_from_table(req, {"method": "code", "code": CODE})["selected_option"] == "code"


# -- SignInFile: registry requests answered end to end ------------------------------------------------
def test_sign_in_file_submits_a_request_from_its_origins_table(tmp_path):
    path = _file(tmp_path, GOOD_TOML)
    reg = ApprovalRegistry(timeout_s=10)
    answerer = SignInFile(path, reg)
    try:
        req = _request(reg)
        reg.wait(req)
        assert (req.state, req.by, req.selected_option, req.submitted_fields) == ("submitted", "sign-in file", "pw",
                                                                                   ["user", "pass"])
        assert reg.take_values(req) == [("user", "me@example.com"), ("pass", SECRET)]
        assert SECRET not in json.dumps(req.as_json()) and SECRET not in repr(req)
        # read anew for each request: a changed file answers the next one
        path.write_text(f'["{ORIGIN}"]\nmethod = "code"\nemail = "me@example.com"\ncode = "{CODE}"\n')
        second = _request(reg)
        reg.wait(second)
        assert (second.state, second.selected_option, second.submitted_fields) == ("submitted", "mailcode",
                                                                                    ["user", "otp"])
    finally:
        answerer.stop()


@pytest.mark.parametrize("text, mode", [
    (f'["https://elsewhere.example"]\nmethod = "password"\nemail = "me@example.com"\npassword = "{SECRET}"\n', 0o600),
    (GOOD_TOML, 0o644),                     # readable by others: refused, so the request is cancelled
    (f'["{ORIGIN}"]\nmethod = "sms"\npassword = "{SECRET}"\n', 0o600),
])
def test_sign_in_file_cancels_what_it_cannot_answer(tmp_path, text, mode):
    from rich.console import Console

    console = Console(record=True, width=200)
    reg = ApprovalRegistry(timeout_s=10)
    answerer = SignInFile(_file(tmp_path, text, mode), reg, console)
    try:
        req = _request(reg)
        reg.wait(req)
        assert (req.state, req.by, req.submitted_fields) == ("cancelled", "sign-in file", [])
        assert reg.take_values(req) == []
    finally:
        answerer.stop()
    assert SECRET not in console.export_text()


# -- SignInFlow ----------------------------------------------------------------------------------------
PAGE = SignInPage(origin=ORIGIN, url=f"{ORIGIN}/login", title="Sign in", form=SignInForm(
    fields=[SignInField(id="user", label="E-mail", type="email", kind="email", required=True),
            SignInField(id="pass", label="Password", type="password", kind="password", required=True)],
    options=[SignInOption(id="pw", label="Sign in with a password", field_ids=["user", "pass"])]))


class FakeAgent:
    """A test double standing in for the guest agent (``controller.agent_client.AgentClient``): no browser
    runs in this unit test. ``signin_page()`` returns ``page`` on its first call and None afterwards (the
    form is gone once submitted); ``signin_fill()`` records the :class:`FillRequest` it got and answers
    ``outcome``; ``fail`` makes ``signin_fill`` raise an AgentError instead."""

    def __init__(self, page: SignInPage | None = PAGE, outcome: str = "submitted", fail: bool = False,
                 **result: str) -> None:
        self.page, self.outcome, self.fail, self.result = page, outcome, fail, result
        self.page_calls = 0
        self.fills: list[FillRequest] = []

    def signin_page(self) -> SignInPage | None:
        self.page_calls += 1
        return self.page if self.page_calls == 1 else None

    def signin_fill(self, fill: FillRequest) -> FillResult:
        self.fills.append(fill)
        if self.fail:
            raise AgentError(502, "cdp_error", "the browser went away")
        return FillResult(outcome=self.outcome, navigated=True, origin=ORIGIN, **self.result)


def _answer_with(reg: ApprovalRegistry, response: dict) -> None:
    """Answer every new sign-in request as a console would (on the opening thread: first answer wins)."""
    def on_change(request):
        if request.kind == "browser_authentication" and request.pending:
            reg.answer_signin(request.id, json.loads(json.dumps(response)), by="console")
    reg.subscribe(on_change)


def _flow(agent, reg, entries, *, allows=lambda origin: True, answerable=lambda: True):
    return SignInFlow(agent, reg, allows=allows, write=entries.append, answerable=answerable,
                      cancelled=lambda: False, screenshot=lambda: "step-001.png")


SUBMIT = {"action": "submit", "selected_option": "pw",
          "fields": [{"field_id": "user", "value": "me@example.com"}, {"field_id": "pass", "value": SECRET}]}


def test_flow_fills_a_submitted_answer_and_records_no_value():
    reg, entries, agent = ApprovalRegistry(timeout_s=10), [], FakeAgent()
    _answer_with(reg, SUBMIT)
    assert _flow(agent, reg, entries)() is True
    [fill] = agent.fills
    assert fill.credential_origin == ORIGIN and fill.selected_option == "pw"
    assert [(f.field_id, f.value) for f in fill.fields] == [("user", "me@example.com"), ("pass", SECRET)]
    [request] = reg.all()
    assert (request.state, request.screenshot) == ("submitted", "step-001.png")
    assert reg.take_values(request) == []  # the flow took them
    [entry] = entries
    assert isinstance(entry, SignIn)
    assert (entry.outcome, entry.request_id, entry.step, entry.origin, entry.method, entry.submitted, entry.by,
            entry.navigated) == ("submitted", request.id, 1, ORIGIN, "pw", ["user", "pass"], "console", True)
    assert entry.fields == ["user", "pass"] and entry.options == ["pw"]
    text = json.dumps(entry.as_json())
    assert SECRET not in text and "me@example.com" not in text
    assert SECRET not in repr(fill)
    # the same form is not asked about again
    agent.page_calls = 0
    assert _flow(agent, reg, entries)() is True  # a new flow asks anew...
    flow = _flow(FakeAgent(), reg, entries)
    assert flow() is True
    flow.agent.page_calls = 0
    assert flow() is False and len(reg.all()) == 3  # ...but one flow asks about one form once


@pytest.mark.parametrize("outcome", ["origin_changed", "form_changed", "field_unstable", "no_form"])
def test_flow_records_what_the_fill_came_to(outcome):
    reg, entries, agent = ApprovalRegistry(timeout_s=10), [], FakeAgent(outcome=outcome)
    _answer_with(reg, SUBMIT)
    assert _flow(agent, reg, entries)() is True
    assert [e.outcome for e in entries] == [outcome] and agent.page_calls == 1  # no next step after a failed fill
    assert SECRET not in json.dumps(entries[0].as_json())


@pytest.mark.parametrize("outcome, destination, detail", [
    ("unsafe_form", ORIGIN, "the form's method is 'get', not post: the values would be in the URL"),
    ("cross_origin_form", "https://collector.example", "the form sends to https://collector.example, not to ..."),
    ("invalid", ORIGIN, "the browser's validation stops the submit: field user: is not of the field's type\x1b[31m"),
    ("cross_origin_redirect", "https://collector.example",
     "the site answered the submit with a redirect to https://collector.example that would send the values there "
     "again: refused before they left"),
])
def test_flow_records_a_refused_form_with_its_destination_and_why(outcome, destination, detail):
    reg, entries, agent = ApprovalRegistry(timeout_s=10), [], FakeAgent(outcome=outcome, destination=destination,
                                                                        detail=detail)
    _answer_with(reg, SUBMIT)
    assert _flow(agent, reg, entries)() is True
    [entry] = entries
    assert (entry.outcome, entry.destination, entry.submitted) == (outcome, destination, ["user", "pass"])
    assert entry.detail == clean(detail, 300) and "\x1b" not in entry.detail  # page text, escaped
    assert agent.page_calls == 1  # a refused fill ends the sign-in


@pytest.mark.parametrize("method, destination, outcome", [
    ("get", ORIGIN, "unsafe_form"),
    ("dialog", ORIGIN, "unsafe_form"),
    ("", "", "unsafe_form"),                               # the fields are in no form
    ("post", "https://collector.example", "cross_origin_form"),
    ("post", "null", "cross_origin_form"),                 # javascript: or another opaque destination
    ("post", "https://login.example:8443", "cross_origin_form"),
])
def test_flow_asks_nobody_about_a_form_that_would_send_elsewhere(method, destination, outcome):
    page = PAGE.model_copy(update={"form": PAGE.form.model_copy(update={"method": method, "destination": destination})})
    reg, entries, agent = ApprovalRegistry(timeout_s=10), [], FakeAgent(page=page)
    _answer_with(reg, SUBMIT)
    flow = _flow(agent, reg, entries)
    assert flow() is False
    assert reg.all() == [] and agent.fills == []
    [entry] = entries
    assert (entry.outcome, entry.request_id, entry.destination, entry.by) == (outcome, None, destination or None, None)
    agent.page_calls = 0
    assert flow() is False and len(entries) == 1  # noted once


def test_flow_asks_about_a_post_form_to_its_own_origin_and_records_the_destination():
    page = PAGE.model_copy(update={"form": PAGE.form.model_copy(update={"method": "post", "destination": ORIGIN})})
    reg, entries, agent = ApprovalRegistry(timeout_s=10), [], FakeAgent(page=page)
    _answer_with(reg, SUBMIT)
    assert _flow(agent, reg, entries)() is True
    [entry] = entries
    assert (entry.outcome, entry.destination) == ("submitted", ORIGIN) and len(agent.fills) == 1


BAD_VALUES = [f"{SECRET}\x00", f"\x00{SECRET}", f"me@example.com\n{SECRET}", f"{SECRET}\r", f"a\r\nb{SECRET}"]


@pytest.mark.parametrize("value", BAD_VALUES)
def test_a_value_with_nul_or_a_line_break_is_refused_naming_the_rule_not_the_value(value):
    from controller.run.registry import AnswerRefused
    from wire.browser import FillField

    reg = ApprovalRegistry()
    req = _request(reg, options=[])
    answer = {"action": "submit", "fields": [{"field_id": "user", "value": "me@example.com"},
                                             {"field_id": "pass", "value": value}, {"field_id": "otp", "value": CODE}]}
    with pytest.raises(AnswerRefused) as refused:
        reg.answer_signin(req.id, answer, by="console")
    assert (refused.value.status, refused.value.code) == (400, "invalid_answer")
    assert "NUL, CR or LF" in refused.value.message and "fields.1.value" in refused.value.message
    assert SECRET not in refused.value.message and req.pending and reg.take_values(req) == []
    with pytest.raises(ValueError) as caught:  # the agent's own endpoint validates the same model
        FillField(field_id="pass", value=value)
    assert SECRET not in str(caught.value)


def test_a_sign_in_file_whose_value_breaks_the_rule_cancels_at_once(tmp_path):
    from rich.console import Console

    console = Console(record=True, width=200)
    reg = ApprovalRegistry(timeout_s=10)
    text = f'["{ORIGIN}"]\nmethod = "pw"\nemail = "me@example.com"\npassword = "{SECRET}\\u0000"\n'
    answerer = SignInFile(_file(tmp_path, text), reg, console)
    try:
        req = _request(reg)
        reg.wait(req)
        assert (req.state, req.by, req.submitted_fields) == ("cancelled", "sign-in file", [])
    finally:
        answerer.stop()
    shown = console.export_text()
    assert "NUL, CR or LF" in shown and "cancelling the sign-in" in shown and SECRET not in shown


def test_flow_records_an_agent_error_without_the_value():
    reg, entries, agent = ApprovalRegistry(timeout_s=10), [], FakeAgent(fail=True)
    _answer_with(reg, SUBMIT)
    _flow(agent, reg, entries)()
    [entry] = entries
    assert entry.outcome == "error" and "cdp_error" in entry.detail
    assert SECRET not in json.dumps(entry.as_json())


def test_flow_on_an_origin_the_policy_refuses_asks_nothing_and_notes_it_once():
    reg, entries, agent = ApprovalRegistry(timeout_s=10), [], FakeAgent()
    _answer_with(reg, SUBMIT)
    flow = _flow(agent, reg, entries, allows=lambda origin: False)
    assert flow() is False
    agent.page_calls = 0
    assert flow() is False
    assert reg.all() == [] and agent.fills == []
    [entry] = entries
    assert (entry.outcome, entry.request_id, entry.origin, entry.submitted, entry.by) == ("refused_origin", None,
                                                                                        ORIGIN, [], None)


def test_flow_with_nobody_to_answer_cancels_and_fills_nothing():
    reg, entries, agent = ApprovalRegistry(timeout_s=10), [], FakeAgent()
    assert _flow(agent, reg, entries, answerable=lambda: False)() is True
    [request] = reg.all()
    assert (request.state, request.by) == ("cancelled", "no-approver")
    assert agent.fills == []
    [entry] = entries
    assert (entry.outcome, entry.request_id, entry.submitted) == ("no_approver", request.id, [])


def test_flow_cancelled_by_a_person_records_cancelled():
    reg, entries, agent = ApprovalRegistry(timeout_s=10), [], FakeAgent()
    _answer_with(reg, {"action": "cancel"})
    _flow(agent, reg, entries)()
    assert [e.outcome for e in entries] == ["cancelled"] and agent.fills == []


def test_flow_without_a_form_does_nothing():
    reg, entries = ApprovalRegistry(timeout_s=10), []
    for agent in (FakeAgent(page=None), FakeAgent(page=PAGE.model_copy(update={"form": None}))):
        assert _flow(agent, reg, entries)() is False
    assert reg.all() == [] and entries == []

