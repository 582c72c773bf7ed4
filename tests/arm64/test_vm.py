"""The arm64 VM disk (scripts/build-vm-image.sh --arch arm64) booted with qemu-system-aarch64 (``virt``
machine, direct kernel boot) under TCG on this host: it boots to ready with the same isolation and
token handling as the amd64 VM, and the pickup exercise passes in it."""

from __future__ import annotations

from pathlib import Path

import pytest

from controller.run.record import read_record, summarize
from controller.run.runner import RunOptions, run_task
from controller.run.tasks import load_task

from .conftest import record

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


def test_the_pickup_exercise_passes_on_the_arm64_vm(arm64_vm_image, tmp_path):
    from controller.cli import sandbox_opener
    from controller.sandbox.vm import TCG_TIME_SCALE, VMSandbox

    started: list[VMSandbox] = []
    open_vm = sandbox_opener("vm", None, arch="arm64")

    def opener(task):
        sb = open_vm(task)
        started.append(sb)
        record("arm64 VM boot to ready", sb.timings)
        return sb

    outcome = run_task(load_task(TASKS / "pickup.toml"), opener, RunOptions(runs_dir=tmp_path, live=False, asker=None))
    s = summarize(read_record(outcome.record_dir))
    record("pickup on the arm64 VM", {"wall_s": float(s["wall_s"]), "expectations_met": s["expectations_met"]})
    [sb] = started
    assert (sb.accel, sb.time_scale) == ("tcg", TCG_TIME_SCALE)
    assert outcome.status == "passed", (outcome.reason, outcome.checks, str(outcome.record_dir))
    assert [c["passed"] for c in outcome.checks] == [True, True, True]
    assert (s["expectations_met"], s["expectations_unmet"]) == (7, 0)
    for proc in (sb.qemu, sb.gateway):
        assert proc is None or proc.poll() is not None
