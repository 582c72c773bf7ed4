"""The VM backend's host side before a start: the host's architecture, QEMU's binary and acceleration,
and the guest image (``scripts/build-vm-image.sh``: where it is, building it when missing)."""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from controller.sandbox import SandboxError
from controller.sandbox.vm_process import TMP_PREFIX, _stop_group
from controller.text import clean, clean_lines

REPO_ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO_ROOT / "scripts" / "build-vm-image.sh"

_ARCHES = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}


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
                time.sleep(0.1)  # poll interval while the build runs (ends when it exits)
        finally:
            _stop_group(proc, grace=0.5)
    _KVM_PROBE[key] = ok
    return ok


def image_arch(image: str | Path | None) -> str | None:
    """The architecture a built VM image directory is for (its manifest's ``arch``), or None when
    ``image`` is None or holds no readable manifest. Lets ``--image DIR`` of an arm64 disk start an arm64
    guest without also naming ``--arch``."""
    if image is None:
        return None
    try:
        arch = json.loads((Path(image) / "manifest.json").read_text()).get("arch")
    except (OSError, ValueError, AttributeError):
        return None
    return arch if arch in ("amd64", "arm64") else None


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
        raise SandboxError(f"build-vm-image.sh --print-dir failed: {clean_lines(out.stderr.strip())}")
    return Path(out.stdout.strip().splitlines()[-1])


def build_image(arch: str | None = None, *, force: bool = False) -> Path:
    """Build (or find up to date) the VM image for ``arch``; progress goes to this process's stdout,
    each line escaped (:func:`controller.text.clean`: the build runs Debian's package scripts).

    Returns the image directory. Raises SandboxError when the build fails (needs root, debootstrap).
    """
    argv = ["bash", str(BUILD_SCRIPT), "--arch", arch or host_arch()] + (["--force"] if force else [])
    proc = subprocess.run(argv, stdout=subprocess.PIPE, text=True, check=False)
    lines = proc.stdout.strip().splitlines()
    for line in lines[:-1]:
        print(clean(line, 2000), flush=True)
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
