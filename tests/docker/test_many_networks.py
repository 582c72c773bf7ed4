"""Many sandboxes at once on one engine: each network of a sandbox takes a small subnet of its own
(``SUBNET_RANGE``), so 20 sandboxes' networks fit where the engine's default pools (a /16 or /20 a
network, about 30 networks) hold 15 sandboxes."""

from __future__ import annotations

import ipaddress

import pytest

from controller.sandbox.docker import SUBNET_PREFIX, DockerOptions, DockerSandbox, new_sandbox_id
from controller.sandbox.docker_cleanup import remove_sandbox

pytestmark = [pytest.mark.docker]

SANDBOXES = 20


def test_twenty_sandboxes_networks_fit_each_in_subnets_of_its_own(docker_client, desktop_image, test_labels):
    made: list[DockerSandbox] = []
    try:
        for _ in range(SANDBOXES):
            sandbox = DockerSandbox(docker_client, new_sandbox_id())
            made.append(sandbox)
            internal, egress, subnets = sandbox._create_networks(DockerOptions(image=desktop_image,
                                                                               extra_labels=test_labels))
            assert [ipaddress.ip_network(s).prefixlen for s in subnets] == [SUBNET_PREFIX]
        nets = [ipaddress.ip_network(c["Subnet"]) for sb in made
                for n in docker_client.networks.list(filters={"label": f"desktop-sandbox.sandbox={sb.id}"})
                for c in n.attrs["IPAM"]["Config"]]
        assert len(nets) == 2 * SANDBOXES
        assert not any(a.overlaps(b) for i, a in enumerate(nets) for b in nets[i + 1:])
    finally:
        for sandbox in made:
            remove_sandbox(docker_client, sandbox.id)
