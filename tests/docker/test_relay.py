"""The agent relay in a real sandbox: the controller's client takes the short way to it when the host
routes to the gateway's egress address, and the relay serves only the host."""

from __future__ import annotations

import ipaddress
import json
import re
import sys

import pytest

from controller.agent_client import AgentClient
from controller.sandbox.docker import AGENT_PORT

# Run in the gateway container: connect to the relay from the gateway's own egress address (a peer that
# is not the host) and report whether an answer came.
_FROM_INSIDE = (
    "import json, socket, sys\n"
    "s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5)\n"
    "s.sendall(b'GET /livez HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n')\n"
    "try:\n"
    "    data = s.recv(4096)\n"
    "except OSError as exc:\n"
    "    data = b''\n"
    "print(json.dumps({'answer': data.decode('latin-1'), 'local': s.getsockname()[0]}))\n"
)


def test_the_published_port_and_the_direct_address_reach_the_same_agent(sandbox):
    topo = sandbox.topology()
    assert sandbox.agent_url.startswith("http://127.0.0.1:")  # what a person is shown stays the published port
    with AgentClient(sandbox.agent_url, sandbox.agent_token, timeout=10) as published:
        assert published.display()["width"] == 1280
    if not sys.platform.startswith("linux"):
        pytest.skip("the egress bridge is routable from the host only on a Linux Docker host")
    # On a Linux Docker host the controller's own client goes to the relay at the egress address.
    assert sandbox.agent.base_url == f"http://{topo.gateway_egress_ip}:{AGENT_PORT}"
    assert sandbox.agent.display()["width"] == 1280


def test_the_relay_closes_a_peer_that_is_not_the_host(sandbox):
    topo = sandbox.topology()
    egress = topo.gateway_egress_ip
    result = sandbox.exec_in_gateway(["python3", "-c", _FROM_INSIDE, egress, str(AGENT_PORT)], timeout=20)
    assert result.exit_code == 0, result.stderr.decode()
    seen = json.loads(result.stdout)
    assert seen["local"] == egress  # the gateway's own address: not the host's on the egress bridge
    assert seen["answer"] == "", seen
    log = sandbox.logs("gateway", 200)
    assert f"relay: refused a connection from {egress}" in log
    # The start line names the one peer allowed: the egress network's gateway, i.e. the host.
    allowed = re.findall(r"peers allowed: ((?:\d+\.\d+\.\d+\.\d+/\d{1,2}(?:, )?)+)", log)
    assert allowed, log
    peers = [ipaddress.ip_network(p.strip()) for p in allowed[-1].split(",")]
    assert len(peers) == 1 and ipaddress.ip_address(egress) not in peers[0]
    assert peers[0].num_addresses == 1 and str(peers[0].network_address) in topo.host_ips
