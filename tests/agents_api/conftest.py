"""Fixtures: ``desktop-sandbox serve``'s server on loopback, driven by the real openai client.

``api`` needs nothing but this machine: its sessions name an image that does not exist, so their
sandboxes fail to start at once (what a program then sees is part of the contract). ``docker_api``
runs real Docker sandboxes from the guest image (skipped, or failed under
``DESKTOP_SANDBOX_REQUIRE_IMAGE=1``, without them) and is shared by a module: its sessions carry the
test session's label, so whatever a failed test leaves is removed at the end.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from controller.agents_api.server import AgentsServer, ServeOptions
from controller.agents_api.sessions import LABEL_SESSION, HubOptions
from tests.docker.conftest import _remove_test_leftovers, desktop_image, docker_client, test_labels  # noqa: F401

ROOT = Path(__file__).resolve().parents[2]
ABSENT_IMAGE = "desktop-sandbox-absent:none"


@pytest.fixture
def api(tmp_path: Path) -> Iterator[AgentsServer]:
    """A server whose sandboxes never start (an image that does not exist)."""
    server = AgentsServer(ServeOptions(hub=HubOptions(runs_dir=tmp_path / "runs", image=ABSENT_IMAGE))).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def docker_api(tmp_path_factory: pytest.TempPathFactory, desktop_image: str,  # noqa: F811
               test_labels: dict[str, str]) -> Iterator[AgentsServer]:  # noqa: F811
    """A server with real Docker sandboxes, shared by a module."""
    runs = tmp_path_factory.mktemp("agents") / "runs"
    server = AgentsServer(ServeOptions(hub=HubOptions(runs_dir=runs, image=desktop_image,
                                                      extra_labels=dict(test_labels)))).start()
    try:
        yield server
    finally:
        server.stop()


def session_containers(docker_client, session_id: str) -> list:  # noqa: ANN001, F811
    """The containers of the session's sandbox (by the label every session's sandbox carries)."""
    return docker_client.containers.list(all=True, ignore_removed=True,
                                         filters={"label": f"{LABEL_SESSION}={session_id}"})
