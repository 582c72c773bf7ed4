"""Container settings of the Docker backend shared by both roles: the hardening options, tmpfs mounts,
and the in-container program that writes a file atomically (see ``controller.sandbox.docker``)."""

from __future__ import annotations

from typing import Any


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
