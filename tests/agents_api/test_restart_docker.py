"""A killed server and the next start: ``desktop-sandbox serve`` as its own process, killed with SIGKILL
while its session's sandbox runs; the next ``serve`` on the same runs folder lists the session as
``failed``, replays its events (``agent.session.failed`` last) and has removed the sandbox."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from openai import OpenAI

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


def test_a_killed_servers_session_is_failed_after_the_next_start_and_its_sandbox_gone(tmp_path, desktop_image,
                                                                                       docker_client):
    runs = tmp_path / "runs"
    first, c = serve(runs, desktop_image)
    second = None
    session_id = None
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
        first.send_signal(signal.SIGKILL)
        first.wait(30)
        assert len(session_containers(docker_client, session.id)) >= 2  # nothing removed them: the server died

        second, c = serve(runs, desktop_image)
        assert session_containers(docker_client, session.id) == []
        [listed] = c.beta.agents.sessions.list().data
        assert listed.id == session.id and listed.status == "failed" and "stopped" in listed.error
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
        if session_id is not None:
            for container in session_containers(docker_client, session_id):
                container.remove(force=True)
