"""The scripted Responses server through the real openai.OpenAI client, and offline loopback-only mode."""

from __future__ import annotations

import base64
import json
import socket

import httpx
import openai
import pytest

from controller.model_client import LoopbackOnlyTransport, UsageMeter, offline_client
from controller.scripted_server import ScriptedModel, ScriptedServer, ScriptError, load_script

PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\0" * 16).decode()


@pytest.fixture
def server():
    servers = []

    def make(turns):
        s = ScriptedServer(ScriptedModel(turns)).start()
        servers.append(s)
        return s

    yield make
    for s in servers:
        s.stop()


def test_listens_on_loopback_only(server):
    s = server([{"message": "hi"}])
    assert s.base_url.startswith("http://127.0.0.1:")
    laddr = s._sock.getsockname()
    assert laddr[0] == "127.0.0.1"


def test_batched_call_is_a_valid_response_for_the_sdk(server):
    s = server([{"actions": [{"type": "click", "x": 1, "y": 2, "button": "left"}, {"type": "wait"}],
                 "pending_safety_checks": [{"id": "a", "code": "c", "message": "m"}]}])
    client = offline_client(s.base_url)
    resp = client.responses.create(model="scripted", input="go", tools=[{"type": "computer"}])
    (call,) = resp.output
    assert call.type == "computer_call" and call.status == "completed"
    assert [a.type for a in call.actions] == ["click", "wait"]
    assert call.actions[0].x == 1 and call.action is None
    assert call.pending_safety_checks[0].code == "c"
    assert resp.usage is not None and resp.usage.total_tokens > 0
    client.close()


def test_legacy_single_action_form(server):
    s = server([{"action": {"type": "keypress", "keys": ["ctrl", "a"]}}])
    client = offline_client(s.base_url)
    resp = client.responses.create(model="scripted", input="go", tools=[{"type": "computer"}])
    (call,) = resp.output
    assert call.action is not None and call.action.type == "keypress" and call.actions is None
    assert call.pending_safety_checks == []
    client.close()


def _history(checks, acked, url=f"data:image/png;base64,{PNG}"):
    return [
        {"role": "user", "content": "go"},
        {"type": "computer_call", "id": "cu_1", "call_id": "call_1", "status": "completed",
         "actions": [{"type": "wait"}], "pending_safety_checks": checks},
        {"type": "computer_call_output", "call_id": "call_1", "acknowledged_safety_checks": acked,
         "output": {"type": "computer_screenshot", "image_url": url}},
    ]


def test_refuses_unacknowledged_or_reordered_checks(server):
    checks = [{"id": "a", "code": "c1", "message": "m1"}, {"id": "b", "code": "c2", "message": "m2"}]
    s = server([{"actions": [{"type": "wait"}]}, {"message": "ok"}])
    client = offline_client(s.base_url)
    for acked in ([], checks[:1], list(reversed(checks))):
        with pytest.raises(openai.BadRequestError) as info:
            client.responses.create(model="scripted", input=_history(checks, acked), tools=[{"type": "computer"}])
        assert info.value.body["code"] == "safety_checks_not_acknowledged"
    ok = client.responses.create(model="scripted", input=_history(checks, checks), tools=[{"type": "computer"}])
    assert ok.output_text == "ok"
    client.close()


@pytest.mark.parametrize("url", ["https://example.com/x.png", "data:image/png;base64,@@@",
                                 f"data:image/jpeg;base64,{PNG}", f"data:image/gif;base64,{PNG}"])
def test_refuses_screenshots_that_are_not_matching_data_urls(server, url):
    s = server([{"actions": [{"type": "wait"}]}, {"message": "ok"}])
    client = offline_client(s.base_url)
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(model="scripted", input=_history([], [], url), tools=[{"type": "computer"}])
    assert info.value.body["code"] == "invalid_image"
    client.close()


def test_exhausted_script_is_an_error_not_a_guess(server):
    s = server([{"actions": [{"type": "wait"}]}])
    client = offline_client(s.base_url)
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(model="scripted", input=_history([], []), tools=[{"type": "computer"}])
    assert info.value.body["code"] == "script_exhausted"
    client.close()


def test_usage_meter_sees_each_request_and_missing_usage(server):
    s = server([{"actions": [{"type": "wait"}], "usage": None}, {"message": "ok"}])
    meter = UsageMeter()
    client = offline_client(s.base_url, meter)
    client.responses.create(model="scripted", input="go", tools=[{"type": "computer"}])
    client.responses.create(model="scripted", input=_history([], []), tools=[{"type": "computer"}])
    assert [r.total_tokens is None for r in meter.requests] == [True, False]
    assert meter.totals()["complete"] is False
    client.close()


def test_offline_client_only_reaches_loopback():
    with pytest.raises(ValueError):
        offline_client("http://192.0.2.1:8000/v1")
    with pytest.raises(ValueError):
        offline_client("http://localhost.example:8000/v1")
    # the transport refuses names and non-loopback addresses before any connection is made
    with httpx.Client(transport=LoopbackOnlyTransport(), trust_env=False) as http:
        for url in ("http://api.openai.com/v1/responses", "http://192.0.2.1/", "http://[2001:db8::1]/"):
            with pytest.raises(httpx.ConnectError, match="loopback"):
                http.get(url)


def test_offline_client_ignores_proxy_environment(server, monkeypatch):
    s = server([{"message": "hi"}])
    # a proxy that does not exist: if it were used, the request would fail
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead = sock.getsockname()[1]
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{dead}")
    monkeypatch.setenv("ALL_PROXY", f"http://127.0.0.1:{dead}")
    client = offline_client(s.base_url)
    assert client.responses.create(model="scripted", input="go", tools=[{"type": "computer"}]).output_text == "hi"
    client.close()


def test_load_script_validates_each_line(tmp_path):
    good = tmp_path / "good.jsonl"
    good.write_text('// comment\n{"actions": [{"type": "wait"}]}\n\n{"message": "done"}\n')
    assert [list(t) for t in load_script(good)] == [["actions"], ["message"]]
    for bad in ('{"actions": []}', '{"message": 3}', '{"actions": [{"type":"wait"}], "message": "x"}',
                '{"actions": [{"type":"wait"}], "extra": 1}', 'not json',
                '{"action": {"type":"wait"}, "pending_safety_checks": [{"code": "x"}]}'):
        path = tmp_path / "bad.jsonl"
        path.write_text(bad + "\n")
        with pytest.raises(ScriptError, match="bad.jsonl:1"):
            load_script(path)


def test_the_task_scripts_are_valid():
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "tasks"
    scripts = sorted(root.glob("*.offline.jsonl"))
    assert scripts, "no offline scripts in tasks/"
    for script in scripts:
        turns = load_script(script)
        assert "message" in turns[-1]
        json.dumps(turns)


WAIT = {"type": "wait"}


@pytest.mark.parametrize("turn, why", [
    ({"actions": [WAIT], "pending_safety_checks": None}, "pending_safety_checks"),
    ({"actions": [WAIT], "pending_safety_checks": {"id": "x"}}, "pending_safety_checks"),
    ({"actions": [WAIT], "pending_safety_checks": [{"id": "x", "code": 5}]}, "code"),
    ({"actions": [WAIT], "pending_safety_checks": [{"id": "x", "message": ["m"]}]}, "message"),
    ({"actions": [WAIT], "pending_safety_checks": [{"id": "x", "colour": "red"}]}, "colour"),
    ({"actions": [{"type": "teleport", "x": 1, "y": 1}]}, "teleport"),
    ({"actions": [5]}, "object"),
    ({"actions": [{"x": 1, "y": 1}]}, "type"),
    ({"actions": [{"type": "click", "x": 1.5, "y": 2, "button": "left"}]}, "integer"),
    ({"actions": [{"type": "click", "x": "1", "y": 2, "button": "left"}]}, "integer"),
    ({"actions": [{"type": "click", "x": True, "y": 2, "button": "left"}]}, "integer"),
    ({"actions": [{"type": "click", "x": -1, "y": 2, "button": "left"}]}, "negative"),
    ({"actions": [{"type": "click", "x": 1, "y": 2, "button": "middle"}]}, "button"),
    ({"actions": [{"type": "click", "x": 1, "y": 2}]}, "button"),
    ({"actions": [{"type": "move", "x": 1}]}, "y"),
    ({"actions": [{"type": "move", "x": 1, "y": 2, "z": 3}]}, "z"),
    ({"actions": [{"type": "drag", "path": [{"x": 1, "y": 1}]}]}, "path"),
    ({"actions": [{"type": "drag", "path": [{"x": 1, "y": 1}, {"x": -2, "y": 0}]}]}, "negative"),
    ({"actions": [{"type": "scroll", "x": 1, "y": 1, "scroll_x": 0, "scroll_y": 1.5}]}, "scroll_y"),
    ({"actions": [{"type": "keypress", "keys": "ctrl+c"}]}, "keys"),
    ({"actions": [{"type": "keypress", "keys": []}]}, "keys"),
    ({"actions": [{"type": "type", "text": 5}]}, "text"),
    ({"message": "x", "usage": 5}, "usage"),
])
def test_hostile_turns_are_refused_at_load_naming_the_line(tmp_path, turn, why):
    path = tmp_path / "s.jsonl"
    path.write_text(json.dumps({"message": "first"}) + "\n" + json.dumps(turn) + "\n")
    with pytest.raises(ScriptError, match="s.jsonl:2") as info:
        load_script(path)
    assert why in str(info.value)


@pytest.mark.parametrize("content", [b"\xff\xfe{}", ("[" * 100000 + "]" * 100000).encode()])
def test_undecodable_scripts_are_script_errors(tmp_path, content):
    path = tmp_path / "s.jsonl"
    path.write_bytes(content)
    with pytest.raises(ScriptError, match="s.jsonl"):
        load_script(path)


def test_unreadable_script_is_a_script_error(tmp_path):
    for path in (tmp_path / "missing.jsonl", tmp_path):
        with pytest.raises(ScriptError, match="cannot read"):
            load_script(path)


def test_valid_hostile_looking_turns_still_load(tmp_path):
    """Out-of-image points are a runtime matter (the image size is known only then)."""
    path = tmp_path / "s.jsonl"
    turns = [{"actions": [{"type": "click", "x": 99999, "y": 0, "button": "left", "keys": ["shift"]},
                          {"type": "drag", "path": [{"x": 0, "y": 0}, {"x": 5, "y": 5}]},
                          {"type": "scroll", "x": 1, "y": 1, "scroll_x": -3, "scroll_y": 0},
                          {"type": "type", "text": ""}, {"type": "screenshot"}],
              "pending_safety_checks": [{"id": "a", "code": None, "message": None}]},
             {"action": {"type": "double_click", "x": 0, "y": 0}, "pending_safety_checks": []},
             {"message": "", "usage": None}]
    path.write_text("".join(json.dumps(t) + "\n" for t in turns))
    assert load_script(path) == turns


_T = [{"type": "computer"}]


@pytest.mark.parametrize("body", [
    {"tools": _T, "input": [{"type": "computer_call", "call_id": [1]}]},
    {"tools": _T, "input": [{"type": "computer_call_output", "call_id": {"a": 1}}]},
    {"tools": _T, "input": [{"type": "computer_call", "call_id": "c", "pending_safety_checks": 5},
                            {"type": "computer_call_output", "call_id": "c"}]},
    {"tools": _T, "input": [{"type": "computer_call", "call_id": "c", "pending_safety_checks": [5]},
                            {"type": "computer_call_output", "call_id": "c"}]},
    {"tools": _T, "input": [{"type": "computer_call", "call_id": "c"},
                            {"type": "computer_call_output", "call_id": "c", "acknowledged_safety_checks": [5]}]},
    {"tools": _T, "input": [{"type": "computer_call", "call_id": "c"},
                            {"type": "computer_call_output", "call_id": "c", "acknowledged_safety_checks": "x"}]},
])
def test_malformed_requests_get_a_structured_400(server, body):
    s = server([{"actions": [{"type": "wait"}]}, {"message": "ok"}])
    resp = httpx.post(f"{s.base_url}/responses", json=body, timeout=10)
    assert resp.status_code == 400, resp.text
    assert set(resp.json()["error"]) >= {"code", "message"}


def test_deeply_nested_json_gets_a_structured_400(server):
    s = server([{"message": "ok"}])
    resp = httpx.post(f"{s.base_url}/responses", content=b"[" * 100000 + b"]" * 100000,
                      headers={"content-type": "application/json"}, timeout=10)
    assert resp.status_code == 400 and resp.json()["error"]["code"] == "invalid_json"
