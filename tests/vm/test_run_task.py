"""The offline exercise end to end on the VM backend (QEMU under emulation here): the same task and
script as in Docker, on a guest many times slower, where the scripted model waits for what it expects
to see on the screen instead of trusting a fixed settle time.

Under TCG two things made it fail before: the VM's host name made the shell prompt longer than in the
container (the paste expectation then looked at the wrong cells; the guest is ``desktop`` on both
backends now), and Firefox takes the PRIMARY selection a few seconds after it paints it, so a paste
right after the selection can find none (the script's ``expect_retry`` redoes clear-type-paste).
"""

from __future__ import annotations

from pathlib import Path

from controller.run.record import read_record, summarize
from controller.run.runner import RunOptions, run_task
from controller.run.tasks import load_task

from .conftest import _timings

TASKS = Path(__file__).resolve().parents[2] / "tasks"


def test_pickup_offline_exercise_passes_on_the_vm(vm_image, tmp_path):
    from controller.cli import sandbox_opener
    from controller.sandbox.vm import VMSandbox

    started: list[VMSandbox] = []
    open_vm = sandbox_opener("vm", None)

    def opener(task):
        sb = open_vm(task)
        started.append(sb)
        return sb

    outcome = run_task(load_task(TASKS / "pickup.toml"), opener,
                       RunOptions(runs_dir=tmp_path, live=False, asker=None))
    entries = read_record(outcome.record_dir)
    s = summarize(entries)
    _timings.append(("pickup run-task", {"wall_s": s["wall_s"], "waits": s["expectation_waits"],
                                         **(s.get("timings") or {})}))
    assert outcome.status == "passed", (outcome.reason, outcome.checks, str(outcome.record_dir))
    assert [c["passed"] for c in outcome.checks] == [True, True, True]
    assert (s["expectations_met"], s["expectations_unmet"]) == (7, 0)
    assert s["network_log_complete"]
    # torn down: the QEMU and host-side gateway processes are gone
    [sb] = started
    for proc in (sb.qemu, sb.gateway):
        assert proc is None or proc.poll() is not None
