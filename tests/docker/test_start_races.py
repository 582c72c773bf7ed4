"""A sandbox starts whatever else holds the host's loopback ports and the engine's names: client
connections of another process bound to the ports at the start of the kernel's ephemeral range (and to
those right after the last port the engine published, where its own allocator goes on), host ports
taken between their choice and the engine's bind, and a leftover network with the name the start
creates first. One sandbox start covers all three."""

from __future__ import annotations

import contextlib
import resource
import socket
import struct
from collections.abc import Iterator

import pytest

from controller.agent_client import AgentClient
from controller.sandbox import SandboxSpec
from controller.sandbox import docker as docker_backend
from controller.sandbox.docker import DockerOptions, DockerSandbox

from .conftest import record_ready

pytestmark = [pytest.mark.docker, pytest.mark.slow]

HELD_AT_START = 3000
"""Ports held from the start of ``ip_local_port_range``."""
HELD_AFTER_LAST = 2000
"""Ports held after the highest port the engine publishes on 127.0.0.1 now."""


def ephemeral_range() -> tuple[int, int]:
    with open("/proc/sys/net/ipv4/ip_local_port_range", encoding="ascii") as f:
        low, high = (int(v) for v in f.read().split())
    return low, high


def published_ports(client) -> list[int]:
    """Host ports the engine's containers publish on 127.0.0.1 now."""
    ports = []
    for container in client.containers.list(ignore_removed=True):
        for bindings in (container.attrs["NetworkSettings"]["Ports"] or {}).values():
            ports += [int(b["HostPort"]) for b in bindings or [] if b.get("HostIp") == "127.0.0.1"]
    return ports


@contextlib.contextmanager
def held_loopback_ports(ports: list[int]) -> Iterator[set[int]]:
    """Hold each of ``ports`` with a client socket bound to it on 127.0.0.1 and connected to a listener
    of this test (ports another socket holds already are passed over); yields the ports held. Every
    socket is closed with a reset (SO_LINGER 0), so none is left in TIME_WAIT."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = 2 * len(ports) + 1024
    if soft < need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(need, hard), hard))
    sockets: list[socket.socket] = []
    held: set[int] = set()
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sockets.append(listener)
    try:
        listener.bind(("127.0.0.1", 0))
        listener.listen(128)
        for port in ports:
            client = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sockets.append(client)
            try:
                client.bind(("127.0.0.1", port))
            except OSError:
                continue  # another socket has it already: held anyway
            client.connect(listener.getsockname())
            sockets.append(listener.accept()[0])
            held.add(port)
        yield held
    finally:
        for sock in reversed(sockets):
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            sock.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_start_succeeds_past_held_host_ports_and_a_taken_name(docker_client, desktop_image, test_labels,
                                                                 monkeypatch):
    low, high = ephemeral_range()
    ports = list(range(low, min(low + HELD_AT_START, high + 1)))
    last = max([p for p in published_ports(docker_client) if low <= p <= high], default=low)
    ports += [p for p in range(last + 1, min(last + 1 + HELD_AFTER_LAST, high + 1)) if p >= low + HELD_AT_START]
    # a network left with the name the start would create first (not a sandbox's: nothing reaps it)
    taken = "ds-0ddba11a"
    leftover = docker_client.networks.create(f"{taken}-internal", driver="bridge", internal=True,
                                             labels=dict(test_labels))
    ids = iter([taken])
    real_new_id = docker_backend.new_sandbox_id
    monkeypatch.setattr(docker_backend, "new_sandbox_id", lambda: next(ids, None) or real_new_id())
    try:
        with held_loopback_ports(ports) as held:
            assert len(held) > HELD_AT_START // 2, f"held only {len(held)} of {len(ports)} ports"
            # and the ports chosen first are taken before the engine binds them (a race lost): chosen anew
            chosen: list[list[int]] = []
            real_free = docker_backend.free_loopback_ports

            def free_ports(count: int) -> list[int]:
                chosen.append(sorted(held)[:count] if not chosen else real_free(count))
                return chosen[-1]

            monkeypatch.setattr(docker_backend, "free_loopback_ports", free_ports)
            sandbox = DockerSandbox.start(SandboxSpec(), DockerOptions(image=desktop_image, extra_labels=test_labels),
                                          client=docker_client)
            record_ready(f"sandbox {sandbox.id} (ports held)", sandbox.timings)
            with sandbox:
                agent_port = int(sandbox.agent_url.rsplit(":", 1)[1])
                control_port = int(sandbox.gateway_control_url.rsplit(":", 1)[1])
                assert agent_port not in held and control_port not in held
                assert len(chosen) == 2 and {agent_port, control_port} == set(chosen[1]), chosen
                with AgentClient(sandbox.agent_url, sandbox.agent_token, timeout=30) as agent:
                    assert agent.display()["width"] > 0  # through the published port
                # the taken name: the sandbox took another id and left the other network alone
                assert sandbox.id != taken
                names = [n.name for n in docker_client.networks.list(names=[f"{taken}-internal"])]
                assert names == [f"{taken}-internal"], names
                leftover.reload()
    finally:
        leftover.remove()
