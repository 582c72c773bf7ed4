"""The arm64 tier: the guest built for arm64 and run under emulation on this (x86-64) host.

Opt-in: every test here that runs the guest is marked ``arm64`` and skipped unless ``DESKTOP_SANDBOX_ARM64=1`` (``make
test-arm64`` sets it after building ``desktop-sandbox:latest-arm64``), so the everyday ``make test`` is
not slowed by emulation. Opted in, a missing image or VM disk is a failure, not a skip.

Sandboxes started here carry ``desktop-sandbox.test=<session id>`` and are removed at the end; the
figures of each start and run (seconds) are printed in the terminal summary, for README.md's table.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

import pytest

OPT_IN = "DESKTOP_SANDBOX_ARM64"
IMAGE = os.environ.get("DESKTOP_SANDBOX_ARM64_IMAGE", "desktop-sandbox:latest-arm64")
TEST_LABEL = "desktop-sandbox.test"
SESSION_ID = secrets.token_hex(4)

EMULATED_FIXTURES = {"docker_client", "arm64_image", "arm64_vm_image"}
"""A test using one of these runs the arm64 guest: it is in the tier (marked, opt-in)."""

_figures: list[tuple[str, dict[str, float]]] = []


def opted_in() -> bool:
    """Whether the arm64 tier runs (``DESKTOP_SANDBOX_ARM64=1``)."""
    return os.environ.get(OPT_IN) == "1"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    skip = pytest.mark.skip(reason=f"arm64 tier (emulated, slow): opt in with `make test-arm64` ({OPT_IN}=1)")
    for item in items:
        # The helpers' unit tests (no fixture of this tier) run every day; what runs the guest is the tier.
        if here in Path(str(item.fspath)).parents and EMULATED_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.arm64)
            if not opted_in():
                item.add_marker(skip)


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:  # noqa: ANN001
    if not _figures:
        return
    terminalreporter.section("arm64 under emulation: figures")
    for what, figures in _figures:
        terminalreporter.write_line(f"{what}: " + ", ".join(f"{k} {v:.1f}s" if isinstance(v, float) else f"{k} {v}"
                                                            for k, v in figures.items()))


def record(what: str, figures: dict) -> None:
    """Remember figures (seconds, counts) of a start or a run for the terminal summary."""
    _figures.append((what, dict(figures)))


@pytest.fixture(scope="session")
def docker_client():
    """A docker SDK client to the local engine (a failure when there is none: the tier was asked for)."""
    import docker

    client = docker.from_env()
    client.ping()
    return client


@pytest.fixture(scope="session")
def arm64_image(docker_client) -> str:
    """The arm64 guest image tag; a failure when it is missing or not arm64."""
    import docker.errors

    try:
        image = docker_client.images.get(IMAGE)
    except docker.errors.ImageNotFound:
        pytest.fail(f"image {IMAGE} missing: build it with `make desktop ARCH=arm64`")
    assert image.attrs.get("Architecture") == "arm64", image.attrs.get("Architecture")
    return IMAGE


@pytest.fixture(scope="session")
def test_labels() -> dict[str, str]:
    """Labels every sandbox of this session carries (removed by the session's teardown)."""
    return {TEST_LABEL: SESSION_ID}


@pytest.fixture(scope="session", autouse=True)
def _remove_leftovers():
    """After the session: remove any sandbox this session's tests started and left (none, normally)."""
    yield
    if not opted_in():
        return
    from controller.sandbox.docker import DockerSandbox

    DockerSandbox.remove_all({TEST_LABEL: SESSION_ID})
