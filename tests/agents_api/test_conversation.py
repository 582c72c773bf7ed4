"""A session is one model conversation, without Docker: what the session keeps of the conversation a
turn's run leaves (:mod:`controller.run.conversation`: a cancelled run's unanswered call cut, older
screenshots left out) and what the next turn's run is told (the instructions with the first message
the model sees, then each message alone). The whole path -- the real openai client, the server, the
runner and the scripted model on a Docker desktop -- is in ``test_session_conversation_docker.py``."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any, Iterator

import pytest

from controller.agents_api.requests import SessionParams
from controller.agents_api.sessions import HubOptions, LiveSession, SessionHub, Turn
from controller.agents_api.store import Store
from controller.run.conversation import OMITTED_IMAGE_URL, OMITTED_TEXT, bound_images, continuable

from .conftest import ROOT

TASKS = ROOT / "tasks"

SHOT = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAIAAAACCAIAAAD91JpzAAAAFklEQVR4nGP8z8DAwMDAxMDAwMDAAAANHQEDasKb6QAAAABJRU5ErkJggg=="


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": [{"type": "input_text", "text": text},
                                        {"type": "input_image", "image_url": SHOT, "detail": "high"}]}


def call(call_id: str) -> list[dict[str, Any]]:
    return [{"type": "computer_call", "id": f"cu_{call_id}", "call_id": call_id, "status": "completed",
             "actions": [{"type": "click", "x": 1, "y": 2, "button": "left"}], "pending_safety_checks": []},
            {"type": "computer_call_output", "call_id": call_id,
             "output": {"type": "computer_screenshot", "image_url": SHOT}}]


def answer(text: str) -> dict[str, Any]:
    return {"type": "message", "id": f"msg_{text}", "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": []}]}


def turn(text: str, call_id: str, said: str) -> list[dict[str, Any]]:
    return [user(text), *call(call_id), answer(said)]


# -- the conversation a session hands on -------------------------------------------------------------

def test_a_call_no_output_answers_is_cut_with_its_reasoning_and_a_whole_conversation_stays():
    whole = turn("one", "call_0000", "done")
    assert continuable(whole) is whole
    cut_short = [user("one"), *call("call_0000"), {"type": "reasoning", "id": "rs_1", "summary": []},
                 call("call_0001")[0]]  # cancelled while call_0001 ran: no output came back
    assert continuable(cut_short) == [user("one"), *call("call_0000")]
    functions = [user("one"), {"type": "function_call", "call_id": "call_0000_b00", "name": "browser_click",
                               "arguments": "{}"}]
    assert continuable(functions) == [user("one")]


def test_the_screenshots_of_all_but_the_last_two_turns_are_left_out_and_their_words_stay():
    items = [*turn("one", "call_0000", "first"), *turn("two", "call_0002", "second"), *turn("three", "call_0004", "third")]
    before = copy.deepcopy(items)
    bounded = bound_images(items)
    assert items == before  # the conversation given is not changed
    first, rest = bounded[:4], bounded[4:]
    assert rest == items[4:]  # the last two turns keep their screenshots
    assert first[0]["content"] == [{"type": "input_text", "text": "one"}, {"type": "input_text", "text": OMITTED_TEXT}]
    assert first[2]["output"] == {"type": "computer_screenshot", "image_url": OMITTED_IMAGE_URL}
    assert first[1] == items[1] and first[2]["call_id"] == "call_0000" and first[3] == items[3]
    assert bound_images(items, keep_turns=3) is items
    browser = [user("one"), {"type": "function_call_output", "call_id": "c", "output": [
        {"type": "input_text", "text": "read"}, {"type": "input_image", "image_url": SHOT}]}, *turn("two", "c2", "x")]
    assert bound_images(browser, keep_turns=1)[1]["output"] == [{"type": "input_text", "text": "read"},
                                                                {"type": "input_text", "text": OMITTED_TEXT}]


def test_the_placeholder_screenshot_is_a_png_the_scripted_model_takes():
    from controller.offline.expectations import decode_image
    from controller.offline.scripted_server import _check_data_url

    assert _check_data_url(OMITTED_IMAGE_URL) is None
    assert decode_image(OMITTED_IMAGE_URL).size == (1, 1)


# -- what each turn's run is given ---------------------------------------------------------------------

@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    opened = Store(tmp_path / "agents.db")
    try:
        yield opened
    finally:
        opened.close()


def session(store: Store, model: str, instructions: str | None = None) -> LiveSession:
    """A session of a hub on ``store`` (nothing started: what its turns' runs are given is looked at)."""
    hub = SessionHub(store, HubOptions(runs_dir=store.path.parent, backend="stub", tasks_dir=TASKS))
    params = SessionParams(model=model, instructions=instructions, include_screenshots=False, network="disabled")
    task, task_file = hub._task_for(params)
    return LiveSession(hub, "sess_test", params, task, task_file)


def message(text: str) -> Turn:
    return Turn(id="turn_test", text=text, created_at=0)


def test_each_turn_continues_the_conversation_the_turn_before_left(store, monkeypatch):
    """Instructions once, with the first message; then each message alone after the conversation; a
    cancelled turn's unanswered call cut; a run that left nothing changes nothing."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-not-used-no-model-is-called")
    live = session(store, "gpt-test", "Be brief.")
    assert live._turn_text(message("Open the editor.")) == "Be brief.\n\nOpen the editor."
    one = turn("Be brief.\n\nOpen the editor.", "call_0000", "opened")
    live._carry(one)
    assert live.conversation == one
    assert live._turn_text(message("Type hello.")) == "Type hello."
    cancelled = [*one, user("Type hello."), *call("call_0001"), call("call_0002")[0]]
    live._carry(cancelled)
    assert live.conversation == cancelled[:-1]  # call_0002 never answered
    live._carry([])  # a turn whose run left nothing (cancelled or failed before the model answered)
    assert live.conversation == cancelled[:-1]
    three = [*cancelled[:-1], user("Save it."), *call("call_0003"), answer("saved")]
    live._carry(three)
    assert live.conversation == bound_images(three) != three  # the first turn's screenshots left out
    assert live.conversation[0]["content"][1] == {"type": "input_text", "text": OMITTED_TEXT}
    assert live._turn_text(message("Close it.")) == "Close it."


def test_an_offline_tasks_instructions_go_with_the_first_message_the_model_sees(store):
    live = session(store, "offline:tasks/pickup.toml")
    first = live._turn_text(message("Book it."))
    assert first.startswith("In the Pickup desk page in the browser") and first.endswith('saved.\n\nBook it.')
    live._carry(turn(first, "call_0000", "done"))
    assert live._turn_text(message("Thanks.")) == "Thanks."


def test_a_hostile_answer_is_not_carried_into_the_next_turn():
    """An answer with an item type the API refuses as input and a lone surrogate in its text (a model
    or a server of its own making): what is carried encodes as UTF-8 and holds only input items."""
    from controller.run.conversation import INPUT_ITEM_TYPES, sanitized

    answer = [{"role": "user", "content": [{"type": "input_text", "text": "hello"}]},
              {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "ok \ud800!"}]},
              {"type": "made_up_item", "payload": 1}, "not an item", {"no": "type"}]
    carried = sanitized(answer)
    json.dumps(carried, ensure_ascii=False).encode("utf-8")  # a lone surrogate would raise here
    assert [item.get("type", "message") for item in carried] == ["message", "message"]
    assert carried[1]["content"][0]["text"] == "ok ?!"
    assert all(item.get("type", "message") in INPUT_ITEM_TYPES for item in carried)


def test_a_conversation_past_its_bound_loses_its_oldest_turns_not_its_newest():
    from controller.run.conversation import trimmed

    def turn(n):
        return [{"role": "user", "content": [{"type": "input_text", "text": f"turn {n}"}]},
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "x" * 1000}]}]

    items = [item for n in range(10) for item in turn(n)]
    assert trimmed(items, 10**6) is items
    kept = trimmed(items, 3500)
    assert kept == items[-6:]  # the last three turns
    assert trimmed(items, 10) == items[-2:]  # the last turn always stays
