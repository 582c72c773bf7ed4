"""VM backend: the guest desktop as a QEMU virtual machine, its gateway as a host process.

The same guest as the Docker backend (provisioned by ``images/provision.sh``, the same supervisord
session, agent and browser policies), built into a disk image by ``scripts/build-vm-image.sh`` and booted
with QEMU's direct kernel boot. Per sandbox (id ``dv-<8 hex>``), in a private temporary directory
``desktop-sandbox-vm-<id>-*`` (mode 0700):

* the gateway: ``python -m controller.gateway serve --policy policy.json --log decisions.jsonl
  --listen 127.0.0.1:<port>`` on the host's loopback, in its own process group.
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
  root unit copies it to ``/run/desktop-sandbox/agent-token`` (owner ``sandbox``, 0400) and the agent
  starts once it exists. It is never on the kernel command line.
* ``exec_in_guest`` (the network audit's probes) goes through qemu-guest-agent on a virtio-serial port
  whose host end is a unix socket in the private directory; commands run as ``sandbox`` via ``runuser``.

Readiness: ``/livez`` and then ``/v1/display`` answer through the host forward. Teardown stops QEMU (and
the forwarders it spawned), the gateway, and deletes the directory, also after an exception, Ctrl-C or
SIGTERM; ``reap_orphans`` (run at every start) and ``remove_all`` clean up after killed runs.

Acceleration: KVM on Linux when ``/dev/kvm`` is usable and the guest's architecture is the host's, HVF on
macOS likewise, otherwise plain emulation (TCG). ``DESKTOP_SANDBOX_VM_ACCEL`` (kvm | hvf | tcg) overrides.

Rule source: ARCHITECTURE.md, "Isolation model", "VM path".
"""

from __future__ import annotations

import base64
import json
import os
import platform
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from controller.gateway import gateway_python
from controller.sandbox import (
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

REPO_ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO_ROOT / "scripts" / "build-vm-image.sh"
FORWARDER = Path(__file__).resolve().parent / "vm_forward.py"

GUEST_ADDR = "10.0.2.15"
"""The guest's address on QEMU's user-mode network (static, see scripts/vm/guest/10-sandbox.network)."""
GATEWAY_GUEST_ADDR = "10.0.2.100"
"""The gateway's address as the guest sees it (``gateway`` in the guest's /etc/hosts)."""
AGENT_PORT = 8000
"""The agent's port in the guest (the Docker backend's ``AGENT_PORT``)."""
GATEWAY_PROXY_PORT = 3128
"""The proxy port the guest uses (the Docker backend's ``GATEWAY_PROXY_PORT``, images/firefox/policies.json)."""
GUEST_USER = "sandbox"
GUEST_PATH = "/opt/desktop-sandbox/bin:/usr/local/bin:/usr/bin:/bin"
GUEST_ENV = {
    "PATH": GUEST_PATH,
    "HOME": "/home/sandbox",
    "LANG": "C.UTF-8",
    "DISPLAY": ":99",
    "HTTP_PROXY": f"http://gateway:{GATEWAY_PROXY_PORT}",
    "HTTPS_PROXY": f"http://gateway:{GATEWAY_PROXY_PORT}",
    "http_proxy": f"http://gateway:{GATEWAY_PROXY_PORT}",
    "https_proxy": f"http://gateway:{GATEWAY_PROXY_PORT}",
    "NO_PROXY": "127.0.0.1,localhost",
    "no_proxy": "127.0.0.1,localhost",
}
"""Environment of commands run by ``exec_in_guest`` (as the session's, see desktop-sandbox.service)."""
TMP_PREFIX = "desktop-sandbox-vm-"
FW_CFG_PREFIX = "opt/desktop-sandbox"

_ARCHES = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}



TCG_TIME_SCALE = 5.0
"""``Sandbox.time_scale`` of a guest under plain emulation (accel ``tcg``): measured here, Firefox and
the desktop react 3-5 times slower than in a container (boot to ready 70-100 s against 4-5 s), more
under host load; 5 keeps the offline exercise's deadlines meaningful without making a stuck run wait
long."""

def host_arch() -> str:
    """The host's architecture in Debian terms: ``amd64`` or ``arm64`` (others raise SandboxError)."""
    machine = platform.machine().lower()
    if machine not in _ARCHES:
        raise SandboxError(f"no VM guest for host architecture {machine}")
    return _ARCHES[machine]


def choose_accel(arch: str, qemu: str | None = None, kernel: Path | None = None) -> str:
    """``kvm`` | ``hvf`` | ``tcg`` for a guest of ``arch`` on this host (env DESKTOP_SANDBOX_VM_ACCEL wins).

    KVM is chosen only when ``/dev/kvm`` is usable *and* a probe boot of ``kernel`` with ``qemu`` prints
    on the console within a few seconds (nested KVM can exist and still not run guests); otherwise TCG.
    """
    forced = os.environ.get("DESKTOP_SANDBOX_VM_ACCEL", "").strip().lower()
    if forced:
        if forced not in ("kvm", "hvf", "tcg"):
            raise SandboxError(f"DESKTOP_SANDBOX_VM_ACCEL must be kvm, hvf or tcg, not {forced!r}")
        return forced
    if arch != host_arch():
        return "tcg"
    if sys.platform.startswith("linux") and os.access("/dev/kvm", os.R_OK | os.W_OK):
        if qemu is None or kernel is None or _kvm_boots(qemu, kernel):
            return "kvm"
        return "tcg"
    if sys.platform == "darwin":
        return "hvf"
    return "tcg"


_KVM_PROBE: dict[tuple[str, str], bool] = {}


def _kvm_boots(qemu: str, kernel: Path, timeout: float = 6.0) -> bool:
    """Whether a KVM guest runs here: boot ``kernel`` (no disk) and wait for its first console output.

    Cached per process. The probe VM has no network and no disk; it is killed at once.
    """
    key = (qemu, str(kernel))
    if key in _KVM_PROBE:
        return _KVM_PROBE[key]
    with tempfile.TemporaryDirectory(prefix=TMP_PREFIX + "probe-") as tmp:
        console = Path(tmp) / "console.log"
        proc = subprocess.Popen(
            [qemu, "-nodefaults", "-no-user-config", "-display", "none", "-machine", "q35,accel=kvm"
             if "x86_64" in Path(qemu).name else "virt,accel=kvm", "-cpu", "host", "-m", "256",
             "-kernel", str(kernel), "-append", "console=ttyS0 console=ttyAMA0 panic=-1",
             "-serial", f"file:{console}", "-no-reboot", "-net", "none"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        ok = False
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                if console.exists() and console.stat().st_size > 0:
                    ok = True
                    break
                if proc.poll() is not None:
                    break
                time.sleep(0.1)
        finally:
            _stop_group(proc, grace=0.5)
    _KVM_PROBE[key] = ok
    return ok


def qemu_binary(arch: str) -> str | None:
    """Path of ``qemu-system-x86_64`` / ``qemu-system-aarch64`` for ``arch``, or None when not installed."""
    return shutil.which("qemu-system-x86_64" if arch == "amd64" else "qemu-system-aarch64")


def image_dir(arch: str | None = None) -> Path:
    """Where the VM image for the current inputs lives (built or not): ``$DESKTOP_SANDBOX_VM_IMAGE``, else
    the directory ``scripts/build-vm-image.sh --print-dir`` names (a cache keyed by a hash of the inputs).
    """
    env = os.environ.get("DESKTOP_SANDBOX_VM_IMAGE")
    if env:
        return Path(env)
    arch = arch or host_arch()
    if not BUILD_SCRIPT.exists():
        raise SandboxError(f"{BUILD_SCRIPT} not found; set DESKTOP_SANDBOX_VM_IMAGE to a built image directory")
    out = subprocess.run(["bash", str(BUILD_SCRIPT), "--print-dir", "--arch", arch],
                         capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SandboxError(f"build-vm-image.sh --print-dir failed: {out.stderr.strip()}")
    return Path(out.stdout.strip().splitlines()[-1])


def build_image(arch: str | None = None, *, force: bool = False) -> Path:
    """Build (or find up to date) the VM image for ``arch``; progress goes to this process's stdout.

    Returns the image directory. Raises SandboxError when the build fails (needs root, debootstrap).
    """
    argv = ["bash", str(BUILD_SCRIPT), "--arch", arch or host_arch()] + (["--force"] if force else [])
    proc = subprocess.run(argv, stdout=subprocess.PIPE, text=True, check=False)
    lines = proc.stdout.strip().splitlines()
    for line in lines[:-1]:
        print(line, flush=True)
    if proc.returncode != 0 or not lines:
        raise SandboxError(f"VM image build failed (exit {proc.returncode})")
    return Path(lines[-1])


def ensure_image(say: Any = print, arch: str | None = None) -> Path:
    """The VM image directory for the current inputs, building it first when missing (minutes).

    ``say(text)`` reports what happens. ``DESKTOP_SANDBOX_VM_IMAGE`` names a prebuilt image instead.
    Raises SandboxError when the build fails.
    """
    path = image_dir(arch)
    if (path / "manifest.json").exists():
        return path
    say(f"VM image {path.name} missing: building it (scripts/build-vm-image.sh)")
    return build_image(arch)


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
    """

    image: Path | None = None
    arch: str | None = None
    accel: str | None = None
    memory_mib: int = 2048
    cpus: int = 2
    apps_file: str = ""
    agent_args: list[str] = field(default_factory=list)
    keep_dir: bool = False


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cmdline_has(pid: int, marker: str) -> bool:
    """True when process ``pid``'s command line contains ``marker`` (guards against pid reuse)."""
    try:
        return marker.encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def _stop_group(proc: subprocess.Popen | None, grace: float = 5.0) -> None:
    """SIGTERM the process's group, wait up to ``grace`` s, then SIGKILL the group; reap the process."""
    if proc is None:
        return
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            proc.wait(timeout=wait)
            break
        except subprocess.TimeoutExpired:
            continue
    try:  # children left in the group (guestfwd forwarders) once the leader is gone
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


class GuestAgentChannel:
    """Client of qemu-guest-agent over its virtio-serial port (host end: a unix socket).

    Speaks the QGA JSON protocol: ``guest-sync-delimited`` to resynchronise, then one command at a time.
    Used only for ``guest-exec``/``guest-exec-status``. Thread-safe (one lock).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._sock: socket.socket | None = None
        self._buf = b""
        self._lock = threading.Lock()

    def close(self) -> None:
        """Close the connection (the guest side is unaffected)."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        self._buf = b""

    def _readline(self, deadline: float) -> bytes:
        assert self._sock is not None
        while b"\n" not in self._buf:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("guest agent did not answer")
            self._sock.settimeout(remaining)
            chunk = self._sock.recv(65536)
            if not chunk:
                raise ConnectionError("guest agent channel closed")
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        return line

    def _sync(self, deadline: float) -> None:
        """Connect if needed and discard stale output until a fresh sync id comes back."""
        while True:
            if self._sock is None:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sock.connect(str(self.path))
                self._sock = sock
            sync_id = secrets.randbelow(2**31)
            msg = {"execute": "guest-sync-delimited", "arguments": {"id": sync_id}}
            self._sock.sendall(json.dumps(msg).encode() + b"\n")
            attempt_deadline = min(deadline, time.monotonic() + 3.0)
            try:
                while True:
                    line = self._readline(attempt_deadline).lstrip(b"\xff").strip()
                    if not line:
                        continue
                    try:
                        reply = json.loads(line)
                    except json.JSONDecodeError:
                        continue
                    if reply.get("return") == sync_id:
                        return
            except TimeoutError:
                if time.monotonic() >= deadline:
                    raise
                self._buf = b""  # guest agent not up yet (or a reply lost): resend

    def command(self, name: str, arguments: dict[str, Any] | None = None, *, timeout: float = 30.0) -> Any:
        """Run one QGA command and return its ``return`` value.

        Raises SandboxError on an ``error`` reply, a closed channel, or no answer within ``timeout`` s.
        """
        deadline = time.monotonic() + timeout
        with self._lock:
            try:
                if self._sock is None:
                    self._sync(deadline)
                msg: dict[str, Any] = {"execute": name}
                if arguments is not None:
                    msg["arguments"] = arguments
                assert self._sock is not None
                self._sock.sendall(json.dumps(msg).encode() + b"\n")
                while True:
                    line = self._readline(deadline).lstrip(b"\xff").strip()
                    if not line:
                        continue
                    reply = json.loads(line)
                    if "error" in reply:
                        raise SandboxError(f"guest agent {name}: {reply['error'].get('desc', reply['error'])}")
                    if "return" in reply:
                        return reply["return"]
            except (OSError, TimeoutError, ConnectionError, json.JSONDecodeError) as exc:
                self.close()
                raise SandboxError(f"guest agent {name}: {type(exc).__name__}: {exc}") from exc

    def wait_ready(self, timeout: float) -> None:
        """Block until the guest agent answers a sync (raises SandboxError after ``timeout`` s)."""
        with self._lock:
            try:
                self._sync(time.monotonic() + timeout)
            except (OSError, TimeoutError, ConnectionError) as exc:
                self.close()
                raise SandboxError(f"guest agent not answering: {exc}") from exc


class VMSandbox(Sandbox):
    """A running VM sandbox. Create with ``VMSandbox.start``; see the module docstring."""

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
        self._qga: GuestAgentChannel | None = None
        self._closed = False
        self._keep_dir = False
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
        reap_orphans()
        sandbox_id = f"dv-{secrets.token_hex(4)}"
        workdir = Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{sandbox_id}-"))
        sandbox = cls(sandbox_id, workdir)
        sandbox._keep_dir = options.keep_dir
        sandbox._start_or_close(lambda: sandbox._start(spec, options))
        return sandbox

    def exec_in_guest(self, argv: Sequence[str], *, timeout: float | None = None) -> ExecResult:
        if self._qga is None or self.qemu is None or self.qemu.poll() is not None:
            raise SandboxError(f"VM of sandbox {self.id} is not running")
        inner = with_timeout(argv, timeout)
        env = [f"{k}={v}" for k, v in GUEST_ENV.items()]
        args = {
            "path": "/usr/sbin/runuser",
            "arg": ["-u", GUEST_USER, "--", "/usr/bin/env", "-i", *env, *inner],
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
            time.sleep(delay)
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
            _stop_group(self.qemu)
            _stop_group(self.gateway)
            if not self._keep_dir:
                shutil.rmtree(self.workdir, ignore_errors=True)
            self._closed = True

    # -- start sequence -----------------------------------------------------------------------------

    def _start(self, spec: SandboxSpec, options: VMOptions) -> None:
        t0 = time.monotonic()
        arch = options.arch or host_arch()
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
        self.accel = options.accel or choose_accel(arch, qemu, image / "vmlinuz")
        self.time_scale = TCG_TIME_SCALE if self.accel == "tcg" else 1.0

        self._write_owner()
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
        (self.workdir / "guest.env").write_text("\n".join(env_lines) + "\n")

        for attempt in range(3):
            agent_port = _free_port()
            argv = self._qemu_argv(qemu, arch, image, manifest, options, agent_port, gateway_port)
            self.qemu = subprocess.Popen(
                argv, cwd=self.workdir, stdin=subprocess.DEVNULL,
                stdout=open(self.workdir / "qemu.log", "ab"), stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            self._write_owner()
            time.sleep(0.2)
            self._checkpoint()
            if self.qemu.poll() is None:
                break
            log = (self.workdir / "qemu.log").read_text("utf-8", "replace")
            if "hostfwd" in log and attempt < 2:  # the port was taken in between: try another
                continue
            raise SandboxError(f"QEMU exited at start ({self.qemu.returncode}): {log.strip()[-2000:]}")
        self.agent_host_port = agent_port
        self._agent_url = f"http://127.0.0.1:{agent_port}"
        self._qga = GuestAgentChannel(self.workdir / "qga.sock")
        self.timings["vm_started"] = time.monotonic() - t0
        self._wait_ready(spec.ready_timeout, t0)

    def _write_owner(self) -> None:
        """Record who owns this sandbox's processes, for ``reap_orphans``/``remove_all``."""
        owner = {
            "id": self.id,
            "host": socket.gethostname(),
            "owner_pid": os.getpid(),
            "qemu_pid": self.qemu.pid if self.qemu else None,
            "gateway_pid": self.gateway.pid if self.gateway else None,
        }
        tmp = self.workdir / "owner.json.partial"
        tmp.write_text(json.dumps(owner))
        tmp.replace(self.workdir / "owner.json")

    def _start_gateway(self, policy: Path) -> int:
        """Start the gateway on a free loopback port; return the port once it accepts connections."""
        python = gateway_python()
        if python is None:
            raise SandboxError("the gateway needs mitmproxy: pip install '.[gateway]' into its own virtual "
                               "environment and set DESKTOP_SANDBOX_GATEWAY_PYTHON, or create build/gateway-venv")
        for attempt in range(3):
            port = _free_port()
            argv = [python, "-m", "controller.gateway", "serve", "--policy", str(policy),
                    "--log", str(self.workdir / "decisions.jsonl"), "--listen", f"127.0.0.1:{port}",
                    "--confdir", str(self.workdir / "mitmproxy")]
            env = dict(os.environ)
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
            self.gateway = subprocess.Popen(
                argv, cwd=self.workdir, env=env, stdin=subprocess.DEVNULL,
                stdout=open(self.workdir / "gateway.log", "ab"), stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            self._write_owner()
            deadline = time.monotonic() + 30.0
            while time.monotonic() < deadline:
                if self.gateway.poll() is not None:
                    break
                self._checkpoint()
                try:
                    with socket.create_connection(("127.0.0.1", port), timeout=1.0):
                        return port
                except OSError:
                    time.sleep(0.05)
            log = self.logs("gateway", 30)
            _stop_group(self.gateway)
            if attempt == 2 or "address already in use" not in log.lower():
                raise SandboxError(f"gateway did not start on 127.0.0.1:{port}; output:\n{log}")
        raise AssertionError("unreachable")

    def _qemu_argv(self, qemu: str, arch: str, image: Path, manifest: dict[str, Any], options: VMOptions,
                   agent_port: int, gateway_port: int) -> list[str]:
        """The QEMU command line (argv, no shell). See the module docstring for each part."""
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
        cpu = "host" if self.accel in ("kvm", "hvf") else "max"
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
            "-device", "virtio-serial-pci", "-device", "virtserialport,chardev=qga0,name=org.qemu.guest_agent.0",
            "-device", "virtio-rng-pci",
            "-serial", f"file:{self.console_log}",
            "-no-reboot",
        ]

    def _wait_ready(self, timeout: float, t0: float) -> None:
        """Poll ``/livez`` then ``/v1/display`` through the host forward until both answer 200.

        Raises SandboxError (with the console's last lines) on timeout or when QEMU or the gateway exits.
        """
        wait_agent_ready(self.id, self._agent_url, self._token, timeout=timeout, check_alive=self._check_alive,
                         describe=lambda: f"accel {self.accel}; console:\n" + self.logs("desktop", 40),
                         timings=self.timings, t0=t0, first_delay=0.1)

    def _check_alive(self) -> None:
        """Raise SandboxError (with the console and QEMU/gateway output) when QEMU or the gateway exited; the
        interruption when a signal came (``_checkpoint``: this runs after every unanswered readiness poll)."""
        self._checkpoint()
        for name, proc in (("QEMU", self.qemu), ("gateway", self.gateway)):
            if proc is not None and proc.poll() is not None:
                raise SandboxError(
                    f"{name} of sandbox {self.id} exited ({proc.returncode}); console:\n"
                    + self.logs("desktop", 40) + "\nQEMU/gateway output:\n"
                    + (self.workdir / "qemu.log").read_text("utf-8", "replace")[-2000:]
                    + self.logs("gateway", 20)
                )


# -- cleanup ------------------------------------------------------------------------------------------

def _sandbox_dirs() -> list[Path]:
    return sorted(Path(tempfile.gettempdir()).glob(f"{TMP_PREFIX}dv-*"))


def _remove_dir(path: Path) -> str | None:
    """Stop the processes recorded in ``path``/owner.json (if still theirs) and delete ``path``."""
    try:
        owner = json.loads((path / "owner.json").read_text())
    except (OSError, json.JSONDecodeError):
        owner = {}
    sandbox_id = owner.get("id", path.name)
    for key in ("qemu_pid", "gateway_pid"):
        pid = owner.get(key)
        if isinstance(pid, int) and pid_alive(pid) and _cmdline_has(pid, str(path)):
            for sig in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.killpg(pid, sig)
                except (ProcessLookupError, PermissionError):
                    break
                for _ in range(50):
                    if not pid_alive(pid):
                        break
                    time.sleep(0.1)
    shutil.rmtree(path, ignore_errors=True)
    return sandbox_id


def reap_orphans() -> list[str]:
    """Remove VM sandboxes of this host whose starting process is gone (a killed run). Returns their ids."""
    host = socket.gethostname()
    reaped = []
    for path in _sandbox_dirs():
        try:
            owner = json.loads((path / "owner.json").read_text())
        except (OSError, json.JSONDecodeError):
            continue  # being created right now, or not ours
        if owner.get("host") != host or pid_alive(int(owner.get("owner_pid", 0) or 0)):
            continue
        removed = _remove_dir(path)
        if removed:
            reaped.append(removed)
    return reaped


def remove_all() -> list[str]:
    """Stop and delete every VM sandbox on this host (what ``desktop-sandbox down --all`` does for VMs)."""
    return [r for r in (_remove_dir(p) for p in _sandbox_dirs()) if r]
