"""Container-backed fixtures for running the agent conformance suite (tests/conformance) against the
agent inside the desktop container (see the ``test_conformance_*.py`` modules here).

The agent is reached through the gateway's relay (as the controller reaches it); apps (the event probe,
the xterm text sink) are started through ``POST /v1/launch`` and their logs read through
``GET /v1/files``; pressed keys and buttons are read from the guest's X server by a command run in the
guest; clients are stopped with ``kill`` run in the guest.

Shared by ``tests/vm`` (the same observations through the VM's agent and guest commands). The
session-wide sandbox and ``desktop`` fixtures live in each ``conftest.py`` (``desktop`` through
``sandbox_desktop``), which imports ``target`` from here; ``probe``, ``sink`` and the after-each-test
key-state check are imported by each module, so they are per module as in the suite itself.
"""

from __future__ import annotations

import json
from typing import Iterator

import pytest

from controller.agent_client import AgentClient
from tests.conformance.fixtures import probe, sink  # noqa: F401 - imported by each test module from here
from tests.conformance.harness import AgentDesktop, AgentTarget, poll

WORKDIR = "/home/sandbox/conformance"
CONFORMANCE_APPS = "/opt/desktop-sandbox/src/images/apps.conformance.json"
"""The guest's app allowlist that adds the input-event probe."""
GUEST_PYTHON = "/opt/desktop-sandbox/bin/python"
_PRESSED = (
    "import json\n"
    "from Xlib import display\n"
    "from guest.held import pressed_state\n"
    "d = display.Display(':99')\n"
    "keys, buttons = pressed_state(d)\n"
    "print(json.dumps([list(keys), int(buttons)]))\n"
)


class ContainerDesktop(AgentDesktop):
    """``AgentDesktop`` whose observations go through the sandbox: launch/files over the agent API,
    key state and ``kill`` through commands run in the guest as its user."""

    def __init__(self, sandbox, client: AgentClient) -> None:
        super().__init__(client, WORKDIR, display=None)
        self.sandbox = sandbox

    def kill(self, pid: int, timeout: float = 10.0) -> None:
        self.sandbox.exec_in_guest(["kill", str(pid)], timeout=10)
        # `kill -0` succeeds on a zombie too, so this waits until the agent has reaped the child.
        poll(lambda: self.sandbox.exec_in_guest(["kill", "-0", str(pid)], timeout=10).exit_code != 0,
             timeout, interval=0.1, what=f"process {pid} to exit")

    def pressed(self) -> tuple[list[int], int] | None:
        result = self.sandbox.exec_in_guest([GUEST_PYTHON, "-c", _PRESSED], timeout=20)
        assert result.exit_code == 0, result.stderr.decode()
        keys, buttons = json.loads(result.stdout)
        return keys, buttons


def sandbox_desktop(sandbox, *, timeout: float) -> Iterator[ContainerDesktop]:
    """Body of a session ``desktop`` fixture: a ``ContainerDesktop`` on a started ``sandbox``, with its
    own ``AgentClient`` (``timeout``: seconds per request); both closed afterwards."""
    client = AgentClient(sandbox.agent_url, sandbox.agent_token, timeout=timeout)
    d = ContainerDesktop(sandbox, client)
    yield d
    d.close()
    client.close()


@pytest.fixture(scope="session")
def target(desktop) -> AgentTarget:
    """The conformance target: the agent in the guest over HTTP, the way the controller reaches it."""
    return AgentTarget(desktop.client)


@pytest.fixture(autouse=True)
def _nothing_left_pressed(desktop) -> Iterator[None]:
    """After every test, the guest's X server reports no key and no button down (within 2 s).

    Unlike the suite's bare Xvfb, the guest runs openbox, which takes a synchronous passive grab for
    click-to-focus on client windows: the server freezes pointer events until openbox allows them, so
    a release the agent has already sent (and synced) can show in the device state a moment later.
    A stuck key or button stays down and still fails.
    """
    yield
    last: list = []

    def released() -> bool:
        last[:] = [desktop.pressed()]
        return last[0] == ([], 0)

    try:
        poll(released, 2.0, interval=0.1, what="no key or button pressed")
    except AssertionError:
        keys, buttons = last[0]
        pytest.fail(f"left pressed: keycodes {keys}, button mask {buttons:#x}")
