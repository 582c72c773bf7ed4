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
