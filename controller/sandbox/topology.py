"""The network shape of a running sandbox, as the network audit probes it (``Sandbox.topology()``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Optional


@dataclass(frozen=True)
class NetworkTopology:
    """Addresses and ports of one sandbox, as seen from the guest and from the host.

    ``backend``: registry name (``docker`` | ``vm``).
    ``proxy_host``/``proxy_port``: the gateway's proxy as the guest reaches it (IPv4 address, TCP port);
    the guest's HTTP(S)_PROXY names it ``gateway``.
    ``gateway_guest_ip``: the gateway's address on the guest-facing side (Docker: on the internal
    network; VM: QEMU's guestfwd address 10.0.2.100).
    ``gateway_egress_ip``: the gateway's address on its way out (Docker: on the egress network); None
    where the gateway is a host process (VM).
    ``agent_port``: the agent's TCP port in the guest (Docker: also the relay's port in the gateway).
    ``agent_host_port``: the port on the host's 127.0.0.1 that reaches the agent.
    ``gateway_host_port``: the gateway's port on the host's 127.0.0.1 (VM); None where it is not on the
    host (Docker).
    ``host_ips``: IPv4 addresses at which the host itself may answer next to the guest (Docker: the
    bridge addresses of the sandbox's two networks and of the default bridge; VM: QEMU's user-network
    host and DNS addresses), the ones a probe must find closed.
    ``networks``: backend-specific network names by role (Docker: ``internal``, ``egress``; VM: none).
    ``dns_servers``: resolvers the guest's network offers or could offer besides the host addresses
    (Docker: its embedded resolver 127.0.0.11; VM: QEMU's DNS and host aliases), which a guest must
    not reach.
    ``gateway_control_url``: base URL of the gateway's control API as the controller reaches it
    (``http://127.0.0.1:PORT``; ARCHITECTURE.md, "Gateway control API"), None when the gateway has none.
    ``gateway_control_token``: its bearer token (per sandbox, not the agent's; never log or record it;
    left out of ``repr``), None when there is no control API.
    ``gateway_control_port``: the control API's port on the gateway's own addresses (Docker: inside the
    gateway container, egress side only; VM: on the host's loopback), None when there is none.
    """

    backend: str
    proxy_host: str
    proxy_port: int
    gateway_guest_ip: str
    agent_port: int
    agent_host_port: int
    gateway_egress_ip: Optional[str] = None
    gateway_host_port: Optional[int] = None
    host_ips: tuple[str, ...] = ()
    networks: Mapping[str, str] = field(default_factory=dict)
    dns_servers: tuple[str, ...] = ()
    gateway_control_url: Optional[str] = None
    gateway_control_token: Optional[str] = field(default=None, repr=False)
    gateway_control_port: Optional[int] = None
