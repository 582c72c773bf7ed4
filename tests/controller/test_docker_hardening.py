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
