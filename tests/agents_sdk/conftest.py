"""The Docker fixtures of tests/docker (the engine's client, the guest image) for the Agents SDK's tests."""

from tests.docker.conftest import desktop_image, docker_client  # noqa: F401 - fixtures
