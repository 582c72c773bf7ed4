"""Docker backend: the guest desktop and its gateway as two hardened containers (docker SDK for Python).

Per sandbox (id ``ds-<8 hex>``), all labelled ``desktop-sandbox.sandbox=<id>``:

* network ``<id>-internal``: ``internal=True`` (no route out, no host ports) and no host address on its
  bridge (``inhibit_ipv4``), so not even the Docker host is reachable from it. The desktop's only network.
* network ``<id>-egress``: a plain bridge; only the gateway joins it.
* container ``<id>-gateway`` (role ``gateway``, user ``gateway``): the egress policy proxy on port
  ``GATEWAY_PROXY_PORT`` (the guest's HTTP(S)_PROXY), the agent relay and the gateway's control API
  (``GATEWAY_CONTROL_PORT``, ``controller.gateway.control``): both listen only on the egress side
  (``controller.gateway.relay``) and are published on the host's 127.0.0.1 only, at host ports the
  kernel reports free (:func:`free_loopback_ports`): Docker's own allocator walks the ephemeral range in
  order without asking whether another process's socket holds a port (an open client connection, one in
  TIME_WAIT), and docker-proxy then fails to bind it; a port taken between the choice and the bind is
  chosen anew (:data:`START_ATTEMPTS`). The control API's
  token (``secrets.token_urlsafe``, per sandbox, not the agent's) is written into a 0400 file of the
  gateway user before the policy file, which starts the proxy.
* container ``<id>-desktop`` (role ``desktop``): supervisord as uid 0 with only SETUID, SETGID and KILL
  kept, starting Xvfb, openbox and the demo app as the desktop user ``sandbox`` (uid 1000) and the agent
  as ``agent`` (uid 1002) (``docker_hardening``). ``cap_drop=ALL`` otherwise, ``no-new-privileges``,
  default seccomp, read-only root with tmpfs for /tmp, the home, /run/desktop-sandbox and the control
  directory, sized to the memory budget, pids and memory limits, no Docker socket, no secrets in its
  environment, IPv6 off, no DNS upstream. The agent token (``secrets.token_urlsafe``) is written into a
  0400 file of the agent's user in its 0700 directory after start; the agent starts once it exists.

Readiness: ``/livez`` and then ``/v1/display`` answer through the relay. Teardown removes every container
and network with the sandbox's label (also after an exception, Ctrl-C, SIGTERM); ``remove_all`` cleans
up what killed runs left behind, and every start reaps sandboxes whose starting process is provably dead
and was this host's (``controller.sandbox.owner``; never detached ones). Cleanup: ``docker_cleanup``; container settings: ``docker_hardening``. Over 400 lines: the start
sequence and the backend's class-side API (options, image, cleanup) are one unit around the container pair.

Rule source: ARCHITECTURE.md, "Isolation model (Docker)".
"""

from __future__ import annotations

import base64
import os
import ipaddress
import secrets
import shlex
import socket
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import docker
import docker.errors
from docker.models.containers import Container

from controller.sandbox import (
    Capabilities,
    SANDBOX_ID,
    DECISIONS_READ_MAX_BYTES, BackendUnavailable, ExecResult, NetworkTopology, Sandbox, SandboxError, SandboxSpec,
    parse_decision_lines, parse_decision_log, signals_deferred, wait_agent_ready, wait_control_ready, with_timeout,
)
from controller.sandbox import seccomp
from controller.sandbox.owner import forget_claim
from controller.sandbox.backend_setup import decisions_since_argv, owner_labels, sandbox_labels
from controller.sandbox.docker_cleanup import (  # noqa: F401 - re-exported: the backend's cleanup API
    _remove,
    list_sandboxes,
    reap_orphans,
    remove_all,
    remove_sandbox,
)
from controller.sandbox.docker_hardening import (
    _WRITE_FILE,
    DESKTOP_CAP_ADD,
    _hardening,
    _tmpfs,
    check_memory_budget,
    desktop_tmpfs,
)
from controller.sandbox.guest import (  # noqa: F401 - re-exported: the backend's guest facts
    AGENT_PORT,
    AGENT_UID,
    DECISION_LOG,
    DESKTOP_UID,
    GATEWAY_HOME,
    GATEWAY_HOSTNAME,
    GATEWAY_LOG_DIR,
    GATEWAY_PROXY_PORT,
    GATEWAY_UID,
    GUEST_HOME,
    GUEST_NO_PROXY,
    RUN_DIR,
)
from controller.agent_client import direct_client
from controller.sandbox.readiness import direct_control_url
from controller.gateway.relay import interface_addresses
from controller.text import clean, clean_lines

DEFAULT_IMAGE = "desktop-sandbox:latest"
GATEWAY_CONTROL_PORT = 8001
"""The gateway control API's port inside the gateway container (egress side only; published on the host's
127.0.0.1)."""
DESKTOP_ALIAS = "desktop"
"""The desktop's name on the internal network, as the relay resolves it."""
AGENT_TOKEN_FILE = f"{RUN_DIR}/agent-token"
GATEWAY_POLICY_FILE = f"{RUN_DIR}/policy.json"
GATEWAY_CONTROL_TOKEN_FILE = f"{RUN_DIR}/control-token"
DOCKER_DNS = "127.0.0.11"
"""Docker's embedded resolver, as containers on user-defined networks see it."""
EXEC_MAX_BYTES = 16 * 1024 * 1024
"""Most output (bytes, stdout and stderr together) collected from one command run in a container."""
DECISION_LOG_MAX_BYTES = 256 * 1024 * 1024
"""Most of the gateway's decision log read in one go (``decision_log``)."""

START_ATTEMPTS = 5
"""Most tries of a start step that failed for a transient reason: a host port or a name taken."""
PORT_TAKEN = ("address already in use", "port is already allocated")
"""What the engine says when a host port it is to publish on is held: by another process's socket
(docker-proxy's bind fails), or by another container."""
NAME_TAKEN = ("already exists", "is already in use")
"""What the engine says (409) when a network's or a container's name is taken."""


SUBNET_RANGE_ENV = "DESKTOP_SANDBOX_DOCKER_SUBNETS"
"""Environment variable: the IPv4 range a sandbox's networks take their subnets from (default
:data:`SUBNET_RANGE`); empty: let the engine choose (its default address pools)."""
SUBNET_RANGE = "172.24.0.0/13"
"""Where a sandbox's two networks take a /:data:`SUBNET_PREFIX` each, chosen at random among the free ones
(inside the engine's own default pools, 172.17.0.0/12, so that nothing else on the host is shadowed).
The engine's default pools give each network a /16 or a /20, about 30 networks in all on a default engine:
15 sandboxes. A sandbox needs 2 addresses on its internal network and 1 on its egress network."""
SUBNET_PREFIX = 28
SUBNET_TAKEN = ("overlaps", "pool overlaps")
"""What the engine says when a subnet asked for overlaps another network's."""


def _subnets_in_use(client: docker.DockerClient) -> list[ipaddress.IPv4Network]:
    """Every IPv4 subnet of the engine's networks (one list call)."""
    found = []
    for network in client.networks.list():
        for config in (network.attrs.get("IPAM") or {}).get("Config") or []:
            try:
                subnet = ipaddress.ip_network(config.get("Subnet", ""), strict=False)
            except ValueError:
                continue
            if isinstance(subnet, ipaddress.IPv4Network):
                found.append(subnet)
    return found


def _small_ipam(taken: list[ipaddress.IPv4Network]) -> Any:
    """An IPAM config with one free /:data:`SUBNET_PREFIX` of the configured range (added to ``taken``), or
    None (the engine chooses) when the range is empty or has none free after a few random picks."""
    text = os.environ.get(SUBNET_RANGE_ENV, SUBNET_RANGE).strip()
    if not text:
        return None
    try:
        span = ipaddress.ip_network(text, strict=False)
    except ValueError:
        return None
    if not isinstance(span, ipaddress.IPv4Network) or span.prefixlen > SUBNET_PREFIX:
        return None
    count = 2 ** (SUBNET_PREFIX - span.prefixlen)
    for _ in range(64):
        subnet = ipaddress.IPv4Network((int(span.network_address) + secrets.randbelow(count) * 2 ** (32 - SUBNET_PREFIX),
                                        SUBNET_PREFIX))
        if not any(subnet.overlaps(other) for other in taken):
            taken.append(subnet)
            return docker.types.IPAMConfig(pool_configs=[docker.types.IPAMPool(subnet=str(subnet))])
    return None


def _says(exc: docker.errors.APIError, phrases: Sequence[str]) -> bool:
    """Whether the engine's error ``exc`` says one of ``phrases`` (case-insensitive)."""
    text = str(exc.explanation or exc).lower()
    return any(phrase in text for phrase in phrases)


def new_sandbox_id() -> str:
    """A fresh sandbox id, ``ds-<8 hex>``."""
    return f"{DockerSandbox.id_prefix}{secrets.token_hex(4)}"


def free_loopback_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports of 127.0.0.1 that no socket on this host holds now: the kernel's
    choice for sockets bound to port 0 (from ``ip_local_port_range``, skipping every port a socket holds,
    open client connections and TIME_WAIT included), the sockets closed again before this returns."""
    held: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            held.append(sock)
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in held]
    finally:
        for sock in held:
            sock.close()


@dataclass
class DockerOptions:
    """Container resources and image for the Docker backend.

    ``mem_limit``/``gateway_mem_limit``: Docker size strings (no swap beyond it). ``pids_limit``: tasks
    (threads count) in the desktop container; the browser alone uses a few hundred. ``shm_size``: the
    desktop's /dev/shm (the browser's shared memory; Docker's default 64m crashes heavy pages); with the
    tmpfs mounts it must leave ``docker_hardening.MIN_PROCESS_MIB`` of ``mem_limit`` (SandboxError at start).
    ``nano_cpus``: CPU quota in 1e-9 CPUs (0 = unlimited). ``detached``: the sandbox outlives its
    starter (``up --detach``); it is then not reaped automatically. ``apps_file``: the agent's app
    allowlist inside the image (default ``images/apps.json``; ``images/apps.conformance.json`` adds the
    input-event probe for conformance tests). ``agent_args``: extra ``python -m guest serve`` options
    (e.g. ``["--wait-cap", "3"]``).
    """

    image: str = DEFAULT_IMAGE
    mem_limit: str = "2g"
    pids_limit: int = 1024
    shm_size: str = "256m"
    nano_cpus: int = 0
    gateway_mem_limit: str = "512m"
    gateway_pids_limit: int = 256
    detached: bool = False
    apps_file: str = ""
    agent_args: list[str] = field(default_factory=list)
    extra_labels: dict[str, str] = field(default_factory=dict)


def _desktop_hardening(spec: SandboxSpec, options: DockerOptions) -> dict[str, Any]:
    """The desktop container's hardening options; a task that drives the agent's chromium
    (``spec.browser_channel``) gets :mod:`controller.sandbox.seccomp`'s profile in place of Docker's
    default, so that chromium's sandbox can start."""
    hardening = _hardening("0:0", desktop_tmpfs(), options.mem_limit, options.pids_limit, cap_add=DESKTOP_CAP_ADD)
    if spec.browser_channel:
        hardening["security_opt"] = [*hardening["security_opt"], seccomp.security_opt()]
    return hardening


def engine() -> docker.DockerClient:
    """``docker.from_env()``; raises BackendUnavailable (naming why) when the engine cannot be reached."""
    try:
        client = docker.from_env()
        client.ping()
    except docker.errors.DockerException as exc:
        raise BackendUnavailable(f"cannot reach the Docker engine: {exc}") from None
    return client


class DockerSandbox(Sandbox):
    """A running sandbox on the local Docker engine. Create with ``DockerSandbox.start``."""

    backend_name = "docker"
    id_prefix = "ds-"
    default_ready_timeout = 120.0
    capabilities = Capabilities(policy_swap=True, pool=True, snapshot="files", fork=True)

    def __init__(self, client: docker.DockerClient, sandbox_id: str) -> None:
        self.client = client
        self.id = sandbox_id
        self.desktop: Container | None = None
        self.gateway: Container | None = None
        self._closed = False
        self.timings: dict[str, float] = {}
        """Seconds from the start call to each milestone (``containers_started``, ``agent_live``,
        ``display_ready``)."""

    # -- public interface ---------------------------------------------------------------------------

    @classmethod
    def start(
        cls,
        spec: SandboxSpec | None = None,
        options: DockerOptions | None = None,
        client: docker.DockerClient | None = None,
    ) -> "DockerSandbox":
        """Create networks and containers, provision policy and token, and wait until ready.

        Returns a ready sandbox (use it as a context manager). Raises SandboxError when the image is
        missing, a container exits, or readiness is not reached within ``spec.ready_timeout`` seconds;
        everything created so far is removed before the error propagates (also on Ctrl-C/SIGTERM).
        """
        spec = spec or SandboxSpec()
        options = options or DockerOptions()
        client = client or docker.from_env()
        sandbox = cls(client, new_sandbox_id())
        sandbox._start_or_close(lambda: sandbox._start(spec, options))
        return sandbox

    def handover(self) -> dict[str, Any]:
        direct = getattr(self._agent_client, "base_url", None) if getattr(self, "_agent_client", None) else None
        return {"backend": self.backend_name, "id": self.id, "agent_url": self._agent_url, "agent_token": self._token,
                "control_url": self._control_url, "control_token": self._control_token, "image_id": self._image_id,
                "arch": self.arch, "time_scale": self.time_scale, "timings": dict(self.timings),
                "direct_url": direct if direct and direct != self._agent_url else None}

    @classmethod
    def adopt(cls, facts: Mapping[str, Any], client: docker.DockerClient | None = None) -> "DockerSandbox":
        from controller.agent_client import AgentClient

        sandbox_id = facts.get("id")
        if facts.get("backend") != cls.backend_name or not isinstance(sandbox_id, str) \
                or not SANDBOX_ID.fullmatch(sandbox_id):
            raise SandboxError("the facts handed over do not describe a Docker sandbox")
        client = client or engine()
        sandbox = cls(client, sandbox_id)
        try:
            sandbox.desktop = client.containers.get(f"{sandbox_id}-desktop")
            sandbox.gateway = client.containers.get(f"{sandbox_id}-gateway")
        except docker.errors.NotFound:
            raise SandboxError(f"sandbox {sandbox_id} is gone") from None
        sandbox._agent_url, sandbox._token = str(facts["agent_url"]), str(facts["agent_token"])
        sandbox._control_url, sandbox._control_token = str(facts["control_url"]), str(facts["control_token"])
        sandbox._image_id, sandbox.arch = str(facts.get("image_id") or ""), str(facts.get("arch") or "")
        sandbox.time_scale = float(facts.get("time_scale") or 1.0)
        sandbox.timings = {str(k): float(v) for k, v in dict(facts.get("timings") or {}).items()}
        if facts.get("direct_url"):
            sandbox._agent_client = AgentClient(str(facts["direct_url"]), sandbox._token)
        return sandbox

    @classmethod
    def make_options(cls, *, image: str | None = None, detached: bool = False) -> DockerOptions:
        return DockerOptions(image=image or DEFAULT_IMAGE, detached=detached)

    @classmethod
    def ensure_image(cls, options: DockerOptions, say: Callable[[str], None]) -> DockerOptions:
        """Build ``options.image`` (``controller.sandbox.image``, Dockerfile.desktop) when the engine lacks
        it, one ``say`` line per build step. Raises BackendUnavailable (no engine), SandboxError (build)."""
        from controller.sandbox import image as image_build

        client = engine()
        try:
            client.images.get(options.image)
            return options
        except docker.errors.ImageNotFound:
            pass
        say(f"image {options.image} missing: building it first (make desktop)")
        arch = image_build.arch_of_tag(options.image)  # desktop-sandbox:latest-arm64: an arm64 build
        base = image_build.arch_tag("debian:bookworm-slim", arch)
        image_build.ensure_base(client, base, log=lambda m: say(f"base {m}"), arch=arch)
        if image_build.is_foreign(arch):
            image_build.prepare_foreign_wheelhouse(arch, log=lambda m: say(f"wheels {m}"))
        else:
            image_build.prepare_wheelhouse(client, log=lambda m: say(f"wheels {m}"))

        def show(ev: image_build.BuildEvent) -> None:
            if ev.is_step:
                say(f"[{ev.step}/{ev.total}] {ev.text.split(' : ', 1)[-1][:110]}")

        try:
            image_build.build(options.image, base, client=client, on_event=show, arch=arch)
        except image_build.BuildError as exc:
            raise SandboxError(f"image build failed: {clean_lines(exc)}") from None
        return options

    @classmethod
    def list_all(cls) -> dict[str, dict[str, str]]:
        return list_sandboxes(engine())

    @classmethod
    def remove(cls, sandbox_id: str) -> list[str]:
        return remove_sandbox(engine(), sandbox_id)

    @classmethod
    def remove_all(cls, labels: Mapping[str, str] | None = None) -> list[str]:
        if labels:
            return super().remove_all(labels)
        return remove_all(engine())

    @classmethod
    def reap_orphans(cls) -> list[str]:
        return reap_orphans(engine())

    def topology(self) -> NetworkTopology:
        if self.gateway is None:
            raise SandboxError(f"sandbox {self.id} has no gateway container")
        try:
            self.gateway.reload()
            internal = self.client.networks.get(f"{self.id}-internal")
            egress = self.client.networks.get(f"{self.id}-egress")
            networks = self.gateway.attrs["NetworkSettings"]["Networks"]
            # the host's bridge address on every network the gateway sits on (also ones attached later,
            # such as the audit's targets network), then the default bridge's
            others = sorted(n for n in networks if n not in (internal.name, egress.name, "bridge"))
            attached = [internal, egress, *(self.client.networks.get(n) for n in others),
                        self.client.networks.get("bridge")]
        except docker.errors.NotFound as exc:
            raise SandboxError(f"sandbox {self.id} is gone: {exc}") from None
        bindings = self.gateway.attrs["NetworkSettings"]["Ports"].get(f"{AGENT_PORT}/tcp") or []
        host_port = next((int(b["HostPort"]) for b in bindings if b.get("HostIp") == "127.0.0.1"), 0)
        host_ips = [ip for ip in map(_network_gateway, attached) if ip]
        control = bool(self.gateway_control_url)
        return NetworkTopology(
            backend=self.backend_name,
            proxy_host=networks[internal.name]["IPAddress"],
            proxy_port=GATEWAY_PROXY_PORT,
            gateway_guest_ip=networks[internal.name]["IPAddress"],
            gateway_egress_ip=networks[egress.name]["IPAddress"] or None,
            agent_port=AGENT_PORT,
            agent_host_port=host_port,
            gateway_host_port=None,
            host_ips=tuple(dict.fromkeys(host_ips)),
            networks={"internal": internal.name, "egress": egress.name},
            dns_servers=(DOCKER_DNS,),
            gateway_control_url=self.gateway_control_url,
            gateway_control_token=self.gateway_control_token,
            gateway_control_port=GATEWAY_CONTROL_PORT if control else None,
        )

    def attach_gateway(self, network: str) -> tuple[str, str | None]:
        """Connect the gateway container (only it) to the Docker network named ``network`` (e.g. the
        audit's targets); returns its (IPv4, IPv6 or None) address there. Raises SandboxError.

        Docker publishes a container's ports on its default-route network; when the new network takes
        that place (one that is not internal, whose name sorts before the egress network's), the
        published ports lead to the gateway's address there, where nothing listens. The controller's own
        agent client already uses the egress address where the host routes there (the end of the
        start); the control API's URL (``gateway_control_url``) then becomes the egress address too."""
        if self.gateway is None:
            raise SandboxError(f"sandbox {self.id} has no gateway container")
        try:
            self.client.networks.get(network).connect(self.gateway)
            self.gateway.reload()
        except docker.errors.DockerException as exc:
            raise SandboxError(f"cannot attach the gateway of {self.id} to {network}: {exc}") from None
        networks = self.gateway.attrs["NetworkSettings"]["Networks"]
        egress_ip = networks.get(f"{self.id}-egress", {}).get("IPAddress")
        if self._control_url and egress_ip and direct_control_url(self._control_url, self._control_token) is None:
            direct = direct_control_url(f"http://{egress_ip}:{GATEWAY_CONTROL_PORT}", self._control_token)
            self._control_url = direct or self._control_url
        endpoint = networks[network]
        return endpoint["IPAddress"], endpoint.get("GlobalIPv6Address") or None

    def exec_in_guest(self, argv: Sequence[str], *, timeout: float | None = None) -> ExecResult:
        if self.desktop is None:
            raise SandboxError("sandbox has no desktop container")
        return self._exec(self.desktop, list(argv), user=f"{DESKTOP_UID}:{DESKTOP_UID}", timeout=timeout)

    def exec_in_gateway(self, argv: Sequence[str], *, timeout: float | None = None) -> ExecResult:
        """Run ``argv`` in the gateway container as the gateway user (diagnostics, tests)."""
        if self.gateway is None:
            raise SandboxError("sandbox has no gateway container")
        return self._exec(self.gateway, list(argv), user=f"{GATEWAY_UID}:{GATEWAY_UID}", timeout=timeout)

    def decision_log(self) -> list[dict[str, Any]]:
        if self.gateway is None:
            return []
        result = self._exec(self.gateway, ["cat", DECISION_LOG], user=f"{GATEWAY_UID}:{GATEWAY_UID}",
                            timeout=30, max_bytes=DECISION_LOG_MAX_BYTES)
        if result.exit_code != 0:
            return []
        return parse_decision_log(result.stdout.decode("utf-8", "replace"))

    def decisions_since(self, start: int, max_lines: int = 1000,
                        max_bytes: int = DECISIONS_READ_MAX_BYTES) -> list[Any]:
        """Lines ``start``.. (0-based) of the gateway's decision log, read in the gateway container with
        ``tail``/``head`` (one exec; the log stays where the gateway writes it), at most ``max_lines``
        lines and ``max_bytes`` bytes; a line cut by the byte cap or still being written is left for
        the next read."""
        if self.gateway is None:
            return []
        result = self._exec(self.gateway, decisions_since_argv(start, max_lines, max_bytes, DECISION_LOG),
                            user=f"{GATEWAY_UID}:{GATEWAY_UID}", timeout=30, max_bytes=max_bytes + 4096)
        return parse_decision_lines(result.stdout)

    def logs(self, role: str = "desktop", tail: int = 200) -> str:
        """The last ``tail`` lines of a container's output (``role``: desktop | gateway)."""
        container = self.desktop if role == "desktop" else self.gateway
        if container is None:
            return ""
        try:
            return container.logs(tail=tail).decode("utf-8", "replace")
        except docker.errors.NotFound:
            return ""

    def close(self) -> None:
        if self._closed:
            return
        with signals_deferred():  # a second Ctrl-C or a SIGTERM waits until everything is removed
            self._close_agent_client()
            if self.release_to is not None and self.release_to():  # its pool's keeper removes it
                self._closed = True
                return
            remove_sandbox(self.client, self.id)
            forget_claim(self.id)
            self._closed = True

    # -- start sequence -----------------------------------------------------------------------------

    def _labels(self, role: str, options: DockerOptions) -> dict[str, str]:
        return sandbox_labels(self.id, role, options, owner_labels())

    def _start(self, spec: SandboxSpec, options: DockerOptions) -> None:
        """The start sequence. Runs under ``_start_or_close``: a signal is acted on only at the
        ``_checkpoint()`` calls between Docker calls (and in readiness polls), never inside one."""
        t0 = time.monotonic()
        reap_orphans(self.client)
        self._checkpoint()
        try:
            image = self.client.images.get(options.image)
        except docker.errors.ImageNotFound:
            raise SandboxError(f"image {options.image} not found; build it with `make desktop`") from None
        self._image_id = image.id
        # An image of another architecture (arm64 on x86-64) runs under qemu-user: slower guest.
        from controller.sandbox import image as image_build

        self.time_scale = image_build.time_scale_of(image.attrs.get("Architecture"))
        self.arch = str(image.attrs.get("Architecture") or "")
        if self.time_scale != 1.0:
            try:
                image_build.ensure_emulation(image.attrs.get("Architecture"))
            except image_build.BuildError as exc:
                raise SandboxError(f"image {options.image}: {clean_lines(exc)}") from None
        try:
            check_memory_budget(options.mem_limit, options.shm_size)
        except ValueError as exc:
            raise SandboxError(f"desktop memory budget: {exc}") from None
        policy_json = spec.policy_json()

        internal, egress, subnets = self._create_networks(options)
        self._start_gateway(options, internal, egress, subnets)
        self._checkpoint()
        self.gateway.reload()
        gw_ip = self.gateway.attrs["NetworkSettings"]["Networks"][internal.name]["IPAddress"]
        ports = self.gateway.attrs["NetworkSettings"]["Ports"]
        bindings = ports.get(f"{AGENT_PORT}/tcp") or []
        host_port = next((b["HostPort"] for b in bindings if b.get("HostIp") == "127.0.0.1"), None)
        control_bindings = ports.get(f"{GATEWAY_CONTROL_PORT}/tcp") or []
        control_port = next((b["HostPort"] for b in control_bindings if b.get("HostIp") == "127.0.0.1"), None)
        if not gw_ip or not host_port or not control_port:
            raise SandboxError(f"gateway has no internal address or published ports: {gw_ip!r}, {ports!r}")
        self._agent_url = f"http://127.0.0.1:{host_port}"
        control_token = secrets.token_urlsafe(32)
        self._write_file(self.gateway, GATEWAY_CONTROL_TOKEN_FILE, control_token.encode(), 0o400,
                         user=f"{GATEWAY_UID}:{GATEWAY_UID}")
        self._control_url, self._control_token = f"http://127.0.0.1:{control_port}", control_token
        self._checkpoint()
        self._write_file(self.gateway, GATEWAY_POLICY_FILE, policy_json.encode(), 0o444,
                         user=f"{GATEWAY_UID}:{GATEWAY_UID}")
        self._checkpoint()

        proxy = f"http://{GATEWAY_HOSTNAME}:{GATEWAY_PROXY_PORT}"
        self.desktop = self.client.containers.create(
            options.image,
            command=["desktop"],
            name=f"{self.id}-desktop",
            hostname="desktop",
            labels=self._labels("desktop", options),
            network=internal.name,
            networking_config={internal.name: self.client.api.create_endpoint_config(aliases=[DESKTOP_ALIAS])},
            extra_hosts={GATEWAY_HOSTNAME: gw_ip},
            dns=["127.0.0.1"],  # the embedded DNS forwards nothing anywhere
            environment={
                "HOME": GUEST_HOME,
                "SCREEN_WIDTH": str(spec.screen_width),
                "SCREEN_HEIGHT": str(spec.screen_height),
                "HTTP_PROXY": proxy,
                "HTTPS_PROXY": proxy,
                "http_proxy": proxy,
                "https_proxy": proxy,
                "NO_PROXY": GUEST_NO_PROXY,
                "no_proxy": GUEST_NO_PROXY,
                **({"AGENT_APPS_FILE": options.apps_file} if options.apps_file else {}),
                **({"AGENT_ARGS": shlex.join(options.agent_args)} if options.agent_args else {}),
            },
            shm_size=options.shm_size,
            nano_cpus=options.nano_cpus or None,
            **_desktop_hardening(spec, options),
        )
        self._checkpoint()
        self.desktop.start()
        self._checkpoint()
        self._token = secrets.token_urlsafe(32)
        self._write_file(self.desktop, AGENT_TOKEN_FILE, self._token.encode(), 0o400,
                         user=f"{AGENT_UID}:{AGENT_UID}")
        self.timings["containers_started"] = time.monotonic() - t0
        self._checkpoint()
        self._wait_ready(spec.ready_timeout * self.time_scale, t0)
        # The controller's own client goes to the relay on the gateway's egress address when the host
        # routes there (saves docker-proxy's hop); else the published port (agent_url) as before.
        egress_ip = self.gateway.attrs["NetworkSettings"]["Networks"].get(egress.name, {}).get("IPAddress")
        if egress_ip:
            self._agent_client = direct_client(f"http://{egress_ip}:{AGENT_PORT}", self._token)

    def _create_networks(self, options: DockerOptions) -> tuple[Any, Any, list[str]]:
        """The sandbox's internal and egress networks (module doc) and the internal one's IPv4 subnets.

        The id is first made one no sandbox on the engine has (its label), and the networks are created
        with ``check_duplicate``: a name another network holds (a part left by another start that is not
        this host's to reap, or a start racing this one) is a 409 instead of a second network of that name;
        then the networks made are removed and the sandbox takes a new id, at most :data:`START_ATTEMPTS`
        times. Raises SandboxError, or the engine's error."""
        existing = list_sandboxes(self.client)
        while self.id in existing:
            self.id = new_sandbox_id()
        taken = _subnets_in_use(self.client)
        for attempt in range(1, START_ATTEMPTS + 1):
            made: list[Any] = []
            try:
                # internal: no route out (Docker drops forwarding) and, with inhibit_ipv4, no address of
                # the host on it either; otherwise the guest could reach host services bound to 0.0.0.0
                # through the bridge's gateway address.
                made.append(self.client.networks.create(
                    f"{self.id}-internal", driver="bridge", internal=True, enable_ipv6=False, check_duplicate=True,
                    labels=self._labels("internal", options), ipam=_small_ipam(taken),
                    options={"com.docker.network.bridge.inhibit_ipv4": "true"},
                ))
                self._checkpoint()
                made.append(self.client.networks.create(
                    f"{self.id}-egress", driver="bridge", internal=False, enable_ipv6=False, check_duplicate=True,
                    labels=self._labels("egress", options), ipam=_small_ipam(taken),
                    options={"com.docker.network.bridge.enable_icc": "false"},
                ))
                break
            except docker.errors.APIError as exc:
                overlap = _says(exc, SUBNET_TAKEN)
                if attempt == START_ATTEMPTS or not (overlap or (exc.status_code == 409 and _says(exc, NAME_TAKEN))):
                    raise
                for network in made:
                    network.remove()
                if overlap:  # another network took the subnet meanwhile: look again, pick others
                    taken = _subnets_in_use(self.client)
                else:
                    self.id = new_sandbox_id()
        self._checkpoint()
        internal, egress = made
        internal.reload()
        subnets = [c["Subnet"] for c in internal.attrs["IPAM"]["Config"] if "." in c.get("Subnet", "")]
        if not subnets:
            raise SandboxError(f"network {internal.name} has no IPv4 subnet")
        return internal, egress, subnets

    def _start_gateway(self, options: DockerOptions, internal: Any, egress: Any, subnets: list[str]) -> None:
        """Create, connect and start the gateway container: the egress network at create (so the
        published ports map to its egress address), the internal network connected before start, under
        the name the relay's peer never resolves. Its agent and control ports are published on 127.0.0.1
        at host ports the kernel reports free (:func:`free_loopback_ports`, module doc); when one is taken
        before the engine binds it, the container is made anew on new ports, at most
        :data:`START_ATTEMPTS` times. Raises SandboxError, or the engine's error for any other failure."""
        gw_tmpfs = {
            "/tmp": _tmpfs("64m", GATEWAY_UID, "1777"),
            RUN_DIR: _tmpfs("16m", GATEWAY_UID),
            GATEWAY_LOG_DIR: _tmpfs("64m", GATEWAY_UID, "0755"),
            GATEWAY_HOME: _tmpfs("64m", GATEWAY_UID),
        }
        for attempt in range(1, START_ATTEMPTS + 1):
            agent_port, control_port = free_loopback_ports(2)
            self.gateway = self.client.containers.create(
                options.image,
                command=["gateway"],
                name=f"{self.id}-gateway",
                hostname=GATEWAY_HOSTNAME,
                labels=self._labels("gateway", options),
                network=egress.name,
                ports={f"{AGENT_PORT}/tcp": ("127.0.0.1", agent_port),
                       f"{GATEWAY_CONTROL_PORT}/tcp": ("127.0.0.1", control_port)},
                environment={
                    "HOME": GATEWAY_HOME,
                    "RELAY_PORT": str(AGENT_PORT),
                    "RELAY_TARGET": f"{DESKTOP_ALIAS}:{AGENT_PORT}",
                    "INTERNAL_SUBNET": ",".join(subnets),
                    "GATEWAY_POLICY_FILE": GATEWAY_POLICY_FILE,
                    "GATEWAY_PROXY_PORT": str(GATEWAY_PROXY_PORT),
                    "GATEWAY_DECISION_LOG": DECISION_LOG,
                    "GATEWAY_CONTROL_PORT": str(GATEWAY_CONTROL_PORT),
                    "GATEWAY_CONTROL_TOKEN_FILE": GATEWAY_CONTROL_TOKEN_FILE,
                },
                **_hardening(f"{GATEWAY_UID}:{GATEWAY_UID}", gw_tmpfs, options.gateway_mem_limit,
                             options.gateway_pids_limit),
            )
            self._checkpoint()
            internal.connect(self.gateway, aliases=[GATEWAY_HOSTNAME])
            self._checkpoint()
            try:
                self.gateway.start()
                return
            except docker.errors.APIError as exc:
                if not _says(exc, PORT_TAKEN):
                    raise
                if attempt == START_ATTEMPTS:
                    raise SandboxError(f"the gateway of {self.id} found its host ports taken {attempt} times: "
                                       f"{clean(str(exc.explanation or exc), 500)}") from None
                self.gateway.remove(force=True, v=True)
                self.gateway = None
                self._checkpoint()

    def _wait_ready(self, timeout: float, t0: float) -> None:
        """Poll ``/livez`` then ``/v1/display`` through the relay until both answer 200, then the gateway's
        control API (it started long before; this only makes sure).

        Raises SandboxError (with the containers' last output) on timeout or when a container exits.
        """
        wait_agent_ready(self.id, self._agent_url, self._token, timeout=timeout, check_alive=self._check_alive,
                         describe=lambda: "desktop output:\n" + self.logs("desktop", 40)
                         + "\ngateway output:\n" + self.logs("gateway", 20),
                         timings=self.timings, t0=t0)
        wait_control_ready(self.id, self._control_url, self._control_token,
                           timeout=max(timeout - (time.monotonic() - t0), 5.0), check_alive=self._check_alive,
                           describe=lambda: "gateway output:\n" + self.logs("gateway", 20))

    def _check_alive(self) -> None:
        """Raise SandboxError (with its last output) when the gateway or the desktop container exited; the
        interruption when a signal came (``_checkpoint``: this runs after every unanswered readiness poll)."""
        self._checkpoint()
        for container in (self.gateway, self.desktop):
            assert container is not None
            container.reload()
            if container.status not in ("created", "running"):
                raise SandboxError(
                    f"{container.name} exited ({container.status}); last output:\n"
                    + clean_lines(container.logs(tail=40).decode("utf-8", "replace"))
                )

    # -- helpers --------------------------------------------------------------------------------------

    def _write_file(self, container: Container, path: str, data: bytes, mode: int, *, user: str) -> None:
        """Write ``data`` to ``path`` in a running container, atomically, with ``mode``, as ``user``."""
        result = container.exec_run(
            ["python3", "-c", _WRITE_FILE, path, f"{mode:o}"],
            user=user,
            environment={"DS_DATA": base64.b64encode(data).decode()},
            demux=True,
        )
        if result.exit_code != 0:
            out = b"".join(part or b"" for part in result.output).decode("utf-8", "replace")
            raise SandboxError(f"cannot write {path} in {container.name}: {clean_lines(out.strip(), 2000)}")

    def _exec(self, container: Container, argv: list[str], *, user: str,
              timeout: float | None = None, max_bytes: int = EXEC_MAX_BYTES) -> ExecResult:
        """Run ``argv`` in ``container`` as ``user`` and collect its output, at most ``max_bytes``
        (bytes, stdout and stderr together: the guest chooses what it prints). Raises SandboxError
        when the exec fails or prints more (the command is then left to its ``timeout``)."""
        api = self.client.api
        try:
            exec_id = api.exec_create(container.id, with_timeout(argv, timeout), user=user)["Id"]
            chunks = api.exec_start(exec_id, stream=True, demux=True)
            out: list[bytes] = []
            err: list[bytes] = []
            total = 0
            for stdout, stderr in chunks:
                total += len(stdout or b"") + len(stderr or b"")
                if total > max_bytes:
                    chunks.close()
                    raise SandboxError(f"exec in {container.name} printed more than {max_bytes} bytes")
                if stdout:
                    out.append(stdout)
                if stderr:
                    err.append(stderr)
            code = api.exec_inspect(exec_id).get("ExitCode")
        except docker.errors.APIError as exc:
            raise SandboxError(f"exec in {container.name} failed: {exc.explanation or exc}") from exc
        return ExecResult(int(code if code is not None else -1), b"".join(out), b"".join(err))

    # -- snapshots (kind "files": controller.sandbox.docker_snapshot; controller.sandbox.snapshot proves them)

    def save_snapshot(self, dest: Any) -> dict[str, Any]:
        """Kind ``files``: write the guest user's home and the agent's chromium's profile into the directory
        ``dest`` (a path) as tar archives (``docker_snapshot.ARCHIVES``, read by ``tar`` in the container as their
        owners, capped and deadlined; without the X cookie and chromium's profile locks) and the
        backend's facts (``docker_snapshot.FACTS``). Files only: processes are not saved; a restore starts
        the apps again. Returns ``{"kind": "files", "archives": {name: guest directory}, "template":
        {"screen", "browser_channel", "options"}}``. Raises SandboxError."""
        from pathlib import Path

        from controller.sandbox import docker_snapshot as files

        if self.desktop is None or self.gateway is None:
            raise SandboxError(f"sandbox {self.id} is not running")
        archives = {}
        for name, directory, uid in files.ARCHIVES:
            if files.has_directory(self, directory, uid):  # an older image has no /home/browser
                files.tar_out(self, directory, uid, Path(dest) / name)
                archives[name] = directory
        self.desktop.reload()
        self.gateway.reload()
        config, host = self.desktop.attrs["Config"], self.desktop.attrs["HostConfig"]
        gateway_host = self.gateway.attrs["HostConfig"]
        env = dict(item.partition("=")[::2] for item in config.get("Env") or [])
        options = {
            "image": config.get("Image") or DEFAULT_IMAGE, "mem_limit": str(host.get("Memory") or "2g"),
            "shm_size": str(host.get("ShmSize") or "256m"), "pids_limit": int(host.get("PidsLimit") or 1024),
            "nano_cpus": int(host.get("NanoCpus") or 0),
            "gateway_mem_limit": str(gateway_host.get("Memory") or "512m"),
            "gateway_pids_limit": int(gateway_host.get("PidsLimit") or 256),
            "apps_file": env.get("AGENT_APPS_FILE", ""), "agent_args": shlex.split(env.get("AGENT_ARGS", "")),
        }
        template = {
            "browser_channel": any(str(opt).startswith("seccomp=") for opt in host.get("SecurityOpt") or []),
            "screen": {"width": int(env.get("SCREEN_WIDTH") or 1280), "height": int(env.get("SCREEN_HEIGHT") or 800)},
            "options": options,
        }
        files.write_facts(Path(dest), {"format": 1, "image_id": self.image_id, "archives": archives, **template})
        return {"kind": "files", "archives": archives, "template": template}

    @classmethod
    def restore_snapshot(cls, source: Any, count: int = 1, spec: SandboxSpec | None = None,
                         options: DockerOptions | None = None,
                         client: docker.DockerClient | None = None) -> list["DockerSandbox"]:
        """Start ``count`` sandboxes (``spec``, ``options``: default the snapshot's screen, browser channel
        and options, deny-all; the image must be the one the snapshot was taken on) and write the archives
        of the snapshot directory ``source`` (a path) into each before any app is launched: the session programs that write the
        home held (``docker_snapshot.HELD_PROGRAMS``), each directory emptied (but the new X cookie) and
        the archive unpacked by ``tar`` as its owner. The held programs stay stopped until
        :meth:`resume_after_restore`. Processes do not survive: apps start again. Use
        :func:`controller.sandbox.snapshot.restore`, which checks the payload first and proves the state
        after. Raises SandboxError before starting anything for malformed facts or another image; on
        any failure, also a signal, every sandbox started here is removed."""
        from pathlib import Path

        from controller.sandbox import docker_snapshot as files

        source = Path(source)
        facts = files.read_facts(source)
        screen = facts.get("screen") or {}
        spec = spec or SandboxSpec(screen_width=int(screen.get("width", 1280)),
                                   screen_height=int(screen.get("height", 800)),
                                   browser_channel=bool(facts.get("browser_channel")),
                                   ready_timeout=cls.default_ready_timeout)
        options = options or cls.snapshot_options(facts)
        client = client or engine()
        try:
            have = client.images.get(options.image).id
        except docker.errors.ImageNotFound:
            raise SandboxError(f"image {options.image} not found; build it with `make desktop`") from None
        if facts.get("image_id") and have != facts["image_id"]:
            raise SandboxError(f"the snapshot was taken on image {clean(facts['image_id'], 80)}; "
                               f"{options.image} is {have}")
        owners = {name: (directory, uid) for name, directory, uid in files.ARCHIVES}
        restored: list[DockerSandbox] = []
        try:
            for _ in range(count):
                sandbox = cls.start(spec, options, client=client)
                restored.append(sandbox)
                files.supervise(sandbox, "stop")
                for name in sorted(facts["archives"]):
                    files.tar_in(sandbox, source / name, *owners[name])
        except BaseException:
            for sandbox in restored:
                sandbox.close()
            raise
        return restored

    @classmethod
    def snapshot_options(cls, template: Mapping[str, Any], **overrides: Any) -> DockerOptions:
        """The options a snapshot's ``template`` was started with (image tag, resources, app allowlist),
        with ``overrides`` (``detached=True``, ``extra_labels``, ``image``) applied. Raises TypeError for
        an unknown option name."""
        fields = set(DockerOptions.__dataclass_fields__) - {"detached", "extra_labels"}
        saved = {k: v for k, v in dict(template.get("options") or {}).items() if k in fields}
        return DockerOptions(**{**saved, **overrides})

    def resume_after_restore(self) -> None:
        """Start the session programs a restore held (``docker_snapshot.HELD_PROGRAMS``) again."""
        from controller.sandbox import docker_snapshot as files

        files.supervise(self, "start")

    @classmethod
    def attach(cls, sandbox_id: str, client: docker.DockerClient | None = None,
               agent_token: str | None = None) -> "DockerSandbox":
        """The running sandbox ``sandbox_id`` (``ds-<8 hex>``), started by another process (``up``): its
        containers, agent and gateway control API, for ``desktop-sandbox snapshot``. The agent's token is
        ``agent_token`` (``up`` writes it to a file), else the one the sandbox started with (read from its
        file in the container; a sandbox whose token was replaced since then refuses it). ``close()`` on
        it removes the sandbox like any other's. Raises SandboxError when there is no such running sandbox."""
        from controller.sandbox import LABEL_ROLE, LABEL_SANDBOX, SANDBOX_ID

        if not SANDBOX_ID.fullmatch(sandbox_id) or not sandbox_id.startswith(cls.id_prefix):
            raise SandboxError(f"not a Docker sandbox id: {clean(sandbox_id, 40)} (ds-<8 hex>)")
        client = client or engine()
        found = {c.labels.get(LABEL_ROLE): c
                 for c in client.containers.list(filters={"label": f"{LABEL_SANDBOX}={sandbox_id}"})}
        sandbox = cls(client, sandbox_id)
        sandbox.desktop, sandbox.gateway = found.get("desktop"), found.get("gateway")
        if sandbox.desktop is None or sandbox.gateway is None:
            raise SandboxError(f"no running Docker sandbox {sandbox_id}")
        sandbox._image_id = str(sandbox.desktop.attrs.get("Image") or "")
        ports = sandbox.gateway.attrs["NetworkSettings"]["Ports"]

        def host_port(port: int) -> str | None:
            return next((b["HostPort"] for b in ports.get(f"{port}/tcp") or [] if b.get("HostIp") == "127.0.0.1"),
                        None)

        def read(container: Container, path: str, uid: int) -> str:
            result = sandbox._exec(container, ["cat", path], user=f"{uid}:{uid}", timeout=10, max_bytes=4096)
            if result.exit_code != 0:
                raise SandboxError(f"cannot read {path} in {container.name}")
            return result.stdout.decode("ascii", "replace").strip()

        agent_port, control_port = host_port(AGENT_PORT), host_port(GATEWAY_CONTROL_PORT)
        if not agent_port or not control_port:
            raise SandboxError(f"sandbox {sandbox_id} publishes no agent or control port")
        sandbox._agent_url = f"http://127.0.0.1:{agent_port}"
        sandbox._token = agent_token or read(sandbox.desktop, AGENT_TOKEN_FILE, AGENT_UID)
        sandbox._control_url = f"http://127.0.0.1:{control_port}"
        sandbox._control_token = read(sandbox.gateway, GATEWAY_CONTROL_TOKEN_FILE, GATEWAY_UID)
        return sandbox


def _network_gateway(network: Any) -> str | None:
    """The IPv4 bridge address of a Docker network (the host's address on it), or None.

    The network's IPAM ``Gateway`` when Docker lists one; else (the default bridge on some engines
    lists only its subnet) the IPv4 address of its bridge interface on this host (``docker0``, named in
    ``com.docker.network.bridge.name``, or ``br-<id>``)."""
    network.reload()
    for config in network.attrs.get("IPAM", {}).get("Config") or []:
        gateway = config.get("Gateway")
        if gateway and "." in gateway:
            return gateway.split("/")[0]
    options = network.attrs.get("Options") or {}
    bridge = options.get("com.docker.network.bridge.name") or f"br-{str(network.attrs.get('Id', ''))[:12]}"
    address = interface_addresses().get(bridge)
    return str(address) if address is not None else None
