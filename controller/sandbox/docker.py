"""Docker backend: the guest desktop and its gateway as two hardened containers (docker SDK for Python).

Per sandbox (id ``ds-<8 hex>``), all labelled ``desktop-sandbox.sandbox=<id>``:

* network ``<id>-internal``: ``internal=True`` (no route out, no host ports) and no host address on its
  bridge (``inhibit_ipv4``), so not even the Docker host is reachable from it. The desktop's only network.
* network ``<id>-egress``: a plain bridge; only the gateway joins it.
* container ``<id>-gateway`` (role ``gateway``, user ``gateway``): the egress policy proxy on port
  ``GATEWAY_PROXY_PORT`` (the guest's HTTP(S)_PROXY) and the agent relay, whose port is published on the
  host's 127.0.0.1 only and which listens only on the egress side (``controller.gateway.relay``).
* container ``<id>-desktop`` (role ``desktop``, user ``sandbox`` uid 1000): Xvfb, openbox, the agent,
  the demo app. ``cap_drop=ALL``, ``no-new-privileges``, default seccomp, read-only root with tmpfs for
  /tmp, the home and /run/desktop-sandbox, pids and memory limits, no Docker socket, no secrets in its
  environment, IPv6 off, no DNS upstream. The agent token (``secrets.token_urlsafe``) is written into a
  0400 file on a tmpfs owned by the desktop user after start; the agent starts once it exists.

Readiness: ``/livez`` and then ``/v1/display`` answer through the relay. Teardown removes every container
and network with the sandbox's label (also after an exception, Ctrl-C, SIGTERM); ``remove_all`` cleans
up what killed runs left behind, and every start reaps sandboxes whose starting process on this host is
gone (unless started detached).

Rule source: ARCHITECTURE.md, "Isolation model (Docker)".
"""

from __future__ import annotations

import base64
import os
import secrets
import shlex
import socket
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import docker
import docker.errors
from docker.models.containers import Container

from controller.sandbox import (
    LABEL_DETACHED,
    LABEL_OWNER,
    LABEL_ROLE,
    LABEL_SANDBOX,
    ExecResult,
    Sandbox,
    SandboxError,
    SandboxSpec,
    parse_decision_log,
    pid_alive,
    signals_deferred,
    wait_agent_ready,
    with_timeout,
)

DEFAULT_IMAGE = "desktop-sandbox:latest"
AGENT_PORT = 8000
"""The agent's port inside the desktop container, and the relay's port inside the gateway."""
GATEWAY_PROXY_PORT = 3128
"""The egress proxy's port on the gateway's guest-facing address (also in images/firefox/policies.json)."""
GATEWAY_HOSTNAME = "gateway"
"""Name of the gateway as the guest sees it: an /etc/hosts entry, so the guest needs no DNS."""
DESKTOP_ALIAS = "desktop"
"""The desktop's name on the internal network, as the relay resolves it."""
AGENT_TOKEN_FILE = "/run/desktop-sandbox/agent-token"
GATEWAY_POLICY_FILE = "/run/desktop-sandbox/policy.json"
DECISION_LOG = "/var/log/desktop-sandbox/decisions.jsonl"
"""JSONL decision log of the gateway's policy addon, inside the gateway container."""
DESKTOP_UID = 1000
GATEWAY_UID = 1001

_WRITE_FILE = (
    "import base64,os,sys\n"
    "path, mode = sys.argv[1], int(sys.argv[2], 8)\n"
    "data = base64.b64decode(os.environ.pop('DS_DATA'))\n"
    "tmp = path + '.partial'\n"
    "fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)\n"
    "view = memoryview(data)\n"
    "while view:\n"
    "    view = view[os.write(fd, view):]\n"
    "os.close(fd)\n"
    "os.rename(tmp, path)\n"
)
"""Writes a file atomically (temp + rename) inside a container; data arrives in the exec's environment
(not in argv, not in the container's configuration)."""


@dataclass
class DockerOptions:
    """Container resources and image for the Docker backend.

    ``mem_limit``/``gateway_mem_limit``: Docker size strings (no swap beyond it). ``pids_limit``: tasks
    (threads count) in the desktop container; the browser alone uses a few hundred. ``shm_size``: the
    desktop's /dev/shm (the browser's shared memory; Docker's default 64m crashes heavy pages).
    ``nano_cpus``: CPU quota in 1e-9 CPUs (0 = unlimited). ``detached``: the sandbox outlives its
    starter (``up --detach``); it is then not reaped automatically. ``apps_file``: the agent's app
    allowlist inside the image (default ``images/apps.json``; ``images/apps.conformance.json`` adds the
    input-event probe for conformance tests). ``agent_args``: extra ``python -m guest serve`` options
    (e.g. ``["--wait-cap", "3"]``).
    """

    image: str = DEFAULT_IMAGE
    mem_limit: str = "2g"
    pids_limit: int = 1024
    shm_size: str = "512m"
    nano_cpus: int = 0
    gateway_mem_limit: str = "512m"
    gateway_pids_limit: int = 256
    detached: bool = False
    apps_file: str = ""
    agent_args: list[str] = field(default_factory=list)
    extra_labels: dict[str, str] = field(default_factory=dict)


def _owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _hardening(user: str, tmpfs: dict[str, str], mem_limit: str, pids_limit: int) -> dict[str, Any]:
    """Container options common to both roles (see the module docstring)."""
    return {
        "user": user,
        "cap_drop": ["ALL"],
        "security_opt": ["no-new-privileges:true"],
        "read_only": True,
        "tmpfs": tmpfs,
        "mem_limit": mem_limit,
        "memswap_limit": mem_limit,
        "pids_limit": pids_limit,
        "ipc_mode": "private",
        "sysctls": {"net.ipv6.conf.all.disable_ipv6": "1", "net.ipv6.conf.default.disable_ipv6": "1"},
        "init": False,
        "privileged": False,
    }


def _tmpfs(size: str, uid: int, mode: str = "0700", exec_: bool = False) -> str:
    opts = ["rw", "nosuid", "nodev", f"size={size}", f"uid={uid}", f"gid={uid}", f"mode={mode}"]
    if not exec_:
        opts.append("noexec")
    return ",".join(opts)


class DockerSandbox(Sandbox):
    """A running sandbox on the local Docker engine. Create with ``DockerSandbox.start``."""

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
        sandbox = cls(client, f"ds-{secrets.token_hex(4)}")
        sandbox._start_or_close(lambda: sandbox._start(spec, options))
        return sandbox

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
        result = self._exec(self.gateway, ["cat", DECISION_LOG], user=f"{GATEWAY_UID}:{GATEWAY_UID}")
        if result.exit_code != 0:
            return []
        return parse_decision_log(result.stdout.decode("utf-8", "replace"))

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
            remove_sandbox(self.client, self.id)
            self._closed = True

    # -- start sequence -----------------------------------------------------------------------------

    def _labels(self, role: str, options: DockerOptions) -> dict[str, str]:
        labels = {LABEL_SANDBOX: self.id, LABEL_ROLE: role, LABEL_OWNER: _owner(), **options.extra_labels}
        if options.detached:
            labels[LABEL_DETACHED] = "1"
        return labels

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
        policy_json = spec.policy_json()

        # internal: no route out (Docker drops forwarding) and, with inhibit_ipv4, no address of the
        # host on it either; otherwise the guest could reach host services bound to 0.0.0.0 through
        # the bridge's gateway address.
        internal = self.client.networks.create(
            f"{self.id}-internal", driver="bridge", internal=True, enable_ipv6=False,
            labels=self._labels("internal", options),
            options={"com.docker.network.bridge.inhibit_ipv4": "true"},
        )
        self._checkpoint()
        egress = self.client.networks.create(
            f"{self.id}-egress", driver="bridge", internal=False, enable_ipv6=False,
            labels=self._labels("egress", options),
            options={"com.docker.network.bridge.enable_icc": "false"},
        )
        self._checkpoint()
        internal.reload()
        subnets = [c["Subnet"] for c in internal.attrs["IPAM"]["Config"] if "." in c.get("Subnet", "")]
        if not subnets:
            raise SandboxError(f"network {internal.name} has no IPv4 subnet")

        # Gateway: egress network at create (so the published port maps to its egress address), the
        # internal network connected before start, under the name the relay's peer never resolves.
        gw_tmpfs = {
            "/tmp": _tmpfs("64m", GATEWAY_UID, "1777"),
            "/run/desktop-sandbox": _tmpfs("16m", GATEWAY_UID),
            "/var/log/desktop-sandbox": _tmpfs("64m", GATEWAY_UID, "0755"),
            "/home/gateway": _tmpfs("64m", GATEWAY_UID),
        }
        self.gateway = self.client.containers.create(
            options.image,
            command=["gateway"],
            name=f"{self.id}-gateway",
            hostname=GATEWAY_HOSTNAME,
            labels=self._labels("gateway", options),
            network=egress.name,
            ports={f"{AGENT_PORT}/tcp": ("127.0.0.1", None)},
            environment={
                "HOME": "/home/gateway",
                "RELAY_PORT": str(AGENT_PORT),
                "RELAY_TARGET": f"{DESKTOP_ALIAS}:{AGENT_PORT}",
                "INTERNAL_SUBNET": ",".join(subnets),
                "GATEWAY_POLICY_FILE": GATEWAY_POLICY_FILE,
                "GATEWAY_PROXY_PORT": str(GATEWAY_PROXY_PORT),
                "GATEWAY_DECISION_LOG": DECISION_LOG,
            },
            **_hardening(f"{GATEWAY_UID}:{GATEWAY_UID}", gw_tmpfs, options.gateway_mem_limit,
                         options.gateway_pids_limit),
        )
        self._checkpoint()
        internal.connect(self.gateway, aliases=[GATEWAY_HOSTNAME])
        self._checkpoint()
        self.gateway.start()
        self._checkpoint()
        self.gateway.reload()
        gw_ip = self.gateway.attrs["NetworkSettings"]["Networks"][internal.name]["IPAddress"]
        bindings = self.gateway.attrs["NetworkSettings"]["Ports"].get(f"{AGENT_PORT}/tcp") or []
        host_port = next((b["HostPort"] for b in bindings if b.get("HostIp") == "127.0.0.1"), None)
        if not gw_ip or not host_port:
            raise SandboxError(f"gateway has no internal address or published port: {gw_ip!r}, {bindings!r}")
        self._agent_url = f"http://127.0.0.1:{host_port}"
        self._write_file(self.gateway, GATEWAY_POLICY_FILE, policy_json.encode(), 0o444,
                         user=f"{GATEWAY_UID}:{GATEWAY_UID}")
        self._checkpoint()

        proxy = f"http://{GATEWAY_HOSTNAME}:{GATEWAY_PROXY_PORT}"
        desktop_tmpfs = {
            "/tmp": _tmpfs("512m", DESKTOP_UID, "1777"),
            "/home/sandbox": _tmpfs("1g", DESKTOP_UID),
            "/run/desktop-sandbox": _tmpfs("16m", DESKTOP_UID),
            "/var/tmp": _tmpfs("64m", DESKTOP_UID, "1777"),
        }
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
                "SCREEN_WIDTH": str(spec.screen_width),
                "SCREEN_HEIGHT": str(spec.screen_height),
                "HTTP_PROXY": proxy,
                "HTTPS_PROXY": proxy,
                "http_proxy": proxy,
                "https_proxy": proxy,
                "NO_PROXY": "127.0.0.1,localhost",
                "no_proxy": "127.0.0.1,localhost",
                **({"AGENT_APPS_FILE": options.apps_file} if options.apps_file else {}),
                **({"AGENT_ARGS": shlex.join(options.agent_args)} if options.agent_args else {}),
            },
            shm_size=options.shm_size,
            nano_cpus=options.nano_cpus or None,
            **_hardening(f"{DESKTOP_UID}:{DESKTOP_UID}", desktop_tmpfs, options.mem_limit, options.pids_limit),
        )
        self._checkpoint()
        self.desktop.start()
        self._checkpoint()
        self._token = secrets.token_urlsafe(32)
        self._write_file(self.desktop, AGENT_TOKEN_FILE, self._token.encode(), 0o400,
                         user=f"{DESKTOP_UID}:{DESKTOP_UID}")
        self.timings["containers_started"] = time.monotonic() - t0
        self._checkpoint()
        self._wait_ready(spec.ready_timeout, t0)

    def _wait_ready(self, timeout: float, t0: float) -> None:
        """Poll ``/livez`` then ``/v1/display`` through the relay until both answer 200.

        Raises SandboxError (with the containers' last output) on timeout or when a container exits.
        """
        wait_agent_ready(self.id, self._agent_url, self._token, timeout=timeout, check_alive=self._check_alive,
                         describe=lambda: "desktop output:\n" + self.logs("desktop", 40)
                         + "\ngateway output:\n" + self.logs("gateway", 20),
                         timings=self.timings, t0=t0)

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
                    + container.logs(tail=40).decode("utf-8", "replace")
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
            raise SandboxError(f"cannot write {path} in {container.name}: {out.strip()}")

    def _exec(self, container: Container, argv: list[str], *, user: str,
              timeout: float | None = None) -> ExecResult:
        try:
            result = container.exec_run(with_timeout(argv, timeout), user=user, demux=True)
        except docker.errors.APIError as exc:
            raise SandboxError(f"exec in {container.name} failed: {exc.explanation or exc}") from exc
        stdout, stderr = result.output if isinstance(result.output, tuple) else (result.output, b"")
        return ExecResult(int(result.exit_code if result.exit_code is not None else -1), stdout or b"",
                          stderr or b"")


# -- cleanup ------------------------------------------------------------------------------------------

def remove_sandbox(client: docker.DockerClient, sandbox_id: str) -> list[str]:
    """Remove every container (forcefully) and then every network labelled with ``sandbox_id``.

    Returns the names removed. Parts already gone are skipped silently.
    """
    return _remove(client, {"label": f"{LABEL_SANDBOX}={sandbox_id}"})


def remove_all(client: docker.DockerClient | None = None) -> list[str]:
    """Remove every container and network carrying the ``desktop-sandbox.sandbox`` label (any sandbox).

    What ``desktop-sandbox down --all`` does. Returns the names removed.
    """
    return _remove(client or docker.from_env(), {"label": LABEL_SANDBOX})


def list_sandboxes(client: docker.DockerClient | None = None) -> dict[str, dict[str, str]]:
    """Sandboxes on this engine: ``{id: labels of one of its containers or networks}``."""
    client = client or docker.from_env()
    found: dict[str, dict[str, str]] = {}
    for c in client.containers.list(all=True, filters={"label": LABEL_SANDBOX}):
        found.setdefault(c.labels[LABEL_SANDBOX], dict(c.labels))
    for n in client.networks.list(filters={"label": LABEL_SANDBOX}):
        found.setdefault(n.attrs["Labels"][LABEL_SANDBOX], dict(n.attrs["Labels"]))
    return found


def reap_orphans(client: docker.DockerClient) -> list[str]:
    """Remove sandboxes started on this host by a process that no longer exists (a killed run).

    Detached sandboxes and those of other hosts or live processes are left alone. Returns their ids.
    """
    host = socket.gethostname()
    reaped = []
    for sandbox_id, labels in list_sandboxes(client).items():
        if labels.get(LABEL_DETACHED) == "1":
            continue
        owner_host, _, pid = labels.get(LABEL_OWNER, "").rpartition(":")
        if owner_host != host or not pid.isdigit() or pid_alive(int(pid)):
            continue
        remove_sandbox(client, sandbox_id)
        reaped.append(sandbox_id)
    return reaped


def _remove(client: docker.DockerClient, filters: dict[str, str]) -> list[str]:
    removed = []
    for container in client.containers.list(all=True, filters=filters):
        try:
            container.remove(force=True, v=True)
            removed.append(container.name)
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as exc:
            if exc.status_code != 409:  # 409: removal already in progress
                raise
    for network in client.networks.list(filters=filters):
        try:
            network.remove()
            removed.append(network.name)
        except docker.errors.NotFound:
            pass
    return removed
