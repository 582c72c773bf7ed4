"""Container settings of the Docker backend: the hardening options of both roles, the desktop's
users, capabilities and tmpfs mounts, its memory budget, and the in-container program that writes a
file atomically (see ``controller.sandbox.docker``).

Users and capabilities (desktop). supervisord is the container's process, uid 0, with ``cap_drop=ALL``
plus exactly ``DESKTOP_CAP_ADD`` (SETUID, SETGID: start each program as its user; KILL: stop programs
of other users) and ``no-new-privileges``. A uid 0 process without CAP_DAC_OVERRIDE/CAP_CHOWN/CAP_FOWNER
is held to ordinary file permissions, and the root file system is read-only. The desktop programs
(Xvfb, openbox, the demo app, the apps the agent launches) run as ``sandbox`` (``DESKTOP_UID``), the
agent as ``agent`` (``AGENT_UID``), so the desktop user can neither read the agent's token nor signal,
trace or replace it; a uid 0 to non-0 switch clears every capability, so neither user holds any. The
desktop user's processes keep the bounding set (the three above), which ``no-new-privileges`` keeps
them from ever gaining. Without CAP_SETUID no process could start programs as two users; the rejected
alternatives (the agent as the desktop user, or the agent holding CAP_SETUID itself) leave the agent
open to the desktop user or give the agent the power to become root.

Memory budget (desktop, defaults; tmpfs and /dev/shm pages are charged to the container's memory
cgroup and, without swap, cannot be evicted, so filled tmpfs is memory the processes no longer have):

============================  =====  ============================================
what                          MiB    note
============================  =====  ============================================
memory limit (mem_limit)      2048   ``DockerOptions.mem_limit`` "2g", no swap
/home/sandbox                 512    the desktop user's files, browser profile
/home/browser                 128    the agent's chromium's profile (contract 8)
/tmp                          256    X socket and lock, supervisord's child logs
/var/tmp                      32
/run/desktop-sandbox          1      the agent's token and X cookie
/run/desktop-sandbox-control  1      supervisord's and the launch broker's sockets
/run/desktop-sandbox-browser  1      the proxy routes of the agent's chromium
/dev/shm (shm_size)           256    ``DockerOptions.shm_size`` "256m", browser
left for processes            861    Xvfb, openbox, agent, demo app, browsers, xterm
============================  =====  ============================================

With every tmpfs full a writer gets ENOSPC and the session keeps about 861 MiB (``MIN_PROCESS_MIB``
at least, checked by :func:`check_memory_budget`) for the browser and the rest of the session; the
sum may not exceed the limit, or a full tmpfs makes the kernel OOM-kill the session instead of the
writer failing.
"""

from __future__ import annotations

import re
from typing import Any

from controller.sandbox.guest import AGENT_UID, BROWSER_UID, DESKTOP_UID, GUEST_HOME, RUN_DIR

DESKTOP_CAP_ADD = ["SETUID", "SETGID", "KILL"]
"""The only capabilities the desktop container keeps (supervisord's and the launch broker's)."""
CONTROL_DIR = "/run/desktop-sandbox-control"
"""supervisord's control socket and pid file, the launch broker's socket: root, group agent, 0750."""
BROWSER_ROUTES_DIR = "/run/desktop-sandbox-browser"
"""The proxy routes the agent writes for its chromium (guest/chromium_policy.py): agent, 0755."""

DESKTOP_TMPFS_MIB = {GUEST_HOME: 512, "/home/browser": 128, "/tmp": 256, "/var/tmp": 32, RUN_DIR: 1, CONTROL_DIR: 1,
                    BROWSER_ROUTES_DIR: 1}
"""Size (MiB) of each tmpfs of the desktop container; see the memory budget above."""
MIN_PROCESS_MIB = 768
"""Least memory (MiB) that must stay for processes when every tmpfs and /dev/shm are full."""

_SIZE = re.compile(r"(\d+)([bkmg]?)", re.IGNORECASE)
_UNIT = {"": 1, "b": 1, "k": 1024, "m": 1024**2, "g": 1024**3}


def size_bytes(size: str) -> int:
    """Bytes of a Docker size string (``"512m"``, ``"2g"``, ``"1048576"``). Raises ValueError."""
    match = _SIZE.fullmatch(size.strip())
    if not match:
        raise ValueError(f"not a size: {size!r} (expected e.g. 512m or 2g)")
    return int(match.group(1)) * _UNIT[match.group(2).lower()]


def check_memory_budget(mem_limit: str, shm_size: str) -> int:
    """MiB left for processes when the desktop's tmpfs mounts and /dev/shm (``shm_size``) are full under
    ``mem_limit``. Raises ValueError when that is less than ``MIN_PROCESS_MIB`` (a full tmpfs would
    then OOM-kill the session) or a size is malformed."""
    left = (size_bytes(mem_limit) - size_bytes(shm_size)) // 1024**2 - sum(DESKTOP_TMPFS_MIB.values())
    if left < MIN_PROCESS_MIB:
        raise ValueError(
            f"mem_limit {mem_limit} leaves {left} MiB for processes after {sum(DESKTOP_TMPFS_MIB.values())} MiB "
            f"of tmpfs and {shm_size} of /dev/shm; at least {MIN_PROCESS_MIB} MiB are needed"
        )
    return left


def desktop_tmpfs() -> dict[str, str]:
    """The desktop container's tmpfs mounts (path -> mount options): the home (sandbox, 0750: group
    ``sandbox``, i.e. the agent, reads it), /tmp and /var/tmp (1777), the agent's directory (agent, 0700),
    the control directory (root, group agent, 0750) and the agent's chromium's routes (agent, 0755: its
    chromium reads them, only the agent writes them)."""
    mib = DESKTOP_TMPFS_MIB
    return {
        "/tmp": _tmpfs(f"{mib['/tmp']}m", DESKTOP_UID, "1777"),
        GUEST_HOME: _tmpfs(f"{mib[GUEST_HOME]}m", DESKTOP_UID, "0750"),
        "/home/browser": _tmpfs(f"{mib['/home/browser']}m", BROWSER_UID, "0700"),
        "/var/tmp": _tmpfs(f"{mib['/var/tmp']}m", DESKTOP_UID, "1777"),
        RUN_DIR: _tmpfs(f"{mib[RUN_DIR]}m", AGENT_UID),
        CONTROL_DIR: _tmpfs(f"{mib[CONTROL_DIR]}m", 0, "0750", gid=AGENT_UID),
        BROWSER_ROUTES_DIR: _tmpfs(f"{mib[BROWSER_ROUTES_DIR]}m", AGENT_UID, "0755"),
    }


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


def _hardening(user: str, tmpfs: dict[str, str], mem_limit: str, pids_limit: int,
               cap_add: list[str] | None = None) -> dict[str, Any]:
    """Container options common to both roles (see the module docstring); ``cap_add``: the capabilities
    kept on top of ``cap_drop=ALL`` (none unless given)."""
    return {
        "user": user,
        "cap_drop": ["ALL"],
        **({"cap_add": list(cap_add)} if cap_add else {}),
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


def _tmpfs(size: str, uid: int, mode: str = "0700", exec_: bool = False, gid: int | None = None) -> str:
    """tmpfs mount options: ``size`` (Docker size string), owner ``uid`` and group ``gid`` (default
    ``uid``), ``mode`` (octal string), nosuid, nodev and, unless ``exec_``, noexec."""
    opts = ["rw", "nosuid", "nodev", f"size={size}", f"uid={uid}", f"gid={uid if gid is None else gid}", f"mode={mode}"]
    if not exec_:
        opts.append("noexec")
    return ",".join(opts)
