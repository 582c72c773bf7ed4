"""The local Agents API's contract without a sandbox: the real openai client (sync and async) against
``serve``'s server on loopback. Its sessions' sandboxes fail to start (the image does not exist), which
is itself part of the contract: ``environment.failed`` and ``agent.session.failed`` with the reason.
Every answer is validated strictly against the SDK's own pydantic models."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import stat
import subprocess
import sys
from pathlib import Path

import httpx
import openai
import pytest
from openai import AsyncOpenAI, OpenAI
from openai.types.beta.agent_session import AgentSession
from openai.types.beta.agent_session_event import AgentSessionEvent
from pydantic import TypeAdapter

from controller.agents_api.server import AgentsServer, KeyFileError, ServeOptions, load_or_make_key
from controller.agents_api.sessions import HubOptions
from controller.agents_api.store import StoreBusy

from .conftest import ABSENT_IMAGE, ROOT

EVENT = TypeAdapter(AgentSessionEvent)
CREATE = {"agent": {"model": "offline:tasks/pickup.toml", "tools": [{"type": "computer_use", "include_screenshots": True}]},
          "environment": {"type": "openai_hosted", "desktop": {"enabled": True}, "network": {"access": "disabled"}}}


def client(server: AgentsServer) -> OpenAI:
    return OpenAI(base_url=server.url, api_key=server.key, max_retries=0)


def raw(server: AgentsServer) -> httpx.Client:
    return httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {server.key}"}, timeout=30)


def error_of(exc: openai.APIStatusError) -> dict:
    body = exc.body
    assert isinstance(body, dict) and set(body) >= {"message", "type", "param", "code"}, body
    return body


def failed_session(server: AgentsServer) -> tuple[str, list]:
    """A session whose sandbox failed to start, and its events to the end of its stream."""
    c = client(server)
    session = c.beta.agents.sessions.create(**CREATE)
    with c.beta.agents.sessions.events.stream(session.id, extra_headers={"Last-Event-ID": "0"}) as stream:
        events = list(stream)
    return session.id, events


def test_a_session_whose_sandbox_cannot_start_fails_with_the_reason_and_the_stream_ends(api):
    session_id, events = failed_session(api)
    assert [e.type for e in events] == ["agent.session.created", "agent.session.environment.pending",
                                        "agent.session.environment.failed", "agent.session.failed"]
    assert "desktop-sandbox-absent:none" in events[2].environment.error.message
    assert len({e.event_id for e in events}) == 4
    with raw(api) as http:
        body = http.get(f"/agents/sessions/{session_id}").json()
        AgentSession.model_validate(body, strict=False)
        assert body["status"] == "failed" and "did not start" in body["error"]
        with http.stream("GET", f"/agents/sessions/{session_id}/events", headers={"Last-Event-ID": "0"}) as resp:
            lines = [line for line in resp.iter_lines() if line.startswith("data:")]
        for line in lines:
            EVENT.validate_json(line[5:])
        resent = http.post(f"/agents/sessions/{session_id}/events", json={"events": [
            {"type": "agent.session.input.message", "input": "hello"}]})
        assert resent.status_code == 409 and resent.json()["error"]["code"] == "session_failed"
    c = client(api)
    assert [s.id for s in c.beta.agents.sessions.list()] == [session_id]
    deleted = c.beta.agents.sessions.delete(session_id)
    assert deleted.deleted and deleted.object == "agent.session.deleted"
    with pytest.raises(openai.NotFoundError):
        c.beta.agents.sessions.retrieve(session_id)
    assert list(c.beta.agents.sessions.list()) == []


def test_a_wrong_or_missing_key_is_401_in_the_api_error_shape(api):
    with pytest.raises(openai.AuthenticationError) as caught:
        OpenAI(base_url=api.url, api_key=api.key + "x", max_retries=0).beta.agents.sessions.list()
    assert error_of(caught.value)["code"] == "invalid_api_key"
    with httpx.Client(base_url=api.url) as http:
        for resp in (http.get("/agents/sessions"), http.post("/agents/sessions", json=CREATE),
                     http.get("/agents/sessions", headers={"Authorization": api.key})):
            assert resp.status_code == 401 and resp.headers["www-authenticate"] == "Bearer"
            assert resp.json()["error"]["code"] == "invalid_api_key"


def test_unknown_sessions_are_404_everywhere(api):
    c = client(api)
    for call in (lambda: c.beta.agents.sessions.retrieve("sess_nope"),
                 lambda: c.beta.agents.sessions.delete("sess_nope"),
                 lambda: list(c.beta.agents.sessions.items.list("sess_nope")),
                 lambda: c.beta.agents.sessions.events.create("sess_nope", events=[{"type": "agent.session.input.cancel"}]),
                 lambda: list(c.beta.agents.sessions.events.stream("sess_nope"))):
        with pytest.raises(openai.NotFoundError) as caught:
            call()
        assert error_of(caught.value)["code"] == "session_not_found"


@pytest.mark.parametrize("body,code,words", [
    (b"{not json", "invalid_request", "JSON"),
    (b'{"events": [], "events": []}', "invalid_request", "JSON"),
    (b'{"events": "x"}', "invalid_request", "events"),
    (b'{"events": [{"type": "agent.session.input.nonsense"}]}', "invalid_request", "events[0].type"),
    (b'{"events": [{"type": "agent.session.input.message", "input": [{"role": "user", "content": '
     b'[{"type": "input_image", "image_url": "x"}]}]}]}', "unsupported", "input_image"),
    (b'{"events": [{"type": "agent.session.input.computer_use_approval_request_result", "request_id": "r"}]}',
     "invalid_request", "response"),
    (b'{"events": [{"type": "agent.session.input.computer_use_approval_request_result", "request_id": "r", '
     b'"response": {"type": "browser_origin_access", "decision": "maybe"}}]}', "invalid_request", "decision"),
    (b'{"events": [{"type": "agent.session.input.tool_result", "call_id": "c", "turn_id": "t", "success": true}]}',
     "unsupported", "tool_result"),
    (b'{"events": [{"type": "agent.session.input.computer_use_approval_request_result", "request_id": "r", '
     b'"response": {"type": "browser_authentication", "action": "submit", "fields": [{"field_id": "f", "value": 1}]}}]}',
     "invalid_request", "response.fields[0].value"),
    (b'{"events": [{"type": "agent.session.input.computer_use_approval_request_result", "request_id": "r", '
     b'"response": {"type": "browser_authentication", "action": "login"}}]}', "invalid_request", "response.action"),
    (b'{"events": [{"type": "agent.session.input.message", "input": "a"}, '
     b'{"type": "agent.session.input.message", "input": "b"}]}', "unsupported", "more than one message"),
    (b'[' * 5000 + b']' * 5000, "invalid_request", "JSON"),
    (b'{"events": [{"type": "agent.session.input.message", "input": "a\\u0000b"}]}', "invalid_request", "NUL"),
])
def test_malformed_events_are_400_naming_the_field(api, body, code, words):
    session_id, _ = failed_session(api)
    with raw(api) as http:
        resp = http.post(f"/agents/sessions/{session_id}/events", content=body,
                         headers={"Content-Type": "application/json"})
        assert resp.status_code == 400, resp.text
        error = resp.json()["error"]
        assert error["code"] == code and words in error["message"] + str(error["param"]), error
        assert error["type"] == "invalid_request_error"
        assert http.get(f"/agents/sessions/{session_id}").status_code == 200  # still there


@pytest.mark.parametrize("change,words", [
    ({"agent": {"model": "offline:tasks/pickup.toml", "tools": [{"type": "function", "name": "f"}]}}, "function"),
    ({"agent": {"model": "offline:tasks/pickup.toml", "tools": [{"type": "web_search"}, {"type": "mcp"}]}}, "mcp, web_search"),
    ({"environment": {"type": "none"}}, "environment.type"),
    ({"environment": {"type": "openai_hosted", "files": [{"name": "a"}]}}, "environment.files"),
    ({"environment": {"type": "openai_hosted", "network": {"access": "restricted", "blocked_domains": ["a.b"]}}},
     "blocked_domains"),
    ({"stream": True}, "stream"),
    ({"vault_ids": ["v"]}, "vault_ids"),
    ({"agent_id": "agent_x"}, "agent_id"),
    ({"review": "auto_review"}, "review"),
    ({"agent": {"model": "offline:tasks/pickup.toml", "reasoning": {"effort": "low"}}}, "agent.reasoning"),
])
def test_what_is_outside_the_subset_is_a_400_naming_it(api, change, words):
    with raw(api) as http:
        resp = http.post("/agents/sessions", json={**CREATE, **change})
        assert resp.status_code == 400, resp.text
        error = resp.json()["error"]
        assert error["code"] == "unsupported" and words in error["message"], error
        assert http.get("/agents/sessions").json()["data"] == []  # nothing was created


def test_other_endpoints_and_the_idempotency_header_are_refused_by_name(api):
    c = client(api)
    with pytest.raises(openai.NotFoundError) as caught:
        c.beta.agents.sessions.update("sess_x", metadata={"a": "b"})
    assert "POST /v1/agents/sessions/sess_x" in error_of(caught.value)["message"]
    with pytest.raises(openai.NotFoundError) as caught:
        c.beta.agents.environments.list()
    assert error_of(caught.value)["code"] == "unsupported"
    with pytest.raises(openai.BadRequestError) as caught:
        c.beta.agents.sessions.create(**CREATE, extra_headers={"Idempotency-Key": "k1"})
    assert "Idempotency-Key" in error_of(caught.value)["message"]
    with pytest.raises(openai.BadRequestError) as caught:
        c.beta.agents.sessions.list(limit=1000)
    assert error_of(caught.value)["param"] == "limit"


def test_an_oversized_body_is_413_declared_or_streamed(api):
    session_id, _ = failed_session(api)
    big = b'{"events": [{"type": "agent.session.input.message", "input": "' + b"a" * (2 * 1024 * 1024) + b'"}]}'
    with raw(api) as http:
        declared = http.post(f"/agents/sessions/{session_id}/events", content=big)
        streamed = http.post(f"/agents/sessions/{session_id}/events",
                             content=(big[i:i + 65536] for i in range(0, len(big), 65536)))
        for resp in (declared, streamed):
            assert resp.status_code == 413 and resp.json()["error"]["code"] == "body_too_large"
        assert http.get(f"/agents/sessions/{session_id}").status_code == 200


def test_the_async_client_sees_the_same_contract(api):
    async def main() -> None:
        c = AsyncOpenAI(base_url=api.url, api_key=api.key, max_retries=0)
        session = await c.beta.agents.sessions.create(**CREATE, metadata={"who": "async"})
        assert session.metadata == {"who": "async"} and session.object == "agent.session"
        stream = await c.beta.agents.sessions.events.stream(session.id, extra_headers={"Last-Event-ID": "0"})
        types = [e.type async for e in stream]
        assert types[-1] == "agent.session.failed"
        page = await c.beta.agents.sessions.list(order="asc", limit=1)
        assert [s.id for s in page.data] == [session.id]
        with pytest.raises(openai.AuthenticationError):
            await AsyncOpenAI(base_url=api.url, api_key="wrong", max_retries=0).beta.agents.sessions.list()
        await c.beta.agents.sessions.delete(session.id)
        await c.close()

    asyncio.run(main())


def test_the_key_file_is_made_0600_reused_and_refused_when_others_may_read_it(tmp_path):
    path = tmp_path / "key"
    key = load_or_make_key(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and key.startswith("sk-local-") and len(key) > 40
    assert load_or_make_key(path) == key
    path.chmod(0o640)
    with pytest.raises(KeyFileError, match="read by others"):
        load_or_make_key(path)
    path.chmod(0o600)
    path.write_text("two words\n")
    with pytest.raises(KeyFileError):
        load_or_make_key(path)


def test_one_database_one_server(tmp_path):
    options = ServeOptions(hub=HubOptions(runs_dir=tmp_path, image="x:y"))
    with AgentsServer(options):
        with pytest.raises(StoreBusy):
            AgentsServer(options).start()


def test_serve_prints_its_one_line_on_stderr_and_stops_on_sigterm(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "controller.cli", "serve", "--runs-dir", str(tmp_path),
                             "--image", "x:none"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "COLUMNS": "200"})
    try:
        line = proc.stderr.readline().rstrip("\n")
        match = re.fullmatch(r"agents-api: (http://127\.0\.0\.1:\d+/v1) key-file: (.+)", line)
        assert match, line
        key = Path(match.group(2)).read_text().strip()
        assert Path(match.group(2)) == tmp_path / "agents-api.key"
        listed = OpenAI(base_url=match.group(1), api_key=key, max_retries=0).beta.agents.sessions.list()
        assert listed.data == []
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
        assert out == "" and err.splitlines() == [
            "agents-api: stopping: each session's turn is cancelled and its sandbox removed",
            "agents-api: stopped (0 session(s) failed, their sandboxes removed)"]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_past_max_sessions_a_create_is_429_and_nothing_starts(tmp_path):
    options = ServeOptions(hub=HubOptions(runs_dir=tmp_path, image="x:none", max_sessions=0))
    with AgentsServer(options) as server:
        with pytest.raises(openai.RateLimitError) as caught:
            client(server).beta.agents.sessions.create(**CREATE)
        assert error_of(caught.value)["code"] == "too_many_sessions"
        assert list(client(server).beta.agents.sessions.list()) == []


def test_a_first_turn_given_on_create_fails_with_the_sandbox_and_a_bad_task_is_400(api, monkeypatch):
    c = client(api)
    session = c.beta.agents.sessions.create(**CREATE, input="Book the pickup.")
    with c.beta.agents.sessions.events.stream(session.id, extra_headers={"Last-Event-ID": "0"}) as stream:
        events = list(stream)
    assert [e.type for e in events] == [
        "agent.session.created", "agent.session.environment.pending", "agent.session.turn.created",
        "agent.session.turn.item.added", "agent.session.turn.failed", "agent.session.environment.failed",
        "agent.session.failed"]
    assert events[3].item.content[0].text == "Book the pickup." and events[4].turn.error.code == "sandbox_error"
    [item] = c.beta.agents.sessions.items.list(session.id)
    assert item.role == "user"
    for model in ("offline:/dev/zero", "offline:/nonexistent.toml", "offline:tasks/pickup.offline.jsonl"):
        with pytest.raises(openai.BadRequestError) as caught:
            c.beta.agents.sessions.create(**{**CREATE, "agent": {"model": model}})
        assert error_of(caught.value)["param"] == "agent.model"
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)  # the server runs in this process
    with pytest.raises(openai.BadRequestError) as caught:
        c.beta.agents.sessions.create(**{**CREATE, "agent": {"model": "gpt-live"}})
    assert error_of(caught.value)["code"] == "model_unavailable"


def test_strings_that_are_not_text_are_400_and_create_nothing(api):
    """A lone UTF-16 surrogate in any string (metadata, instructions, the model) is refused before a
    session exists: listing stays answerable."""
    with raw(api) as http:
        for where in ('"metadata": {"m": "\\ud800"}', '"metadata": {"\\udfff": "k"}'):
            body = ('{"agent": {"model": "offline:tasks/pickup.toml"}, "environment": {"type": "openai_hosted"}, '
                    + where + "}")
            resp = http.post("/agents/sessions", content=body.encode(), headers={"Content-Type": "application/json"})
            assert resp.status_code == 400 and resp.json()["error"]["code"] == "invalid_request", resp.text
            assert "surrogate" in resp.json()["error"]["message"]
        body = b'{"agent": {"model": "offline:\\ud800.toml"}, "environment": {"type": "openai_hosted"}}'
        assert http.post("/agents/sessions", content=body).status_code == 400
        listed = http.get("/agents/sessions")
        assert listed.status_code == 200 and listed.json()["data"] == []


def test_numbers_in_queries_and_event_ids_are_ascii_and_bounded(api):
    session_id, _ = failed_session(api)
    with raw(api) as http:
        for limit in ("%C2%B2", "%D9%A1", "99999999999999999999", "-1"):
            for path in ("/agents/sessions", f"/agents/sessions/{session_id}/items"):
                resp = http.get(f"{path}?limit={limit}")
                assert resp.status_code == 400, (path, limit, resp.text)
        for last in (b"evt_99999999999999999999", b"evt_9999999999999999999", "evt_\u0662".encode()):
            with http.stream("GET", f"/agents/sessions/{session_id}/events", headers={"Last-Event-ID": last}) as resp:
                assert resp.status_code == 400, last


def test_the_auth_scheme_is_case_insensitive_the_key_is_not(api):
    with httpx.Client(base_url=api.url, timeout=30) as http:
        assert http.get("/agents/sessions", headers={"Authorization": f"bearer {api.key}"}).status_code == 200
        assert http.get("/agents/sessions", headers={"Authorization": f"BEARER {api.key}"}).status_code == 200
        assert http.get("/agents/sessions", headers={"Authorization": f"Bearer {api.key.upper()}"}).status_code == 401
        assert http.get("/agents/sessions", headers={"Authorization": f"Basic {api.key}"}).status_code == 401


def test_a_key_file_that_is_not_a_regular_file_is_refused_at_once(tmp_path):
    fifo = tmp_path / "fifo.key"
    os.mkfifo(fifo, 0o600)
    with pytest.raises(KeyFileError, match="not a regular file"):
        load_or_make_key(fifo)  # would wait for a writer forever if opened blocking


def test_a_damaged_database_is_refused_with_what_to_do_and_a_damaged_row_is_passed_over(tmp_path):
    import sqlite3

    from controller.agents_api.store import Store, StoreError

    bad = tmp_path / "bad.db"
    bad.write_bytes(b"this is not a database" * 100)
    with pytest.raises(StoreError, match="move it away"):
        Store(bad)
    Store(bad.with_name("bad2.db")).close()  # the refused store left its lock free for others
    good = tmp_path / "good.db"
    store = Store(good)
    store.add_session("sess_a", {"id": "sess_a", "created_at": 1}, owner="h:1:x", backend="docker")
    store.add_session("sess_b", {"id": "sess_b", "created_at": 2}, owner="h:1:x", backend="docker")
    store.close()
    with sqlite3.connect(good) as db:
        db.execute("UPDATE sessions SET data = '{not json' WHERE id = 'sess_a'")
    store = Store(good)
    try:
        assert [row["id"] for row in store.sessions()] == ["sess_b"]
        assert store.session("sess_a") is None
    finally:
        store.close()


def test_a_session_of_a_dead_server_with_the_same_pid_is_failed_at_the_next_start(tmp_path):
    """A server restarted as the same pid (pid 1 of a container or another pid namespace) is another
    server: what the dead one ran is failed, never left running."""
    from controller.agents_api.store import Store, owner_label

    runs = tmp_path / "runs"
    runs.mkdir()
    store = Store(runs / "agents.db")
    host_pid = f"{os.uname().nodename}:{os.getpid()}"  # this process's: the pid the dead server had too
    assert owner_label() != host_pid and owner_label().startswith(host_pid + ":")
    for session_id, owner in (("sess_old", host_pid), ("sess_older", f"{host_pid}:0123456789abcdef")):
        data = {"id": session_id, "created_at": 1, "agent": {"model": "offline:tasks/pickup.toml"},
                "environment": {"type": "openai_hosted"}, "metadata": {}}
        store.add_session(session_id, data, owner=owner, backend="docker")
        store.update_session(session_id, status="in_progress")
    store.close()
    with AgentsServer(ServeOptions(hub=HubOptions(runs_dir=runs, image=ABSENT_IMAGE))) as server:
        with raw(server) as http:
            for session_id in ("sess_old", "sess_older"):
                assert http.get(f"/agents/sessions/{session_id}").json()["status"] == "failed"


def test_the_streams_comments_never_reach_the_sdk_as_events():
    """The SDK's own SSE decoder over a stream with the server's comments after an event id: every
    event it yields is one of ours (a comment followed by a blank line would come out as an event with
    empty data, and the SDK's JSON parse of it fails)."""
    from openai._streaming import SSEDecoder

    from controller.agents_api.app import CONNECTED, PING, sse

    first = {"type": "agent.session.created", "session": {"id": "sess_x"}}
    second = {"type": "agent.session.idle", "session": {"id": "sess_x"}}
    wire = CONNECTED + sse(1, first) + PING + PING + sse(2, second) + PING
    events = list(SSEDecoder().iter_bytes(iter([wire[i:i + 7] for i in range(0, len(wire), 7)])))
    assert [e.json()["type"] for e in events] == ["agent.session.created", "agent.session.idle"]
    assert [e.id for e in events] == ["evt_1", "evt_2"]


def confined_server(tmp_path: Path) -> tuple[AgentsServer, Path]:
    """A server whose tasks directory is ``tmp_path/tasks``: the pickup task and its script, a symlink
    to it inside, a symlink to a task outside, a symlinked folder out, a FIFO, a folder and a .toml
    with secrets."""
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    for name in ("pickup.toml", "pickup.offline.jsonl"):
        (tasks / name).write_bytes((ROOT / "tasks" / name).read_bytes())
    (tmp_path / "outside.toml").write_bytes((ROOT / "tasks" / "pickup.toml").read_bytes())
    (tmp_path / "pickup.offline.jsonl").write_bytes((ROOT / "tasks" / "pickup.offline.jsonl").read_bytes())
    (tasks / "alias.toml").symlink_to("pickup.toml")
    (tasks / "out.toml").symlink_to(tmp_path / "outside.toml")
    (tasks / "etc").symlink_to("/etc")
    os.mkfifo(tasks / "fifo.toml", 0o600)
    (tasks / "folder.toml").mkdir()
    (tasks / "secret.toml").write_text('password = "hunter2-in-a-file"\n[database]\nuser = "admin-in-a-file"\n')
    server = AgentsServer(ServeOptions(hub=HubOptions(runs_dir=tmp_path / "runs", image=ABSENT_IMAGE,
                                                      tasks_dir=tasks))).start()
    return server, tasks


def test_offline_task_paths_are_confined_to_the_tasks_directory_and_refusals_hold_nothing_of_a_file(tmp_path):
    """Absolute paths, ``..``, symlinks (of a file or of a folder) and NUL cannot lead an offline task
    outside the server's tasks directory, whether or not something is there; a file inside that is
    no task is refused without a word of what it holds; a FIFO is refused at once."""
    server, tasks = confined_server(tmp_path)
    try:
        c = client(server)
        outside = [f"offline:{tmp_path / 'outside.toml'}", f"offline:{tasks}/../outside.toml", "offline:../x.toml",
                   "offline:/etc/x.toml", f"offline:{tasks}/out.toml", f"offline:{tasks}/etc/x.toml",
                   "offline:tasks/pickup.toml", f"offline:{tasks}/../tasks.toml"]
        for model in [*outside, f"offline:{tasks}/a\x00.toml", f"offline:{tasks}/missing.toml",
                      f"offline:{tasks}/secret.toml", f"offline:{tasks}/fifo.toml", f"offline:{tasks}/folder.toml"]:
            with pytest.raises(openai.BadRequestError) as caught:
                c.beta.agents.sessions.create(**{**CREATE, "agent": {"model": model}})
            error = error_of(caught.value)
            assert error["param"] == "agent.model" and error["code"] == "invalid_request", (model, error)
            for word in ("hunter2", "password", "admin", "database", "root:"):
                assert word not in error["message"], (model, error)
            if model in outside:
                assert "outside" in error["message"] or "tasks directory" in error["message"], (model, error)
        for model in (f"offline:{tasks}/pickup.toml", f"offline:{tasks}/alias.toml",
                      f"offline:{tasks}/../tasks/pickup.toml"):
            session = c.beta.agents.sessions.create(**{**CREATE, "agent": {"model": model}})
            c.beta.agents.sessions.delete(session.id)
    finally:
        server.stop()


def test_a_key_file_through_a_symlink_of_another_user_or_with_a_weak_key_is_refused(tmp_path):
    real = tmp_path / "real.key"
    key = load_or_make_key(real)
    for link, target in ((tmp_path / "link.key", real), (tmp_path / "dangling.key", tmp_path / "none.key")):
        link.symlink_to(target)
        with pytest.raises(KeyFileError, match="symbolic link"):
            load_or_make_key(link)
    assert not (tmp_path / "none.key").exists()  # nothing was written through the dangling link
    for weak in ("x", "short-but-varied-key-1", "a" * 64, "abababababababababababababababababab"):
        real.write_text(weak + "\n")
        with pytest.raises(KeyFileError, match="too weak|one key") as caught:
            load_or_make_key(real)
        assert weak not in str(caught.value)
    strong = "correct-horse-battery-staple-42!"
    real.write_text(strong + "\n")
    assert load_or_make_key(real) == strong
    assert len(key) >= 32 and load_or_make_key(tmp_path / "again.key") != key  # a generated key meets the rule
    if os.geteuid() != 0:
        pytest.skip("a file of another user can only be made by root")
    for other in (65534, 1):
        os.chown(real, other, -1)
        with pytest.raises(KeyFileError, match=f"belongs to uid {other}"):
            load_or_make_key(real)


def test_the_database_and_its_files_are_private_whatever_the_umask(tmp_path):
    from controller.agents_api.store import Store

    for umask in (0o022, 0o000, 0o002):
        folder = tmp_path / f"umask-{umask:o}"
        previous = os.umask(umask)
        try:
            store = Store(folder / "agents.db")
            store.add_session("sess_a", {"id": "sess_a", "created_at": 1}, owner="h:1:x", backend="docker")
            names = sorted(p.name for p in folder.iterdir())
            assert names == ["agents.db", "agents.db-shm", "agents.db-wal", "agents.db.lock"], names
            modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in folder.iterdir()}
            store.close()
        finally:
            os.umask(previous)
        assert set(modes.values()) == {0o600}, (umask, modes)
        assert not stat.S_IMODE(folder.stat().st_mode) & 0o022
    for suffix in ("-wal", "-shm"):  # as a killed server leaves them
        (folder / f"agents.db{suffix}").touch()
    for path in folder.iterdir():  # files an older server left wider are narrowed
        path.chmod(0o644)
    store = Store(folder / "agents.db")
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in folder.iterdir()}
    store.close()
    assert len(modes) == 4 and set(modes.values()) == {0o600}, modes


def test_a_database_others_could_lock_or_replace_is_refused_and_a_busy_one_names_its_holder(tmp_path):
    from controller.agents_api.store import Store, StoreError

    first = Store(tmp_path / "agents.db")
    try:
        with pytest.raises(StoreBusy, match=f":{os.getpid()}\\)"):
            Store(tmp_path / "agents.db")
    finally:
        first.close()
    for mode, words in ((0o777, "others may write"), (0o703, "others may write")):
        folder = tmp_path / f"open-{mode:o}"
        folder.mkdir()
        folder.chmod(mode)
        with pytest.raises(StoreError, match=words):
            Store(folder / "agents.db")
        assert list(folder.iterdir()) == []  # refused before anything was made there
    linked = tmp_path / "linked"
    linked.mkdir()
    (tmp_path / "elsewhere.lock").write_text("")
    (linked / "agents.db.lock").symlink_to(tmp_path / "elsewhere.lock")
    with pytest.raises(StoreError, match="symbolic link"):
        Store(linked / "agents.db")
    if os.geteuid() != 0:
        pytest.skip("files and folders of another user can only be made by root")
    shared = tmp_path / "shared-group"
    shared.mkdir()
    os.chown(shared, -1, 1)  # the group of another user (daemon's primary group)
    shared.chmod(0o770)
    with pytest.raises(StoreError, match="group 1 may write"):
        Store(shared / "agents.db")
    private = tmp_path / "private-group"  # a umask of 002 with the user's own group: fine
    private.mkdir()
    os.chown(private, -1, os.getegid())
    private.chmod(0o775)
    Store(private / "agents.db").close()
    for other in (65534, 1):
        os.chown(private / "agents.db.lock", other, -1)
        with pytest.raises(StoreError, match=f"belongs to uid {other}"):
            Store(private / "agents.db")
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    os.chown(foreign, 65534, -1)
    with pytest.raises(StoreError, match="belongs to uid 65534"):
        Store(foreign / "agents.db")


@pytest.mark.parametrize("case", ["weak key", "key through a symlink", "runs folder others may write"])
def test_serve_refuses_a_bad_key_file_or_runs_folder_with_exit_2(tmp_path, case):
    runs = tmp_path / "runs"
    runs.mkdir()
    if case == "weak key":
        (runs / "agents-api.key").write_text("k\n")
        (runs / "agents-api.key").chmod(0o600)
    elif case == "key through a symlink":
        load_or_make_key(tmp_path / "real.key")
        (runs / "agents-api.key").symlink_to(tmp_path / "real.key")
    else:
        runs.chmod(0o777)
    done = subprocess.run([sys.executable, "-m", "controller.cli", "serve", "--runs-dir", str(runs),
                           "--image", "x:none"], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "COLUMNS": "200"})
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert {"weak key": "too weak", "key through a symlink": "symbolic link",
            "runs folder others may write": "others may write"}[case] in done.stderr, done.stderr
