"""``desktop-sandbox`` in this process with local desktops for sandboxes: ``python -m tests.loop.cli_local
DESKTOP ARGS...`` runs the command line with ``ARGS`` (``run-task ...``, ``up --backend local ...``), every
sandbox it opens a DESKTOP instead of a container:

* ``plain``: :class:`tests.loop.local_sandbox.LocalSandbox` (private Xvfb and the real agent; apps xterm,
  firefox-esr, the probe window);
* ``ask``: the same behind the real gateway in mode ``ask`` (mitmproxy, its control API on loopback; its
  ask tier the origin of a recording server on 127.0.0.5, hold 120 s): at the model's first action the
  guest opens a connection to that origin, which the gateway holds until someone answers;
* ``chromium``: the local desktop whose one app is Debian's chromium as the agent's channel app
  (:func:`tests.helpers.chromium_desktop`).

``up --backend local`` starts a ``plain`` desktop. Everything else -- options, handlers, the run, the
record, the exit status -- is the command line's own. Used by tests/loop/test_cli_signals.py.
"""

from __future__ import annotations

import contextlib
import sys
import tempfile
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from tests.loop.local_sandbox import LocalSandbox


class _OpeningAgent:
    """The agent, with the guest opening the held connection at the model's first action (what a page
    would do when clicked)."""

    def __init__(self, agent: Any, sandbox: "AskDesktop") -> None:
        self._agent, self._sandbox = agent, sandbox

    def __getattr__(self, name: str) -> Any:
        return getattr(self._agent, name)

    def actions(self, actions: Any, *args: Any, **kwargs: Any) -> Any:
        self._sandbox.open_held(actions)
        return self._agent.actions(actions, *args, **kwargs)

    def actions_screenshot(self, actions: Any, *args: Any, **kwargs: Any) -> Any:
        self._sandbox.open_held(actions)
        return self._agent.actions_screenshot(actions, *args, **kwargs)


class AskDesktop(LocalSandbox):
    """A local desktop behind a real gateway in mode ask (its decision log, its control API)."""

    def __init__(self) -> None:
        super().__init__()
        from tests.controller.origin_gateway import start_ask_gateway

        self._gateway_dir = tempfile.TemporaryDirectory(prefix="ds-ask-")
        self.gateway = start_ask_gateway(Path(self._gateway_dir.name), ("ask",), hold_timeout_s=120.0)
        self.gateway_control_url = self.gateway.control_url
        self.gateway_control_token = self.gateway.token
        self._opened = threading.Lock()
        self._fetch: Any = None

    def open_held(self, actions: Any) -> None:
        """At the first batch of the model's actions (not the driver's own settle), the guest asks for
        the ask origin through the gateway, on a thread of its own (held)."""
        if any(a.get("type") != "wait" for a in actions) and self._opened.acquire(blocking=False):
            self._fetch = self.gateway.fetch_later(self.gateway.url("ask"))

    @property
    def agent(self) -> Any:
        return _OpeningAgent(LocalSandbox.agent.fget(self), self)

    def decision_log(self) -> list[dict[str, Any]]:
        return self.gateway.decisions()

    def close(self) -> None:
        try:
            super().close()
        finally:
            self.gateway.stop()
            self._gateway_dir.cleanup()


class ChromiumDesktop:
    """:func:`tests.helpers.chromium_desktop`'s sandbox, open until :meth:`close`."""

    def __init__(self) -> None:
        from tests.helpers import chromium_desktop

        self._stack = contextlib.ExitStack()
        self._sandbox = self._stack.enter_context(chromium_desktop())

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sandbox, name)

    def close(self) -> None:
        self._stack.close()


DESKTOPS = {"plain": lambda: LocalSandbox().start(), "ask": lambda: AskDesktop().start(),
            "chromium": ChromiumDesktop}


class LocalBackend:
    """``--backend local`` for ``up``: a ``plain`` desktop as the sandbox (the agent's URL and token, its
    id ``local-<pid>``)."""

    default_ready_timeout = 30.0

    @classmethod
    def make_options(cls, image: str | None = None, detached: bool = False) -> Any:
        return SimpleNamespace(image=image, detached=detached)

    @classmethod
    def start(cls, spec: Any, options: Any) -> Any:
        sandbox = LocalSandbox(spec.screen_width, spec.screen_height).start()
        sandbox.agent_url = sandbox.agent_proc.base_url
        sandbox.agent_token = sandbox.agent_proc.token
        sandbox.ready_seconds = None
        return sandbox


def main(argv: list[str]) -> None:
    from controller import cli
    from controller.sandbox import registry

    desktop = DESKTOPS[argv[0]]

    def local_opener(backend: str, image_tag: Any, **_: Any) -> Any:
        return lambda task: desktop()

    cli.sandbox_opener = local_opener
    registry._ENTRIES["local"] = (__name__, "LocalBackend")
    cli.app(argv[1:], prog_name="desktop-sandbox")


if __name__ == "__main__":
    main(sys.argv[1:])
