"""Host processes and private directories of the VM backend: stopping a process group, and finding,
listing and removing VM sandboxes (QEMU, the host-side gateway, the guestfwd forwarders, the private
directory ``desktop-sandbox-vm-<id>-*`` under the temporary directory) from what is on this host.

Each sandbox's directory holds ``owner.json`` (written by ``VMSandbox``; at most :data:`OWNER_CAP`
bytes are read)::

    {"id": "dv-...", "labels": {LABEL: value, ...}, "qemu_pid": int | null, "gateway_pid": int | null}

``labels`` carry the same keys as a Docker sandbox's (``desktop-sandbox.sandbox``, ``.owner``,
``.owner-id``, ``.detached``), so reaping and ``down --all --label`` judge both backends alike. A
process belongs to a sandbox when its command line names the sandbox's directory (QEMU's and the
gateway's do); recorded pids are trusted only with that proof, so a reused pid is never signalled.
"""

from __future__ import annotations

import json
import glob
import os
import signal
import socket
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from controller.sandbox import LABEL_SANDBOX

TMP_PREFIX = "desktop-sandbox-vm-"
"""Prefix of a VM sandbox's private directory: ``<tmp>/desktop-sandbox-vm-<id>-<random>``."""
OWNER_CAP = 64 * 1024
"""Most bytes read from one ``owner.json``."""
CMDLINE_CAP = 64 * 1024
"""Most bytes read from one ``/proc/PID/cmdline``."""
STOP_WAIT_S = 5.0
"""Seconds a stopped process gets after SIGTERM, and again after SIGKILL, before cleanup goes on."""


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cmdline(pid: int) -> bytes:
    """Process ``pid``'s command line (NUL-separated, capped at :data:`CMDLINE_CAP`); b"" when gone."""
    try:
        with open(f"/proc/{int(pid)}/cmdline", "rb") as fh:
            return fh.read(CMDLINE_CAP)
    except OSError:
        return b""


def _cmdline_has(pid: int, marker: str) -> bool:
    """True when process ``pid``'s command line contains ``marker`` (guards against pid reuse)."""
    return marker.encode() in _cmdline(pid)


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


def sandbox_dirs(sandbox_id: str | None = None) -> list[Path]:
    """Private directories of VM sandboxes under the temporary directory (only ``sandbox_id``'s, when
    given), sorted."""
    pattern = f"{TMP_PREFIX}{glob.escape(sandbox_id)}-*" if sandbox_id else f"{TMP_PREFIX}dv-*"
    return sorted(p for p in Path(tempfile.gettempdir()).glob(pattern) if p.is_dir() and not p.is_symlink()
                  and (sandbox_id is None or _sandbox_id(p) == sandbox_id))


def _sandbox_id(path: Path) -> str:
    """The sandbox id in a directory name ``desktop-sandbox-vm-<id>-<random>``."""
    return path.name[len(TMP_PREFIX):].rsplit("-", 1)[0]


def read_owner(path: Path) -> dict[str, Any]:
    """``owner.json`` of a sandbox directory as a dict; {} when missing, unreadable, too big or not JSON."""
    try:
        with open(path / "owner.json", "rb") as fh:
            raw = fh.read(OWNER_CAP + 1)
        owner = json.loads(raw) if len(raw) <= OWNER_CAP else {}
    except (OSError, ValueError):
        return {}
    return owner if isinstance(owner, dict) else {}


def list_vm_sandboxes() -> dict[str, dict[str, str]]:
    """VM sandboxes on this host: ``{id: labels}``. A directory without a readable ``owner.json`` (another
    user's, or one being created) is listed with its id label only."""
    found: dict[str, dict[str, str]] = {}
    for path in sandbox_dirs():
        sandbox_id = _sandbox_id(path)
        labels = read_owner(path).get("labels")
        clean = {str(k): str(v) for k, v in labels.items()} if isinstance(labels, dict) else {}
        clean[LABEL_SANDBOX] = sandbox_id
        found.setdefault(sandbox_id, clean)
    return found


def processes_of(path: Path) -> list[int]:
    """Pids of this host's processes whose command line names ``path`` as a directory (QEMU, gateway)."""
    marker = (str(path) + "/").encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid() and marker in _cmdline(int(entry.name)):
            pids.append(int(entry.name))
    return pids


def _stop_pid(pid: int, path: Path) -> bool:
    """Stop process ``pid`` (its whole group when it leads one that is not ours): SIGTERM, then SIGKILL
    after :data:`STOP_WAIT_S`. Returns whether it was running. Signals nothing once ``pid`` no longer
    names ``path`` (exited, or the pid was reused)."""
    if not _cmdline_has(pid, str(path) + "/"):
        return False
    try:
        group = os.getpgid(pid)
    except ProcessLookupError:
        return False
    own_group = group == pid and group != os.getpgrp()
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(group, sig) if own_group else os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            return True
        deadline = time.monotonic() + STOP_WAIT_S
        while time.monotonic() < deadline and _cmdline_has(pid, str(path) + "/"):
            time.sleep(0.05)  # poll interval until the process is gone, bounded by STOP_WAIT_S
        if not _cmdline_has(pid, str(path) + "/"):
            break
    if own_group:
        try:  # children left in the group (guestfwd forwarders) once the leader is gone
            os.killpg(group, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    return True


def remove_dir(path: Path) -> list[str]:
    """Stop the processes of the sandbox in ``path`` (the recorded ones and any other naming ``path``)
    and delete ``path``. Returns what was removed: ``<id>-qemu``, ``<id>-gateway``, ``<id>-process``
    (another process naming the directory), ``<id>-dir``."""
    sandbox_id = _sandbox_id(path)
    owner = read_owner(path)
    roles = {owner.get("qemu_pid"): "qemu", owner.get("gateway_pid"): "gateway"}
    removed = []
    for pid in dict.fromkeys([p for p in roles if isinstance(p, int)] + processes_of(path)):
        if _stop_pid(pid, path):
            removed.append(f"{sandbox_id}-{roles.get(pid, 'process')}")
    if path.exists():
        shutil.rmtree(path, ignore_errors=True)
        if not path.exists():
            removed.append(f"{sandbox_id}-dir")
    return removed


def remove_vm_sandbox(sandbox_id: str) -> list[str]:
    """Stop and delete VM sandbox ``sandbox_id`` (every directory of that id); returns what was removed."""
    return [name for path in sandbox_dirs(sandbox_id) for name in remove_dir(path)]
