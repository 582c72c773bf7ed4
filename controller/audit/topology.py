"""What the audit knows of a running sandbox (``AuditTopology``), and how each backend provides it.

The audit reaches a sandbox only through this object: the guest-side addresses and ports the probes aim
at, and three calls (run a command in the guest, read the gateway's output, read its decision log). The
probe list (controller.audit.probes) resolves every probe's addresses from it, so one list serves every
backend.

``docker_topology`` and ``vm_topology`` build it from today's ``DockerSandbox`` and ``VMSandbox``;
``connect_docker_gateway`` attaches a Docker sandbox's gateway to the audit's targets network. These three
are the only places in controller.audit that read a sandbox's internals.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Literal, Optional, Protocol, Sequence

if TYPE_CHECKING:  # pragma: no cover
    from controller.sandbox import ExecResult
    from controller.sandbox.docker import DockerSandbox
    from controller.sandbox.vm import VMSandbox

SLIRP_HOST = "10.0.2.2"
"""QEMU user-mode network's alias for the host (reachable only when not ``restrict=on``)."""
SLIRP_DNS = "10.0.2.3"
"""QEMU user-mode network's built-in DNS forwarder (disabled by ``restrict=on``)."""
DOCKER_DNS = "127.0.0.11"
"""Docker's embedded resolver, as containers on user-defined networks see it."""


class GuestExec(Protocol):
    """``exec_in_guest(argv, timeout=seconds) -> ExecResult``: run ``argv`` (no shell) in the guest as the
    desktop user and capture its output; killed after ``timeout`` seconds (exit status 124). Raises
    controller.sandbox.SandboxError when the guest is gone."""

    def __call__(self, argv: Sequence[str], *, timeout: Optional[float] = None) -> "ExecResult": ...


@dataclass(frozen=True)
class AuditTopology:
    """A running sandbox as the audit sees it.

    * ``backend``: ``docker`` | ``vm``; ``sandbox_id``, ``image_id``: for the report.
    * ``gateway_addresses``: ``(label, IPv4 address)`` of every gateway address, the guest-facing one
      first (the proxy listens there on ``proxy_port``; it is scanned 1-65535). Labels name the probes
      (``gateway-relay-<label>``): ``internal``, ``egress`` (Docker), ``guest`` (VM).
    * ``relay_port``: the agent relay's port on the gateway's own addresses, None where the gateway has
      no relay (VM).
    * ``host_label``: name prefix and category of the probes aimed at the host, and of its canary's
      summary probe (``docker-host`` | ``host``).
    * ``host_ips``: the host's IPv4 addresses on the guest's side (Docker: every bridge gateway address
      of the gateway's networks and ``docker0``; VM: QEMU's host and DNS aliases and the host's own).
    * ``host_ports``: TCP ports the sandbox publishes on the host (the relay's, the agent's, the
      gateway's), scanned with the usual service ports.
    * ``dns_servers``: resolvers the guest might try besides the host addresses.
    * ``loopback_ports``: ports asked for through the proxy on every loopback spelling.
    * ``gateway_on_host``: the gateway is a host process, so its loopback is the host's (the host
      canary's port is then a loopback target too).
    * ``scan_batch``: sockets a port scan in the guest opens at once (under the guest's fd limit).
    * ``exec_in_guest``: see :class:`GuestExec`; ``gateway_log(tail)``: the last ``tail`` lines of the
      gateway's output (text); ``decision_log()``: the gateway's decisions so far, one dict each.
    """

    backend: Literal["docker", "vm"]
    sandbox_id: str
    image_id: str
    proxy_port: int
    gateway_addresses: tuple[tuple[str, str], ...]
    relay_port: Optional[int]
    host_label: str
    host_ips: tuple[str, ...]
    host_ports: tuple[int, ...]
    dns_servers: tuple[str, ...]
    loopback_ports: tuple[int, ...]
    gateway_on_host: bool
    scan_batch: int
    exec_in_guest: GuestExec
    gateway_log: Callable[[int], str]
    decision_log: Callable[[], list[dict[str, Any]]]

    @property
    def proxy_host(self) -> str:
        """The gateway's guest-facing address, where its proxy listens."""
        return self.gateway_addresses[0][1]


def docker_topology(sandbox: "DockerSandbox") -> AuditTopology:
    """The topology of a started Docker sandbox, from its gateway container's networks as they are now
    (connect other networks, such as the audit's targets, first: their bridge addresses are host
    addresses too). Raises docker.errors.DockerException when the engine cannot be asked."""
    from controller.sandbox.docker import AGENT_PORT, GATEWAY_PROXY_PORT

    gateway = sandbox.gateway
    assert gateway is not None, "a started sandbox has a gateway"
    gateway.reload()
    settings = gateway.attrs["NetworkSettings"]
    networks = settings["Networks"]
    internal, egress = f"{sandbox.id}-internal", f"{sandbox.id}-egress"
    bindings = settings["Ports"].get(f"{AGENT_PORT}/tcp") or []
    others = sorted(name for name in networks if name not in (internal, egress, "bridge"))
    host_ips = [_network_gateway(sandbox.client.networks.get(name)) for name in (internal, egress, *others, "bridge")]
    internal_ip = networks[internal]["IPAddress"]
    return AuditTopology(
        backend="docker",
        sandbox_id=sandbox.id,
        image_id=sandbox.image_id,
        proxy_port=GATEWAY_PROXY_PORT,
        gateway_addresses=(("internal", internal_ip), ("egress", networks[egress]["IPAddress"])),
        relay_port=AGENT_PORT,
        host_label="docker-host",
        host_ips=tuple(dict.fromkeys(ip for ip in host_ips if ip)),
        host_ports=(int(bindings[0]["HostPort"]) if bindings else AGENT_PORT,),
        dns_servers=(DOCKER_DNS, internal_ip),
        loopback_ports=(AGENT_PORT,),
        gateway_on_host=False,
        scan_batch=1024,
        exec_in_guest=sandbox.exec_in_guest,
        gateway_log=lambda tail: sandbox.logs("gateway", tail),
        decision_log=sandbox.decision_log,
    )


def connect_docker_gateway(sandbox: "DockerSandbox", network: str) -> tuple[str, Optional[str]]:
    """Connect the Docker sandbox's gateway container (only it) to the Docker network named ``network``;
    returns its (IPv4, IPv6 or None) address there. Raises docker.errors.DockerException."""
    gateway = sandbox.gateway
    assert gateway is not None, "a started sandbox has a gateway"
    sandbox.client.networks.get(network).connect(gateway)
    gateway.reload()
    endpoint = gateway.attrs["NetworkSettings"]["Networks"][network]
    return endpoint["IPAddress"], endpoint.get("GlobalIPv6Address") or None


def vm_topology(sandbox: "VMSandbox") -> AuditTopology:
    """The topology of a started VM sandbox: the guest sits on QEMU's user-mode network with
    ``restrict=on``, the only address it may open a connection to is the gateway's guest-forwarded one,
    and the gateway is a process on the host's loopback."""
    from controller.sandbox.vm import GATEWAY_GUEST_ADDR, GATEWAY_PROXY_PORT

    published = (sandbox.agent_host_port, sandbox.gateway_host_port)
    return AuditTopology(
        backend="vm",
        sandbox_id=sandbox.id,
        image_id=sandbox.image_id,
        proxy_port=GATEWAY_PROXY_PORT,
        gateway_addresses=(("guest", GATEWAY_GUEST_ADDR),),
        relay_port=None,
        host_label="host",
        host_ips=tuple(dict.fromkeys([SLIRP_HOST, SLIRP_DNS, *host_addresses()])),
        host_ports=published,
        dns_servers=(SLIRP_DNS, SLIRP_HOST, GATEWAY_GUEST_ADDR),
        loopback_ports=published,
        gateway_on_host=True,
        scan_batch=256,
        exec_in_guest=sandbox.exec_in_guest,
        gateway_log=lambda tail: sandbox.logs("gateway", tail),
        decision_log=sandbox.decision_log,
    )


def host_addresses() -> list[str]:
    """The host's own non-loopback IPv4 addresses (from its name; no packets are sent)."""
    found: list[str] = []
    try:
        infos = socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)
    except OSError:
        infos = []
    for *_rest, sockaddr in infos:
        address = str(sockaddr[0])
        if not address.startswith("127.") and address not in found:
            found.append(address)
    return found


def _network_gateway(network: Any) -> Optional[str]:
    """The IPv4 gateway (the host's bridge address) of a docker.models.networks.Network, or None."""
    network.reload()
    for config in network.attrs.get("IPAM", {}).get("Config") or []:
        gateway = config.get("Gateway")
        if gateway and "." in gateway:
            return gateway.split("/")[0]
    return None
