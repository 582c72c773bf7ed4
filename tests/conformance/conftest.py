"""Fixtures for the conformance suite: the desktop (Xvfb + agent + probe/xterm) and the targets.

Targets are parametrised: by default the guest agent over HTTP; ``--conformance-target
module:factory`` (repeatable) adds targets built by ``factory(desktop)``. The desktop is a private
Xvfb with the agent on it, or what ``--conformance-desktop module:factory`` yields (a sandbox's guest,
observed through its agent).
"""

from __future__ import annotations

import importlib
import os
import sys
import tempfile
from collections.abc import Iterator

import pytest

from controller.agent_client import AgentClient
from guest.localrun import AgentProcess

from .fixtures import _nothing_left_pressed, probe, sink  # noqa: F401 - shared with tests/docker, tests/vm
from .harness import AgentDesktop, AgentTarget

#: Longest ``wait`` of the agent under test (seconds); short so the cap test stays quick.
WAIT_CAP_S = 3.0
#: How long the screen must stay unchanged for a ``wait`` to settle (seconds): the agent's default
#: ``--wait-quiet``, which every agent this suite runs against keeps.
WAIT_QUIET_S = 0.1


def make_agent_target(desktop: AgentDesktop) -> AgentTarget:
    """The default target: the agent that also serves the desktop, over HTTP on loopback."""
    return AgentTarget(desktop.client)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "target_factory" in metafunc.fixturenames:
        specs = metafunc.config.getoption("--conformance-target") or ["agent-http"]
        metafunc.parametrize("target_factory", specs, indirect=True, scope="session")


@pytest.fixture(scope="session")
def target_factory(request: pytest.FixtureRequest):
    spec = request.param
    if spec == "agent-http":
        return make_agent_target
    return load_factory(spec)


@pytest.fixture(scope="session")
def workdir() -> Iterator[str]:
    with tempfile.TemporaryDirectory(prefix="ds-conformance-") as d:
        yield d


@pytest.fixture(scope="session")
def agent(xvfb, workdir) -> Iterator[AgentProcess]:
    env = dict(os.environ, LC_ALL="C.UTF-8", LANG="C.UTF-8")
    proc = AgentProcess(
        xvfb.display,
        apps={"probe": [sys.executable, "-m", "guest", "probe"], "terminal": ["xterm"]},
        files_roots=[workdir],
        extra_args=["--wait-cap", str(WAIT_CAP_S), "--busy-timeout", "1"],
        env=env,
    ).start()
    yield proc
    proc.stop()


def load_factory(spec: str):
    """The object named by ``module:attribute`` (``--conformance-target``, ``--conformance-desktop``)."""
    module, _, attr = spec.partition(":")
    return getattr(importlib.import_module(module), attr)


@pytest.fixture(scope="session")
def desktop(request: pytest.FixtureRequest) -> Iterator[AgentDesktop]:
    """The desktop the suite observes: ``--conformance-desktop``'s factory (a generator function
    yielding an ``AgentDesktop``, e.g. ``tests.docker._conformance:conformance_desktop`` for the
    agent in a Docker sandbox), or a private Xvfb with the guest agent on it."""
    spec = request.config.getoption("--conformance-desktop")
    if spec:
        yield from load_factory(spec)()
        return
    agent, workdir, xvfb = (request.getfixturevalue(name) for name in ("agent", "workdir", "xvfb"))
    client = AgentClient(agent.base_url, agent.token, timeout=60)
    d = AgentDesktop(client, workdir, display=xvfb.display)
    yield d
    d.close()
    client.close()


@pytest.fixture(scope="session")
def target(target_factory, desktop):
    return target_factory(desktop)
