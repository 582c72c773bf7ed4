"""How many sandboxes the Agents API holds, and which leftovers a new server removes, on the stand-in
backend of ``stub_backend`` (its docstring says why it stands in): ``--max-sessions`` holds while
creates and deletes race from many threads, and recovery at start finds a dead server's sandboxes by
their labels -- only those of its own database whose starter is not alive."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Iterator

import openai
import pytest
from openai import OpenAI

from controller.agents_api.server import AgentsServer, ServeOptions
from controller.agents_api.sessions import LABEL_SESSION, LABEL_STORE, HubOptions
from controller.agents_api.store import Store
from controller.sandbox import LABEL_OWNER_ID, LABEL_SANDBOX
from controller.sandbox import registry
from controller.sandbox.owner import owner_id, owner_state

from .conftest import ROOT
from .stub_backend import StubSandbox

TASKS = ROOT / "tasks"
CREATE = {"agent": {"model": f"offline:{TASKS / 'pickup.toml'}"},
          "environment": {"type": "openai_hosted", "desktop": {"enabled": True}}}


@pytest.fixture
def stub_backend(monkeypatch: pytest.MonkeyPatch) -> Iterator[type[StubSandbox]]:
    """The stand-in registered as backend ``stub`` for one test."""
    monkeypatch.setitem(registry._ENTRIES, "stub", ("tests.agents_api.stub_backend", "StubSandbox"))
    StubSandbox.reset()
    yield StubSandbox
    StubSandbox.reset()


def serve_stub(runs: Path, max_sessions: int = 8) -> AgentsServer:
    return AgentsServer(ServeOptions(hub=HubOptions(runs_dir=runs, backend="stub", max_sessions=max_sessions,
                                                    tasks_dir=TASKS)))


def client(server: AgentsServer) -> OpenAI:
    return OpenAI(base_url=server.url, api_key=server.key, max_retries=0)


def wait_ready(c: OpenAI, session_id: str) -> None:
    with c.beta.agents.sessions.events.stream(session_id, extra_headers={"Last-Event-ID": "0"}) as events:
        for event in events:
            assert event.type != "agent.session.failed", event
            if event.type == "agent.session.environment.ready":
                return
    raise AssertionError("the stream ended before the sandbox was ready")


def wait_until(condition, timeout: float = 30.0) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)  # poll interval of a bounded condition wait


def test_max_sessions_holds_while_creates_and_deletes_race_from_many_threads(tmp_path, stub_backend):
    """Threads create sessions over and over, each create followed at once by its delete on another
    thread, while every start is still under way (the stand-in's starts wait for the gate): a deleted
    session keeps its place until its start has finished and its sandbox is closed, so never more
    than max_sessions sandboxes exist; a create past them is the documented 429."""
    stub_backend.reset(gate_open=False)
    with serve_stub(tmp_path / "runs", max_sessions=2) as server:
        c = client(server)
        created: list[str] = []
        refused: list[openai.RateLimitError] = []
        errors: list[BaseException] = []
        deleters: list[threading.Thread] = []

        def delete(session_id: str) -> None:
            try:
                assert c.beta.agents.sessions.delete(session_id).deleted
            except BaseException as exc:  # noqa: BLE001 - reported by the test below
                errors.append(exc)

        def create_then_delete() -> None:
            for _round in range(3):
                try:
                    session = c.beta.agents.sessions.create(**CREATE)
                except openai.RateLimitError as exc:
                    refused.append(exc)
                    continue
                except BaseException as exc:  # noqa: BLE001
                    errors.append(exc)
                    return
                created.append(session.id)
                deleter = threading.Thread(target=delete, args=(session.id,))
                deleters.append(deleter)
                deleter.start()
                try:  # the delete was taken (its start may still be under way): the next create races it
                    wait_until(lambda: server.hub.get(session.id) is None)
                except BaseException as exc:  # noqa: BLE001
                    errors.append(exc)
                    return

        workers = [threading.Thread(target=create_then_delete) for _ in range(4)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(60)
        assert not any(w.is_alive() for w in workers)
        stub_backend.gate.set()  # every create has its answer: the starts may end now
        for deleter in list(deleters):
            deleter.join(60)
        assert not errors, errors
        assert stub_backend.most <= 2, f"{stub_backend.most} sandboxes at once with --max-sessions 2"
        assert len(created) + len(refused) == 12 and created and refused
        for exc in refused:
            assert exc.status_code == 429
            assert exc.body["code"] == "too_many_sessions" and exc.body["type"] == "rate_limit_error", exc.body
            assert "--max-sessions" in exc.body["message"]
        assert stub_backend.running == {} and server.hub.holding == set()

        again = [c.beta.agents.sessions.create(**CREATE) for _ in range(2)]  # every place is free again
        for session in again:
            wait_ready(c, session.id)
        with pytest.raises(openai.RateLimitError):
            c.beta.agents.sessions.create(**CREATE)
        for session in again:
            c.beta.agents.sessions.delete(session.id)
        assert stub_backend.running == {} and stub_backend.most <= 2


def dead_owner_id() -> str:
    """The owner id of a process of this host that has exited."""
    done = subprocess.run([sys.executable, "-c", "from controller.sandbox.owner import owner_id; print(owner_id())"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60, check=True)
    dead = done.stdout.strip()
    assert owner_state(dead)[0] == "dead", dead
    return dead


def test_recovery_removes_by_label_what_a_dead_server_on_this_database_left_and_nothing_else(tmp_path, stub_backend):
    """A session whose start never returned (no sandbox id stored) still has its sandbox removed at the
    next start, found by its labels; a sandbox of another database, of a starter still alive (a
    server on a copy of the database) or of no session stays, as does a live server's on another
    runs folder."""
    runs = tmp_path / "runs"
    runs.mkdir()
    store = Store(runs / "agents.db")
    data = {"id": "sess_dead", "created_at": 1, "agent": {"model": "offline:tasks/pickup.toml"},
            "environment": {"type": "openai_hosted"}, "metadata": {}}
    store.add_session("sess_dead", data, owner="elsewhere:4242:0123456789abcdef", backend="stub")
    ours = store.store_id
    store.close()
    dead = dead_owner_id()
    planted = {
        "dx-left": {LABEL_SESSION: "sess_dead", LABEL_STORE: ours, LABEL_OWNER_ID: dead},
        "dx-older": {LABEL_SESSION: "sess_dead", LABEL_OWNER_ID: dead},  # started before the store label
        "dx-otherdb": {LABEL_SESSION: "sess_dead", LABEL_STORE: "0123456789abcdef", LABEL_OWNER_ID: dead},
        "dx-unknown": {LABEL_SESSION: "sess_elsewhere", LABEL_OWNER_ID: dead},
        "dx-copy": {LABEL_SESSION: "sess_dead", LABEL_STORE: ours, LABEL_OWNER_ID: owner_id()},
        "dx-plain": {LABEL_OWNER_ID: dead},
    }
    for sandbox_id, labels in planted.items():
        stub_backend.add(sandbox_id, {LABEL_SANDBOX: sandbox_id, **labels})
    with serve_stub(tmp_path / "other-runs") as other:
        live = client(other).beta.agents.sessions.create(**CREATE)
        wait_ready(client(other), live.id)
        [live_sandbox] = [k for k, v in stub_backend.running.items() if v.get(LABEL_SESSION) == live.id]
        with serve_stub(runs) as server:
            assert sorted(server.recovered) == ["dx-left", "dx-older"]
            assert set(stub_backend.running) == set(planted) - {"dx-left", "dx-older"} | {live_sandbox}
            listed = client(server).beta.agents.sessions.retrieve("sess_dead")
            assert listed.status == "failed" and "stopped" in listed.error
        assert live_sandbox in stub_backend.running  # the other server's session still has its sandbox
        client(other).beta.agents.sessions.delete(live.id)
    assert live_sandbox not in stub_backend.running


@pytest.mark.parametrize("name", registry.backend_names())
def test_every_backend_labels_a_sessions_sandbox_so_recovery_can_find_it(name):
    """The labels a session sets on its backend's options reach every part of the sandbox, on each
    registered backend (what recovery by label relies on)."""
    from controller.sandbox.backend_setup import sandbox_labels

    options = registry.get_backend(name).make_options(image=None)
    options.extra_labels = {**options.extra_labels, LABEL_SESSION: "sess_x", LABEL_STORE: "0123456789abcdef"}
    labels = sandbox_labels("dx-00000000", None, options, {})
    assert labels[LABEL_SESSION] == "sess_x" and labels[LABEL_STORE] == "0123456789abcdef"
