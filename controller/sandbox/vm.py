"""VM backend: the guest desktop as a QEMU virtual machine, its gateway as a host process.

The same guest as the Docker backend (provisioned by ``images/provision.sh``, the same supervisord
session, agent and browser policies), built into a disk image by ``scripts/build-vm-image.sh`` and booted
with QEMU's direct kernel boot. Per sandbox (id ``dv-<8 hex>``), in a private temporary directory
``desktop-sandbox-vm-<id>-*`` (mode 0700):

* the gateway: ``python -m controller.gateway serve --policy policy.json --log decisions.jsonl
  --listen 127.0.0.1:<port> --control-listen 127.0.0.1:<control port> --control-token-file
  control-token`` on the host's loopback, in its own process group; its control API
  (``controller.gateway.control``) has a random token of its own (not the agent's) in a 0600 file of
  the private directory.
* QEMU with user-mode networking ``restrict=on`` (the guest cannot open any connection to the host or
  beyond), ``ipv6=off``, and exactly two forwards:

  - ``hostfwd`` 127.0.0.1:<agent port> on the host -> the agent at 10.0.2.15:8000 in the guest: the
    controller's only way in;
  - ``guestfwd`` 10.0.2.100:3128 (``gateway`` in the guest's /etc/hosts; the browser's and the
    HTTP(S)_PROXY environment's proxy) -> one ``vm_forward.py`` per connection -> the gateway: the guest's
    only way out. The guest has no default route and no DNS.
* the guest's root disk attached read-only (the guest mounts it ``ro``; all it writes is tmpfs), so the
  image is never modified and any number of sandboxes share it.
* the agent token, random per sandbox, passed through QEMU's fw_cfg (root-only in the guest); at boot a
  root unit copies it to ``/run/desktop-sandbox/agent-token`` (owner ``agent``, 0400, in a directory
  only the agent's user opens: the desktop user ``sandbox`` cannot read it) and the agent starts once
  it exists. It is never on the kernel command line.
* ``exec_in_guest`` (the network audit's probes) goes through qemu-guest-agent on a virtio-serial port
  whose host end is a unix socket in the private directory; commands run as ``sandbox`` via ``runuser``.
* QEMU's machine protocol (QMP, ``vm_qmp``) on another unix socket there: machine snapshots
  (``save_snapshot``: the guest stopped, its RAM and devices written to a file, resumed;
  ``restore_snapshot``: one or many new VMs loading that file instead of booting; ``vm_snapshot``).

Readiness: ``/livez`` and then ``/v1/display`` answer through the host forward. Teardown stops QEMU (and
the forwarders it spawned), the gateway, and deletes the directory, also after an exception, Ctrl-C or
SIGTERM; ``reap_orphans`` (run at every start: only sandboxes whose starter is provably dead and was
this host's, see ``controller.sandbox.owner``) and ``remove_all`` clean up after killed runs.

Parts: ``vm_image`` (architecture, QEMU binary, acceleration, the image), ``vm_process`` (host
processes, private directories, cleanup), ``vm_qga`` (qemu-guest-agent client), ``vm_qmp`` (QMP client),
``vm_snapshot`` (a machine snapshot's files, checks and QEMU steps). Over 400 lines: the start and
restore sequences (gateway, QEMU command line, readiness, token) share the sandbox's state throughout.

Acceleration: KVM on Linux when ``/dev/kvm`` is usable and the guest's architecture is the host's, HVF on
macOS likewise, otherwise plain emulation (TCG). ``DESKTOP_SANDBOX_VM_ACCEL`` (kvm | hvf | tcg) overrides.

Rule source: ARCHITECTURE.md, "Isolation model", "VM path".
"""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from controller.gateway import gateway_python
from controller.sandbox import (
    Capabilities,
    ExecResult,
    NetworkTopology,
    Sandbox,
    SandboxError,
    SandboxSpec,
    DECISIONS_READ_MAX_BYTES,
    parse_decision_lines,
    parse_decision_log,
    signals_deferred,
    wait_agent_ready,
    with_timeout,
)
from controller.sandbox.backend_setup import owner_labels, sandbox_labels
from controller.sandbox.guest import (  # noqa: F401 - re-exported: the backend's guest facts
    AGENT_PORT,
    DESKTOP_USER,
    GATEWAY_HOSTNAME,
    GATEWAY_PROXY_PORT,
    GUEST_DISPLAY,
    GUEST_HOME,
    GUEST_NO_PROXY,
)
from controller.text import clean_lines
from controller.sandbox.vm_image import (  # noqa: F401 - re-exported: the backend's image API
    BUILD_SCRIPT,
    REPO_ROOT,
    build_image,
    choose_accel,
    ensure_image,
    host_arch,
    image_arch,
    image_dir,
    qemu_binary,
)
from controller.sandbox.vm_process import (  # noqa: F401 - re-exported
    TMP_PREFIX,
    _free_port,
    _stop_group,
    list_vm_sandboxes,
    remove_dir,
    remove_vm_sandbox,
    sandbox_dirs,
)
from controller.sandbox.vm_qga import GuestAgentChannel
from controller.sandbox.vm_qmp import QMPChannel

FORWARDER = Path(__file__).resolve().parent / "vm_forward.py"

GUEST_ADDR = "10.0.2.15"
"""The guest's address on QEMU's user-mode network (static, see scripts/vm/guest/10-sandbox.network)."""
GATEWAY_GUEST_ADDR = "10.0.2.100"
"""The gateway's address as the guest sees it (``gateway`` in the guest's /etc/hosts)."""
SLIRP_HOST = "10.0.2.2"
"""The host's address on QEMU's user-mode network (closed to the guest by ``restrict=on``)."""
SLIRP_DNS = "10.0.2.3"
"""QEMU's user-mode DNS address (closed to the guest by ``restrict=on``)."""
GUEST_PATH = "/opt/desktop-sandbox/bin:/usr/local/bin:/usr/bin:/bin"
GUEST_ENV = {
    "PATH": GUEST_PATH,
    "HOME": GUEST_HOME,
    "LANG": "C.UTF-8",
    "DISPLAY": GUEST_DISPLAY,
    "HTTP_PROXY": f"http://{GATEWAY_HOSTNAME}:{GATEWAY_PROXY_PORT}",
    "HTTPS_PROXY": f"http://{GATEWAY_HOSTNAME}:{GATEWAY_PROXY_PORT}",
    "http_proxy": f"http://{GATEWAY_HOSTNAME}:{GATEWAY_PROXY_PORT}",
    "https_proxy": f"http://{GATEWAY_HOSTNAME}:{GATEWAY_PROXY_PORT}",
    "NO_PROXY": GUEST_NO_PROXY,
    "no_proxy": GUEST_NO_PROXY,
}
"""Environment of commands run by ``exec_in_guest`` (as the session's, see desktop-sandbox.service)."""
FW_CFG_PREFIX = "opt/desktop-sandbox"

TCG_TIME_SCALE = 5.0
"""``Sandbox.time_scale`` of a guest under plain emulation (accel ``tcg``): measured here, Firefox and
the desktop react 3-5 times slower than in a container (boot to ready 70-100 s against 4-5 s), more
under host load; 5 keeps the offline exercise's deadlines meaningful without making a stuck run wait
long."""


@dataclass
class VMOptions:
    """How to run the VM.

    ``image``: image directory (``rootfs.raw``, ``vmlinuz``, ``initrd.img``, ``manifest.json``); default
    :func:`image_dir`. ``arch``: guest architecture (default: the host's). ``accel``: ``kvm`` | ``hvf`` |
    ``tcg``; default :func:`choose_accel`. ``memory_mib``, ``cpus``: guest RAM (MiB) and vCPUs.
    ``apps_file``: the agent's app allowlist in the guest (default ``images/apps.json``;
    ``images/apps.conformance.json`` adds the conformance probe), as for Docker.
    ``agent_args``: extra arguments of ``python -m guest serve`` (letters, digits, ``._=-`` only).
    ``keep_dir``: keep the private directory (console log, gateway log) after close, for diagnosis.
    ``detached``: the sandbox outlives its starter (``up --detach``); it is then never reaped
    automatically, only by ``desktop-sandbox down``. ``extra_labels``: more labels in its ``owner.json``
    (listed by ``list_all``, matched by ``down --all --label``), as Docker's containers carry them.
    """

    image: Path | None = None
    arch: str | None = None
    accel: str | None = None
    memory_mib: int = 2048
    cpus: int = 2
    apps_file: str = ""
    agent_args: list[str] = field(default_factory=list)
    keep_dir: bool = False
    detached: bool = False
    extra_labels: dict[str, str] = field(default_factory=dict)


class VMSandbox(Sandbox):
    """A running VM sandbox. Create with ``VMSandbox.start``; see the module docstring."""

    backend_name = "vm"
    id_prefix = "dv-"
    default_ready_timeout = 600.0
    capabilities = Capabilities(policy_swap=True, pool=True, snapshot="machine", fork=True)

    def __init__(self, sandbox_id: str, workdir: Path) -> None:
        self.id = sandbox_id
        self.workdir = workdir
        self.qemu: subprocess.Popen | None = None
        self.gateway: subprocess.Popen | None = None
        self.accel = ""
        self.agent_host_port = 0
        """The host port (127.0.0.1) forwarded to the agent in the guest."""
        self.gateway_host_port = 0
        """The gateway's port on the host's loopback."""
        self.gateway_control_port = 0
        """The gateway control API's port on the host's loopback."""
        self._qga: GuestAgentChannel | None = None
        self._qmp: QMPChannel | None = None
        self._machine: dict[str, Any] = {}
        """What a machine snapshot records of this VM: ``qemu``, ``arch``, ``image``, ``manifest``,
        ``options``, ``guest_env``, ``screen``, ``argv`` and the ``shape`` of it (see ``vm_snapshot``)."""
        self._next_token = ""
        self._snapshot_token = ""
        self._abandon: threading.Event | None = None
        self._gateway_ports = (0, 0)
        self._qemu_log_offset = 0
        self._closed = False
        self._keep_dir = False
        self._labels: dict[str, str] = {}
        self.timings: dict[str, float] = {}
        """Seconds from the start call to each milestone (``gateway_ready``, ``vm_started``,
        ``agent_live``, ``display_ready``)."""

    # -- public interface ---------------------------------------------------------------------------

    @property
    def console_log(self) -> Path:
        """The guest's serial console output (kernel, systemd, the session's programs)."""
        return self.workdir / "console.log"

    @classmethod
    def start(cls, spec: SandboxSpec | None = None, options: VMOptions | None = None) -> "VMSandbox":
        """Start the gateway and the VM, pass policy and token, and wait until the agent is ready.

        Returns a ready sandbox (use it as a context manager). Raises SandboxError when QEMU or the image
        is missing, QEMU or the gateway exits, or readiness is not reached within ``spec.ready_timeout``
        seconds; everything started so far is stopped and deleted before the error propagates (also on
        Ctrl-C/SIGTERM).
        """
        spec = spec or SandboxSpec()
        options = options or VMOptions()
        cls.reap_orphans()
        sandbox_id = f"{cls.id_prefix}{secrets.token_hex(4)}"
        workdir = Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{sandbox_id}-"))
        sandbox = cls(sandbox_id, workdir)
        sandbox._keep_dir = options.keep_dir
        sandbox._labels = sandbox_labels(sandbox_id, None, options, owner_labels())
        sandbox._start_or_close(lambda: sandbox._start(spec, options))
        return sandbox

    @classmethod
    def make_options(cls, *, image: str | None = None, detached: bool = False) -> VMOptions:
        return VMOptions(image=Path(image) if image else None, detached=detached)

    @classmethod
    def ensure_image(cls, options: VMOptions, say: Callable[[str], None]) -> VMOptions:
        """``options`` with ``image`` set: the given directory (SandboxError when it holds no built image),
        else the one for the current inputs, built first when missing (minutes, ``say`` reports it)."""
        if options.image is not None:
            if not (Path(options.image) / "manifest.json").exists():
                raise SandboxError(f"VM image not built ({options.image}); build it with scripts/build-vm-image.sh")
            return options
        return dataclasses.replace(options, image=ensure_image(say, options.arch))

    @classmethod
    def list_all(cls) -> dict[str, dict[str, str]]:
        return list_vm_sandboxes()

    @classmethod
    def remove(cls, sandbox_id: str) -> list[str]:
        return remove_vm_sandbox(sandbox_id)

    def topology(self) -> NetworkTopology:
        if self.qemu is None or self.qemu.poll() is not None:
            raise SandboxError(f"VM of sandbox {self.id} is not running")
        return NetworkTopology(
            backend=self.backend_name, proxy_host=GATEWAY_GUEST_ADDR, proxy_port=GATEWAY_PROXY_PORT,
            gateway_guest_ip=GATEWAY_GUEST_ADDR, gateway_egress_ip=None, agent_port=AGENT_PORT,
            agent_host_port=self.agent_host_port, gateway_host_port=self.gateway_host_port,
            host_ips=(SLIRP_HOST, SLIRP_DNS), networks={}, dns_servers=(SLIRP_DNS, SLIRP_HOST),
            gateway_control_url=self.gateway_control_url, gateway_control_token=self.gateway_control_token,
            gateway_control_port=self.gateway_control_port or None,
        )

    def exec_in_guest(self, argv: Sequence[str], *, timeout: float | None = None) -> ExecResult:
        if self._qga is None or self.qemu is None or self.qemu.poll() is not None:
            raise SandboxError(f"VM of sandbox {self.id} is not running")
        inner = with_timeout(argv, timeout)
        env = [f"{k}={v}" for k, v in GUEST_ENV.items()]
        args = {
            "path": "/usr/sbin/runuser",
            "arg": ["-u", DESKTOP_USER, "--", "/usr/bin/env", "-i", *env, *inner],
            "capture-output": True,
        }
        pid = self._qga.command("guest-exec", args)["pid"]
        deadline = time.monotonic() + (timeout if timeout is not None else 600.0) + 15.0
        delay = 0.02
        while True:
            status = self._qga.command("guest-exec-status", {"pid": pid})
            if status.get("exited"):
                break
            if time.monotonic() > deadline:
                raise SandboxError(f"command in guest did not finish: {list(argv)!r}")
            time.sleep(delay)  # poll interval of a condition wait (the command exited), bounded by the deadline
            delay = min(delay * 1.5, 0.25)
        code = status.get("exitcode")
        if code is None:  # killed by a signal
            code = 128 + int(status.get("signal", 0))
        return ExecResult(int(code), base64.b64decode(status.get("out-data", "")),
                          base64.b64decode(status.get("err-data", "")))

    def decision_log(self) -> list[dict[str, Any]]:
        path = self.workdir / "decisions.jsonl"
        try:
            text = path.read_text("utf-8", "replace")
        except OSError:
            return []
        return parse_decision_log(text)

    def decisions_since(self, start: int, max_lines: int = 1000,
                        max_bytes: int = DECISIONS_READ_MAX_BYTES) -> list[Any]:
        """Lines ``start``.. of the host-side gateway's decision log (a local file), at most
        ``max_lines`` lines and ``max_bytes`` bytes (see :meth:`Sandbox.decisions_since`)."""
        try:
            data = (self.workdir / "decisions.jsonl").read_bytes()
        except OSError:
            return []
        lines = data.split(b"\n")[:-1][start:start + max_lines]  # complete lines only
        piece, size = [], 0
        for line in lines:
            size += len(line) + 1
            if size > max_bytes and piece:
                break
            piece.append(line + b"\n")
        return parse_decision_lines(b"".join(piece))

    def logs(self, role: str = "desktop", tail: int = 200) -> str:
        """The last ``tail`` lines of the guest console (``desktop``) or the gateway's output (``gateway``)."""
        path = self.console_log if role == "desktop" else self.workdir / "gateway.log"
        try:
            lines = path.read_text("utf-8", "replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-tail:])

    def close(self) -> None:
        if self._closed:
            return
        with signals_deferred():  # a second Ctrl-C or a SIGTERM waits until everything is stopped
            self._close_agent_client()
            if self._qga is not None:
                self._qga.close()
            if self._qmp is not None:
                self._qmp.close()
            _stop_group(self.qemu)
            _stop_group(self.gateway)
            if not self._keep_dir:
                shutil.rmtree(self.workdir, ignore_errors=True)
            self._closed = True

    # -- machine snapshots (controller.sandbox.vm_snapshot) ---------------------------------------------

    def save_snapshot(self, dest: Path) -> dict[str, Any]:
        """Save the whole machine (RAM, CPUs, devices: with its read-only disk and tmpfs-only writes, all
        of the guest's state) into directory ``dest`` (made when missing, mode 0700), and let the VM go on.

        Sequence: the agent is moved to a token made for the snapshot, QEMU stops the guest, writes its
        migration stream to ``dest/machine.mig`` (QMP ``migrate`` to a ``file:`` URI, no bandwidth cap)
        and resumes it (``cont``); then the guest's clock is set to the host's again (the pause stopped
        it) and the agent is moved to a fresh token, so the token inside the saved RAM drives nothing that
        runs. ``dest`` then holds ``machine.mig``, ``vm.json`` and ``agent-token`` (layout:
        :mod:`controller.sandbox.vm_snapshot`). Signals wait until the VM runs again.

        Returns facts for a snapshot manifest: ``{"kind": "machine", "backend": "vm", "files": {name:
        bytes}, "bytes": total, "seconds": whole save, "pause_seconds": guest stopped, "migrate_seconds",
        "ram_bytes": RAM written, "image_id", "arch", "accel", "memory_mib", "cpus", "qemu_version",
        "screen": {"width", "height"}, "source_clock_offset_s": guest minus host after the pause (None
        when it could not be set), "template": {"screen", "accel", "memory_mib", "cpus", "image_dir"}:
        what a restore starts from}``. Raises SandboxError when the VM is not running, ``dest`` already
        holds a snapshot's files, or QEMU cannot save (the files it wrote are removed; the VM runs on).
        """
        from controller.sandbox import vm_snapshot as snap

        if self._closed or self.qemu is None or self.qemu.poll() is not None or self._qmp is None \
                or not self._machine.get("shape"):
            raise SandboxError(f"VM of sandbox {self.id} is not running")
        t0 = time.monotonic()
        dest = Path(dest).resolve()
        dest.mkdir(mode=0o700, parents=True, exist_ok=True)
        taken = [name for name in snap.PAYLOAD_FILES if (dest / name).exists()]
        if taken:
            raise SandboxError(f"{dest} already holds a snapshot ({', '.join(taken)})")
        m = self._machine
        image_facts = snap.rootfs_facts(m["image"])  # before the pause (hashed once per image)
        version = snap.qemu_version(m["qemu"])
        partial = dest / (snap.MIGRATION_FILE + ".partial")
        snapshot_token = secrets.token_urlsafe(32)
        made: list[Path] = []
        with signals_deferred():  # the guest must run again whatever comes
            try:
                self.rotate_agent_token(snapshot_token)
                made.append(partial)
                self._qmp.command("stop")
                stopped = time.monotonic()
                try:
                    stats = snap.migrate_to_file(self._qmp, partial, poll=self._check_alive)
                except BaseException:
                    try:
                        self._qmp.command("cont")
                    except SandboxError:
                        pass  # QEMU is gone: the error in flight says more
                    raise
                self._qmp.command("cont")
                pause = time.monotonic() - stopped
                try:
                    offset: float | None = snap.set_guest_clock(self._qga, timeout=30.0) if self._qga else None
                except SandboxError:
                    offset = None
                self.rotate_agent_token(secrets.token_urlsafe(32))
                size = partial.stat().st_size
                facts = {
                    "format": snap.SNAPSHOT_FORMAT, "kind": "machine", "backend": "vm", "source": self.id,
                    "saved_at": snap.utc_now(), "arch": m["arch"], "accel": self.accel,
                    "memory_mib": m["options"].memory_mib, "cpus": m["options"].cpus, "qemu_version": version,
                    "image": {"path": str(Path(m["image"]).resolve()), "key": m["manifest"]["key"], **image_facts},
                    "screen": {"width": m["screen"][0], "height": m["screen"][1]},
                    "guest_env": m["guest_env"], "argv": m["shape"],
                    "migration": {"file": snap.MIGRATION_FILE, "bytes": size},
                }
                for name, data in ((snap.TOKEN_FILE, snapshot_token.encode()),
                                   (snap.FACTS_FILE, json.dumps(facts, indent=1).encode() + b"\n")):
                    made.append(dest / name)
                    snap.write_private(dest / name, data)
                partial.replace(dest / snap.MIGRATION_FILE)
                made.append(dest / snap.MIGRATION_FILE)
            except BaseException:
                for path in made:
                    path.unlink(missing_ok=True)
                raise
        files = {name: (dest / name).stat().st_size for name in snap.PAYLOAD_FILES}
        return {
            "kind": "machine", "backend": self.backend_name, "files": files, "bytes": sum(files.values()),
            "seconds": time.monotonic() - t0, "pause_seconds": pause, "migrate_seconds": stats["seconds"],
            "ram_bytes": stats["ram_bytes"], "image_id": self.image_id, "arch": m["arch"], "accel": self.accel,
            "memory_mib": facts["memory_mib"], "cpus": facts["cpus"], "qemu_version": version,
            "screen": dict(facts["screen"]), "source_clock_offset_s": offset,
            "template": {"screen": dict(facts["screen"]), "accel": self.accel, "memory_mib": facts["memory_mib"],
                         "cpus": facts["cpus"], "image_dir": facts["image"]["path"]},
        }

    @classmethod
    def restore_snapshot(cls, source: Path, count: int = 1, spec: SandboxSpec | None = None,
                         options: VMOptions | None = None) -> list["VMSandbox"]:
        """Start ``count`` (1 to ``vm_snapshot.MAX_FORKS``) new VMs from the machine snapshot in directory
        ``source`` (written by :meth:`save_snapshot`), all at once, each ready when returned.

        Each has its own id, private directory, gateway (policy ``spec.policy``, default deny-all; a fresh
        decision log), forwarded host ports and tmpfs state (a copy of the saved one: what one writes the
        others never see). QEMU loads ``machine.mig`` (``-incoming file:``) instead of booting; then the
        guest's clock is set to the host's (``vm_snapshot.set_guest_clock``), the agent and display
        must answer (with the token inside the saved RAM), and the agent is moved to a fresh token
        (the same one QEMU's fw_cfg hands the session, should it restart). ``timings``: seconds from
        this call to ``gateway_ready``, ``vm_started``, ``vm_running`` (RAM loaded), ``clock_set``,
        ``agent_live``, ``display_ready``, ``token_rotated``.

        The machine is the snapshot's: its arch, acceleration, memory, CPUs, screen size and guest
        settings (``spec``'s screen size and ``options``' memory, CPUs, apps file and agent arguments are
        not used); ``options.image`` may name another copy of the same image. ``spec.ready_timeout``
        bounds each VM's wait. Raises SandboxError before starting anything when the snapshot is
        malformed or does not fit this host (QEMU version, image, command line); and when a VM fails to
        come up (QEMU's output and the console, escaped). On any failure, also Ctrl-C/SIGTERM/SIGHUP
        (handled as :meth:`Sandbox._start_or_close` does), every VM this call started is removed first.
        """
        from controller.sandbox import vm_snapshot as snap

        source = Path(source).resolve()
        snap.check_path(source, "snapshot directory")
        if not 1 <= int(count) <= snap.MAX_FORKS:
            raise SandboxError(f"count must be 1 to {snap.MAX_FORKS}, not {count}")
        facts = snap.read_facts(source)
        old_token = snap.read_token(source)
        spec = spec or SandboxSpec()
        options = options or VMOptions()
        arch = facts["arch"]
        qemu = qemu_binary(arch)
        if qemu is None:
            raise SandboxError(f"QEMU for {arch} is not installed; the snapshot's guest is {arch}")
        if snap.qemu_version(qemu) != facts["qemu_version"]:
            raise SandboxError(f"the snapshot was saved by {clean(facts['qemu_version'], 80)}; this host runs "
                               f"{clean(snap.qemu_version(qemu), 80)}")
        wanted = options.accel or os.environ.get("DESKTOP_SANDBOX_VM_ACCEL", "").strip().lower()
        if wanted and wanted != facts["accel"]:
            raise SandboxError(f"the snapshot's guest ran with accel {clean(facts['accel'], 10)}, not {wanted}")
        image = Path(options.image) if options.image else Path(facts["image"]["path"])
        snap.check_path(image, "VM image directory")
        try:
            manifest = json.loads((image / "manifest.json").read_text())
        except (OSError, ValueError) as exc:
            raise SandboxError(f"VM image {image} not readable ({clean(exc, 200)})") from exc
        snap.check_image(facts, image, manifest)
        machine = dataclasses.replace(options, image=image, arch=arch, accel=facts["accel"],
                                      memory_mib=facts["memory_mib"], cpus=facts["cpus"])
        cls.reap_orphans()
        t0 = time.monotonic()
        made: list[VMSandbox] = []
        try:
            for _ in range(int(count)):
                sandbox_id = f"{cls.id_prefix}{secrets.token_hex(4)}"
                sandbox = cls(sandbox_id, Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{sandbox_id}-")))
                sandbox._keep_dir = options.keep_dir
                sandbox._labels = sandbox_labels(sandbox_id, None, options, owner_labels())
                made.append(sandbox)
        except BaseException:
            with signals_deferred():
                for sandbox in made:
                    sandbox.close()
            raise
        leader, rest = made[0], made[1:]

        def restore_all() -> None:
            for sandbox in rest:  # the leader's signal handling covers them all
                sandbox._signals_noted = leader._signals_noted
            try:
                for sandbox in made:
                    sandbox._launch_restored(source, facts, old_token, spec, machine, qemu, manifest, t0)
                _bring_up_together(made, source, facts, spec.ready_timeout, t0)
            finally:
                for sandbox in rest:
                    sandbox._signals_noted = None

        try:
            leader._start_or_close(restore_all)
        except BaseException:
            with signals_deferred():
                for sandbox in rest:
                    sandbox.close()
            raise
        return made

    def _launch_restored(self, source: Path, facts: dict[str, Any], old_token: str, spec: SandboxSpec,
                         options: VMOptions, qemu: str, manifest: dict[str, Any], t0: float) -> None:
        """Write this restored VM's files and start its gateway and QEMU (``-incoming``), not waiting."""
        from controller.sandbox import vm_snapshot as snap

        self._write_owner()
        self.arch, self.accel = facts["arch"], facts["accel"]
        self.time_scale = TCG_TIME_SCALE if self.accel == "tcg" else 1.0
        self._image_id = f"vm:{self.arch}:{facts['image']['key']}"
        (self.workdir / "policy.json").write_text(spec.policy_json())
        self._next_token = secrets.token_urlsafe(32)
        snap.write_private(self.workdir / "token", self._next_token.encode())  # fw_cfg, for a session restart
        self._token = self._snapshot_token = old_token
        (self.workdir / "guest.env").write_text(facts["guest_env"])
        assert options.image is not None
        self._machine = {"qemu": qemu, "arch": self.arch, "image": Path(options.image), "manifest": manifest,
                         "options": options, "guest_env": facts["guest_env"],
                         "screen": (facts["screen"]["width"], facts["screen"]["height"])}
        self._launch_restored_processes(source, facts)
        self.timings["vm_started"] = time.monotonic() - t0

    def _launch_restored_processes(self, source: Path, facts: dict[str, Any]) -> None:
        from controller.sandbox import vm_snapshot as snap

        m = self._machine
        port, control_port, agent_port = _free_port(), _free_port(), _free_port()
        shape = self._argv_shape(self._qemu_argv(m["qemu"], m["arch"], m["image"], m["manifest"], m["options"],
                                                 agent_port, port), m["image"], agent_port, port)
        snap.check_argv(facts, shape)
        self._launch_gateway(self.workdir / "policy.json", port, control_port)
        self._launch_qemu(m["qemu"], m["arch"], m["image"], m["manifest"], m["options"], agent_port, port,
                          incoming=source / snap.MIGRATION_FILE)
        self.agent_host_port = agent_port
        self._agent_url = f"http://127.0.0.1:{agent_port}"
        self._qga = GuestAgentChannel(self.workdir / "qga.sock")
        self._qmp = QMPChannel(self.workdir / "qmp.sock")

    def _finish_restored(self, source: Path, facts: dict[str, Any], timeout: float, t0: float) -> None:
        """Bring up the VM :meth:`_launch_restored` started (:meth:`_bring_up_restored`), starting QEMU and
        the gateway again on other ports when one was taken in between (at most twice)."""
        deadline = time.monotonic() + timeout
        for attempt in range(3):
            if self._bring_up_restored(deadline, t0):
                return
            if attempt == 2:
                raise SandboxError(f"sandbox {self.id}: its ports were taken by others three times")
            for channel in (self._qmp, self._qga):
                if channel is not None:
                    channel.close()
            self._close_agent_client()
            self._agent_client = None
            self._token = self._snapshot_token
            _stop_group(self.qemu)
            _stop_group(self.gateway)
            self._launch_restored_processes(source, facts)

    def _bring_up_restored(self, deadline: float, t0: float) -> bool:
        """Wait until QEMU has loaded the RAM and runs the guest, set the guest's clock, wait for the agent
        and display, move the agent to its fresh token, then wait for the gateway (it starts meanwhile).
        Returns False when QEMU or the gateway exited because a port was taken; raises SandboxError
        otherwise."""
        from controller.sandbox import vm_snapshot as snap

        assert self._qmp is not None and self._qga is not None and self.qemu is not None
        try:
            snap.wait_running(self._qmp, timeout=max(deadline - time.monotonic(), 0.1), check_alive=self._check_alive)
        except SandboxError:
            try:  # QMP's socket closes a moment before QEMU exits: its output says why
                self.qemu.wait(timeout=5.0)
            except subprocess.TimeoutExpired:
                pass
            if self.qemu.poll() is not None:
                if "hostfwd" in self._qemu_output():
                    return False
                self._check_alive()
            raise
        self.timings["vm_running"] = time.monotonic() - t0
        snap.set_guest_clock(self._qga, timeout=max(min(30.0, deadline - time.monotonic()), 1.0))
        self.timings["clock_set"] = time.monotonic() - t0
        self._checkpoint()
        self._wait_ready(max(deadline - time.monotonic(), 0.1), t0)
        self.rotate_agent_token(self._next_token)
        self.timings["token_rotated"] = time.monotonic() - t0
        if not self._await_gateway(deadline):
            return False
        self.timings["gateway_ready"] = time.monotonic() - t0
        return True

    def _checkpoint(self) -> None:
        """As :meth:`Sandbox._checkpoint`; also gives up once another VM of the same restore failed."""
        if self._abandon is not None and self._abandon.is_set():
            raise SandboxError(f"restore of sandbox {self.id} abandoned: another VM of the same restore failed")
        super()._checkpoint()

    # -- start sequence -----------------------------------------------------------------------------

    def _start(self, spec: SandboxSpec, options: VMOptions) -> None:
        t0 = time.monotonic()
        self._write_owner()
        arch = options.arch or image_arch(options.image) or host_arch()
        qemu = qemu_binary(arch)
        if qemu is None:
            raise SandboxError(f"QEMU for {arch} is not installed (Debian: apt-get install "
                               f"{'qemu-system-x86' if arch == 'amd64' else 'qemu-system-arm'})")
        image = Path(options.image) if options.image else image_dir(arch)
        manifest_path = image / "manifest.json"
        if not manifest_path.exists():
            raise SandboxError(f"VM image not built ({image}); build it with scripts/build-vm-image.sh")
        manifest = json.loads(manifest_path.read_text())
        if manifest.get("arch") != arch:
            raise SandboxError(f"VM image {image} is for {manifest.get('arch')}, not {arch}")
        self._image_id = f"vm:{arch}:{manifest['key']}"
        self.arch = arch
        self.accel = options.accel or choose_accel(arch, qemu, image / "vmlinuz")
        self.time_scale = TCG_TIME_SCALE if self.accel == "tcg" else 1.0

        policy = self.workdir / "policy.json"
        policy.write_text(spec.policy_json())
        gateway_port = self.gateway_host_port = self._start_gateway(policy)
        self.timings["gateway_ready"] = time.monotonic() - t0

        self._token = secrets.token_urlsafe(32)
        token_file = self.workdir / "token"
        fd = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(self._token)
        env_lines = [f"SCREEN_WIDTH={int(spec.screen_width)}", f"SCREEN_HEIGHT={int(spec.screen_height)}"]
        if options.apps_file:
            env_lines.append(f"AGENT_APPS_FILE={options.apps_file}")
        if options.agent_args:
            args = " ".join(options.agent_args)
            if not re.fullmatch(r"[A-Za-z0-9 ._=-]{0,200}", args):
                raise SandboxError(f"agent_args may hold only letters, digits and ._=- : {args!r}")
            env_lines.append(f"AGENT_ARGS={args}")
        guest_env = "\n".join(env_lines) + "\n"
        (self.workdir / "guest.env").write_text(guest_env)
        self._machine = {"qemu": qemu, "arch": arch, "image": image, "manifest": manifest, "options": options,
                         "guest_env": guest_env, "screen": (int(spec.screen_width), int(spec.screen_height))}

        for attempt in range(3):
            agent_port = _free_port()
            self._launch_qemu(qemu, arch, image, manifest, options, agent_port, gateway_port)
            time.sleep(0.2)
            self._checkpoint()
            if self.qemu.poll() is None:
                break
            log = self._qemu_output()
            if "hostfwd" in log and attempt < 2:  # the port was taken in between: try another
                continue
            raise SandboxError(f"QEMU exited at start ({self.qemu.returncode}): {clean_lines(log.strip(), 2000)}")
        self.agent_host_port = agent_port
        self._agent_url = f"http://127.0.0.1:{agent_port}"
        self._qga = GuestAgentChannel(self.workdir / "qga.sock")
        self._qmp = QMPChannel(self.workdir / "qmp.sock")
        self.timings["vm_started"] = time.monotonic() - t0
        self._wait_ready(spec.ready_timeout, t0)

    def _write_owner(self) -> None:
        """Record who owns this sandbox and its processes (``owner.json``, shape in
        ``controller.sandbox.vm_process``), for ``reap_orphans``/``remove_all``."""
        owner = {
            "id": self.id,
            "labels": self._labels,
            "qemu_pid": self.qemu.pid if self.qemu else None,
            "gateway_pid": self.gateway.pid if self.gateway else None,
        }
        tmp = self.workdir / "owner.json.partial"
        tmp.write_text(json.dumps(owner))
        tmp.replace(self.workdir / "owner.json")

    def _start_gateway(self, policy: Path) -> int:
        """Start the gateway on a free loopback port, its control API on another (token: a 0600 file in
        the private directory); return the proxy's port once it accepts connections (the control API
        is up before it)."""
        for attempt in range(3):
            port, control_port = _free_port(), _free_port()
            self._launch_gateway(policy, port, control_port)
            if self._await_gateway(time.monotonic() + 30.0):
                return port
            if attempt == 2:
                raise SandboxError(f"gateway did not start on 127.0.0.1:{port}: its ports were taken three times")
        raise AssertionError("unreachable")

    def _launch_gateway(self, policy: Path, port: int, control_port: int) -> None:
        """Start the gateway process on 127.0.0.1:``port`` (control API on ``control_port``) without waiting
        for it (:meth:`_await_gateway` does); its control token is made once per sandbox."""
        python = gateway_python()
        if python is None:
            raise SandboxError("the gateway needs mitmproxy, fastapi and uvicorn: pip install '.[gateway]' fastapi "
                               "uvicorn into its own virtual environment and set DESKTOP_SANDBOX_GATEWAY_PYTHON, or "
                               "create build/gateway-venv (make deps)")
        token_file = self.workdir / "control-token"
        if not token_file.exists():
            fd = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_urlsafe(32))
        argv = [python, "-m", "controller.gateway", "serve", "--policy", str(policy),
                "--log", str(self.workdir / "decisions.jsonl"), "--listen", f"127.0.0.1:{port}",
                "--confdir", str(self.workdir / "mitmproxy"),
                "--control-listen", f"127.0.0.1:{control_port}", "--control-token-file", str(token_file)]
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
        self.gateway = subprocess.Popen(
            argv, cwd=self.workdir, env=env, stdin=subprocess.DEVNULL,
            stdout=open(self.workdir / "gateway.log", "ab"), stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self._gateway_ports = (port, control_port)
        self._write_owner()

    def _await_gateway(self, deadline: float) -> bool:
        """Wait (until ``deadline``, ``time.monotonic()``) for the gateway :meth:`_launch_gateway` started to
        accept connections; then set the control API's URL and token and return True. Return False when
        it exited because a port was taken (the caller tries others); raise SandboxError (its output,
        escaped) when it exited otherwise or did not answer in time."""
        port, control_port = self._gateway_ports
        assert self.gateway is not None
        while time.monotonic() < deadline:
            if self.gateway.poll() is not None:
                break
            self._checkpoint()
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1.0):
                    self.gateway_control_port = control_port
                    self._control_url = f"http://127.0.0.1:{control_port}"
                    self._control_token = (self.workdir / "control-token").read_text()
                    self.gateway_host_port = port
                    return True
            except OSError:
                time.sleep(0.05)  # poll interval while the gateway starts, bounded by the deadline
        log = self.logs("gateway", 30)
        _stop_group(self.gateway)
        if "address already in use" in log.lower():
            return False
        raise SandboxError(f"gateway did not start on 127.0.0.1:{port}; output:\n{clean_lines(log)}")

    def _launch_qemu(self, qemu: str, arch: str, image: Path, manifest: dict[str, Any], options: VMOptions,
                     agent_port: int, gateway_port: int, incoming: Path | None = None) -> None:
        """Start QEMU (:meth:`_qemu_argv`; ``incoming``: a migration file to load instead of booting)
        without waiting; record its command line and the shape of it (``_machine``)."""
        argv = self._qemu_argv(qemu, arch, image, manifest, options, agent_port, gateway_port, incoming)
        self._machine["argv"] = argv
        self._machine["shape"] = self._argv_shape(argv, image, agent_port, gateway_port)
        log = self.workdir / "qemu.log"
        self._qemu_log_offset = log.stat().st_size if log.exists() else 0
        self.qemu = subprocess.Popen(
            argv, cwd=self.workdir, stdin=subprocess.DEVNULL, stdout=open(log, "ab"), stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self._write_owner()

    def _qemu_output(self) -> str:
        """What the QEMU started last printed (``qemu.log`` from its start, at most 64 KiB)."""
        try:
            with open(self.workdir / "qemu.log", "rb") as fh:
                fh.seek(self._qemu_log_offset)
                return fh.read(64 * 1024).decode("utf-8", "replace")
        except OSError:
            return ""

    def _argv_shape(self, argv: list[str], image: Path, agent_port: int, gateway_port: int) -> list[str]:
        """``argv`` without this sandbox's own paths, id and ports (``vm_snapshot.argv_shape``)."""
        from controller.sandbox.vm_snapshot import argv_shape

        return argv_shape(argv, [
            (str(self.workdir), "{dir}"), (str(image), "{image}"), (self.id, "{id}"),
            (f"127.0.0.1:{agent_port}-", "127.0.0.1:{agent_port}-"),
            (f"127.0.0.1 {gateway_port}", "127.0.0.1 {gateway_port}"),
            (sys.executable, "{python}"), (str(FORWARDER), "{forwarder}"),
        ])

    def _qemu_argv(self, qemu: str, arch: str, image: Path, manifest: dict[str, Any], options: VMOptions,
                   agent_port: int, gateway_port: int, incoming: Path | None = None) -> list[str]:
        """The QEMU command line (argv, no shell). See the module docstring for each part; ``incoming``: a
        migration file (a machine snapshot) QEMU loads instead of booting."""
        forward = f"cmd:{sys.executable} -I -S {FORWARDER} 127.0.0.1 {gateway_port}"
        if any(c.isspace() for c in f"{sys.executable}{FORWARDER}"):
            raise SandboxError("the Python and forwarder paths must not contain spaces (QEMU guestfwd cmd:)")
        netdev = ",".join([
            "user", "id=net0", "restrict=on", "ipv6=off", "net=10.0.2.0/24",
            f"hostfwd=tcp:127.0.0.1:{agent_port}-{GUEST_ADDR}:{AGENT_PORT}",
            f"guestfwd=tcp:{GATEWAY_GUEST_ADDR}:{GATEWAY_PROXY_PORT}-{forward}",
        ])
        if arch == "amd64":
            machine = ["-machine", f"q35,accel={self.accel}"]
        else:
            machine = ["-machine", f"virt,accel={self.accel}" + (",highmem=off" if self.accel == "hvf" else "")]
        # Under TCG an emulated arm64 CPU with QEMU's own pointer-authentication algorithm (pauth-impdef)
        # boots and runs several times faster than with the architected one; the guest sees no difference.
        cpu = "host" if self.accel in ("kvm", "hvf") else "max,pauth-impdef=on" if arch == "arm64" else "max"
        return [
            qemu, "-name", f"desktop-sandbox-{self.id}",
            "-nodefaults", "-no-user-config", "-display", "none", "-monitor", "none",
            *machine, "-cpu", cpu, "-smp", str(options.cpus), "-m", str(options.memory_mib),
            # QEMU's seccomp filter (inherited by the guestfwd forwarders it spawns, which is why
            # elevateprivileges/spawn stay allowed: denying them kills the forwarder).
            "-sandbox", "on,obsolete=deny,resourcecontrol=deny",
            "-kernel", str(image / "vmlinuz"), "-initrd", str(image / "initrd.img"),
            "-append", manifest["cmdline"],
            "-drive", f"file={image / 'rootfs.raw'},format=raw,if=virtio,readonly=on,cache=unsafe",
            "-netdev", netdev, "-device", "virtio-net-pci,netdev=net0",
            "-fw_cfg", f"name={FW_CFG_PREFIX}/token,file={self.workdir / 'token'}",
            "-fw_cfg", f"name={FW_CFG_PREFIX}/env,file={self.workdir / 'guest.env'}",
            "-chardev", f"socket,id=qga0,path={self.workdir / 'qga.sock'},server=on,wait=off",
            "-qmp", f"unix:{self.workdir / 'qmp.sock'},server=on,wait=off",
            "-device", "virtio-serial-pci", "-device", "virtserialport,chardev=qga0,name=org.qemu.guest_agent.0",
            "-device", "virtio-rng-pci",
            "-serial", f"file:{self.console_log}",
            "-no-reboot",
        ] + (["-incoming", f"file:{incoming}"] if incoming is not None else [])

    def _wait_ready(self, timeout: float, t0: float) -> None:
        """Poll ``/livez`` then ``/v1/display`` through the host forward until both answer 200.

        Raises SandboxError (with the console's last lines) on timeout or when QEMU or the gateway exits.
        """
        wait_agent_ready(self.id, self._agent_url, self._token, timeout=timeout, check_alive=self._check_alive,
                         describe=lambda: f"accel {self.accel}; console:\n" + self.logs("desktop", 40),
                         timings=self.timings, t0=t0, first_delay=0.1)

    def _check_alive(self) -> None:
        """Raise SandboxError (with the console and QEMU/gateway output, each line escaped by
        :func:`controller.text.clean_lines`) when QEMU or the gateway exited; the
        interruption when a signal came (``_checkpoint``: this runs after every unanswered readiness poll)."""
        self._checkpoint()
        for name, proc in (("QEMU", self.qemu), ("gateway", self.gateway)):
            if proc is not None and proc.poll() is not None:
                qemu_log = (self.workdir / "qemu.log").read_text("utf-8", "replace")
                raise SandboxError(
                    f"{name} of sandbox {self.id} exited ({proc.returncode}); console:\n"
                    + clean_lines(self.logs("desktop", 40)) + "\nQEMU/gateway output:\n"
                    + clean_lines(qemu_log, 2000) + "\n" + clean_lines(self.logs("gateway", 20))
                )


def _bring_up_together(made: list[VMSandbox], source: Path, facts: dict[str, Any], timeout: float,
                       t0: float) -> None:
    """Run ``_finish_restored`` of every VM of one restore at once, one thread each (their guests run
    side by side; waiting for them in turn would add up each one's round trips). The calling thread
    watches for signals (``_checkpoint`` of the first); on a signal or a failure the others give up at
    their next step. Raises the first error that came (the others' giving up follows from it), or the
    interruption."""
    abandon = threading.Event()
    errors: list[BaseException] = []

    def work(sandbox: VMSandbox) -> None:
        try:
            sandbox._finish_restored(source, facts, timeout, t0)
        except BaseException as exc:  # noqa: BLE001 - handed to the calling thread
            errors.append(exc)
            abandon.set()

    for sandbox in made:
        sandbox._abandon = abandon
    threads = [threading.Thread(target=work, args=(sb,), name=f"restore-{sb.id}", daemon=True) for sb in made]
    try:
        for thread in threads:
            thread.start()
        try:
            while any(thread.is_alive() for thread in threads):
                for thread in threads:
                    thread.join(0.05)  # bounded wait for the workers, then a look at the signals
                Sandbox._checkpoint(made[0])  # the signals only: a worker's failure is raised below
        except BaseException:
            abandon.set()
            raise
        finally:
            for thread in threads:  # each gives up within its current wait (at most a guest round trip)
                thread.join(60.0)
    finally:
        for sandbox in made:
            sandbox._abandon = None
    if errors:
        raise errors[0]


# -- cleanup ------------------------------------------------------------------------------------------

def reap_orphans() -> list[str]:
    """Remove VM sandboxes whose starting process is provably dead and was this host's (a killed run);
    report the ones that cannot be proven dead (see ``Sandbox.reap_orphans``). Returns their ids."""
    return VMSandbox.reap_orphans()


def remove_all() -> list[str]:
    """Stop and delete every VM sandbox on this host (what ``desktop-sandbox down --all`` does for VMs).
    Returns what was removed (``<id>-qemu``, ``<id>-gateway``, ``<id>-dir``, ...)."""
    return VMSandbox.remove_all()
