"""The arm64 tier: the guest built for arm64 and run under emulation on this (x86-64) host.

Opt-in: every test here that runs the guest is marked ``arm64`` and skipped unless ``DESKTOP_SANDBOX_ARM64=1`` (``make
test-arm64`` sets it after building ``desktop-sandbox:latest-arm64``), so the everyday ``make test`` is
not slowed by emulation. Opted in, a missing image or VM disk is a failure, not a skip.

Sandboxes started here carry ``desktop-sandbox.test=<session id>`` and are removed at the end; the
figures of each start and run (seconds) are printed in the terminal summary, for docs/arm64.md's table.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

OPT_IN = "DESKTOP_SANDBOX_ARM64"
IMAGE = os.environ.get("DESKTOP_SANDBOX_ARM64_IMAGE", "desktop-sandbox:latest-arm64")
TEST_LABEL = "desktop-sandbox.test"
SESSION_ID = secrets.token_hex(4)

EMULATED_FIXTURES = {"docker_client", "arm64_image", "arm64_vm_image"}
"""A test using one of these runs the arm64 guest: it is in the tier (marked, opt-in)."""

REPO = Path(__file__).resolve().parents[2]
QUICK_CONFORMANCE = ["tests/conformance/test_screenshot.py", "tests/conformance/test_pointer.py",
                     "tests/conformance/test_keys.py", "tests/conformance/test_type.py"]
"""The conformance suite's quick modules (screenshots, pointer, keys, typing): the agent's contract
without the long waits of test_wait_release/test_type_events."""
CONFORMANCE_TIMEOUT_S = 2400

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


def run_quick_conformance(what: str, desktop: str, env: dict[str, str], report: Path) -> None:
    """Run :data:`QUICK_CONFORMANCE` in a pytest process of its own through ``--conformance-desktop=desktop``
    (the adapters' path) with ``env`` added, its JUnit report at ``report``; record its counts as
    ``what`` and fail unless every test ran and passed."""
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}", *QUICK_CONFORMANCE,
         f"--conformance-desktop={desktop}"],
        cwd=REPO, env=dict(os.environ, **env), capture_output=True, text=True, timeout=CONFORMANCE_TIMEOUT_S,
    )
    assert report.exists(), f"no report (exit {run.returncode}):\n{run.stdout[-4000:]}{run.stderr[-4000:]}"
    suite = ET.parse(report).getroot()
    suite = suite if suite.tag == "testsuite" else next(suite.iter("testsuite"))
    counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    record(what, {**counts, "wall_s": float(suite.get("time", 0))})
    assert run.returncode == 0, run.stdout[-4000:]
    assert counts["tests"] > 0 and counts["failures"] == counts["errors"] == counts["skipped"] == 0, counts


def labels_json(labels: dict[str, str]) -> str:
    """``labels`` as ``$DESKTOP_SANDBOX_TEST_LABELS`` carries them."""
    return json.dumps(labels)


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
