"""A session is one conversation on one desktop, through the real openai client (sync and async) against
``serve``'s server on loopback, on a real Docker sandbox.

The session's task (``tasks/session-terminal.toml``, shipped as the docs' example) has an offline script of two
parts, one per user message. The first message's turn writes ``first`` into a file with the terminal;
the second's must be answered from the conversation the first left -- the scripted model's captured
requests show its first request carrying the first message, the first turn's computer calls with their
outputs and the first answer, then the second message alone (the instructions are not sent again) --
and it acts on the desktop the first left: its screen expectation sees the first command's prompt line
before it appends ``second``, and its check reads both lines from the one file.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
from openai import AsyncOpenAI, OpenAI

from controller.agents_api.server import AgentsServer, ServeOptions
from controller.agents_api.sessions import HubOptions
from controller.offline.scripted_server import ScriptedModel

pytestmark = [pytest.mark.docker, pytest.mark.slow]

TASKS = Path(__file__).resolve().parents[2] / "tasks"
TASK = TASKS / "session-terminal.toml"
ENDS = ("agent.session.turn.completed", "agent.session.turn.failed", "agent.session.turn.cancelled",
        "agent.session.failed")
FIRST, SECOND = "Write first into the file.", "Now append second."


@pytest.fixture(scope="module")
def conversation_api(tmp_path_factory: pytest.TempPathFactory, desktop_image: str,
                     test_labels: dict[str, str]) -> Iterator[AgentsServer]:
    """A server with real Docker sandboxes whose offline tasks are the shipped ones (tasks/)."""
    runs = tmp_path_factory.mktemp("conversation") / "runs"
    server = AgentsServer(ServeOptions(hub=HubOptions(runs_dir=runs, image=desktop_image, tasks_dir=TASKS,
                                                      extra_labels=dict(test_labels)))).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def requests_by_run(monkeypatch: pytest.MonkeyPatch) -> Callable[[], list[list[dict[str, Any]]]]:
    """Every request the scripted models of this test's runs answer, one list per run (a turn's run has a
    scripted model of its own), in the order the runs began."""
    runs: list[tuple[ScriptedModel, list[dict[str, Any]]]] = []
    answer = ScriptedModel.answer

    def capture(self: ScriptedModel, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        mine = next((seen for model, seen in runs if model is self), None)
        if mine is None:
            mine = []
            runs.append((self, mine))
        mine.append(body)
        return answer(self, body)

    monkeypatch.setattr(ScriptedModel, "answer", capture)
    return lambda: [seen for _model, seen in runs]


def create_args() -> dict[str, Any]:
    return {"agent": {"model": f"offline:{TASK}", "tools": [{"type": "computer_use"}]},
            "environment": {"type": "openai_hosted", "desktop": {"enabled": True}, "network": {"access": "disabled"}}}


def message(text: str) -> list[dict[str, Any]]:
    return [{"type": "agent.session.input.message",
             "input": [{"role": "user", "content": [{"type": "input_text", "text": text}]}]}]


def texts(item: dict[str, Any], part: str) -> list[str]:
    content = item.get("content")
    return [content] if isinstance(content, str) else [p["text"] for p in content if p.get("type") == part]


def check_one_conversation(server: AgentsServer, session_id: str, answers: list[str],
                           runs: list[list[dict[str, Any]]]) -> None:
    """What both clients must see: two completed turns, the second turn's first request carrying the
    first turn, its record showing the file both turns wrote."""
    assert len(runs) == 2, [len(r) for r in runs]
    first_run, second_run = runs
    carried = second_run[0]["input"]
    users = [i for i in carried if i.get("role") == "user"]
    assert len(users) == 2
    assert texts(users[0], "input_text")[0].startswith("Use the terminal at the bottom of the screen")
    assert f"\n\n{FIRST}" in texts(users[0], "input_text")[0]
    assert texts(users[1], "input_text")[0].startswith(f"{SECOND}\n\nThe screenshot is ")  # the instructions once
    assert [i["call_id"] for i in carried if i.get("type") == "computer_call"] == ["call_0000", "call_0001"]
    outputs = [i for i in carried if i.get("type") == "computer_call_output"]
    assert [i["call_id"] for i in outputs] == ["call_0000", "call_0001"]
    assert all(i["output"]["image_url"].startswith("data:image/") for i in outputs)
    assert [t for i in carried if i.get("role") == "assistant" for t in texts(i, "output_text")] == ["wrote first"]
    assert carried.index(users[1]) == len(carried) - 1  # the conversation, then the new message
    assert carried[:len(first_run[-1]["input"])] == first_run[-1]["input"]  # the first run's last request, as sent
    assert len(answers) == 2 and answers[0].startswith("wrote first"), answers
    assert answers[1].startswith("appended second") and "checks: 1 of 1 passed; run passed" in answers[1], answers
    path = Path(server.hub.session_json(session_id)["metadata"]["desktop_sandbox.record"])  # the second turn's
    record = [json.loads(line) for line in path.read_text().splitlines()]
    [check] = [e for e in record if e["type"] == "check"]
    assert check["passed"] and check["observed"] == "first\nsecond\n", check  # one file, both turns' lines
    met = [e for e in record if e["type"] == "expectation"]
    assert [e["turn"] for e in met] == [3, 4, 5] and all(e["met"] for e in met), met


def test_two_messages_are_one_conversation_on_one_desktop_with_the_sync_client(conversation_api, requests_by_run):
    c = OpenAI(base_url=conversation_api.url, api_key=conversation_api.key, max_retries=0)
    session = c.beta.agents.sessions.create(**create_args())
    answers = []
    for text in (FIRST, SECOND):
        with c.beta.agents.sessions.events.stream(session.id) as events:
            c.beta.agents.sessions.events.create(session.id, events=message(text))
            for event in events:
                if event.type == "agent.session.turn.output_text.done":
                    answers.append(event.text)
                if event.type in ENDS:
                    assert event.type == "agent.session.turn.completed", event
                    break
    try:
        check_one_conversation(conversation_api, session.id, answers, requests_by_run())
    finally:
        c.beta.agents.sessions.delete(session.id)


def test_two_messages_are_one_conversation_on_one_desktop_with_the_async_client(conversation_api, requests_by_run):
    async def main() -> tuple[str, list[str]]:
        c = AsyncOpenAI(base_url=conversation_api.url, api_key=conversation_api.key, max_retries=0)
        try:
            session = await c.beta.agents.sessions.create(**create_args())
            answers = []
            for text in (FIRST, SECOND):
                stream = await c.beta.agents.sessions.events.stream(session.id)
                await c.beta.agents.sessions.events.create(session.id, events=message(text))
                async for event in stream:
                    if event.type == "agent.session.turn.output_text.done":
                        answers.append(event.text)
                    if event.type in ENDS:
                        assert event.type == "agent.session.turn.completed", event
                        break
                await stream.close()
            return session.id, answers
        finally:
            await c.close()

    session_id, answers = asyncio.run(main())
    try:
        check_one_conversation(conversation_api, session_id, answers, requests_by_run())
    finally:
        OpenAI(base_url=conversation_api.url, api_key=conversation_api.key, max_retries=0).beta.agents.sessions.delete(
            session_id)
