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


ONE_WORKER = ("tests/vm/", "tests/browser_conformance/")
"""Folders whose tests share one session's state, each run on one worker: the VM tier shares one
booted VM (tests/vm/conftest.py); the browser suite's coverage test reads what its other modules
exercised (tests/browser_conformance/conftest.py)."""


SLOW_FIRST = ("tests/vm/", "tests/docker/", "tests/audit/", "tests/console/", "tests/suite/", "tests/agents_api/",
              "tests/mcp/", "tests/python_api/", "tests/agents_sdk/", "tests/loop/", "tests/af/", "tests/video/")
"""The folders whose modules start sandboxes, the longest first: run before the rest, so that on
several workers the quick modules fill in at the end (tests/vm first: one worker runs all of it)."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        return next((n for n, folder in enumerate(SLOW_FIRST) if item.nodeid.startswith(folder)), len(SLOW_FIRST))

    items.sort(key=rank)  # stable: a module's own order is kept


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):  # noqa: ANN001, ANN201 - xdist's types
    """Under ``pytest -n N`` (``make test``): a module's tests stay on one worker (they share its
    module-scoped sandbox), and each folder of :data:`ONE_WORKER` on one worker."""
    from xdist.scheduler import LoadScopeScheduling

    class ModuleScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return next((folder for folder in ONE_WORKER if nodeid.startswith(folder)), nodeid.split("::", 1)[0])

    return ModuleScheduling(config, log)


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
