"""Sessions on real Docker sandboxes, driven by the real openai client (sync and async) through
``serve``'s server on loopback: the offline pickup task end to end, a stream cut and resumed with
``Last-Event-ID``, items paged, a safety check answered through events beside a second session running
at the same time, delete removing the sandbox."""

from __future__ import annotations

import asyncio
import base64
import io
import time

import openai
import pytest
from openai import AsyncOpenAI, OpenAI
from openai.types.beta.agent_session import AgentSession
from openai.types.beta.agent_session_event import AgentSessionEvent
from PIL import Image
from pydantic import TypeAdapter

from pathlib import Path

from controller.run.record import read_entries
from controller.run.registry import AnswerRefused

from .conftest import session_containers

pytestmark = [pytest.mark.docker, pytest.mark.slow]

EVENT = TypeAdapter(AgentSessionEvent)
ENDS = ("agent.session.turn.completed", "agent.session.turn.failed", "agent.session.turn.cancelled",
        "agent.session.failed")


def create_args(task: str) -> dict:
    return {"agent": {"model": f"offline:{task}", "tools": [{"type": "computer_use", "include_screenshots": True}]},
            "environment": {"type": "openai_hosted", "desktop": {"enabled": True}, "network": {"access": "disabled"}}}


def message(text: str) -> list[dict]:
    return [{"type": "agent.session.input.message",
             "input": [{"role": "user", "content": [{"type": "input_text", "text": text}]}]}]


def strict(event) -> None:  # noqa: ANN001
    """The event as the server sent it validates against the SDK's model, not only constructs. A
    ``safety_check`` approval request is this server's own kind (the SDK knows only the browser's):
    its fields are checked here, and the rest of the event against the SDK."""
    data = event.model_dump(mode="json", by_alias=True, exclude_unset=True, warnings=False)
    for action in (data.get("session") or {}).get("required_actions", []):
        request = action.get("request", {})
        if request.get("type") == "safety_check":
            assert set(request) == {"type", "checks", "actions", "call_id", "question"}, request
            action["request"] = {"type": "browser_origin_access", "origin": "http://placeholder", "reason": None}
    EVENT.validate_python(data)


def test_pickup_through_the_sync_client_resumed_with_last_event_id_then_deleted(docker_api, docker_client):
    c = OpenAI(base_url=docker_api.url, api_key=docker_api.key, max_retries=0)
    session = c.beta.agents.sessions.create(**create_args("tasks/pickup.toml"), metadata={"case": "pickup"})
    AgentSession.model_validate(session.model_dump(mode="json", by_alias=True, warnings=False))
    seen = []
    with c.beta.agents.sessions.events.stream(session.id) as events:
        c.beta.agents.sessions.events.create(session.id, events=message("Book the pickup."))
        for event in events:
            seen.append(event)
            if event.type == "agent.session.turn.item.done":
                break  # cut mid-turn: the first screenshot is there, the loop goes on
    cut = len(seen)
    last = int(seen[-1].event_id.removeprefix("evt_"))
    deadline = time.monotonic() + 120
    while docker_api.hub.store.last_seq(session.id) < last + 3:  # events go on while nobody listens
        assert time.monotonic() < deadline, "the turn stopped producing events"
        time.sleep(0.05)  # poll interval of a bounded condition wait
    with c.beta.agents.sessions.events.stream(session.id, extra_headers={"Last-Event-ID": seen[-1].event_id}) as events:
        for event in events:
            seen.append(event)
            if event.type in ENDS:
                break
    assert seen[-1].type == "agent.session.turn.completed", [e.type for e in seen]
    ids = [e.event_id for e in seen]
    assert len(ids) == len(set(ids)), "an event came twice"
    with c.beta.agents.sessions.events.stream(session.id, extra_headers={"Last-Event-ID": "0"}) as events:
        everything, kinds = [], {}
        for event in events:
            everything.append(event.event_id)
            kinds[event.event_id] = event.type
            if event.type in ENDS:
                break
    assert everything[everything.index(ids[0]):] == ids, "the resumed stream lost or reordered events"
    assert 0 < cut < len(seen)
    for event in seen:
        strict(event)
        assert getattr(event, "session_id", session.id) == session.id

    [text] = [e.text for e in seen if e.type == "agent.session.turn.output_text.done"]
    assert "checks: 3 of 3 passed; run passed" in text
    current = c.beta.agents.sessions.retrieve(session.id)
    assert current.status == "idle" and current.required_actions == []
    assert current.metadata["case"] == "pickup" and current.metadata["desktop_sandbox.verdict"] == "passed"
    record = Path(current.metadata["desktop_sandbox.record"])
    entries = read_entries(record.parent)
    assert entries[0].type == "run_started"
    assert entries[-1].type == "run_finished" and entries[-1].status == "passed"
    assert not [e for e in entries if e.type == "agents_event"]  # the events are the server's, not the record's

    # each screenshot event carries the image the model got, as a JPEG (the hosted API's form)
    shots = [e.item for e in seen if e.type == "agent.session.turn.item.done" and e.item.type == "computer_use_call"]
    recorded = [e for e in entries if e.type == "screenshot"]
    assert len(shots) >= 5 and len(shots) == len(recorded) and all(s.status == "completed" for s in shots)
    prefix = "data:image/jpeg;base64,"
    assert all(s.output is not None and s.output.image_url.startswith(prefix) for s in shots)
    with Image.open(io.BytesIO(base64.b64decode(shots[-1].output.image_url[len(prefix):], validate=True))) as image:
        assert image.format == "JPEG" and image.size == (1280, 800)

    paged = list(c.beta.agents.sessions.items.list(session.id, order="asc", limit=3))
    whole = c.beta.agents.sessions.items.list(session.id, order="asc", limit=100)
    assert not whole.has_more and [i.id for i in paged] == [i.id for i in whole.data]
    newest_first = [i.id for i in c.beta.agents.sessions.items.list(session.id, limit=2)]
    assert newest_first == [i.id for i in reversed(whole.data)]
    assert [i.type for i in paged][0] == "message" and paged[0].role == "user"
    assert paged[-1].type == "message" and paged[-1].role == "assistant"
    calls = [i for i in paged if i.type == "computer_use_call"]
    assert [i.id for i in calls] == [s.id for s in shots] and all(i.output is None for i in calls)

    assert len(session_containers(docker_client, session.id)) >= 2  # desktop and gateway
    assert c.beta.agents.sessions.delete(session.id).deleted
    assert session_containers(docker_client, session.id) == []
    with pytest.raises(openai.NotFoundError):
        c.beta.agents.sessions.retrieve(session.id)


def test_two_sessions_at_once_each_its_own_events_sandbox_and_approvals(docker_api, docker_client):
    """Pickup and the safety-check demo run at the same time through the async client; the demo's
    request is answered through events after bad answers (the other session's id, the wrong response
    type, an unknown id), and a later answer of the console's is refused by the same registry."""

    async def follow(c: AsyncOpenAI, task: str, on_action) -> tuple[str, list]:  # noqa: ANN001
        session = await c.beta.agents.sessions.create(**create_args(task))
        started.append(session.id)
        seen = []
        stream = await c.beta.agents.sessions.events.stream(session.id)
        await c.beta.agents.sessions.events.create(session.id, events=message("Go."))
        async for event in stream:
            seen.append(event)
            if event.type == "agent.session.requires_action":
                await on_action(session.id, event)
            if event.type in ENDS:
                break
        await stream.close()
        return session.id, seen

    answered: list[str] = []

    async def answer(session_id: str, event) -> None:  # noqa: ANN001
        current = await c.beta.agents.sessions.retrieve(session_id)
        for action in current.required_actions:
            if action.request_id in answered:
                continue
            assert action.type == "computer_use_approval_request" and action.request.type == "safety_check"
            assert action.request.checks[0]["code"] == "sensitive_action"
            other = next(s for s in started if s != session_id)
            result = {"type": "agent.session.input.computer_use_approval_request_result",
                      "request_id": action.request_id, "response": {"type": "safety_check", "decision": "approve"}}
            with pytest.raises(openai.NotFoundError):  # the other session knows no such request
                await c.beta.agents.sessions.events.create(other, events=[result])
            with pytest.raises(openai.BadRequestError):
                await c.beta.agents.sessions.events.create(session_id, events=[
                    {**result, "response": {"type": "browser_origin_access", "decision": "approve"}}])
            with pytest.raises(openai.NotFoundError):
                await c.beta.agents.sessions.events.create(session_id, events=[{**result, "request_id": "req_nope"}])
            await c.beta.agents.sessions.events.create(session_id, events=[result])
            await c.beta.agents.sessions.events.create(session_id, events=[result])  # the same again: accepted
            with pytest.raises(openai.ConflictError) as caught:
                await c.beta.agents.sessions.events.create(session_id, events=[
                    {**result, "response": {"type": "safety_check", "decision": "deny"}}])
            assert caught.value.body["code"] == "already_decided"
            registry, _turn = docker_api.hub.get(session_id).requests[action.request_id]
            with pytest.raises(AnswerRefused) as refused:  # what the console's route calls
                registry.answer(action.request_id, "deny", by="console")
            assert refused.value.status == 409
            answered.append(action.request_id)

    async def nothing(session_id: str, event) -> None:  # noqa: ANN001
        raise AssertionError("pickup asks nothing")

    started: list[str] = []
    c = AsyncOpenAI(base_url=docker_api.url, api_key=docker_api.key, max_retries=0)

    async def main() -> list:
        try:
            return await asyncio.gather(follow(c, "tasks/pickup.toml", nothing),
                                        follow(c, "tasks/approval-demo.toml", answer))
        finally:
            await c.close()  # in the loop its connections belong to

    (pickup_id, pickup), (demo_id, demo) = asyncio.run(main())
    assert len(answered) == 1
    for session_id, events in ((pickup_id, pickup), (demo_id, demo)):
        assert events[-1].type == "agent.session.turn.completed", [e.type for e in events]
        for event in events:
            strict(event)
            owner = event.session.id if hasattr(event, "session") and event.session else event.session_id
            assert owner == session_id
    assert "checks: 1 of 1 passed" in next(e.text for e in demo if e.type == "agent.session.turn.output_text.done")
    assert not any(e.type == "agent.session.requires_action" for e in pickup)
    sync = OpenAI(base_url=docker_api.url, api_key=docker_api.key, max_retries=0)
    demo_record = read_entries(Path(sync.beta.agents.sessions.retrieve(demo_id).metadata["desktop_sandbox.record"]).parent)
    assert [(e.what, e.decision, e.by) for e in demo_record if e.type == "approval"] == [
        ("safety_check", "approved", "agents-api")]
    pickup_ids = {c.id for c in session_containers(docker_client, pickup_id)}
    demo_ids = {c.id for c in session_containers(docker_client, demo_id)}
    assert pickup_ids and demo_ids and not pickup_ids & demo_ids
    for session_id in (pickup_id, demo_id):
        sync.beta.agents.sessions.delete(session_id)
        assert session_containers(docker_client, session_id) == []


def test_a_sandbox_that_died_fails_the_next_turn_and_the_session(docker_api, docker_client):
    c = OpenAI(base_url=docker_api.url, api_key=docker_api.key, max_retries=0)
    session = c.beta.agents.sessions.create(**create_args("tasks/pickup.toml"))
    seen = []
    with c.beta.agents.sessions.events.stream(session.id, extra_headers={"Last-Event-ID": "0"}) as events:
        for event in events:
            seen.append(event)
            if event.type == "agent.session.environment.ready":
                break
    for container in session_containers(docker_client, session.id):
        if container.labels.get("desktop-sandbox.role") == "desktop":
            container.kill()
    with c.beta.agents.sessions.events.stream(session.id, extra_headers={"Last-Event-ID": seen[-1].event_id}) as events:
        c.beta.agents.sessions.events.create(session.id, events=message("Go."))
        types = [e.type for e in events]  # the stream ends after agent.session.failed
    assert types[-3:] == ["agent.session.turn.failed", "agent.session.environment.failed", "agent.session.failed"]
    current = c.beta.agents.sessions.retrieve(session.id)
    assert current.status == "failed" and "stopped answering" in current.error
    with pytest.raises(openai.ConflictError):
        c.beta.agents.sessions.events.create(session.id, events=message("Again."))
    deadline = time.monotonic() + 60
    while session_containers(docker_client, session.id):  # what was left of it is removed
        assert time.monotonic() < deadline, "the dead sandbox's containers stayed"
        time.sleep(0.1)  # poll interval of a bounded condition wait
    c.beta.agents.sessions.delete(session.id)


def test_a_live_model_session_runs_the_message_through_the_responses_api(docker_api, monkeypatch, tmp_path):
    """A session of a model that is not an offline task: the live path (``OPENAI_API_KEY``), its Responses
    API here the project's scripted server on loopback (through ``OPENAI_BASE_URL``, as the SDK reads it):
    the desktop with the browser, the network from ``restricted`` domains, the user's text sent to the
    model, the model's words as the answer."""
    import json as _json

    from controller.offline.scripted_server import ScriptedModel, ScriptedServer, load_script

    script = tmp_path / "live.jsonl"
    script.write_text(_json.dumps({"actions": [{"type": "wait"}]}) + "\n"
                      + _json.dumps({"message": "the browser is open"}) + "\n")
    model = ScriptedModel(load_script(script))
    with ScriptedServer(model) as responses:
        monkeypatch.setenv("OPENAI_API_KEY", responses.key)
        monkeypatch.setenv("OPENAI_BASE_URL", responses.base_url)
        c = OpenAI(base_url=docker_api.url, api_key=docker_api.key, max_retries=0)
        session = c.beta.agents.sessions.create(
            agent={"model": "gpt-test", "instructions": "Be brief.", "tools": [{"type": "computer_use"}]},
            environment={"type": "openai_hosted", "desktop": {"enabled": True},
                         "network": {"access": "restricted", "allowed_domains": ["example.org"]}})
        assert session.environment.network.access == "restricted"
        assert session.environment.network.allowed_domains == ["example.org"]
        with c.beta.agents.sessions.events.stream(session.id) as events:
            c.beta.agents.sessions.events.create(session.id, events=message("Open the browser, then stop."))
            seen = []
            for event in events:
                seen.append(event)
                if event.type in ENDS:
                    break
    assert seen[-1].type == "agent.session.turn.completed", [e.type for e in seen]
    assert [e.text for e in seen if e.type == "agent.session.turn.output_text.done"] == ["the browser is open"]
    calls = [e.item for e in seen if e.type == "agent.session.turn.item.done" and e.item.type == "computer_use_call"]
    assert calls and all(c_.output is None for c_ in calls)  # include_screenshots defaults to false
    first = _json.dumps(model.requests[0])
    assert "Be brief." in first and "Open the browser, then stop." in first
    record = Path(c.beta.agents.sessions.retrieve(session.id).metadata["desktop_sandbox.record"]).parent
    started = read_entries(record)[0]
    assert started.mode == "live" and started.model == "gpt-test"
    assert started.policy["mode"] == "ask" and started.policy["ask"] == ["https://example.org", "http://example.org"]
    c.beta.agents.sessions.delete(session.id)
