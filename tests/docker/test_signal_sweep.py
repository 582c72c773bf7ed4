"""``run-task`` against Docker under SIGINT/SIGTERM at every phase: once, twice, SIGINT then SIGTERM.

Each case runs the real command line (``python -m controller.cli run-task tasks/pickup.toml --offline``)
as the leader of its own session, waits for an observable moment -- its run record on disk, an entry in
it, a line it printed, a Docker event of one of its containers (they carry ``desktop-sandbox.owner=
<host>:<pid>``) -- and sends the signal then. Never a fixed delay: every wait is for a condition, under
a deadline. The moments, in run order:

==========================================  ====================================================
spawn                                       right after the process is created (interpreter start-up)
record-open                                 the record exists, no container yet
gateway-created                             the gateway container exists, the desktop does not
desktop-created (SIGINT then SIGTERM)       the desktop container exists, not started
desktop-started (+ SIGINT in its removal)   the desktop runs, not ready; again once its removal began
loop-first-action                           after the first action (inputs released before removal)
loop-step-2 (SIGINT twice)                  after step 2; again once the first was acknowledged
verify                                      after the first check entry
teardown                                    a passed run, once Docker is killing its containers
loop-step-3, then SIGINT + SIGTERM          cancelled in the loop, twice more during its teardown
==========================================  ====================================================

After every case: the process exited 130; the record path is its last line on stdout; the record's
first entry is ``run_started`` and its last the one ``run_finished``, status ``cancelled``; no container
or network with its owner label, no process of its session, no ``docker-proxy`` for its published agent
port, no token file are left. A signal during the start abandons it (``run_started`` names no sandbox).
A signal before the command has installed its handlers (interpreter start-up, imports: ``spawn``) ends
the process by that signal, having started nothing and written no record; that case accepts either.

``up`` (whose agent token is a file on the host) gets SIGTERM during its start and Ctrl-C once its
token file is written.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from typing import Callable

import pytest

from ._cli_run import (
    ROOT, RUNS, CliRun, acknowledged, container, entries, read_entries, record_open, teardown_begun)

TASK = ROOT / "tasks" / "pickup.toml"
SIGINT, SIGTERM = signal.SIGINT, signal.SIGTERM

pytestmark = [pytest.mark.docker, pytest.mark.slow]


@dataclass
class Case:
    """``steps``: (moment, or None for "right after the previous signal"; the signal to send).
    ``during_start``: the first signal comes before the sandbox is ready, so the start must be abandoned.
    ``no_loop``: the loop must never have started. ``reason``: text the final reason must hold.
    ``check_release``: the agent's log must show inputs released after the last action.
    ``may_die_by_signal``: the signal may come before the command's handlers exist."""

    steps: list[tuple[Callable[[CliRun], bool] | None, int]]
    during_start: bool = False
    no_loop: bool = False
    reason: str = ""
    check_release: bool = False
    may_die_by_signal: bool = False


CASES = {
    "spawn-sigterm": Case([(None, SIGTERM)], may_die_by_signal=True),
    "record-open-sigint": Case([(record_open, SIGINT)], no_loop=True),
    "gateway-created-sigterm": Case([(container("create", "gateway"), SIGTERM)], during_start=True),
    "desktop-created-sigint-sigterm": Case([(container("create", "desktop"), SIGINT), (None, SIGTERM)],
                                           during_start=True),
    "desktop-started-sigint-again-in-removal": Case([(container("start", "desktop"), SIGINT),
                                                     (teardown_begun, SIGINT)], during_start=True),
    "loop-first-action-sigint": Case([(entries("action"), SIGINT)], check_release=True),
    "loop-step-2-sigint-twice": Case([(entries("model_response", 2), SIGINT), (acknowledged(1), SIGINT)]),
    "verify-sigterm": Case([(entries("check"), SIGTERM)], reason="cancelled by SIGTERM after the run had"),
    "teardown-sigint": Case([(teardown_begun, SIGINT)], reason="cancelled by SIGINT after the run had passed"),
    "loop-step-3-sigterm-then-sigint-sigterm-in-teardown": Case(
        [(entries("model_response", 3), SIGTERM), (teardown_begun, SIGINT), (None, SIGTERM)],
        reason="cancelled by SIGTERM"),
}


def _send(run: CliRun, steps: list[tuple[Callable[[CliRun], bool] | None, int]]) -> None:
    for moment, signum in steps:
        if moment is not None:
            run.wait_for(moment.__doc__ or moment.__name__, moment)
        run.proc.send_signal(signum)


@pytest.mark.parametrize("name", list(CASES))
def test_run_task_cancelled_by_signal_leaves_nothing(cli_run, desktop_image, name):
    case = CASES[name]
    run = cli_run("run-task", TASK, "--offline", "--image", desktop_image, "--runs-dir", RUNS,
                  follow_desktop_log=case.check_release)
    _send(run, case.steps)
    code = run.finish()
    err = run.err()[-4000:]
    run.assert_nothing_left()
    path = run.record()
    if case.may_die_by_signal and code == -case.steps[0][1]:
        assert path is None, f"died by the signal after its record was opened:\n{err}"
        return
    assert code == 130, f"exit {code}:\n{err}"
    assert path is not None and run.stdout[-1:] == [str(path)], (run.stdout, err)
    record = read_entries(path)
    kinds = [e["type"] for e in record]
    assert kinds[0] == "run_started" and kinds.count("run_finished") == 1, kinds
    assert kinds[-1] == "run_finished" and record[-1]["status"] == "cancelled", record[-1]
    assert case.reason in record[-1]["reason"], record[-1]
    if case.during_start:  # the start was abandoned: no sandbox ever served the run
        assert record[0]["sandbox"] is None, record[0]
    if case.during_start or case.no_loop:
        assert "model_response" not in kinds, kinds
    if case.check_release:
        # the agent's access log, read while the desktop ran: inputs released after the last action
        log = [line for line in run.desktop_log if "guest.access" in line]
        actions = [i for i, line in enumerate(log) if '"POST /v1/actions' in line]  # also ?screenshot=, a step
        releases = [i for i, line in enumerate(log) if '"POST /v1/release" 200' in line]
        assert actions and releases and releases[-1] > actions[-1], "\n".join(log[-20:])


def test_up_interrupted_leaves_no_token_file_and_no_sandbox(cli_run, desktop_image):
    """``up`` writes the agent token to a file on the host: SIGTERM during its start (exit 130), and
    Ctrl-C once the token file is there (exit 0, the usual way to end it), leave neither behind."""
    starting = cli_run("up", "--image", desktop_image)
    _send(starting, [(container("create", "desktop"), SIGTERM)])
    code = starting.finish()
    starting.assert_nothing_left()
    assert code == 130, f"exit {code}:\n{starting.err()[-3000:]}"

    ready = cli_run("up", "--image", desktop_image)
    _send(ready, [(lambda r: bool(r.token_files()), SIGINT)])
    code = ready.finish()
    ready.assert_nothing_left()
    assert code == 0, f"exit {code}:\n{ready.err()[-3000:]}"
    assert "removing sandbox" in ready.err()
