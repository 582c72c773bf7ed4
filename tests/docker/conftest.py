"""Fixtures for tests against real containers of the guest image.

Every test here that needs the engine is marked ``docker``. Without a Docker engine or without the image they are skipped with
the reason, unless ``DESKTOP_SANDBOX_REQUIRE_IMAGE=1`` (CI), where that is a failure. The image is
``$DESKTOP_SANDBOX_IMAGE`` (default ``desktop-sandbox:latest``, built by ``make desktop``).

Sandboxes started here carry the project's labels plus ``desktop-sandbox.test=<session id>`` and are
removed at the end; start-to-ready times are printed in the terminal summary.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from tests.helpers import timings_section
from tests.require import unavailable

from ._cli_run import cli_run  # noqa: F401 - fixture, for test_signal_sweep and test_teardown
from ._conformance import CONFORMANCE_APPS

IMAGE = os.environ.get("DESKTOP_SANDBOX_IMAGE", "desktop-sandbox:latest")
TEST_LABEL = "desktop-sandbox.test"
SESSION_ID = secrets.token_hex(4)

_ready_times: list[tuple[str, dict[str, float]]] = []


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents and "docker_client" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.docker)


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:  # noqa: ANN001
    timings_section(terminalreporter, "desktop sandbox start-to-ready", _ready_times, lambda v: f"{v:.2f}s")


def record_ready(what: str, timings: dict[str, float]) -> None:
    """Remember a sandbox's start timings for the terminal summary."""
    _ready_times.append((what, dict(timings)))


def _unavailable(reason: str) -> None:
    unavailable("IMAGE", reason)


@pytest.fixture(scope="session")
def docker_client():
    """A docker SDK client to the local engine."""
    try:
        import docker

        client = docker.from_env()
        client.ping()
    except Exception as exc:  # noqa: BLE001 - any failure means: no engine here
        _unavailable(f"no Docker engine: {exc}")
    return client


@pytest.fixture(scope="session")
def desktop_image(docker_client) -> str:
    """The guest image tag; skips (or fails under DESKTOP_SANDBOX_REQUIRE_IMAGE=1) when it is missing."""
    import docker.errors

    try:
        docker_client.images.get(IMAGE)
    except docker.errors.ImageNotFound:
        _unavailable(f"image {IMAGE} missing: build it with `make desktop`")
    return IMAGE


@pytest.fixture(scope="session")
def test_labels() -> dict[str, str]:
    """Labels marking everything this test session starts."""
    return {TEST_LABEL: SESSION_ID}


@pytest.fixture(scope="module")
def sandbox(docker_client, desktop_image, test_labels) -> Iterator["object"]:
    """A ready sandbox (deny-all policy, 1280x800, conformance app allowlist), shared by a module."""
    from controller.sandbox import SandboxSpec
    from controller.sandbox.docker import DockerOptions, DockerSandbox

    sb = DockerSandbox.start(
        SandboxSpec(),
        DockerOptions(image=desktop_image, apps_file=CONFORMANCE_APPS, extra_labels=test_labels),
        client=docker_client,
    )
    record_ready(f"sandbox {sb.id}", sb.timings)
    with sb:
        yield sb


@pytest.fixture
def task_sandbox(docker_client, desktop_image, test_labels) -> Iterator[Callable[[Any], Any]]:
    """``open(task)``: a fresh sandbox of the image for ``task`` (its screen and policy), labelled as this
    session's, for ``run_task``; every sandbox it opened is closed after the test."""
    from controller.sandbox.docker import DockerOptions, DockerSandbox

    started: list[Any] = []

    def open_(task: Any) -> Any:
        sb = DockerSandbox.start(task.sandbox_spec(), DockerOptions(image=desktop_image, extra_labels=test_labels),
                                 client=docker_client)
        started.append(sb)
        return sb

    yield open_
    for sb in started:
        sb.close()


@pytest.fixture(scope="session", autouse=True)
def _remove_test_leftovers() -> Iterator[None]:
    """After the session, remove anything still carrying this session's test label."""
    yield
    try:
        import docker

        client = docker.from_env()
        for c in client.containers.list(all=True, ignore_removed=True, filters={"label": f"{TEST_LABEL}={SESSION_ID}"}):
            c.remove(force=True)
        for n in client.networks.list(filters={"label": f"{TEST_LABEL}={SESSION_ID}"}):
            n.remove()
    except Exception:  # noqa: BLE001 - best effort
        pass
