"""Teardown of the VM backend: after Ctrl-C during start, nothing is left (no QEMU, no gateway, no
private directory). Runs a separate Python process that starts a VM sandbox and interrupts it once QEMU
runs, so it does not need a full boot."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

_CHILD = """
import sys
from controller.sandbox import SandboxSpec
from controller.sandbox.vm import VMOptions, VMSandbox
print("starting", flush=True)
try:
    VMSandbox.start(SandboxSpec(ready_timeout=600), VMOptions(image=sys.argv[1]))
except KeyboardInterrupt:
    print("interrupted", flush=True)
    sys.exit(130)
"""


def _sandbox_dirs() -> set[Path]:
    return set(Path(tempfile.gettempdir()).glob("desktop-sandbox-vm-dv-*"))


def _processes_mentioning(marker: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker.encode() in (entry / "cmdline").read_bytes():
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


def test_ctrl_c_during_boot_leaves_nothing(vm_image):
    before = _sandbox_dirs()
    child = subprocess.Popen([sys.executable, "-c", _CHILD, str(vm_image)], cwd=ROOT,
                             stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        new: set[Path] = set()
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:  # until QEMU runs for this sandbox
            new = _sandbox_dirs() - before
            if new and any(_processes_mentioning(f"{d}/console.log") for d in new):
                break
            time.sleep(0.2)
        assert new, "the child never created its sandbox directory"
        (workdir,) = new
        assert _processes_mentioning(str(workdir)), "QEMU/gateway not running"
        child.send_signal(signal.SIGINT)
        out, _ = child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
    assert child.returncode == 130 and "interrupted" in out
    assert not workdir.exists()
    assert _processes_mentioning(str(workdir)) == []
