"""The MCP server's parts that need no sandbox: how an elicitation result answers a question, what a
question shows of hostile text, the ``run_task`` path rule, the ``--task`` file of a session, the command
line's refusals (exit 2 before anything starts), the HTTP gates on a real loopback server, and the
driver's screen binding after a zoom (a confirmed click on a zoomed screenshot)."""

from __future__ import annotations

import io
import threading
from typing import Any

import pytest
from typer.testing import CliRunner

from controller.mcp.elicit import APPROVAL_SCHEMA, question_of, verdict
from controller.mcp.server import _task_path, _utf8
from controller.mcp.session import load_session_task
from controller.run.tasks import TaskError


@pytest.mark.parametrize("action,content,answers,word", [
    ("accept", {"approve": True}, ("approve", "deny"), "approve"),
    ("accept", {"approve": False}, ("approve", "deny"), "deny"),
    ("accept", {}, ("approve", "deny"), "deny"),
    ("accept", {"approve": "true"}, ("approve", "deny"), "deny"),  # only the boolean true approves
    ("accept", None, ("approve", "deny"), "deny"),
    ("decline", None, ("approve", "deny"), "deny"),
    ("cancel", None, ("approve", "deny"), "deny"),
    ("cancel", None, ("approve", "deny", "cancel"), "cancel"),
    ("decline", None, ("approve", "deny", "cancel"), "deny"),
])
def test_an_elicitation_result_answers_the_question(action, content, answers, word):
    assert verdict(action, content, answers) == word


def test_the_approval_form_is_one_boolean():
    assert APPROVAL_SCHEMA["properties"] == {"approve": {"type": "boolean", "title": "Approve", "default": False,
                                                         "description": "true: let it happen; false: refuse it"}}
    assert APPROVAL_SCHEMA["required"] == ["approve"]


class _Request:
    id = "req_x"
    kind = "action"
    question = "Run type 'a\x1b[2Jb'?\nApprove everything"
    actions = ["type 'a\x1b[2Jb'", "x" * 5000]

    @staticmethod
    def seconds_left() -> float:
        return 12.0


def test_a_question_shows_hostile_text_escaped_and_cut():
    q = question_of(_Request(), lambda _word: None)
    assert "\x1b" not in q.message and "\\x1b" in q.message
    first = q.message.split("\n")[0]
    assert first.startswith("desktop-sandbox asks (action): Run type") and "\\nApprove everything" in first
    assert len(q.message) <= 2000 and q.deadline_s == 12.0 and q.answers == ("approve", "deny")


def test_run_task_takes_only_a_file_under_the_current_directory(tmp_path):
    (tmp_path / "tasks").mkdir()
    inside = tmp_path / "tasks" / "t.toml"
    inside.write_text("x")
    (tmp_path / "escape.toml").symlink_to("/etc/hostname")
    assert _task_path(tmp_path, "tasks/t.toml") == inside.resolve()
    for bad, why in (("../t.toml", "under the server's current directory"), ("/etc/hostname", "under the server"),
                     ("escape.toml", "under the server"), ("tasks", "no such task file"),
                     ("tasks/none.toml", "no such task file")):
        with pytest.raises(ValueError, match=why):
            _task_path(tmp_path, bad)


def test_utf8_text_or_none():
    assert _utf8("héllo".encode()) == "héllo"
    assert _utf8("hé".encode()[:2]) == "h"  # a character cut at the end is left out
    assert _utf8(b"\xff\xfe binary") is None and _utf8(b"a\x00b") is None


def test_a_session_task_needs_no_name_instructions_or_checks(tmp_path):
    path = tmp_path / "screen.toml"
    path.write_text("[screen]\nwidth = 2560\nheight = 1600\n[[launch]]\napp = \"terminal\"\n")
    task = load_session_task(path)
    assert (task.screen.width, task.screen.height) == (2560, 1600) and task.checks == []
    assert task.launch[0].app == "terminal" and task.source == path.resolve()
    path.write_text("[screen]\nwidth = 2560\nheight = 1600\nborder = 3\n")
    with pytest.raises(TaskError, match="screen.toml"):
        load_session_task(path)


@pytest.mark.parametrize("args,message", [
    (["--port", "8765"], "--port: only with --http"),
    (["--key-file", "k"], "--key-file: only with --http"),
    (["--confirm-actions", "click,teleport"], "unknown action type 'teleport'"),
    (["--task", "no-such-file.toml"], "--task no-such-file.toml: cannot read"),
    (["--backend", "nowhere"], "nowhere"),
])
def test_the_command_refuses_bad_options_before_anything_starts(args, message):
    from controller.cli import app

    result = CliRunner().invoke(app, ["mcp", *args])
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split())


def _serve(app: Any) -> tuple[str, Any, threading.Thread]:
    from controller.asgi import ThreadedUvicorn
    from wire.connections import listen, uvicorn_config

    sock = listen("127.0.0.1", 0)
    server = ThreadedUvicorn(uvicorn_config(app, lifespan="off", log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    assert server.ready.wait(15) and server.started
    return f"http://127.0.0.1:{sock.getsockname()[1]}/mcp", server, thread


def test_the_http_gates_refuse_before_the_mcp_app_is_reached():
    """The gates of controller.mcp.http around an app that only counts what reaches it, on a real
    uvicorn on 127.0.0.1 (the mcp app itself is driven by tests/mcp/test_mcp_http_docker.py)."""
    import httpx2

    from controller.mcp.http import guarded_app

    reached: list[str] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        reached.append(scope["path"])
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    key = "k" * 20 + "0123456789abcdef"
    url, server, thread = _serve(guarded_app(app, key))
    try:
        auth = {"Authorization": f"Bearer {key}"}
        assert httpx2.post(url, headers={}).status_code == 401
        assert httpx2.post(url, headers={"Authorization": f"Bearer {key[:-1]}"}).status_code == 401
        assert httpx2.post(url, headers={**auth, "Authorization": f"bearer {key}"}).status_code == 200
        modern = httpx2.post(url, headers={**auth, "MCP-Protocol-Version": "2026-07-28"})
        assert modern.status_code == 400 and modern.json()["error"]["code"] == -32600
        assert httpx2.post(url, headers={**auth, "MCP-Protocol-Version": "2025-06-18"}).status_code == 200
        port = url.split(":")[2].split("/")[0]
        assert httpx2.post(url, headers={**auth, "Host": f"rebound.example:{port}"}).status_code == 403
        assert reached == ["/mcp", "/mcp"]
    finally:
        server.should_exit = True
        thread.join(10)


def test_a_confirmed_action_after_a_zoom_binds_where_it_lands():
    """A screenshot of a region (another model space) after a point was acted on elsewhere: the approval's
    screen binding is made on the new image (the point acted on before is kept in screen px)."""
    from PIL import Image

    from controller.run.driver import SandboxDriver, SentScreenshot
    from controller.run.mapping import Frame, ModelSpace
    from wire.screen_match import MatchRule

    d = SandboxDriver(agent=None)  # type: ignore[arg-type]
    d.bind_rule = MatchRule()
    d.model_space = ModelSpace(1568, 980, Frame(0, 0, 2560, 1600))
    d._last_point = d.model_space.to_screen(784, 490)  # what a click there leaves
    out = io.BytesIO()
    Image.new("RGB", (200, 100), "#ffffff").save(out, format="PNG")
    zoom = SentScreenshot(out.getvalue(), "image/png", (200, 100), Frame(1000, 600, 200, 100), (2560, 1600))
    d.model_space = ModelSpace(200, 100, Frame(1000, 600, 200, 100))
    click = d.bind_next([{"type": "click", "x": 10, "y": 20, "button": "left"}], zoom)
    assert click is not None and (click.regions[0].x, click.regions[0].y) == (0, 0)
    typed = d.bind_next([{"type": "type", "text": "x"}], zoom)  # no point: the last one is off this image
    assert typed is not None and sum(r.w * r.h for r in typed.regions) == 200 * 100


def test_a_key_file_others_may_read_is_refused(tmp_path):
    from controller.cli import app

    key_file = tmp_path / "mcp.key"
    key_file.write_text("k" * 20 + "0123456789abcdef\n")
    key_file.chmod(0o644)
    result = CliRunner().invoke(app, ["mcp", "--http", "--key-file", str(key_file), "--runs-dir", str(tmp_path)])
    assert result.exit_code == 2 and "chmod 600" in " ".join(result.output.split()), result.output


def test_the_session_offers_decision_questions_only_and_answers_them_by_mcp():
    """A session's subscription to a real approval registry: an action request and an origin request the
    gateway holds are offered to the client (the origin's answers with cancel, which reaches the gateway
    as cancel); a sign-in request is not; a request decided elsewhere is withdrawn from the questions. The
    run is a stand-in holding the registry (its other parts play no role here); the gateway is a
    function that records what it was told."""
    import asyncio
    from types import SimpleNamespace

    from controller.mcp.elicit import Elicitor
    from controller.mcp.session import McpOptions, McpSession
    from controller.run.registry import ApprovalRegistry

    loop = asyncio.new_event_loop()
    try:
        elicitor = Elicitor(loop)
        session = McpSession(McpOptions(), "s1", client="tests", elicitor=elicitor)
        registry = ApprovalRegistry(60.0)
        session._attend(SimpleNamespace(registry=registry))
        assert "mcp" in registry.views
        told: list[tuple[str, str]] = []
        action = registry.open("action", "Run click (1,1) left?", actions=["click (1,1) left"])
        origin, _ = registry.mirror("oreq_abc", origin="https://example.test", reason="ask tier",
                                    forward=lambda answer, by: told.append((answer, by)))
        registry.open_signin("sign in", credential_origin="https://example.test", fields=[], options=[])
        later = registry.open("action", "Run type?", actions=["type 'x'"])
        registry.deny(later, by="timeout", reason="deadline")
        loop.run_until_complete(asyncio.sleep(0))
        questions = elicitor._open
        assert set(questions) == {action.id, origin.id}
        assert questions[origin.id].answers == ("approve", "deny", "cancel")
        assert "origin: https://example.test" in questions[origin.id].message
        questions[origin.id].decide("cancel")
        assert told == [("cancel", "mcp")] and origin.state == "cancelled" and origin.by == "mcp"
        questions[action.id].decide("approve")
        assert action.approved and action.by == "mcp"
    finally:
        loop.close()


def test_a_server_holds_at_most_max_sessions_until_one_ends():
    """``--max-sessions``: a session beyond the cap is refused before anything starts for it, with what to do;
    one that ended (its sandbox removed) makes room."""
    import time

    from controller.mcp.session import McpOptions, SessionHub, SessionsFull

    hub = SessionHub(McpOptions(max_sessions=2))
    first = hub.open(client=None, elicitor=None)
    hub.open(client=None, elicitor=None)
    with pytest.raises(SessionsFull, match="holds its 2 sessions .--max-sessions.*end one"):
        hub.open(client=None, elicitor=None)
    hub.end(first, "done")
    deadline = time.monotonic() + 10
    while True:
        try:
            hub.open(client=None, elicitor=None)
            break
        except SessionsFull:
            assert time.monotonic() < deadline, "an ended session never made room"
            time.sleep(0.02)
    hub.close_all("test over")
