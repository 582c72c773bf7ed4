"""``desktop-sandbox replay runs/<id>``: a recorded run again on a fresh sandbox, as a regression test
(:mod:`controller.run.replay` builds the offline script; :func:`controller.run.runner.run_task` runs it
through the normal loop), then a per-step table -- matched / diverged / not reached -- and the task's
checks. ``--write-task FILE`` keeps the replay as a task file with its offline script, for ``run-suite``."""

from __future__ import annotations

import hashlib
import re
import tempfile
from pathlib import Path
from typing import Any, Callable, Optional

import typer
from rich.table import Table

from controller.commands.common import backend_class, console, refuse, say, writable_runs_dir
from controller.text import clean

STATES = ("matched", "diverged", "not reached")
"""What came of a replayed step: ``matched`` (the screen matched where the step's actions land, and they
ran), ``diverged`` (it did not match within the step's deadline: the replay stopped there), ``not
reached`` (the replay stopped before it)."""


def step_states(replay: Any, entries: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """For each step of ``replay`` (a :class:`controller.run.replay.Replay`), ``(state, detail)`` from the
    replay run's record ``entries``: the ``expectation`` line of its turn (met: matched; given up on:
    diverged, with what was observed), else whether its computer call ran (matched) or not (not
    reached)."""
    by_turn = {e.get("turn"): e for e in entries if e["type"] == "expectation"}
    ran = {e.get("call_id") for e in entries if e["type"] == "computer_call"}
    states: list[tuple[str, str]] = []
    stopped = False
    for index, step in enumerate(replay.steps):
        exp = by_turn.get(index)
        if stopped:
            states.append(("not reached", ""))
        elif exp is not None and not exp.get("met"):
            unmet = exp.get("unmet") or []
            seen = unmet[0].get("observed", "") if unmet else ""
            states.append(("diverged", f"{exp.get('reason') or ''}: {seen}".strip(": ")))
            stopped = True
        elif f"call_{index:04d}" in ran:
            states.append(("matched", f"{step.regions} region(s)" + (f", {exp['waits']} waits" if exp and exp.get("waits") else "")))
        else:
            states.append(("not reached", ""))
            stopped = True
    return states


def write_task(replay: Any, script: Path, destination: Path) -> Path:
    """Write the recorded task as ``destination`` with its ``[offline]`` script replaced by the replay's
    (copied beside it as ``<stem>.offline.jsonl``): the task's own text, every other table as it was.
    Returns the task path."""
    text = replay.task_source.read_text(encoding="utf-8")
    # Drop the task's [offline] table (its header up to the next table header), then add the replay's.
    text = re.sub(r"(?ms)^\[offline\][^\n]*\n.*?(?=^\[|\Z)", "", text).rstrip() + "\n"
    name = f"{destination.stem}.offline.jsonl"
    (destination.parent / name).write_text(script.read_text(encoding="utf-8"), encoding="utf-8")
    header = (f"# A replay of {replay.record_dir}: every step expects the screen the model had when it chose it.\n"
              f"# Run: desktop-sandbox run-task {destination} (the recorded task's own notes follow)\n")
    destination.write_text(header + text + f'\n[offline]\nscript = "{name}"\n', encoding="utf-8")
    return destination


def replay_run(record: Path, *, image_tag: Optional[str], backend: str, runs_dir: Path,
               write_task_to: Optional[Path], opener: Callable[..., Callable[[Any], Any]],
               attach_network: Optional[list[str]] = None, tolerance: Optional[int] = None,
               max_changed: Optional[float] = None) -> None:
    """Replay ``record`` (a run directory or its record.jsonl) on a fresh sandbox from
    ``opener(backend, image_tag)``, each step compared by the screen comparison rule with ``tolerance``
    and ``max_changed`` (None: the rule's defaults); prints the per-step table and the checks; exits 0 when every step
    matched and every check passed, 1 otherwise, 2 when the record cannot be replayed, 130 cancelled."""
    from controller.offline.script import ScriptError, load_task_script
    from controller.run.record import read_record
    from controller.run.replay import ReplayError, build
    from controller.run.runner import RunOptions, run_task
    from controller.run.tasks import TaskError, load_task

    from wire.screen_match import MatchRule

    backend_class(backend)
    rule = MatchRule(**{k: v for k, v in (("tolerance", tolerance), ("max_changed", max_changed)) if v is not None})
    try:
        replay = build(record, rule)
    except ReplayError as exc:
        refuse(f"cannot replay {record}: {exc}")
    try:
        task = load_task(replay.task_source)
    except (TaskError, OSError) as exc:
        refuse(f"cannot load the recorded task {replay.task_source}: {exc}")
    digest = hashlib.sha256(replay.task_source.read_bytes()).hexdigest()
    if replay.task_sha256 and digest != replay.task_sha256:
        say(f"note: {clean(str(replay.task_source), 300)} changed since the run was recorded "
            "(its checks, launches and policy are today's)")
    writable_runs_dir(runs_dir)
    if attach_network and backend != "docker":
        refuse("--attach-network needs the docker backend")
    with tempfile.TemporaryDirectory(prefix="ds-replay-") as tmp:
        script = replay.write_script(Path(tmp) / "replay.offline.jsonl")
        try:  # as the run will load it (the task's tools): a record it would refuse is refused here
            load_task_script(task, script)
        except ScriptError as exc:
            refuse(f"cannot replay {record}: {str(exc).replace(str(script), 'the replay script')}")
        if write_task_to is not None:
            say(f"task written: {write_task(replay, script, write_task_to)}")
        say(f"replaying {len(replay.steps)} steps of {clean(str(replay.record_dir), 300)}"
            + (f" ({sum(len(v) for v in replay.human.values())} actions of a person)" if replay.human else ""))
        open_sandbox = opener(backend, image_tag, **({"attach_networks": list(attach_network)} if attach_network else {}))
        options = RunOptions(runs_dir=runs_dir, live=False, script=script, asker=None,
                             human_actions=replay.human)
        outcome = run_task(task, open_sandbox, options, console=console)
    entries = read_record(outcome.record_dir / "record.jsonl")
    states = step_states(replay, entries)
    table = Table(title=f"replay of {clean(str(replay.record_dir), 200)}", show_lines=False)
    for column in ("step", "recorded call", "state", "detail"):
        table.add_column(column, overflow="fold")
    for index, (step, (state, detail)) in enumerate(zip(replay.steps, states), 1):
        table.add_row(str(index), clean(step.call_id, 40), state, clean(detail, 300))
    console.print(table)
    matched = sum(state == "matched" for state, _ in states)
    say(f"{matched} of {len(states)} steps matched; checks: "
        f"{sum(bool(c.get('passed')) for c in outcome.checks)} of {len(outcome.checks)} passed; run {outcome.status}")
    typer.echo(str(outcome.record_dir / "record.jsonl"))
    if outcome.status == "cancelled":
        raise typer.Exit(130)
    raise typer.Exit(0 if matched == len(states) and outcome.status == "passed" else 1)
