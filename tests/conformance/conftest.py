"""Fixtures for the conformance suite: the desktop (Xvfb + agent + probe/xterm) and the targets.

Targets are parametrised: by default the guest agent over HTTP; ``--conformance-target
module:factory`` (repeatable) adds targets built by ``factory(desktop)``.
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

from .fixtures import probe, sink  # noqa: F401 - per-module fixtures, shared with tests/docker, tests/vm
from .harness import AgentDesktop, AgentTarget

#: Longest ``wait`` of the agent under test (seconds); short so the cap test stays quick.
WAIT_CAP_S = 3.0


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
    module, _, attr = spec.partition(":")
    return getattr(importlib.import_module(module), attr)


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


@pytest.fixture(scope="session")
def desktop(agent, workdir, xvfb) -> Iterator[AgentDesktop]:
    client = AgentClient(agent.base_url, agent.token, timeout=60)
    d = AgentDesktop(client, workdir, display=xvfb.display)
    yield d
    d.close()
    client.close()


@pytest.fixture(scope="session")
def target(target_factory, desktop):
    return target_factory(desktop)


@pytest.fixture(autouse=True)
def _nothing_left_pressed(desktop) -> Iterator[None]:
    """After every test, the server reports no key and no button down."""
    yield
    state = desktop.pressed()
    if state is not None:
        keys, buttons = state
        assert keys == [] and buttons == 0, f"left pressed: keycodes {keys}, button mask {buttons:#x}"
