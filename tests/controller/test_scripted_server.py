"""The scripted Responses server through the real openai.OpenAI client, and offline loopback-only mode."""

from __future__ import annotations

import base64
import json
import socket

import httpx
import openai
import pytest

from controller.run.model_client import LoopbackOnlyTransport, UsageMeter, offline_client
from controller.offline.expectations import MAX_WAITS_PER_TURN
from controller.offline.scripted_server import ScriptedModel, ScriptedServer, ScriptError, load_script
from tests import scripted

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
    client = scripted.client(s)
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
    client = scripted.client(s)
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
    client = scripted.client(s)
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
    client = scripted.client(s)
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(model="scripted", input=_history([], [], url), tools=[{"type": "computer"}])
    assert info.value.body["code"] == "invalid_image"
    client.close()


def test_exhausted_script_is_an_error_not_a_guess(server):
    s = server([{"actions": [{"type": "wait"}]}])
    client = scripted.client(s)
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(model="scripted", input=_history([], []), tools=[{"type": "computer"}])
    assert info.value.body["code"] == "script_exhausted"
    client.close()


def test_usage_meter_sees_each_request_and_missing_usage(server):
    s = server([{"actions": [{"type": "wait"}], "usage": None}, {"message": "ok"}])
    meter = UsageMeter()
    client = scripted.client(s, meter)
    client.responses.create(model="scripted", input="go", tools=[{"type": "computer"}])
    client.responses.create(model="scripted", input=_history([], []), tools=[{"type": "computer"}])
    assert [r.total_tokens is None for r in meter.requests] == [True, False]
    assert meter.totals()["complete"] is False
    client.close()


def test_offline_client_only_reaches_loopback():
    with pytest.raises(ValueError):
        offline_client("http://192.0.2.1:8000/v1", api_key="k")
    with pytest.raises(ValueError):
        offline_client("http://localhost.example:8000/v1", api_key="k")
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
    client = scripted.client(s)
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
    resp = scripted.post(s, body)
    assert resp.status_code == 400, resp.text
    assert set(resp.json()["error"]) >= {"code", "message"}


def test_deeply_nested_json_gets_a_structured_400(server):
    s = server([{"message": "ok"}])
    resp = scripted.post(s, content=b"[" * 100000 + b"]" * 100000, headers={"content-type": "application/json"})
    assert resp.status_code == 400 and resp.json()["error"]["code"] == "invalid_json"


# -- only the run that started a server reaches it: its key --------------------------------------

_FIRST = {"model": "scripted", "input": "go", "tools": [{"type": "computer"}]}


def _without_the_key(s, other):
    """Ways a request may come without ``s``'s key: each a list of extra header pairs."""
    return {
        "none": [],
        "wrong key": [("Authorization", f"Bearer {s.key}x")],
        "another server's key": [("Authorization", f"Bearer {other.key}")],
        "a prefix of the key": [("Authorization", f"Bearer {s.key[:-1]}")],
        "bearer without a key": [("Authorization", "Bearer")],
        "another scheme": [("Authorization", f"Basic {s.key}")],
        "no scheme": [("Authorization", s.key)],
        "x-api-key header": [("X-Api-Key", s.key)],
        "api-key header": [("api-key", s.key)],
        "openai-api-key header": [("OpenAI-Api-Key", f"Bearer {s.key}")],
        "two authorization headers": [("Authorization", f"Bearer {s.key}"), ("Authorization", "Bearer other")],
    }


def test_each_server_makes_its_own_random_key(server):
    first, second = server([{"message": "a"}]), server([{"message": "b"}])
    assert first.key != second.key and len(first.key) >= 43  # 32 random bytes, urlsafe base64


def test_a_request_without_the_key_is_refused_and_uses_no_turn(server):
    s = server([{"actions": [{"type": "wait"}]}, {"message": "ok"}])
    other = server([{"message": "other"}])
    for name, headers in _without_the_key(s, other).items():
        for method, path in (("POST", "/v1/responses"), ("GET", "/livez"), ("GET", "/nowhere")):
            resp = httpx.request(method, f"http://127.0.0.1:{s.port}{path}", json=_FIRST if method == "POST" else None,
                                 headers=headers, timeout=10)
            assert resp.status_code == 401, (name, path, resp.text)
            assert resp.json() == {"error": {"code": "invalid_api_key", "message": resp.json()["error"]["message"],
                                             "param": None, "type": "invalid_request_error"}}, name
            assert s.key not in resp.text
    assert s.model.requests == [] and s.model.errors == [] and s.model.unmet is None
    client = scripted.client(s)
    first = client.responses.create(**_FIRST)
    assert first.output[0].type == "computer_call" and first.output[0].call_id == "call_0000"
    assert len(s.model.requests) == 1
    client.close()


def test_the_sdk_with_a_wrong_key_gets_an_authentication_error_and_no_turn(server):
    s = server([{"message": "ok"}])
    client = offline_client(s.base_url, api_key=s.key[::-1])
    with pytest.raises(openai.AuthenticationError) as info:
        client.responses.create(**_FIRST)
    assert info.value.body["code"] == "invalid_api_key" and s.model.requests == []
    client.close()
    with pytest.raises(TypeError):
        offline_client(s.base_url)  # no client without a key


def _exchange(sock: socket.socket, head: bytes) -> int:
    """Send one request ``head`` (no body) on ``sock`` and read its answer (Content-Length); its status."""
    sock.sendall(head)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, "closed before an answer"
        data += chunk
    head_part, _, body = data.partition(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head_part.split(b"\r\n")
                  if line.lower().startswith(b"content-length"))
    while len(body) < length:
        body += sock.recv(65536)
    return int(head_part.split()[1])


def _closed_within(sock: socket.socket, seconds: float) -> bool:
    sock.settimeout(seconds)
    try:
        return sock.recv(4096) == b""
    except socket.timeout:
        return False
    except ConnectionResetError:
        return True


def test_keyless_keep_alive_connections_stay_unauthenticated_capped_and_closed(server, monkeypatch):
    """Connections whose requests came without the key (each answered 401, kept alive) count against
    the connection rules' cap on unauthenticated connections: past it the oldest are closed, while a
    connection that carried the key stays; and one idle after its 401 is closed by the head deadline."""
    from wire import connections

    s = server([{"message": "ok"}])
    keyless = f"GET /livez HTTP/1.1\r\nHost: 127.0.0.1:{s.port}\r\n\r\n".encode()
    keyed = keyless.replace(b"\r\n\r\n", f"\r\nAuthorization: Bearer {s.key}\r\n\r\n".encode())
    monkeypatch.setattr(connections, "UNAUTHENTICATED_MAX", 4)
    socks = []
    try:
        owner = socket.create_connection(("127.0.0.1", s.port), timeout=10)
        socks.append(owner)
        assert _exchange(owner, keyed) == 200
        flood = []
        for _ in range(12):  # one after another: each accepted, answered, kept alive
            sock = socket.create_connection(("127.0.0.1", s.port), timeout=10)
            socks.append(sock)
            flood.append(sock)
            assert _exchange(sock, keyless) == 401
        assert all(_closed_within(sock, 2.0) for sock in flood[:8]), "past the cap the oldest are closed"
        assert not any(_closed_within(sock, 0.1) for sock in flood[8:])
        assert _exchange(owner, keyed) == 200  # the run's own connection is still there

        monkeypatch.setattr(connections, "HEAD_TIMEOUT_S", 0.5)
        idle = socket.create_connection(("127.0.0.1", s.port), timeout=10)
        socks.append(idle)
        assert _exchange(idle, keyless) == 401
        assert _closed_within(idle, 3.0), "a connection without the key gets no idle keep-alive"
    finally:
        for sock in socks:
            sock.close()


# -- screen expectations: the scripted model waits for the screen, then acts, or gives up ----------

import io  # noqa: E402

from openai import ComputerToolset  # noqa: E402
from PIL import Image  # noqa: E402

RED, BLUE = "#cc0000", "#1d5fd1"


class PaintedDesk:
    """An in-memory ComputerDriver: a 200x100 white screen (model px = its px). ``log`` lists the action
    types it ran; ``paint[(when, n)]`` fills a box when the n-th action of type ``when`` runs."""

    def __init__(self, paint: dict[tuple[str, int], tuple[tuple[int, int, int, int], str]] | None = None) -> None:
        self.image = Image.new("RGB", (200, 100), "#ffffff")
        self.log: list[str] = []
        self.paint = paint or {}

    def _act(self, action) -> None:
        self.log.append(action.type)
        box_colour = self.paint.get((action.type, self.log.count(action.type)))
        if box_colour:
            box, colour = box_colour
            self.image.paste(colour, box)

    click = double_click = drag = keypress = move = scroll = type = wait = _act

    def url(self) -> str:
        buf = io.BytesIO()
        self.image.save(buf, format="PNG")
        return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()

    def screenshot(self):
        return {"type": "computer_screenshot", "image_url": self.url()}

    def params(self, legacy: bool = False) -> dict:
        tool = ({"type": "computer_use_preview", "display_width": 200, "display_height": 100, "environment": "linux"}
                if legacy else {"type": "computer"})
        return {"model": "scripted", "tools": [tool], "input": [{"role": "user", "content": [
            {"type": "input_text", "text": "go"}, {"type": "input_image", "image_url": self.url(), "detail": "high"}]}]}


class Clock:
    """A monotonic clock that moves ``step`` seconds each time it is read (no real waiting)."""

    def __init__(self, step: float) -> None:
        self.now, self.step = 1000.0, step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


def _expecting_model(turns, clock=None):
    entries: list[dict] = []
    model = ScriptedModel(turns, on_expectation=entries.append, **({"clock": clock} if clock else {}))
    return model, entries


def _call_ids(model: ScriptedModel) -> list[str]:
    return [i["call_id"] for i in model.requests[-1]["input"]
            if isinstance(i, dict) and i.get("type") == "computer_call"]


RED_BOX = {"kind": "color", "x": 150, "y": 60, "w": 20, "h": 20, "rgb": RED}


def test_unmet_expectation_answers_waits_then_the_scripted_actions():
    desk = PaintedDesk({("wait", 3): ((150, 60, 170, 80), RED)})  # the page reacts during the third wait
    model, entries = _expecting_model([
        {"actions": [{"type": "click", "x": 10, "y": 10, "button": "left"}]},
        {"expect": [RED_BOX], "actions": [{"type": "keypress", "keys": ["Return"]}]},
        {"message": "done"},
    ])
    with ScriptedServer(model) as s:
        client = scripted.client(s)
        response = ComputerToolset(desk).run(client, desk.params(), max_steps=10)
        client.close()
    assert response.output_text == "done"
    assert desk.log == ["click", "wait", "wait", "wait", "keypress"]
    assert _call_ids(model) == ["call_0000", "call_0001_wait_001", "call_0001_wait_002", "call_0001_wait_003",
                                "call_0001"]
    assert len(model.requests) == 6 and model.unmet is None and model.errors == []
    (entry,) = entries
    assert entry["turn"] == 1 and entry["met"] is True and entry["waits"] == 3 and entry["waited_s"] >= 0
    assert entry["expected"] == ["color #cc0000 +-16 in >=90% of 20x20 at (150,60)"]
    # each wait is a computer_call with one wait action and no pending safety checks
    wait_call = [i for i in model.requests[2]["input"] if i.get("call_id") == "call_0001_wait_001"][0]
    assert wait_call["actions"] == [{"type": "wait"}] and wait_call["pending_safety_checks"] == []
    assert model.wait_allowance == MAX_WAITS_PER_TURN


def test_past_the_deadline_the_model_gives_up_naming_the_expectation():
    desk = PaintedDesk()  # the red box never comes
    model, entries = _expecting_model([
        {"actions": [{"type": "click", "x": 10, "y": 10, "button": "left"}]},
        {"expect": [{"kind": "color", "x": 0, "y": 0, "w": 10, "h": 10, "rgb": "#ffffff"}, RED_BOX],
         "expect_timeout_s": 2.5, "actions": [{"type": "keypress", "keys": ["Return"]}]},
        {"message": "done"},
    ], clock=Clock(1.0))
    with ScriptedServer(model) as s:
        client = scripted.client(s)
        response = ComputerToolset(desk).run(client, desk.params(), max_steps=10)
        client.close()
    # one wait answered at t, checked again at t+1, t+2, then past 2.5 s: three waits, no keypress
    assert desk.log == ["click", "wait", "wait", "wait"]
    assert "gave up at turn 1" in response.output_text and "#cc0000" in response.output_text
    failure = model.unmet
    assert failure is not None and entries == [failure]
    assert failure["met"] is False and failure["turn"] == 1 and failure["waits"] == 3
    assert failure["reason"] == "deadline of 2.5s passed" and failure["waited_s"] == pytest.approx(3.0)
    (unmet,) = failure["unmet"]  # the white box held; only the red one is reported
    assert unmet["index"] == 1 and unmet["kind"] == "color" and unmet["expectation"]["rgb"] == RED
    assert unmet["observed"].startswith("0.0% within 16 of #cc0000 (most common #ffffff 100%)")


def test_a_slower_sandbox_stretches_the_deadline_by_its_time_scale():
    desk = PaintedDesk()  # the red box never comes
    model, entries = _expecting_model([
        {"actions": [{"type": "click", "x": 10, "y": 10, "button": "left"}]},
        {"expect": [RED_BOX], "expect_timeout_s": 2.5, "actions": [{"type": "keypress", "keys": ["Return"]}]},
        {"message": "done"},
    ], clock=Clock(1.0))
    model.time_scale = 3.0  # as the runner sets it from Sandbox.time_scale
    with ScriptedServer(model) as s:
        client = scripted.client(s)
        ComputerToolset(desk).run(client, desk.params(), max_steps=20)
        client.close()
    # 2.5 s x 3 = 7.5 s: waits answered at t .. t+7, given up at t+8
    assert desk.log == ["click"] + ["wait"] * 8
    assert model.unmet["reason"] == "deadline of 7.5s passed" and model.unmet["timeout_s"] == 7.5


def test_expect_retry_redoes_a_step_that_did_not_take_until_the_screen_shows_it():
    # the red box comes only with the second retry (a paste that found no selection the first time)
    desk = PaintedDesk({("move", 2): ((150, 60, 170, 80), RED)})
    retry = {"after_s": 2, "actions": [{"type": "move", "x": 5, "y": 5}]}
    model, entries = _expecting_model([
        {"actions": [{"type": "click", "x": 10, "y": 10, "button": "left"}]},
        {"expect": [RED_BOX], "expect_retry": retry, "actions": [{"type": "keypress", "keys": ["Return"]}]},
        {"message": "done"},
    ], clock=Clock(1.0))
    model.time_scale = 1.5  # retries every 3 s of (fake) waiting
    with ScriptedServer(model) as s:
        client = scripted.client(s)
        ComputerToolset(desk).run(client, desk.params(), max_steps=20)
        client.close()
    assert desk.log[0] == "click" and desk.log[-1] == "keypress" and desk.log.count("move") == 2
    between = desk.log[1:-1]
    assert set(between) == {"wait", "move"} and between[0] == "wait"
    # the moves are 3 s apart: two waits (1 s a request) between the first wait and each move
    assert between == ["wait", "wait", "wait", "move", "wait", "wait", "move"]
    (entry,) = entries
    assert entry["met"] is True and entry["retries"] == 2 and model.unmet is None


@pytest.mark.parametrize("retry, needle", [
    ({"after_s": 0, "actions": [{"type": "wait"}]}, "expect_retry.after_s"),
    ({"after_s": 1, "actions": []}, "expect_retry.actions"),
    ({"after_s": 1, "actions": [{"type": "teleport"}]}, "expect_retry.actions[0]"),
    ({"after_s": 1, "actions": [{"type": "wait"}], "every": 2}, "every"),
])
def test_expect_retry_is_validated_at_load(tmp_path, retry, needle):
    script = tmp_path / "s.jsonl"
    script.write_text(json.dumps({"actions": [{"type": "wait"}]}) + "\n" + json.dumps(
        {"expect": [RED_BOX], "expect_retry": retry, "message": "m"}) + "\n")
    with pytest.raises(ScriptError) as err:
        load_script(script)
    assert needle in str(err.value) and "s.jsonl:2" in str(err.value)


def test_an_expectation_that_cannot_hold_gives_up_without_waiting():
    desk = PaintedDesk()
    model, entries = _expecting_model([
        {"expect": [{"kind": "not_color", "x": 190, "y": 0, "w": 20, "h": 5, "rgb": "#ffffff"}], "message": "x"}])
    with ScriptedServer(model) as s:
        client = scripted.client(s)
        response = ComputerToolset(desk).run(client, desk.params(), max_steps=3)
        client.close()
    assert desk.log == [] and "outside the 200x100 image" in response.output_text
    assert entries[0]["reason"] == "cannot hold on this screenshot" and entries[0]["waits"] == 0


def test_changed_compares_with_the_screenshot_the_previous_turn_was_answered_on():
    # the click paints A at once; B comes with the second wait. After it, A no longer differs from the
    # screenshot before (the first wait's), but it does from the one the click's turn was answered on.
    desk = PaintedDesk({("click", 1): ((0, 0, 40, 40), BLUE), ("wait", 2): ((150, 60, 170, 80), RED)})
    model, entries = _expecting_model([
        {"actions": [{"type": "click", "x": 10, "y": 10, "button": "left"}]},
        {"expect": [{"kind": "changed", "x": 0, "y": 0, "w": 40, "h": 40, "fraction": 0.5}, RED_BOX],
         "message": "both"},
    ])
    with ScriptedServer(model) as s:
        client = scripted.client(s)
        response = ComputerToolset(desk).run(client, desk.params(), max_steps=6)
        client.close()
    assert response.output_text == "both" and desk.log == ["click", "wait", "wait"]
    assert entries == [{"turn": 1, "call_id": "call_0001", "waits": 2, "waited_s": entries[0]["waited_s"],
                        "met": True, "expected": entries[0]["expected"]}]


def test_legacy_tool_gets_single_action_waits(server):
    desk = PaintedDesk({("wait", 1): ((150, 60, 170, 80), RED)})
    s = server([{"expect": [RED_BOX], "message": "seen"}])
    client = scripted.client(s)
    response = ComputerToolset(desk).run(client, desk.params(legacy=True), max_steps=3)
    client.close()
    assert response.output_text == "seen" and desk.log == ["wait"]
    (call,) = [i for i in s.model.requests[-1]["input"] if i.get("type") == "computer_call"]
    assert call["action"] == {"type": "wait"} and "actions" not in call


def test_expectations_without_a_screenshot_ask_for_one(server):
    """A request with only the user's text (the Agents SDK's first request) gets a screenshot call, as a
    model looks before it acts; the turn is then judged on that screenshot."""
    s = server([{"expect": [RED_BOX], "message": "seen"}])
    client = scripted.client(s)
    first = client.responses.create(model="scripted", input="go", tools=[{"type": "computer"}])
    (call,) = [i for i in first.output if i.type == "computer_call"]
    assert [a.type for a in call.actions] == ["screenshot"]
    client.close()
    desk = PaintedDesk()
    desk.image.paste(RED, (150, 60, 170, 80))
    for legacy in (False, True):
        s = server([{"expect": [RED_BOX], "message": "seen"}])
        client = scripted.client(s)
        body = desk.params(legacy=legacy)
        body["input"] = "go"  # no screenshot in the first request
        response = ComputerToolset(desk).run(client, body, max_steps=3)
        client.close()
        assert response.output_text == "seen"
        calls = [i for i in s.model.requests[-1]["input"] if i.get("type") == "computer_call"]
        assert calls and (calls[0].get("action") if legacy else calls[0]["actions"][0]) == {"type": "screenshot"}


def test_a_screenshot_that_cannot_be_decoded_is_refused(server):
    s = server([{"expect": [RED_BOX], "message": "x"}])
    client = scripted.client(s)
    bad = "data:image/png;base64," + base64.b64encode(b"\x89PNG\r\n\x1a\nnot an image").decode()
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(model="scripted", tools=[{"type": "computer"}], input=[{"role": "user", "content": [
            {"type": "input_text", "text": "go"}, {"type": "input_image", "image_url": bad}]}])
    assert info.value.body["code"] == "invalid_image"
    client.close()


@pytest.mark.parametrize("line, why", [
    ('{"message": "x", "expect": [{"kind": "colour", "x": 0, "y": 0, "w": 1, "h": 1, "rgb": "#ffffff"}]}', "'colour'"),
    ('{"message": "x", "expect": [{"kind": "color", "x": 0, "y": 0, "w": 1, "h": 1, "rgb": "#fff"}]}', "expect[0].rgb"),
    ('{"message": "x", "expect": [{"kind": "changed", "x": 0, "y": 0, "w": 1, "h": 1, "hue": 3}]}', "expect[0].hue"),
    ('{"message": "x", "expect_timeout_s": 3}', "expect: required"),
    ('{"message": "x", "expect": [{"kind": "changed", "x": 0, "y": 0, "w": 1, "h": 1}], "expect_timeout_s": "3"}',
     "expect_timeout_s"),
    ('{"message": "x", "expects": []}', "expects"),
])
def test_bad_expectations_are_refused_at_load_naming_the_line(tmp_path, line, why):
    path = tmp_path / "s.jsonl"
    path.write_text('{"actions": [{"type": "wait"}]}\n' + line + "\n")
    with pytest.raises(ScriptError, match="s.jsonl:2") as info:
        load_script(path)
    assert why in str(info.value) and "\n" not in str(info.value)


def test_changed_on_the_first_turn_is_refused(tmp_path):
    path = tmp_path / "s.jsonl"
    path.write_text('// comment\n{"expect": [{"kind": "changed", "x": 0, "y": 0, "w": 1, "h": 1}], "message": "x"}\n')
    with pytest.raises(ScriptError, match=r"s.jsonl:2: expect\[0\]: changed needs an earlier turn"):
        load_script(path)
    with pytest.raises(ScriptError, match="turn 0"):
        ScriptedModel([{"expect": [{"kind": "changed", "x": 0, "y": 0, "w": 1, "h": 1}], "message": "x"}])


def test_the_shipped_scripts_expect_the_screen_before_each_dependent_step():
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "tasks"
    pickup = load_script(root / "pickup.offline.jsonl")
    assert all("expect" in turn for turn in pickup), "every pickup step depends on the screen having reacted"
    demo = load_script(root / "approval-demo.offline.jsonl")
    assert all("expect" in turn for turn in demo)
    # the demo types only in a call of its own, after the terminal shows focused, and that call asks first
    typing = [t for t in demo if any(a["type"] == "type" for a in t.get("actions", []))]
    assert len(typing) == 1 and typing[0]["pending_safety_checks"] and typing[0]["expect"][0]["kind"] == "color"
    assert not any(a["type"] == "wait" for t in pickup + demo for a in t.get("actions", []))


def test_a_script_comment_must_be_text_and_a_huge_script_is_refused_unread(tmp_path, monkeypatch):
    from controller.offline import script

    bad = tmp_path / "comment.jsonl"
    bad.write_text('{"comment": ["not", "text"], "message": "done"}\n')
    with pytest.raises(script.ScriptError, match="comment.jsonl:1: comment must be a string"):
        script.load_script(bad)
    big = tmp_path / "big.jsonl"
    big.write_text('{"message": "done"}\n' * 100)
    monkeypatch.setattr(script, "MAX_SCRIPT_BYTES", 1000)
    with pytest.raises(script.ScriptError, match="larger than 1000 bytes"):
        script.load_script(big)


def test_script_lines_are_split_at_newlines_only_and_hostile_files_are_refused(tmp_path):
    import os

    from controller.offline import script

    ok = tmp_path / "ok.jsonl"
    ok.write_text(json.dumps({"message": "a\u2028b\x85c\x0bd"}, ensure_ascii=False) + "\n"
                  + '{"message": "second"}\n', encoding="utf-8")
    turns = script.load_script(ok)
    assert [t["message"] for t in turns] == ["a\u2028b\x85c\x0bd", "second"]
    fifo = tmp_path / "fifo.jsonl"
    os.mkfifo(fifo)
    with pytest.raises(script.ScriptError, match="fifo.jsonl: cannot read: .*not a regular file"):
        script.load_script(fifo)  # refused at once: opening a FIFO for reading would block
    surrogate = tmp_path / "surrogate.jsonl"
    surrogate.write_text('{"message": "done \\ud800 end"}\n')
    with pytest.raises(script.ScriptError, match="surrogate.jsonl:1: a string holds a lone UTF-16 surrogate"):
        script.load_script(surrogate)
    big = tmp_path / "big.jsonl"
    big.write_text('{"actions": [{"type": "click", "x": 1' + "0" * 5000 + ', "y": 1, "button": "left"}]}\n')
    with pytest.raises(script.ScriptError, match="big.jsonl:1: "):
        script.load_script(big)


# -- a conversation of several user messages (an Agents API session): one script, input expectations --

SESSION_SCRIPT = [
    {"actions": [{"type": "click", "x": 10, "y": 10, "button": "left"}]},
    {"message": "first done"},
    {"expect_input": [{"kind": "user_message", "text": "paint it"}, {"kind": "call", "call_id": "call_0000"},
                      {"kind": "assistant_message", "text": "first done"}],
     "actions": [{"type": "keypress", "keys": ["Return"]}]},
    {"message": "second done"},
]


def _continued(desk: PaintedDesk, model: ScriptedModel, response, text: str) -> dict:
    """The request a session's next run starts with: the last request's input and the answer's output
    (what :class:`controller.run.conversation.ConversationTail` keeps), then the new user message."""
    carried = model.requests[-1]["input"] + [item.to_dict(mode="json") for item in response.output]
    return {**desk.params(), "input": [*carried, {"role": "user", "content": [
        {"type": "input_text", "text": text}, {"type": "input_image", "image_url": desk.url(), "detail": "high"}]}]}


def test_the_second_user_message_continues_the_script_after_the_first_message_turn():
    desk = PaintedDesk()
    model, entries = _expecting_model(SESSION_SCRIPT)
    first = desk.params()
    first["input"][0]["content"][0]["text"] = "paint it"
    with ScriptedServer(model) as s:
        client = scripted.client(s)
        response = ComputerToolset(desk).run(client, first, max_steps=5)
        assert response.output_text == "first done"
        response = ComputerToolset(desk).run(client, _continued(desk, model, response, "now press Return"), max_steps=5)
        client.close()
    assert response.output_text == "second done" and model.unmet is None and model.errors == []
    assert desk.log == ["click", "keypress"]
    assert _call_ids(model) == ["call_0000", "call_0002"]
    (entry,) = entries
    assert entry["met"] is True and entry["turn"] == 2 and entry["call_id"] == "call_0002"
    assert entry["expected"] == ["an earlier user message holds 'paint it'", "call call_0000 and its output in the input",
                                 "an assistant message holds 'first done'"]


def test_an_input_expectation_that_does_not_hold_gives_up_at_once_naming_it():
    """A next run that does not carry the first one's conversation (a new user message alone) reads as
    the first user message: the script starts over; one whose conversation lacks the call gives up."""
    desk = PaintedDesk()
    model, entries = _expecting_model(SESSION_SCRIPT)
    with ScriptedServer(model) as s:
        client = scripted.client(s)
        response = ComputerToolset(desk).run(client, desk.params(), max_steps=5)
        conversation = _continued(desk, model, response, "now press Return")
        conversation["input"] = [i for i in conversation["input"] if i.get("type") != "computer_call_output"
                                 and i.get("type") != "computer_call"]
        response = ComputerToolset(desk).run(client, conversation, max_steps=5)
        client.close()
    assert desk.log == ["click"]  # the second run's keypress never came
    assert "gave up at turn 2" in response.output_text and "expect_input[0]" in response.output_text
    failure = model.unmet
    assert failure is not None and entries == [failure] and failure["reason"] == "the request's input does not hold it"
    assert [(u["index"], u["kind"]) for u in failure["unmet"]] == [(0, "user_message"), (1, "call")]
    assert failure["unmet"][0]["observed"] == "earlier user messages: 'go'"
    assert failure["unmet"][1]["observed"] == "calls: none"


def test_a_user_message_past_the_scripts_message_turns_is_refused_as_exhausted(server):
    s = server([{"message": "only one"}])
    body = {"model": "scripted", "tools": [{"type": "computer"}], "input": [
        {"role": "user", "content": "one"}, {"type": "message", "role": "assistant", "id": "msg_1",
                                              "content": [{"type": "output_text", "text": "only one"}]},
        {"role": "user", "content": "two"}]}
    resp = scripted.post(s, body)
    assert resp.status_code == 400 and resp.json()["error"]["code"] == "script_exhausted"
    assert "answers 1 user message (" in resp.json()["error"]["message"]


@pytest.mark.parametrize("line, why", [
    ('{"expect_input": [{"kind": "user_message"}], "message": "x"}', "expect_input[0].text"),
    ('{"expect_input": [{"kind": "tool", "call_id": "c"}], "message": "x"}', "'tool'"),
    ('{"expect_input": [], "message": "x"}', "expect_input"),
    ('{"expect_input": [{"kind": "call", "call_id": "c", "output": true}], "message": "x"}', "expect_input[0].output"),
])
def test_bad_input_expectations_are_refused_at_load_naming_the_line(tmp_path, line, why):
    path = tmp_path / "s.jsonl"
    path.write_text('{"message": "first"}\n' + line + "\n")
    with pytest.raises(ScriptError, match="s.jsonl:2") as info:
        load_script(path)
    assert why in str(info.value) and "\n" not in str(info.value)
    path.write_text('{"expect_input": [{"kind": "call", "call_id": "c"}], "message": "x"}\n')
    with pytest.raises(ScriptError, match="s.jsonl:1: expect_input: the first turn"):
        load_script(path)
