"""Fixtures of the browser driver conformance suite: the site, the targets and the session of each.

Targets are parametrised: by default :func:`tests.browser_conformance.targets.guest_driver` (this
project's ``GuestBrowserDriver`` over a local agent with Debian's chromium);
``--browser-conformance-target module:factory`` (repeatable) names others instead (the factory's shape:
tests/browser_conformance/harness.py). One driver, and so one browser, per target for the whole session;
each test starts from one tab on about:blank (:meth:`BrowserSession.reset`).

The members each target's calls exercised successfully are kept in :data:`EXERCISED`;
``test_coverage.py`` runs last (:func:`pytest_collection_modifyitems`) and checks them.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from tests import browser_site

from .harness import BrowserSession

DEFAULT_TARGET = "tests.browser_conformance.targets:guest_driver"
EXERCISED: dict[str, set[str]] = {}
"""Target spec -> the members whose calls answered ``ok`` (the suite's own set-up calls excluded)."""
SERVED: dict[str, tuple[str, ...]] = {}
"""Target spec -> the members its toolset was built with."""


def targets(config: pytest.Config) -> list[str]:
    """The target specs of this session (``--browser-conformance-target``, else the default)."""
    return list(config.getoption("--browser-conformance-target", default=None) or []) or [DEFAULT_TARGET]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "target_spec" in metafunc.fixturenames:
        metafunc.parametrize("target_spec", targets(metafunc.config), scope="session")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The coverage test after every other test (it reads what they exercised)."""
    last = [i for i in items if i.nodeid.split("::")[0].endswith("browser_conformance/test_coverage.py")]
    if last:
        items[:] = [i for i in items if i not in last] + last


def load_factory(spec: str) -> Any:
    """The object named by ``module:attribute``."""
    module, _, attr = spec.partition(":")
    return getattr(importlib.import_module(module), attr)


@dataclass(frozen=True)
class Site:
    """The suite's site (tests/browser_site.py): ``base`` ``http://127.0.0.1:PORT``, ``other`` a second
    origin ``http://127.0.0.2:PORT``."""

    base: str
    other: str


@pytest.fixture(scope="session")
def site() -> Iterator[Site]:
    base, other, stop = browser_site.serve()
    yield Site(base, other)
    stop()


@pytest.fixture(scope="session")
def session(target_spec: str, site: Site) -> Iterator[BrowserSession]:
    """The target's driver behind the SDK's toolset, for the whole session."""
    made = load_factory(target_spec)(site.base)
    generator = inspect.isgenerator(made)
    driver = next(made) if generator else made
    s = BrowserSession(driver, EXERCISED.setdefault(target_spec, set()))
    SERVED[target_spec] = s.members
    yield s
    if generator:
        try:
            next(made)
        except StopIteration:
            pass
        else:
            raise RuntimeError(f"{target_spec} yielded more than one driver")


@pytest.fixture
def browser(session: BrowserSession) -> BrowserSession:
    """The session, on one tab showing about:blank."""
    session.reset()
    return session
