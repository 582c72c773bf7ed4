"""A sandbox made of local processes, for loop tests without Docker.

Private Xvfb (``-displayfd``), optionally openbox and the pickup demo app, and the real agent
(``python -m guest serve``) on a free loopback port, with a private HOME as the files root. It offers
the part of ``controller.sandbox.Sandbox`` the runner uses (``agent``, ``id``, ``image_id``,
``decision_log``, ``close``). No isolation: it is for tests and script crafting only.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from controller.agent_client import AgentClient
from guest.localrun import AgentProcess, Xvfb, free_port, terminate

REPO = Path(__file__).resolve().parents[2]


class LocalSandbox:
    """Local desktop: Xvfb + (openbox) + (pickup app) + agent. Use as a context manager."""

    def __init__(self, width: int = 1280, height: int = 800, *, openbox: bool = False, pickup: bool = False,
                 apps: dict[str, list[str]] | None = None) -> None:
        self.width, self.height = width, height
        self.want_openbox, self.want_pickup = openbox, pickup
        self.apps = apps if apps is not None else {
            "browser": ["firefox-esr", "--no-remote"],
            "terminal": ["xterm"],
            "probe": [sys.executable, "-m", "guest", "probe", "--log"],
        }
        self._tmp = tempfile.TemporaryDirectory(prefix="ds-local-")
        self.home = Path(self._tmp.name) / "home"
        self.guest_home = str(self.home)
        (self.home / "Documents").mkdir(parents=True)
        self.id = f"local-{os.getpid()}"
        self.image_id = "local"
        self.xvfb = Xvfb(width, height)
        self.procs: list[subprocess.Popen[bytes]] = []
        self.agent_proc: AgentProcess | None = None
        self.pickup_port: int | None = None
        self._agent: AgentClient | None = None

    def env(self) -> dict[str, str]:
        env = dict(os.environ, DISPLAY=self.xvfb.display, HOME=str(self.home))
        env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
        env.pop("OPENAI_API_KEY", None)
        for k in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
            env.pop(k, None)
        return env

    def start(self) -> "LocalSandbox":
        self.xvfb.start()
        env = self.env()
        log = open(Path(self._tmp.name) / "session.log", "ab")
        if self.want_openbox:
            # the guest's own configuration: the tiled browser/terminal layout the task scripts rely on
            self.procs.append(subprocess.Popen(["openbox", "--config-file", str(REPO / "images/openbox/rc.xml")],
                                               env=env, stdout=log, stderr=subprocess.STDOUT))
        if self.want_pickup:
            self.pickup_port = free_port()
            self.procs.append(subprocess.Popen(
                [sys.executable, "-m", "uvicorn", "app:app", "--host", "127.0.0.1", "--port",
                 str(self.pickup_port), "--app-dir", str(REPO / "images" / "pickup")],
                env=env, stdout=log, stderr=subprocess.STDOUT, cwd=str(REPO / "images" / "pickup")))
            self._wait_http(f"http://127.0.0.1:{self.pickup_port}/livez")
        log.close()
        # The agent, and every app it launches, starts in a long working directory outside HOME (unlike
        # the guest's): a task whose screen layout depends on the shell's working directory or on the
        # host's name (a prompt that shows them) fails here instead of on some machines only.
        workdir = Path(self._tmp.name) / ("workdir-" + "w" * 48)
        workdir.mkdir()
        self.agent_proc = AgentProcess(self.xvfb.display, apps=self.apps, files_roots=[str(self.home)],
                                       env=env, cwd=str(workdir)).start()
        return self

    @staticmethod
    def _wait_http(url: str, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(url, timeout=1):
                    return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"{url} did not answer")

    @property
    def agent(self) -> AgentClient:
        if self._agent is None:
            assert self.agent_proc is not None
            self._agent = AgentClient(self.agent_proc.base_url, self.agent_proc.token)
        return self._agent

    def decision_log(self) -> list[dict[str, Any]]:
        return []

    def close(self) -> None:
        if self._agent is not None:
            self._agent.close()
            self._agent = None
        if self.agent_proc is not None:
            self.agent_proc.stop()
            self.agent_proc = None
        for proc in reversed(self.procs):
            terminate(proc, 5)
        self.procs.clear()
        self.xvfb.stop()
        # children the agent launched (firefox, xterm) die with the X server; remove the home last
        shutil.rmtree(self._tmp.name, ignore_errors=True)
        self._tmp.cleanup()

    def __enter__(self) -> "LocalSandbox":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
