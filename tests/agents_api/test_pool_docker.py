"""``serve --pool``: a session's sandbox is claimed from the server's warm pool (its record says so), the
turn runs as on a cold start, deleting the session removes the sandbox, and the server stopping removes
the pool's own."""

from __future__ import annotations

import time

import pytest
from openai import OpenAI

from controller.agents_api.server import AgentsServer, ServeOptions
from controller.agents_api.sessions import HubOptions
from controller.run.record import read_entries
from controller.sandbox import LABEL_SANDBOX

from .test_sessions_docker import ENDS, create_args, message

pytestmark = [pytest.mark.docker, pytest.mark.slow]


def test_a_session_claims_from_the_servers_pool(tmp_path, desktop_image, docker_client, test_labels):
    server = AgentsServer(ServeOptions(hub=HubOptions(runs_dir=tmp_path / "runs", image=desktop_image,
                                                      extra_labels=dict(test_labels), pool=1))).start()
    pooled: list[str] = []
    try:
        assert server.hub.pool.wait_ready(1, timeout=240)
        pooled = [sb.id for q in server.hub.pool._ready.values() for sb in q]
        c = OpenAI(base_url=server.url, api_key=server.key, max_retries=0)
        session = c.beta.agents.sessions.create(**create_args("tasks/pickup.toml"))
        with c.beta.agents.sessions.events.stream(session.id) as events:
            c.beta.agents.sessions.events.create(session.id, events=message("Book the pickup."))
            last = None
            for event in events:
                last = event
                if event.type in ENDS:
                    break
        assert last is not None and last.type == "agent.session.turn.completed", last
        current = c.beta.agents.sessions.retrieve(session.id)
        started = read_entries(current.metadata["desktop_sandbox.record"])[0]
        assert started.sandbox in pooled and started.claim["source"] == "pool"
        assert c.beta.agents.sessions.delete(session.id).deleted
        deadline = time.monotonic() + 60
        while docker_client.containers.list(all=True, filters={"label": f"{LABEL_SANDBOX}={started.sandbox}"}):
            assert time.monotonic() < deadline, "the claimed sandbox outlived its session"
            time.sleep(0.2)  # poll interval: the session's teardown removes it
    finally:
        refills = [sb.id for q in server.hub.pool._ready.values() for sb in q] if server.hub.pool else []
        server.stop()
    for sandbox_id in {*pooled, *refills}:
        assert docker_client.containers.list(all=True, filters={"label": f"{LABEL_SANDBOX}={sandbox_id}"}) == []
