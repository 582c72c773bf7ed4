"""The desktop container's memory budget (controller/sandbox/docker_hardening.py): full tmpfs mounts and
/dev/shm must leave memory for the session's processes under the limit."""

from __future__ import annotations

import pytest

from controller.sandbox.docker import DockerOptions
from controller.sandbox.docker_hardening import (
    DESKTOP_TMPFS_MIB,
    MIN_PROCESS_MIB,
    check_memory_budget,
    desktop_tmpfs,
    size_bytes,
)


def test_default_options_leave_room_for_processes():
    options = DockerOptions()
    left = check_memory_budget(options.mem_limit, options.shm_size)
    assert left >= MIN_PROCESS_MIB
    assert left == 2048 - 256 - sum(DESKTOP_TMPFS_MIB.values())


def test_tmpfs_sizes_match_the_budget():
    mounts = desktop_tmpfs()
    assert set(mounts) == set(DESKTOP_TMPFS_MIB)
    for path, mib in DESKTOP_TMPFS_MIB.items():
        assert f"size={mib}m" in mounts[path]


@pytest.mark.parametrize("mem_limit,shm_size", [("2g", "512m"), ("1g", "64m"), ("1500m", "256m")])
def test_budget_that_would_oom_is_refused(mem_limit, shm_size):
    with pytest.raises(ValueError, match="MiB for processes"):
        check_memory_budget(mem_limit, shm_size)


@pytest.mark.parametrize("text,expected", [("512m", 512 << 20), ("2g", 2 << 30), ("1024", 1024), ("8K", 8192)])
def test_size_bytes(text, expected):
    assert size_bytes(text) == expected


@pytest.mark.parametrize("text", ["", "2 g", "1.5g", "-1m", "2t"])
def test_size_bytes_refuses_malformed(text):
    with pytest.raises(ValueError):
        size_bytes(text)


def test_the_browser_channel_profile_denies_the_kernel_surfaces_a_user_namespace_opens():
    """The desktop's seccomp profile for a task with the agent's chromium (controller/sandbox/seccomp.py):
    user namespaces are allowed, but mounts, setns, modules, BPF, io_uring, the keyring and raw packet /
    netfilter sockets are refused; a sandbox without the channel keeps Docker's default."""
    import json

    from controller.sandbox import SandboxSpec
    from controller.sandbox.docker import DockerOptions, _desktop_hardening
    from controller.sandbox.seccomp import desktop_profile

    profile = desktop_profile()
    denied = set(profile["syscalls"][0]["names"])
    assert {"mount", "setns", "init_module", "bpf", "io_uring_setup", "keyctl", "pivot_root", "open_tree"} <= denied
    assert not {"unshare", "clone", "clone3", "chroot"} & denied
    families = [rule["args"][0]["value"] for rule in profile["syscalls"][1:]]
    assert families == [17, 16]
    with_channel = _desktop_hardening(SandboxSpec(browser_channel=True), DockerOptions())["security_opt"]
    assert any(o.startswith("seccomp=") and json.loads(o[8:]) == profile for o in with_channel)
    assert not any(o.startswith("seccomp") for o in _desktop_hardening(SandboxSpec(), DockerOptions())["security_opt"])
