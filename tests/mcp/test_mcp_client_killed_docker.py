"""A client killed in the middle of a call: ``desktop-sandbox mcp`` over stdio sees its stdin close, withdraws
the question the call waits on, releases every key and button, finishes the run record and removes the
sandbox, then ends. The client (tests/mcp/_killed_client.py) is a process of its own, killed with SIGKILL
while the server waits for its answer to an elicitation about a click."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

from controller.sandbox import LABEL_OWNER, LABEL_ROLE, LABEL_SANDBOX
from tests.mcp._client import (ROOT, SANDBOX_LINE, read_record, sandbox_containers, server_env, wait_for)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_killed_client_leaves_no_sandbox_and_no_key_or_button_held(docker_client, desktop_image, tmp_path):
    runs = tmp_path / "runs"
    client = subprocess.Popen(
        [sys.executable, "-m", "tests.mcp._killed_client", "--confirm-actions", "click", "--runs-dir", str(runs),
         "--image", desktop_image], cwd=ROOT, env=server_env(), text=True, stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    out: list[str] = []
    err: list[str] = []
    log: list[str] = []
    readers = [threading.Thread(target=lambda p=p, sink=s: sink.extend(line.rstrip("\n") for line in p), daemon=True)
               for p, s in ((client.stdout, out), (client.stderr, err))]
    for reader in readers:
        reader.start()
    try:
        found = wait_for(lambda: next((m for m in map(SANDBOX_LINE.search, list(err)) if m), None)
                         or (client.poll() is not None and "ended"), "the session's sandbox")
        assert found != "ended", "\n".join(err[-40:])
        sandbox = found.group(1)
        desktop = docker_client.containers.list(filters={"label": [f"{LABEL_SANDBOX}={sandbox}",
                                                                   f"{LABEL_ROLE}=desktop"]})[0]
        server_pid = int(desktop.labels[LABEL_OWNER].rsplit(":", 1)[1])

        def follow() -> None:  # the agent's access log, read while the desktop runs
            try:
                for chunk in docker_client.api.logs(desktop.id, stream=True, follow=True, stdout=True, stderr=True):
                    log.extend(chunk.decode("utf-8", "replace").splitlines())
            except Exception:  # noqa: BLE001 - the container is removed at the end
                pass

        threading.Thread(target=follow, daemon=True).start()
        wait_for(lambda: "ASKED" in out or client.poll() is not None, "the elicitation about the click")
        assert "ASKED" in out and "MOVED False" in out, (out, "\n".join(err[-40:]))
        client.send_signal(signal.SIGKILL)
        client.wait(30)

        wait_for(lambda: not sandbox_containers(docker_client, sandbox), "the sandbox's removal")
        wait_for(lambda: not _alive(server_pid), "the server's end")
    finally:
        if client.poll() is None:
            client.kill()
            client.wait(30)
    access = [line for line in log if "guest.access" in line]
    actions = [i for i, line in enumerate(access) if '"POST /v1/actions' in line]
    releases = [i for i, line in enumerate(access) if '"POST /v1/release" 200' in line]
    assert actions and releases and releases[-1] > actions[-1], "\n".join(access[-20:])
    entries = read_record(runs)
    kinds = [e["type"] for e in entries]
    assert kinds[0] == "run_started" and kinds.count("run_finished") == 1 and kinds[-1] == "run_finished", kinds
    assert entries[-1]["status"] == "cancelled" and "session ended" in entries[-1]["reason"], entries[-1]
    clicks = [e for e in entries if e["type"] == "action" and e["action"] == "click"]
    assert clicks and all(e["error"] is not None for e in clicks)  # the click never ran
    assert not any(Path(p).name.endswith(".key") for p in os.listdir(tmp_path))
