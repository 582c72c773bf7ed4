"""Teardown of the VM backend: after Ctrl-C during start, nothing is left (no QEMU, no gateway, no
private directory). Runs a separate Python process that starts a VM sandbox and interrupts it once QEMU
runs, so it does not need a full boot. The command line: ``up --backend vm`` SIGKILLed mid-boot, and
``up --backend vm --detach`` (a full boot), each followed by ``down --all``, leave nothing."""

from __future__ import annotations

import os
import signal
import socket
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
        # the one whose QEMU boots: a test on another worker may make a directory of that name meanwhile
        (workdir,) = [d for d in new if _processes_mentioning(f"{d}/console.log")] or new
        assert _processes_mentioning(str(workdir)), "QEMU/gateway not running"
        child.send_signal(signal.SIGINT)
        out, _ = child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
    assert child.returncode == 130 and "interrupted" in out
    assert not workdir.exists()
    assert _processes_mentioning(str(workdir)) == []


# -- the command line: a killed `up`, a detached `up`, then `down --all` ----------------------------------

def _cli(*args: str, env: dict[str, str], **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "controller.cli", *args], cwd=ROOT, env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, **kwargs)


def _cli_env(tmp_path: Path) -> dict[str, str]:
    xdg = tmp_path / "xdg"
    xdg.mkdir(mode=0o700, exist_ok=True)
    return {**os.environ, "PYTHONPATH": str(ROOT), "XDG_RUNTIME_DIR": str(xdg)}


def _dirs_of(owner: str) -> list[Path]:
    """VM sandbox directories whose owner.json names ``owner`` (``desktop-sandbox.owner`` label)."""
    from controller.sandbox import LABEL_OWNER
    from controller.sandbox.vm_process import read_owner

    return [d for d in _sandbox_dirs() if read_owner(d).get("labels", {}).get(LABEL_OWNER) == owner]


def _down_all(owner: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``down --all`` narrowed to what ``owner`` started, so other sessions' VMs on this host survive."""
    return subprocess.run([sys.executable, "-m", "controller.cli", "down", "--all", "--label",
                           f"desktop-sandbox.owner={owner}"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120, stdin=subprocess.DEVNULL)


def _assert_gone(workdir: Path) -> None:
    assert not workdir.exists(), f"{workdir} left"
    assert _processes_mentioning(f"{workdir}/") == [], "QEMU or gateway of the sandbox left"


def test_down_all_after_a_killed_up(vm_image, tmp_path):
    """``up --backend vm`` SIGKILLed once QEMU runs leaves QEMU, the gateway and the directory (nothing
    in it could clean up); ``down --all`` stops and deletes all of it."""
    env = _cli_env(tmp_path)
    up = _cli("up", "--backend", "vm", "--image", str(vm_image), env=env)
    owner = f"{socket.gethostname()}:{up.pid}"
    try:
        deadline = time.monotonic() + 120
        workdir = None
        while workdir is None:  # until QEMU runs for its sandbox
            found = [d for d in _dirs_of(owner) if _processes_mentioning(f"{d}/console.log")]
            workdir = found[0] if found else None
            assert up.poll() is None, f"up exited ({up.returncode}): {up.stderr.read()[-2000:]}"
            assert time.monotonic() < deadline, "QEMU never ran for the sandbox of `up`"
            time.sleep(0.2)
        up.kill()
        up.wait(timeout=30)
        assert len(_processes_mentioning(f"{workdir}/")) >= 2, "SIGKILL cannot clean up: QEMU and gateway remain"
        done = _down_all(owner, env)
        assert done.returncode == 0, done.stderr
        assert "-qemu" in done.stderr and "-gateway" in done.stderr, done.stderr
        _assert_gone(workdir)
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()


def test_down_all_after_a_detached_up(vm_image, tmp_path):
    """``up --backend vm --detach`` exits 0 once the guest is ready, leaving QEMU and the gateway running
    (a later start does not reap them: detached); ``down --all`` removes them, the directory and the
    token file."""
    from controller.sandbox.vm import VMSandbox

    env = _cli_env(tmp_path)
    up = _cli("up", "--backend", "vm", "--detach", "--image", str(vm_image), env=env)
    owner = f"{socket.gethostname()}:{up.pid}"
    try:
        out, err = up.communicate(timeout=600)
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()
    assert up.returncode == 0, err[-3000:]
    sandbox_id = out.strip().splitlines()[-1]
    [workdir] = _dirs_of(owner)
    assert sandbox_id in workdir.name and _processes_mentioning(f"{workdir}/console.log")
    assert list((tmp_path / "xdg").rglob(f"{sandbox_id}.token"))
    assert sandbox_id not in VMSandbox.reap_orphans()
    done = _down_all(owner, env)
    assert done.returncode == 0, done.stderr
    _assert_gone(workdir)
    assert not list((tmp_path / "xdg").rglob("*.token")), "token file left"
