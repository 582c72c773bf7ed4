"""Fixtures for tests that boot the guest as a QEMU VM (the ``vm`` backend).

Every test here is marked ``vm``. The image is the one ``scripts/build-vm-image.sh`` builds for the
current inputs (cached under ``~/.cache/desktop-sandbox/vm``, keyed by a hash of them), built here when
missing (root, debootstrap, network to the Debian mirror and PyPI), or ``$DESKTOP_SANDBOX_VM_IMAGE``.
Without QEMU or without a way to build the image the tests are skipped with the reason, unless
``DESKTOP_SANDBOX_REQUIRE_VM=1`` (CI), where that is a failure.

One VM (deny-all policy, the conformance app allowlist) is shared by the session; its start timings are
printed in the terminal summary. Acceleration: KVM when usable, else plain emulation (TCG);
``DESKTOP_SANDBOX_VM_ACCEL=tcg`` forces emulation.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
import pytest

from tests.helpers import timings_section
from tests.require import unavailable

from tests.docker._conformance import sandbox_desktop, target  # noqa: F401 - target: fixture
from tests.vm._conformance import start_conformance_vm

_timings: list[tuple[str, dict[str, float]]] = []


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.vm)


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:  # noqa: ANN001
    timings_section(terminalreporter, "VM sandbox", _timings,
                    lambda v: f"{v:.1f}s" if isinstance(v, float) else f"{v}")


def _unavailable(reason: str) -> None:
    unavailable("VM", reason)


@pytest.fixture(scope="session")
def vm_image() -> Path:
    """The VM image directory for the current inputs, built if missing."""
    from controller.sandbox import SandboxError
    from controller.sandbox.vm import build_image, host_arch, image_dir, qemu_binary

    arch = host_arch()
    if qemu_binary(arch) is None:
        _unavailable(f"QEMU for {arch} is not installed (apt-get install qemu-system-x86)")
    path = image_dir(arch)
    if (path / "manifest.json").exists():
        return path
    if os.geteuid() != 0 or shutil.which("debootstrap") is None or shutil.which("mke2fs") is None:
        _unavailable(f"VM image {path} not built and cannot build it here (needs root, debootstrap, mke2fs)")
    t0 = time.monotonic()
    try:
        path = build_image(arch)
    except SandboxError as exc:
        _unavailable(f"VM image build failed: {exc}")
    _timings.append(("image build", {"seconds": time.monotonic() - t0}))
    return path


@pytest.fixture(scope="session")
def vm_sandbox(vm_image: Path):
    """A ready VM sandbox shared by the session: deny-all, conformance apps, short wait cap."""
    sb = start_conformance_vm(vm_image)
    _timings.append((f"{sb.id} ({sb.accel})", dict(sb.timings)))
    with sb:
        yield sb


@pytest.fixture(scope="session")
def desktop(vm_sandbox):
    """The conformance suite's observation side, through the VM's agent and guest commands; the
    ``target`` fixture reaches its agent through the host forward."""
    yield from sandbox_desktop(vm_sandbox, timeout=120)
