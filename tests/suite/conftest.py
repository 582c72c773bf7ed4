"""Fixtures for the run-suite tests: the Docker engine and the guest image as tests/docker provides them
(skipped, or failed under DESKTOP_SANDBOX_REQUIRE_IMAGE=1, without them), and the ``cli_run`` helper."""

from tests.docker._cli_run import cli_run  # noqa: F401 - fixture
from tests.docker.conftest import desktop_image, docker_client  # noqa: F401 - fixtures
