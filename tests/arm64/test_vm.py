"""The arm64 VM disk (scripts/build-vm-image.sh --arch arm64) booted with qemu-system-aarch64 (``virt``
machine, direct kernel boot) under TCG on this host: it boots to ready with the same isolation, token
handling and network audit as the amd64 VM (``tests/vm/test_isolation.py``, run here against it), the
conformance suite's quick modules pass against its agent, and the pickup exercise passes in it."""

from __future__ import annotations

from pathlib import Path

import pytest

from controller.run.record import read_entries, summarize
from controller.run.runner import RunOptions, run_task
from controller.run.tasks import load_task

from tests.vm.test_isolation import *  # noqa: F401,F403 - the VM's isolation tests, against the arm64 VM

from .conftest import record, run_quick_conformance

TASKS = Path(__file__).resolve().parents[2] / "tasks"


@pytest.fixture(scope="module")
def arm64_vm_image() -> Path:
    """The built arm64 VM image directory; a failure when it is missing (build it first: minutes)."""
    from controller.sandbox import vm_image

    if vm_image.qemu_binary("arm64") is None:
        pytest.fail("qemu-system-aarch64 not installed (apt-get install qemu-system-arm)")
    path = vm_image.image_dir("arm64")
    if not (path / "manifest.json").exists():
        pytest.fail(f"arm64 VM image not built ({path}): make vm-image ARCH=arm64")
    return path


@pytest.fixture(scope="module")
def vm_sandbox(arm64_vm_image):
    """One arm64 VM (deny-all, the conformance apps) for the isolation tests imported above."""
    from tests.vm._conformance import start_conformance_vm

    sb = start_conformance_vm(arm64_vm_image)
    record("arm64 VM boot to ready", sb.timings)
    with sb:
        yield sb


def test_the_arm64_vm_runs_an_arm64_kernel_under_tcg(vm_sandbox):
    from controller.sandbox.vm import TCG_TIME_SCALE

    assert (vm_sandbox.accel, vm_sandbox.time_scale) == ("tcg", TCG_TIME_SCALE)
    result = vm_sandbox.exec_in_guest(["uname", "-m"], timeout=60)
    assert (result.exit_code, result.stdout.strip()) == (0, b"aarch64")
    assert vm_sandbox.agent.display() == {"width": 1280, "height": 800, "depth": 24}


def test_the_conformance_quick_modules_pass_on_the_arm64_vm(arm64_vm_image, tmp_path):
    run_quick_conformance("conformance quick modules (VM)", "tests.vm._conformance:conformance_desktop",
                          {"DESKTOP_SANDBOX_VM_ARCH": "arm64"}, tmp_path / "junit.xml")


def test_the_pickup_exercise_passes_on_the_arm64_vm(arm64_vm_image, tmp_path):
    from controller.cli import sandbox_opener
    from controller.sandbox.vm import TCG_TIME_SCALE, VMSandbox

    started: list[VMSandbox] = []
    open_vm = sandbox_opener("vm", None, arch="arm64")

    def opener(task):
        sb = open_vm(task)
        started.append(sb)
        record("arm64 VM boot to ready (pickup)", sb.timings)
        return sb

    outcome = run_task(load_task(TASKS / "pickup.toml"), opener, RunOptions(runs_dir=tmp_path, live=False, terminal=False))
    s = summarize(read_entries(outcome.record_dir))
    record("pickup on the arm64 VM", {"wall_s": float(s["wall_s"]), "expectations_met": s["expectations_met"],
                                      **(s.get("timings") or {})})
    [sb] = started
    assert (sb.accel, sb.time_scale) == ("tcg", TCG_TIME_SCALE)
    assert outcome.status == "passed", (outcome.reason, outcome.checks, str(outcome.record_dir))
    assert [c["passed"] for c in outcome.checks] == [True, True, True]
    assert (s["expectations_met"], s["expectations_unmet"]) == (7, 0)
    for proc in (sb.qemu, sb.gateway):
        assert proc is None or proc.poll() is not None
