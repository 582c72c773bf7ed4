"""The desktop container's seccomp profile when the task drives the agent's chromium.

Chromium's own sandbox (the layer that keeps a page's renderer away from the rest of the guest) starts
each renderer in new user, PID and network namespaces. Docker's default seccomp profile refuses
``unshare``/``clone`` with ``CLONE_NEWUSER`` to a container without CAP_SYS_ADMIN, and Debian ships no
setuid sandbox helper that ``no-new-privileges`` would let run, so under the default profile chromium
can only start with ``--no-sandbox``, which this project never passes (docs/ARCHITECTURE.md, contract 8).

:func:`desktop_profile` is the profile such a desktop container gets instead (``SandboxSpec.
browser_channel``; every other sandbox keeps Docker's default): every system call is allowed except
those in :data:`DENIED`, which fail with EPERM. The list names the kernel surfaces a container process
has no business with: kernel modules and kexec, mounts and the new mount API (so a user namespace, which
would hold CAP_SYS_ADMIN over its own mounts, can make none), ``setns``, the keyring, BPF, perf events,
io_uring, userfaultfd, reading or writing other processes' memory (``process_vm_*``, ``kcmp``,
``pidfd_getfd``), file handles, clocks, swap, reboot, quotas, accounting, and the obsolete calls, and raw packet and netfilter
sockets (:data:`SOCKET_RULES`: a user namespace's own network namespace would grant them). What it
adds to the container's reach over Docker's default is the namespace creation chromium needs and
``chroot`` (chromium's sandbox chroots each renderer into an empty directory inside its namespace).

Threat note: user namespaces widen the kernel surface a process can reach (namespaced capabilities).
The capability bounding set (SETUID, SETGID, KILL), ``no-new-privileges`` and the denials above still
hold inside one. The VM backend needs none of this: its guest kernel admits user namespaces itself.
"""

from __future__ import annotations

import json
from typing import Any

DENIED = (
    # kernel modules, kexec, reboot, swap, accounting
    "init_module", "finit_module", "delete_module", "create_module", "query_module", "get_kernel_syms",
    "kexec_load", "kexec_file_load", "reboot", "swapon", "swapoff", "acct",
    # mounts, the new mount API, joining namespaces
    "mount", "umount", "umount2", "pivot_root", "mount_setattr", "move_mount", "open_tree", "fsopen",
    "fsconfig", "fsmount", "fspick", "setns",
    # keyring, BPF, perf, io_uring, userfaultfd, fanotify
    "add_key", "request_key", "keyctl", "bpf", "perf_event_open", "io_uring_setup", "io_uring_enter",
    "io_uring_register", "userfaultfd", "fanotify_init",
    # other processes' memory and descriptors, file handles
    "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd", "name_to_handle_at", "open_by_handle_at",
    # clocks, host names, the kernel log, I/O ports, quotas
    "settimeofday", "stime", "clock_settime", "clock_settime64", "clock_adjtime", "clock_adjtime64", "adjtimex",
    "sethostname", "setdomainname", "syslog", "iopl", "ioperm", "quotactl", "quotactl_fd",
    # obsolete or unused
    "uselib", "ustat", "sysfs", "_sysctl", "nfsservctl", "vm86", "vm86old", "lookup_dcookie", "vhangup",
    "afs_syscall", "tuxcall", "security", "getpmsg", "putpmsg",
)
"""System calls refused (EPERM) by :func:`desktop_profile`."""

AF_NETLINK, AF_PACKET, NETLINK_NETFILTER = 16, 17, 12
SOCKET_RULES = (
    # raw packet sockets (CAP_NET_RAW, which a user namespace grants over its own network namespace)
    {"names": ["socket"], "action": "SCMP_ACT_ERRNO", "errnoRet": 1,
     "args": [{"index": 0, "value": AF_PACKET, "op": "SCMP_CMP_EQ"}]},
    # nf_tables / netfilter configuration (likewise granted there; a frequent home of kernel bugs)
    {"names": ["socket"], "action": "SCMP_ACT_ERRNO", "errnoRet": 1,
     "args": [{"index": 0, "value": AF_NETLINK, "op": "SCMP_CMP_EQ"},
              {"index": 2, "value": NETLINK_NETFILTER, "op": "SCMP_CMP_EQ"}]},
)
"""Sockets refused (EPERM) by :func:`desktop_profile`: chromium needs neither."""

ARCHITECTURES = ("SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32", "SCMP_ARCH_AARCH64", "SCMP_ARCH_ARM")
"""The ABIs the profile covers (amd64 and arm64 hosts with their compat ABIs)."""

EPERM = 1


def desktop_profile() -> dict[str, Any]:
    """The profile as Docker's seccomp JSON (``{"defaultAction", "architectures", "syscalls"}``)."""
    return {
        "defaultAction": "SCMP_ACT_ALLOW",
        "architectures": list(ARCHITECTURES),
        "syscalls": [{"names": list(DENIED), "action": "SCMP_ACT_ERRNO", "errnoRet": EPERM}, *SOCKET_RULES],
    }


def security_opt() -> str:
    """The ``security_opt`` entry that installs :func:`desktop_profile` (``seccomp=<JSON>``)."""
    return "seccomp=" + json.dumps(desktop_profile(), separators=(",", ":"))
