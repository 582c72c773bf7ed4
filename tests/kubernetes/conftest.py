"""Fixtures for the Kubernetes backend's tests: the Docker engine and the guest image (tests/docker's) for
the one test that runs the rendered desktop Pod's containers on Docker."""

from tests.docker.conftest import desktop_image, docker_client  # noqa: F401 - fixtures
