"""The conformance suite against the agent in a VM sandbox: the shared start of such a VM, and the
``--conformance-desktop`` factory the suite takes (the adapters' path, as
``tests.docker._conformance:conformance_desktop`` is for Docker)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

from tests.docker._conformance import CONFORMANCE_APPS, WORKDIR, ContainerDesktop, sandbox_desktop

READY_TIMEOUT_S = float(os.environ.get("DESKTOP_SANDBOX_VM_READY_TIMEOUT", "420"))
"""Seconds a conformance VM has to become ready, before the sandbox's ``time_scale`` (the backend
scales readiness for a guest under emulation)."""


def start_conformance_vm(image: Path | None = None, arch: str | None = None):
    """A started ``VMSandbox`` for the conformance suite (deny-all; the probe allowlisted; the short wait
    cap and busy timeout the suite's local agent has; :data:`WORKDIR` made under the agent's file root)
    from ``image`` (default: the built image of ``arch``, default the host's). The caller closes it."""
    from controller.sandbox import SandboxSpec
    from controller.sandbox.vm import VMOptions, VMSandbox

    sb = VMSandbox.start(
        SandboxSpec(ready_timeout=READY_TIMEOUT_S),
        VMOptions(image=image, arch=arch, apps_file=CONFORMANCE_APPS,
                  agent_args=["--wait-cap", "3", "--busy-timeout", "1"]),
    )
    try:
        assert sb.exec_in_guest(["mkdir", "-p", WORKDIR], timeout=30 * sb.time_scale).exit_code == 0
    except BaseException:
        sb.close()
        raise
    return sb


def conformance_desktop() -> Iterator[ContainerDesktop]:
    """``--conformance-desktop`` factory: the suite observes the agent in a fresh VM sandbox.

    ``python -m pytest tests/conformance --conformance-desktop=tests.vm._conformance:conformance_desktop``;
    ``$DESKTOP_SANDBOX_VM_ARCH`` picks the guest architecture (default the host's: ``arm64`` boots
    the arm64 disk with ``qemu-system-aarch64``), ``$DESKTOP_SANDBOX_VM_IMAGE`` an image directory.
    """
    with start_conformance_vm(arch=os.environ.get("DESKTOP_SANDBOX_VM_ARCH") or None) as sb:
        yield from sandbox_desktop(sb, timeout=120)
