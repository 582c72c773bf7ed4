"""The hosted-browser origin-access sample, saved as ``examples/agents_api_origin_access.py``, run
unchanged (but for its client and model) against ``serve``: the guest's fetch of an origin of the
task's ask tier is held by the gateway, the request reaches the program as
``agent.session.requires_action`` with a ``browser_origin_access`` request, the sample asks on its
stdin and answers through events; the page comes through and the task's check passes. The origin is
ours: the audit's target server in a container on a Docker network of ours (internal: no way out),
which ``serve --attach-network`` joins each session's gateway to (``tasks/origin-demo.toml``)."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys

import pytest

from controller.agents_api.server import AgentsServer, ServeOptions
from controller.agents_api.sessions import HubOptions

from tests.helpers import run_origin_target

from .conftest import ROOT

pytestmark = [pytest.mark.docker, pytest.mark.slow]

SUBNET = "10.213.77.0/24"
"""tasks/origin-demo.toml's allow_addresses."""


@pytest.fixture
def origin_network(docker_client, desktop_image, test_labels):  # noqa: ANN001
    """A network of ours in :data:`SUBNET` with the origin ``origin-demo:8080`` on it; its name."""
    import docker

    name = f"ds-test-origin-demo-{secrets.token_hex(4)}"
    ipam = docker.types.IPAMConfig(pool_configs=[docker.types.IPAMPool(subnet=SUBNET)])
    network = docker_client.networks.create(name, driver="bridge", internal=True, ipam=ipam, labels=test_labels)
    container = None
    try:
        container = run_origin_target(docker_client, desktop_image, name, f"{name}-target", "origin-demo", 8080,
                                      test_labels)
        yield name
    finally:
        if container is not None:
            container.remove(force=True)
        network.remove()


def test_the_hosted_origin_access_sample_runs_against_serve_approving_through_events(
        tmp_path, origin_network, desktop_image, test_labels):
    options = ServeOptions(hub=HubOptions(runs_dir=tmp_path / "runs", image=desktop_image,
                                          extra_labels=dict(test_labels), attach_networks=[origin_network]))
    with AgentsServer(options) as server:
        env = {**os.environ, "DESKTOP_SANDBOX_AGENTS_URL": server.url,
               "DESKTOP_SANDBOX_AGENTS_KEY_FILE": str(server.key_file),
               "DESKTOP_SANDBOX_AGENTS_MODEL": f"offline:{ROOT / 'tasks' / 'origin-demo.toml'}"}
        done = subprocess.run([sys.executable, str(ROOT / "examples" / "agents_api_origin_access.py")],
                              input="approve\n", capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
        out = done.stdout
        assert "Origin: http://origin-demo:8080" in out
        assert "checks: 1 of 1 passed; run passed" in out
        assert "Saved screenshot: browser-screenshot.jpg" in out
        assert (tmp_path / "browser-screenshot.jpg").read_bytes().startswith(b"\xff\xd8\xff")
        session_id = out.split("Session ID: ", 1)[1].split()[0]
        assert server.hub.get(session_id) is None  # the sample deleted it
        [record] = (tmp_path / "runs").glob("*-origin-demo-*/record.jsonl")
        approvals = [json.loads(line) for line in record.read_text().splitlines() if '"approval"' in line]
        assert [(a["what"], a["decision"], a["by"], a["origin"]) for a in approvals] == [
            ("origin_access", "approved", "agents-api", "http://origin-demo:8080")]
