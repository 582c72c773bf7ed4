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

import pytest

from controller.run.record import read_entries, summarize
from controller.run.runner import RunOptions, run_task
from controller.run.tasks import load_task

from .conftest import _timings

TASKS = Path(__file__).resolve().parents[2] / "tasks"


@pytest.fixture(scope="module")
def pickup_on_the_vm(vm_image, tmp_path_factory):
    """One offline pickup run on the VM backend, shared by the module: ``(outcome, sandboxes started)``
    (the run is checked here, then replayed from its record)."""
    from controller.cli import sandbox_opener

    started: list = []
    open_vm = sandbox_opener("vm", None)

    def opener(task):
        sb = open_vm(task)
        started.append(sb)
        return sb

    outcome = run_task(load_task(TASKS / "pickup.toml"), opener,
                       RunOptions(runs_dir=tmp_path_factory.mktemp("pickup-vm"), live=False, terminal=False))
    return outcome, started


def test_pickup_offline_exercise_passes_on_the_vm(pickup_on_the_vm):
    outcome, started = pickup_on_the_vm
    entries = read_entries(outcome.record_dir)
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


def test_a_recorded_pickup_run_replays_on_the_vm(pickup_on_the_vm, tmp_path):
    """``desktop-sandbox replay``'s path on the VM backend: the pickup run recorded there, replayed on a
    fresh VM step by step (each step waits until the screen matches, where its actions land, the
    recorded one), then the task's checks."""
    from controller.cli import sandbox_opener
    from controller.commands.replay import step_states
    from controller.run.replay import build

    recorded, _started = pickup_on_the_vm
    assert recorded.status == "passed", recorded.reason
    opener = sandbox_opener("vm", None)
    replay = build(recorded.record_dir)
    script = replay.write_script(tmp_path / "replay.offline.jsonl")
    outcome = run_task(load_task(replay.task_source), opener,
                       RunOptions(runs_dir=tmp_path / "replays", live=False, terminal=False, script=script))
    entries = read_entries(outcome.record_dir)
    states = step_states(replay, [e.as_json() for e in entries])
    s = summarize(entries)
    _timings.append(("pickup replay", {"wall_s": s["wall_s"], "waits": s["expectation_waits"],
                                       **(s.get("timings") or {})}))
    assert [state for state, _ in states] == ["matched"] * len(replay.steps), states
    assert outcome.status == "passed", (outcome.reason, outcome.checks)


def test_browser_pickup_passes_on_the_vm(vm_image, tmp_path):
    """tasks/browser-pickup.toml (the SDK's structured browser tools over the agent's chromium) on the VM
    backend: every browser call succeeds and the booking is verified from the app's database."""
    from controller.cli import sandbox_opener

    outcome = run_task(load_task(TASKS / "browser-pickup.toml"), sandbox_opener("vm", None),
                       RunOptions(runs_dir=tmp_path, live=False, terminal=False))
    entries = read_entries(outcome.record_dir)
    calls = [e for e in entries if e.type == "browser_call"]
    s = summarize(entries)
    _timings.append(("browser-pickup run-task", {"wall_s": s["wall_s"], **(s.get("timings") or {})}))
    assert outcome.status == "passed", (outcome.reason, calls[-3:])
    assert calls and all(c.ok for c in calls)
    assert [c["passed"] for c in outcome.checks] == [True]
