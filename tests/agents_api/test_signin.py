"""Sign-in requests (``browser_authentication``) through the local Agents API, without Docker.

The server is ``serve`` in a process of its own (:mod:`tests.agents_api.signin_server`): the real routes,
sessions, pump and store, with a sandbox of nothing and a turn that opens one sign-in request in the
run's approval registry, waits for the answer and takes a submit's values as the runner's sign-in step
does (its last message gives the sha256 of what it took, never a value). The real openai client reads
the required action, the events and the items, each validated strictly against the SDK's own models.

The values of a submit must reach :meth:`ApprovalRegistry.take_values` and nothing else: the database
(its file, ``-wal`` and ``-shm``, read as bytes while the server runs and after it stopped), every run
record, the event stream, every response, and the server's stdout and stderr (logging at DEBUG) are
searched for every value sent, valid or refused. Positive controls show each place searched is read:
a canary in the session's metadata is found in the database and the stream, the server's line in its
stderr.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest
from openai import OpenAI
from openai.types.beta.agent_output_item import BrowserAuthenticationRequestItemResource
from openai.types.beta.agent_session import (
    AgentSession,
    RequiredActionSessionRequiredActionResourceComputerUseApprovalRequest as ComputerUseApprovalRequest,
    RequiredActionSessionRequiredActionResourceComputerUseApprovalRequestRequestComputerUseApprovalRequestKindResourceBrowserAuthentication as BrowserAuthentication,  # noqa: E501
)
from openai.types.beta.agent_session_event import AgentSessionEvent
from openai.types.beta.agent_session_item import AgentSessionItem, ComputerUseApprovalRequestResultItemResource
from openai.types.beta.agent_session_item import BrowserAuthenticationRequestItemResource as RequestItem
from pydantic import TypeAdapter

from controller.agents_api.errors import ApiError
from controller.agents_api.requests import parse_events

from .conftest import ROOT
from .signin_server import ORIGIN

EVENT = TypeAdapter(AgentSessionEvent)
ITEM = TypeAdapter(AgentSessionItem)
RESULT = "agent.session.input.computer_use_approval_request_result"
ENDS = ("agent.session.turn.completed", "agent.session.turn.failed", "agent.session.turn.cancelled")
START_S = 30.0


@dataclass
class Served:
    """The server process: ``url``, ``key``, ``runs`` (its runs dir: database, key file, records),
    ``out`` / ``err`` (files its stdout and stderr go to)."""

    proc: subprocess.Popen
    url: str
    key: str
    runs: Path
    out: Path
    err: Path
    sent: list[str] = field(default_factory=list)
    """Every secret value a test sent (searched for at the end)."""

    def stop(self) -> None:
        """SIGTERM and wait for the process to end."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(30)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    runs, out, err = tmp_path / "runs", tmp_path / "server.out", tmp_path / "server.err"
    with open(out, "wb") as stdout, open(err, "wb") as stderr:
        proc = subprocess.Popen([sys.executable, "-m", "tests.agents_api.signin_server", str(runs)], cwd=ROOT,
                                stdout=stdout, stderr=stderr,
                                env={**os.environ, "OPENAI_API_KEY": "sk-not-used-no-model-is-called"})
    try:
        deadline = time.monotonic() + START_S
        while True:
            match = re.search(r"agents-api: (http://127\.0\.0\.1:\d+/v1) key-file: (\S+)", err.read_text())
            if match:
                break
            assert proc.poll() is None and time.monotonic() < deadline, err.read_text()[-4000:]
            time.sleep(0.05)  # poll interval of a bounded wait for the server's line
        yield Served(proc, match.group(1), Path(match.group(2)).read_text().strip(), runs, out, err)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def client(served: Served) -> OpenAI:
    return OpenAI(base_url=served.url, api_key=served.key, max_retries=0)


def raw(served: Served) -> httpx.Client:
    return httpx.Client(base_url=served.url, headers={"Authorization": f"Bearer {served.key}"}, timeout=30)


def create(served: Served, form: str, **extra: Any) -> str:
    """A session whose first turn asks about the form ``form`` (``plain`` | ``options``)."""
    session = client(served).beta.agents.sessions.create(
        agent={"model": "gpt-test", "tools": [{"type": "computer_use", "include_screenshots": False}]},
        environment={"type": "openai_hosted", "desktop": {"enabled": True}, "network": {"access": "disabled"}},
        input=form, **extra)
    return session.id


def pending_action(served: Served, session_id: str) -> ComputerUseApprovalRequest:
    """The sign-in required action, read as a program does: the stream's ``requires_action``, then the
    session."""
    c = client(served)
    with c.beta.agents.sessions.events.stream(session_id, extra_headers={"Last-Event-ID": "0"}) as stream:
        for event in stream:
            assert event.type not in ENDS + ("agent.session.failed",), event
            if event.type == "agent.session.requires_action":
                break
    actions = c.beta.agents.sessions.retrieve(session_id).required_actions
    assert len(actions) == 1 and isinstance(actions[0], ComputerUseApprovalRequest), actions
    assert isinstance(actions[0].request, BrowserAuthentication), actions[0]
    return actions[0]


def stream_to_idle(served: Served, session_id: str) -> tuple[bytes, list[dict]]:
    """The session's whole event stream (raw bytes and events) up to the ``idle`` after its turn ended;
    every event validated strictly against the SDK's union."""
    data, events = b"", []
    ended = False
    with raw(served) as http, http.stream("GET", f"/agents/sessions/{session_id}/events",
                                          headers={"Last-Event-ID": "0"}) as resp:
        assert resp.status_code == 200
        for line in resp.iter_lines():
            data += line.encode() + b"\n"
            if not line.startswith("data:"):
                continue
            EVENT.validate_json(line[5:], strict=True)
            event = json.loads(line[5:])
            events.append(event)
            ended = ended or event["type"] in ENDS
            if ended and event["type"] == "agent.session.idle":
                break
    return data, events


def answer(http: httpx.Client, session_id: str, request_id: str, response: dict) -> httpx.Response:
    return http.post(f"/agents/sessions/{session_id}/events",
                     json={"events": [{"type": RESULT, "request_id": request_id, "response": response}]})


def submit(fields: list[tuple[str, str]], option: str | None = None) -> dict:
    response: dict[str, Any] = {"type": "browser_authentication", "action": "submit",
                                "fields": [{"field_id": i, "value": v} for i, v in fields]}
    if option is not None:
        response["selected_option"] = option
    return response


def secret(name: str) -> str:
    return f"{name}-{secrets.token_urlsafe(18)}"


def items(served: Served, session_id: str) -> list[dict]:
    with raw(served) as http:
        page = http.get(f"/agents/sessions/{session_id}/items", params={"order": "asc", "limit": 100}).json()
    for item in page["data"]:
        ITEM.validate_python(item, strict=True)
    return page["data"]


def digest(pairs: list[tuple[str, str]]) -> str:
    return hashlib.sha256(json.dumps([list(p) for p in pairs]).encode()).hexdigest()


def last_answer(events: list[dict]) -> str:
    texts = [e["text"] for e in events if e["type"] == "agent.session.turn.output_text.done"]
    assert texts, [e["type"] for e in events]
    return texts[-1]


def test_a_sign_in_request_is_the_sdks_required_action_and_item_and_a_cancel_ends_it(served):
    session_id = create(served, "options")
    action = pending_action(served, session_id)
    assert action.request.credential_origin == ORIGIN and action.request.reason == "The page asks you to sign in"
    assert [(o.id, o.field_ids) for o in action.request.options] == [("email_code", []),
                                                                      ("use_password", ["email", "password"])]
    with raw(served) as http:
        body = http.get(f"/agents/sessions/{session_id}").json()
        AgentSession.model_validate(body, strict=True)
        assert body["status"] == "requires_action"
        assert body["required_actions"] == [{
            "type": "computer_use_approval_request", "request_id": action.request_id, "turn_id": action.turn_id,
            "request": {"type": "browser_authentication", "reason": "The page asks you to sign in",
                        "credential_origin": ORIGIN,
                        "fields": [{"id": "email", "label": "Email address", "type": "email", "required": True},
                                   {"id": "password", "label": "Password", "type": "password", "required": True}],
                        "options": [{"id": "email_code", "label": "Email me a code", "field_ids": []},
                                    {"id": "use_password", "label": "Use a password",
                                     "field_ids": ["email", "password"]}]}}]  # no "kind": the SDK's shape
        # the history has the request, credential-free, as the SDK's item
        [requested] = [i for i in items(served, session_id) if i["type"] == "computer_use_approval_request"]
        BrowserAuthenticationRequestItemResource.model_validate(requested, strict=True)
        assert requested["request"] == body["required_actions"][0]["request"]
        assert requested["request_id"] == action.request_id and requested["turn_id"] == action.turn_id
        listed = list(client(served).beta.agents.sessions.items.list(session_id, order="asc"))
        assert [i.request_id for i in listed if isinstance(i, RequestItem)] == [action.request_id]
        # an answer of another kind, or to no request, is refused and changes nothing
        wrong = answer(http, session_id, action.request_id, {"type": "browser_origin_access", "decision": "approve"})
        assert wrong.status_code == 400 and wrong.json()["error"]["code"] == "invalid_request", wrong.text
        assert "browser_authentication" in wrong.json()["error"]["message"]
        unknown = answer(http, session_id, "req_nope", {"type": "browser_authentication", "action": "cancel"})
        assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "unknown_request"
        assert http.get(f"/agents/sessions/{session_id}").json()["status"] == "requires_action"
    client(served).beta.agents.sessions.events.create(session_id, events=[{
        "type": RESULT, "request_id": action.request_id,
        "response": {"type": "browser_authentication", "action": "cancel"}}])
    _, events = stream_to_idle(served, session_id)
    assert last_answer(events).startswith("sign-in cancelled by agents-api; option None; fields -; ")
    assert events[-2]["type"] == "agent.session.turn.completed"
    [result] = [i for i in items(served, session_id) if i["type"] == "computer_use_approval_request_result"]
    ComputerUseApprovalRequestResultItemResource.model_validate(result, strict=True)
    assert result["response"] == {"type": "browser_authentication", "action": "cancel"}
    assert result["request_id"] == action.request_id
    added = [e for e in events if e["type"] == "agent.session.turn.item.added" and e["item"]["id"] == result["id"]]
    assert len(added) == 1
    with raw(served) as http:
        assert http.get(f"/agents/sessions/{session_id}").json()["required_actions"] == []
        again = answer(http, session_id, action.request_id, {"type": "browser_authentication", "action": "cancel"})
        assert again.status_code == 202 and again.content == b""  # the same answer again changes nothing
        late = answer(http, session_id, action.request_id, submit([], "email_code"))
        assert late.status_code == 409 and late.json()["error"]["code"] == "already_decided", late.text


def test_a_method_choice_is_submitted_with_its_option_and_no_fields(served):
    session_id = create(served, "options")
    action = pending_action(served, session_id)
    password = secret("pw-wrong-method")
    served.sent.append(password)
    with raw(served) as http:
        for response, words in ((submit([]), "selected_option"),
                                (submit([("password", password)], "email_code"), "not a field"),
                                (submit([("email", "a@b.test")], "use_password"), "password is required"),
                                (submit([], "sms"), "selected_option")):
            refused = answer(http, session_id, action.request_id, response)
            assert refused.status_code == 400, refused.text
            error = refused.json()["error"]
            assert error["code"] == "invalid_answer" and words in error["message"] and error["param"] == "response"
            assert password not in refused.text
        accepted = answer(http, session_id, action.request_id, submit([], "email_code"))
        assert accepted.status_code == 202 and accepted.content == b""
    _, events = stream_to_idle(served, session_id)
    assert last_answer(events).startswith(f"sign-in submitted by agents-api; option email_code; fields -; "
                                          f"sha256 {digest([])}")
    [result] = [i for i in items(served, session_id) if i["type"] == "computer_use_approval_request_result"]
    assert result["response"] == {"type": "browser_authentication", "action": "submit", "selected_option": "email_code"}
    ComputerUseApprovalRequestResultItemResource.model_validate(result, strict=True)
    assert password.encode() not in served.err.read_bytes() + served.out.read_bytes()


def test_a_submit_reaches_the_registry_and_its_values_are_nowhere_else(served):
    canary = secret("canary")
    session_id = create(served, "plain", metadata={"canary": canary})
    action = pending_action(served, session_id)
    request_id = action.request_id
    email, password = secret("user") + "@example.test", secret("pw")
    refused_values = {name: secret(f"refused-{name}") for name in
                      ("unknown", "missing", "seven", "long", "big", "empty", "option", "twice", "nul", "lf")}
    sent = [email, password, *refused_values.values()]
    served.sent.extend(sent)
    v = refused_values
    cases = [
        ("unknown field id", submit([("email", v["unknown"]), ("password", v["unknown"]), ("nope", v["unknown"])]),
         "field nope is not a field"),
        ("missing required field", submit([("email", v["missing"])]), "field password is required"),
        ("7 fields", submit([("email", v["seven"]), ("password", v["seven"])]
                            + [(f"extra{i}", v["seven"]) for i in range(1, 6)]), "at most 6"),
        ("a value of 20000 characters", submit([("email", v["long"] + "x" * 20000), ("password", v["long"])]),
         "16384"),
        ("more than 120 KiB", submit([("email", v["big"] + "é" * 16000), ("password", v["big"] + "é" * 16000),
                                      ("extra1", v["big"] + "é" * 16000)]), "122880 bytes"),
        ("an empty required value", submit([("email", ""), ("password", v["empty"])]), "at least 1 character"),
        ("an option without options", submit([("email", v["option"]), ("password", v["option"])], "email_code"),
         "no options"),
        ("a field given twice", submit([("email", v["twice"]), ("email", v["twice"]), ("password", v["twice"])]),
         "once"),
        ("a value with NUL", submit([("email", v["nul"]), ("password", v["nul"] + "\x00")]), "NUL, CR or LF"),
        ("a value with a line break", submit([("email", v["lf"] + "\r\n"), ("password", v["lf"])]), "NUL, CR or LF"),
    ]
    with raw(served) as http:
        for what, response, words in cases:
            refused = answer(http, session_id, request_id, response)
            assert refused.status_code == 400, (what, refused.text)
            error = refused.json()["error"]
            assert error["code"] == "invalid_answer" and words in error["message"], (what, error)
            assert error["type"] == "invalid_request_error" and error["param"] == "response"
            assert not any(value in refused.text for value in sent), (what, refused.text)
            assert "é" not in error["message"]
            still = http.get(f"/agents/sessions/{session_id}").json()
            assert [a["request_id"] for a in still["required_actions"]] == [request_id], what
        accepted = answer(http, session_id, request_id, submit([("email", email), ("password", password)]))
        assert accepted.status_code == 202 and accepted.content == b""  # accepted, empty body
        again = answer(http, session_id, request_id, submit([("email", email), ("password", password)]))
        assert again.status_code == 409 and again.json()["error"]["code"] == "already_decided", again.text
        assert not any(value in again.text for value in sent)
    stream, events = stream_to_idle(served, session_id)
    # the values reached the registry's take_values: the turn took exactly these
    assert last_answer(events) == (f"sign-in submitted by agents-api; option None; fields email,password; "
                                   f"sha256 {digest([('email', email), ('password', password)])}")
    history = items(served, session_id)
    [result] = [i for i in history if i["type"] == "computer_use_approval_request_result"]
    assert result["response"] == {"type": "browser_authentication", "action": "submit", "selected_option": None}
    with raw(served) as http:
        responses = [http.get(f"/agents/sessions/{session_id}").text, http.get("/agents/sessions").text,
                     http.get(f"/agents/sessions/{session_id}/items").text]
    db = served.runs / "agents.db"
    live_db = b"".join(p.read_bytes() for p in (db, Path(f"{db}-wal"), Path(f"{db}-shm")) if p.exists())
    # positive controls: each place searched is read (the canary is in the session's metadata)
    assert canary.encode() in live_db and canary.encode() in stream
    assert not any(value in json.dumps(history) + "".join(responses) for value in sent)
    served.stop()
    assert served.proc.returncode == 0
    files = {str(p): p.read_bytes() for p in served.runs.rglob("*") if p.is_file()}
    assert any(canary.encode() in data for data in files.values())
    assert any(p.endswith("record.jsonl") for p in files)
    logs = served.out.read_bytes() + served.err.read_bytes()
    assert b"agents-api: http://127.0.0.1:" in logs and b"Traceback" not in logs, logs[-4000:]
    places = {"the database while serving": live_db, "the event stream": stream, "the server's output": logs, **files}
    for value in sent:
        for form in {value.encode(), json.dumps(value).encode()[1:-1]}:
            found = [place for place, data in places.items() if form in data]
            assert not found, f"a submitted value is in {found}"


def test_answer_refusals_name_fields_never_values():
    """The shape checks of the events body, before any registry: every refusal names the field."""
    value = secret("shape")
    bodies = [
        {"type": "browser_authentication", "action": "submit", "fields": {"email": value}},
        {"type": "browser_authentication", "action": "submit", "fields": [{"field_id": "email", "value": [value]}]},
        {"type": "browser_authentication", "action": "submit", "fields": [{"field_id": value, "value": 1}]},
        {"type": "browser_authentication", "action": "submit", "fields": [{"field_id": "e", "value": value, "x": 1}]},
        {"type": "browser_authentication", "action": "submit", "fields": [{"field_id": "e", "value": value}] * 17},
        {"type": "browser_authentication", "action": "cancel", "fields": [{"field_id": "e", "value": value}]},
        {"type": "browser_authentication", "action": value},
        {"type": "browser_authentication", "action": "submit", "fields": [], "selected_option": 7},
        {"type": "browser_authentication", "decision": "approve"},
    ]
    for response in bodies:
        with pytest.raises(ApiError) as caught:
            parse_events({"events": [{"type": RESULT, "request_id": "req_x", "response": response}]})
        assert caught.value.status == 400 and value not in json.dumps(caught.value.body()), caught.value.body()
        assert (caught.value.param or "").startswith("events[0].response"), caught.value.body()
    [event] = parse_events({"events": [{"type": RESULT, "request_id": "req_x", "response": {
        "type": "browser_authentication", "action": "submit", "fields": [{"field_id": "email", "value": value}],
        "selected_option": "m"}}]})
    assert (event.action, event.selected_option) == ("submit", "m")
    assert event.fields == [{"field_id": "email", "value": value}]
    assert value not in repr(event)
