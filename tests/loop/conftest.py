"""Fixtures for loop tests: the real SDK loop against the scripted server on loopback, driving a
real agent on a private Xvfb, observed by the probe window (what real X clients received)."""

from __future__ import annotations

import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from controller.agent_client import AgentClient
from controller.run.driver import SandboxDriver, ScreenshotPolicy
from controller.run.model_client import UsageMeter
from controller.offline.scripted_server import ScriptedModel, ScriptedServer
from guest.localrun import AgentProcess, Xvfb
from tests.conformance.harness import AgentDesktop, Probe
from tests.scripted import client as scripted_client


class Desk:
    """A private desktop: Xvfb, agent (probe + terminal allowlisted), the probe window."""

    def __init__(self, width: int, height: int) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="ds-loop-")
        self.workdir = self._tmp.name
        self.xvfb = Xvfb(width, height).start()
        self.agent_proc = AgentProcess(
            self.xvfb.display,
            apps={"probe": [sys.executable, "-m", "guest", "probe"], "terminal": ["xterm"]},
            files_roots=[self.workdir], extra_args=["--wait-cap", "2"],
        ).start()
        self.client = AgentClient(self.agent_proc.base_url, self.agent_proc.token, timeout=30)
        self.desktop = AgentDesktop(self.client, self.workdir, display=self.xvfb.display)
        self.probe: Probe = self.desktop.start_probe()

    def input_events(self, mark: int) -> list[dict[str, Any]]:
        return self.probe.input_events(mark)

    def settle(self, mark: int) -> list[dict[str, Any]]:
        """Send a sentinel move straight to the agent and return the input events before it."""
        w, h = self.xvfb.width, self.xvfb.height
        sx, sy = w - 3, h - 2
        self.client.actions([{"type": "move", "x": sx, "y": sy}])
        events = self.probe.wait_for(
            lambda ev: any(e["type"] == "MotionNotify" and (e["x"], e["y"]) == (sx, sy) for e in ev), mark)
        kinds = {"KeyPress", "KeyRelease", "ButtonPress", "ButtonRelease", "MotionNotify"}
        out = [e for e in events if e["type"] in kinds]
        last = max(i for i, e in enumerate(out) if e["type"] == "MotionNotify" and (e["x"], e["y"]) == (sx, sy))
        return out[:last]

    def close(self) -> None:
        self.probe.stop()
        self.desktop.close()
        self.client.close()
        self.agent_proc.stop()
        self.xvfb.stop()
        self._tmp.cleanup()



def interrupt_after_first_action(proc: subprocess.Popen, runs: Path, timeout: float = 60) -> tuple[str, str]:
    """Send SIGINT to ``proc`` once a run record under ``runs`` holds an ``action``; return its output.

    Fails the test when no action is recorded within ``timeout`` seconds; the process is always reaped.
    """
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            records = list(runs.glob("*/record.jsonl"))
            if records and '"type": "action"' in records[0].read_text():
                break
            time.sleep(0.05)
        else:
            pytest.fail("the run never got to an action")
        proc.send_signal(signal.SIGINT)
        return proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

@pytest.fixture(scope="module")
def desk() -> Iterator[Desk]:
    d = Desk(1280, 800)
    yield d
    d.close()


@pytest.fixture
def driver(desk: Desk) -> SandboxDriver:
    return SandboxDriver(desk.client, ScreenshotPolicy(max_width=1280, max_height=800))


@pytest.fixture
def scripted() -> Iterator[Any]:
    """Factory ``scripted(turns) -> (ScriptedServer, openai.OpenAI, UsageMeter)``; servers stopped after."""
    servers: list[ScriptedServer] = []
    clients: list[Any] = []

    def make(turns: list[dict[str, Any]]):
        server = ScriptedServer(ScriptedModel(turns)).start()
        servers.append(server)
        meter = UsageMeter()
        client = scripted_client(server, meter)
        clients.append(client)
        return server, client, meter

    yield make
    for client in clients:
        client.close()
    for server in servers:
        server.stop()
