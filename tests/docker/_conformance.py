"""Container-backed fixtures for running the agent conformance suite (tests/conformance) against the
agent inside the desktop container (see the ``test_conformance_*.py`` modules here).

The agent is reached through the gateway's relay (as the controller reaches it); apps (the event probe,
the xterm text sink) are started through ``POST /v1/launch`` and their logs read through
``GET /v1/files``; pressed keys and buttons are read from the guest's X server by a command run in the
guest; clients are stopped with ``kill`` run in the guest.

The Docker run of the suite goes through the adapters' path: ``--conformance-desktop`` with
:func:`conformance_desktop` (``tests/docker/test_conformance_suite.py`` runs it). Shared by ``tests/vm``
(the same observations through the VM's agent and guest commands): its ``conftest.py`` builds the
``desktop`` fixture with :func:`sandbox_desktop` and imports ``target`` from here; ``probe``, ``sink``
and the after-each-test key-state check are imported by each module, so they are per module as in the
suite itself.
"""

from __future__ import annotations

import json
from typing import Iterator

import pytest

from controller.agent_client import AgentClient
from tests.conformance.fixtures import _nothing_left_pressed, probe, sink  # noqa: F401 - imported by each test module from here
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
_PRESS_ELSEWHERE = (
    "from Xlib import X, display\n"
    "from Xlib.ext import xtest\n"
    "d = display.Display(':99')\n"
    "k = d.keysym_to_keycode(0xFFE1)\n"
    "xtest.fake_input(d, X.KeyPress, k)\n"
    "xtest.fake_input(d, X.ButtonPress, 1)\n"
    "d.sync()\n"
    "print(k)\n"
)


class ContainerDesktop(AgentDesktop):
    """``AgentDesktop`` whose observations go through the sandbox: launch/files over the agent API,
    key state and ``kill`` through commands run in the guest as its user."""

    def __init__(self, sandbox, client: AgentClient) -> None:
        super().__init__(client, WORKDIR, display=None)
        self.sandbox = sandbox
        self.time_scale = float(getattr(sandbox, "time_scale", 1.0) or 1.0)

    def kill(self, pid: int, timeout: float = 10.0) -> None:
        self.sandbox.exec_in_guest(["kill", str(pid)], timeout=10)
        # `kill -0` succeeds on a zombie too, so this waits until the agent has reaped the child.
        poll(lambda: not self.alive(pid), timeout * self.time_scale, interval=0.1, what=f"process {pid} to exit")

    def managed_windows(self, wm_class: str) -> int:
        from tests.conformance.harness import MANAGED_WINDOWS

        result = self.sandbox.exec_in_guest([GUEST_PYTHON, "-c", MANAGED_WINDOWS, ":99", wm_class], timeout=20)
        assert result.exit_code == 0, result.stderr.decode()
        return int(result.stdout)

    def focused_class(self) -> str | None:
        from tests.conformance.harness import FOCUSED_CLASS

        result = self.sandbox.exec_in_guest([GUEST_PYTHON, "-c", FOCUSED_CLASS, ":99"], timeout=20 * self.time_scale)
        assert result.exit_code == 0, result.stderr.decode()
        return result.stdout.decode().strip()

    def alive(self, pid: int) -> bool:
        return self.sandbox.exec_in_guest(["kill", "-0", str(pid)], timeout=10).exit_code == 0

    def press_elsewhere(self) -> int:
        result = self.sandbox.exec_in_guest([GUEST_PYTHON, "-c", _PRESS_ELSEWHERE], timeout=20)
        assert result.exit_code == 0, result.stderr.decode()
        return int(result.stdout)

    def key_state(self, **change) -> dict[str, int] | None:
        from tests.conformance.harness import KEY_STATE

        result = self.sandbox.exec_in_guest([GUEST_PYTHON, "-c", KEY_STATE, ":99", json.dumps(change)], timeout=20)
        assert result.exit_code == 0, result.stderr.decode()
        return json.loads(result.stdout)

    def pressed(self) -> tuple[list[int], int] | None:
        result = self.sandbox.exec_in_guest([GUEST_PYTHON, "-c", _PRESSED], timeout=20)
        assert result.exit_code == 0, result.stderr.decode()
        keys, buttons = json.loads(result.stdout)
        return keys, buttons


def start_conformance_sandbox(client, image: str, labels: dict[str, str]):
    """A started ``DockerSandbox`` for the conformance suite: the probe allowlisted, the short wait cap
    and busy timeout the suite's local agent has, and :data:`WORKDIR` created under the agent's file
    root. The caller closes it (``with``)."""
    from controller.sandbox import SandboxSpec
    from controller.sandbox.docker import DockerOptions, DockerSandbox

    sb = DockerSandbox.start(
        SandboxSpec(),
        DockerOptions(image=image, apps_file=CONFORMANCE_APPS, extra_labels=labels,
                      agent_args=["--wait-cap", "3", "--busy-timeout", "1"]),
        client=client,
    )
    try:
        assert sb.exec_in_guest(["mkdir", "-p", WORKDIR], timeout=10).exit_code == 0
    except BaseException:
        sb.close()
        raise
    return sb


def conformance_desktop() -> Iterator[ContainerDesktop]:
    """``--conformance-desktop`` factory: the suite observes the agent in a fresh Docker sandbox.

    ``python -m pytest tests/conformance --conformance-desktop=tests.docker._conformance:conformance_desktop``
    runs the whole suite there, the way an adapter runs it (docs/adapting.md).
    The image is ``$DESKTOP_SANDBOX_IMAGE`` (default ``desktop-sandbox:latest``); extra labels for the
    sandbox come as a JSON object in ``$DESKTOP_SANDBOX_TEST_LABELS``.
    """
    import os

    import docker

    image = os.environ.get("DESKTOP_SANDBOX_IMAGE", "desktop-sandbox:latest")
    labels = json.loads(os.environ.get("DESKTOP_SANDBOX_TEST_LABELS", "{}"))
    client = docker.from_env()
    try:
        with start_conformance_sandbox(client, image, labels) as sb:
            yield from sandbox_desktop(sb, timeout=60)
    finally:
        client.close()


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
