"""A killed server and the next start: ``desktop-sandbox serve`` as its own process, killed with SIGKILL
while one session's sandbox runs and another's is still starting; the next ``serve`` on the same runs
folder lists both sessions as ``failed``, replays their events (``agent.session.failed`` last) and has
removed both sandboxes, containers and networks (the starting one found by its labels: its start never
returned an id)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from openai import OpenAI

from controller.agents_api.sessions import LABEL_SESSION

from .conftest import ROOT, session_containers

pytestmark = [pytest.mark.docker, pytest.mark.slow]


def serve(runs: Path, image: str) -> tuple[subprocess.Popen, OpenAI]:
    """``desktop-sandbox serve`` in its own process; returns it and a client, once it accepts requests."""
    proc = subprocess.Popen([sys.executable, "-m", "controller.cli", "serve", "--runs-dir", str(runs), "--image", image],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "COLUMNS": "200"})
    line = proc.stderr.readline()
    match = re.fullmatch(r"agents-api: (\S+) key-file: (.+)\n", line)
    assert match, line
    return proc, OpenAI(base_url=match.group(1), api_key=Path(match.group(2)).read_text().strip(), max_retries=0)


def session_networks(docker_client, session_id: str) -> list:  # noqa: ANN001
    return docker_client.networks.list(filters={"label": f"{LABEL_SESSION}={session_id}"})


def wait_for(condition, timeout: float, what: str) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)  # poll interval of a bounded condition wait


def test_a_killed_servers_sessions_are_failed_after_the_next_start_and_their_sandboxes_gone(
        tmp_path, desktop_image, docker_client):
    runs = tmp_path / "runs"
    first, c = serve(runs, desktop_image)
    second = None
    session_id = starting_id = None
    try:
        session = c.beta.agents.sessions.create(
            agent={"model": "offline:tasks/pickup.toml"},
            environment={"type": "openai_hosted", "desktop": {"enabled": True}})
        session_id = session.id
        before = []
        with c.beta.agents.sessions.events.stream(session.id, extra_headers={"Last-Event-ID": "0"}) as events:
            for event in events:
                before.append(event.event_id)
                if event.type == "agent.session.environment.ready":
                    break
        assert len(session_containers(docker_client, session.id)) >= 2
        starting = c.beta.agents.sessions.create(
            agent={"model": "offline:tasks/pickup.toml"},
            environment={"type": "openai_hosted", "desktop": {"enabled": True}})
        starting_id = starting.id

        def desktop_running() -> bool:  # the last part a start makes; readiness is still being waited for
            return any(container.name.endswith("-desktop") and container.status == "running"
                       for container in session_containers(docker_client, starting.id))

        wait_for(desktop_running, 120, "the second session's desktop container never ran")
        first.send_signal(signal.SIGKILL)
        first.wait(30)
        for sid in (session.id, starting.id):  # nothing removed them: the server died
            assert len(session_containers(docker_client, sid)) >= 2 and session_networks(docker_client, sid)
        with contextlib.closing(sqlite3.connect(f"file:{runs / 'agents.db'}?mode=ro", uri=True)) as db:
            stored = dict(db.execute("SELECT id, sandbox_id FROM sessions").fetchall())
        assert stored[session.id] and not stored[starting.id]  # the second start never returned its id

        second, c = serve(runs, desktop_image)
        wait_for(lambda: not any(session_containers(docker_client, sid) or session_networks(docker_client, sid)
                                 for sid in (session.id, starting.id)),
                 30, "the killed server's containers or networks are still there")
        listed = c.beta.agents.sessions.list(order="asc").data
        assert [s.id for s in listed] == [session.id, starting.id]
        assert all(s.status == "failed" and "stopped" in s.error for s in listed), listed
        assert c.beta.agents.sessions.retrieve(session.id).status == "failed"
        with c.beta.agents.sessions.events.stream(session.id, extra_headers={"Last-Event-ID": "0"}) as events:
            replayed = list(events)  # the stream of a failed session ends after its last event
        assert [e.event_id for e in replayed][:len(before)] == before
        assert replayed[-1].type == "agent.session.failed" and replayed[-1].session.status == "failed"
        with c.beta.agents.sessions.events.stream(session.id, extra_headers={"Last-Event-ID": before[-1]}) as events:
            assert [e.type for e in events] == ["agent.session.failed"]
        assert c.beta.agents.sessions.delete(session.id).deleted
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(60)
                except subprocess.TimeoutExpired:
                    proc.kill()
        for sid in (session_id, starting_id):
            if sid is not None:
                for container in session_containers(docker_client, sid):
                    container.remove(force=True)
                for network in session_networks(docker_client, sid):
                    network.remove()
