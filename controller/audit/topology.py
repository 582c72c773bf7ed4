"""What the audit knows of a running sandbox (``AuditTopology``), and how each backend provides it.

The audit reaches a sandbox only through this object: the guest-side addresses and ports the probes aim
at, and three calls (run a command in the guest, read the gateway's output, read its decision log). The
probe list (controller.audit.probes) resolves every probe's addresses from it, so one list serves every
backend.

:func:`audit_topology` builds it for a sandbox of any backend from the sandbox's own
``topology()`` (controller.sandbox.topology.NetworkTopology, the one home of a sandbox's addresses), so
nothing in controller.audit reads a backend's internals.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from urllib.parse import urlsplit
from typing import TYPE_CHECKING, Any, Callable, Literal, Optional, Protocol, Sequence

if TYPE_CHECKING:  # pragma: no cover
    from controller.sandbox import ExecResult



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
      gateway's, its control API's), scanned with the usual service ports.
    * ``dns_servers``: resolvers the guest might try besides the host addresses.
    * ``loopback_ports``: ports asked for through the proxy on every loopback spelling.
    * ``gateway_on_host``: the gateway is a host process, so its loopback is the host's (the host
      canary's port is then a loopback target too).
    * ``scan_batch``: sockets a port scan in the guest opens at once (under the guest's fd limit).
    * ``exec_in_guest``: see :class:`GuestExec`; ``gateway_log(tail)``: the last ``tail`` lines of the
      gateway's output (text); ``decision_log()``: the gateway's decisions so far, one dict each.
    * ``control_port``: the gateway control API's port on the gateway's own addresses (Docker: in the
      gateway container, egress side only; VM: on the host's loopback), None where the gateway has none.
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
    control_port: Optional[int] = None

    @property
    def proxy_host(self) -> str:
        """The gateway's guest-facing address, where its proxy listens."""
        return self.gateway_addresses[0][1]


class Topological(Protocol):
    """What the audit needs of a sandbox (every backend of controller.sandbox has it): ``id``,
    ``image_id``, ``topology()`` (controller.sandbox.topology.NetworkTopology), ``exec_in_guest``,
    ``logs(role, tail)`` and ``decision_log()``."""

    id: str
    image_id: str

    def topology(self) -> Any: ...
    def exec_in_guest(self, argv: Sequence[str], *, timeout: Optional[float] = None) -> "ExecResult": ...
    def logs(self, role: str = "desktop", tail: int = 200) -> str: ...
    def decision_log(self) -> list[dict[str, Any]]: ...


def audit_topology(sandbox: Topological) -> AuditTopology:
    """The audit's view of a started sandbox of any backend, from its ``topology()`` (ask after
    attaching other networks, such as the audit's targets: their bridge addresses are host addresses
    too). Where the gateway is a process on the host (``gateway_host_port`` set: the VM), its loopback
    is the host's: the host's own addresses and the sandbox's published ports are probed, and its
    guest-facing address is the only gateway address; otherwise (Docker) the gateway has a guest-facing
    and an egress address and its relay listens on the agent's port. Raises
    controller.sandbox.SandboxError when the sandbox is gone."""
    t = sandbox.topology()
    on_host = t.gateway_host_port is not None
    control_url = getattr(t, "gateway_control_url", None)
    control_port = getattr(t, "gateway_control_port", None)
    control_host_port = urlsplit(control_url).port if control_url else None
    published = (t.agent_host_port,) + ((t.gateway_host_port,) if on_host else ()) + (
        (control_host_port,) if control_host_port else ())
    addresses = (("guest", t.gateway_guest_ip),) if on_host else (
        ("internal", t.gateway_guest_ip), *((("egress", t.gateway_egress_ip),) if t.gateway_egress_ip else ()))
    return AuditTopology(
        backend=t.backend,
        sandbox_id=sandbox.id,
        image_id=sandbox.image_id,
        proxy_port=t.proxy_port,
        gateway_addresses=addresses,
        relay_port=None if on_host else t.agent_port,
        host_label="host" if on_host else f"{t.backend}-host",
        host_ips=tuple(dict.fromkeys([*t.host_ips, *(host_addresses() if on_host else [])])),
        host_ports=published,
        dns_servers=tuple(dict.fromkeys([*t.dns_servers, t.gateway_guest_ip])),
        loopback_ports=published if on_host else (t.agent_port, *((control_port,) if control_port else ())),
        gateway_on_host=on_host,
        scan_batch=256 if on_host else 1024,  # a VM guest's default open-file limit is lower
        exec_in_guest=sandbox.exec_in_guest,
        gateway_log=lambda tail: sandbox.logs("gateway", tail),
        decision_log=sandbox.decision_log,
        control_port=control_port,
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
