"""Shared fixtures: a private Xvfb (free display via -displayfd), agent processes on it, and a client of a
module's ``agent``."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from guest.localrun import AgentProcess, Xvfb  # noqa: E402


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--conformance-target", action="append", default=[],
        help="module:factory building a conformance target from the desktop (repeatable); "
             "default: the guest agent over HTTP",
    )
    parser.addoption(
        "--conformance-desktop", default=None,
        help="module:factory yielding the desktop the suite observes (an AgentDesktop, see "
             "tests/conformance/harness.py), for a target whose desktop is not a local Xvfb; "
             "default: a private Xvfb with the guest agent on it",
    )
    parser.addoption(
        "--browser-conformance-target", action="append", default=[],
        help="module:factory building a browser driver from the browser suite's site base URL (returned or "
             "yielded; repeatable); default: this project's GuestBrowserDriver over a local agent with chromium",
    )


@pytest.fixture(scope="session")
def xvfb() -> Iterator[Xvfb]:
    """A 1280x800x24 Xvfb shared by the session."""
    server = Xvfb(1280, 800, 24).start()
    yield server
    server.stop()


@pytest.fixture
def client(agent: AgentProcess) -> Iterator:
    """An ``AgentClient`` (20 s timeout) of the ``agent`` fixture the test's module defines."""
    from controller.agent_client import AgentClient

    with AgentClient(agent.base_url, agent.token, timeout=20) as c:
        yield c


@pytest.fixture
def make_agent() -> Iterator:
    """Factory ``make_agent(display, **kwargs) -> AgentProcess`` (started); stopped after the test."""
    started: list[AgentProcess] = []

    def make(display: str, **kwargs) -> AgentProcess:
        agent = AgentProcess(display, **kwargs).start()
        started.append(agent)
        return agent

    yield make
    for agent in started:
        agent.stop()
