"""``desktop-sandbox replay runs/<id>``: a recorded run again on a fresh sandbox, as a regression test
(:mod:`controller.run.replay` builds the offline script; :func:`controller.run.runner.run_task` runs it
through the normal loop, its questions asked as any run's and what the recorded run was refused refused
again by :class:`controller.run.replay.ReplayAnswers`), then a per-step table -- matched / diverged /
denied / not reached -- and the task's checks. ``--write-task FILE`` keeps the replay as a task file with
its offline script (and the recorded web origins, when the record has them), for ``run-suite``;
``--offline-web`` serves the recorded run's web origins instead of fetching (:mod:`controller.run.web`)."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import typer
from rich.table import Table

from controller.commands.common import backend_class, console, refuse, say, writable_runs_dir
from controller.text import clean

STATES = ("matched", "diverged", "denied", "not reached")
"""What came of a replayed step: ``matched`` (it went as recorded: the screen matched where the step's
actions land and they ran -- or, for a call the recorded run was refused, it was refused again and
nothing of it ran, the replay ending there as the recorded run did), ``diverged`` (the screen did not
match within the step's deadline: the replay stopped there), ``denied`` (a question the recorded run
had granted was refused this time -- by a person, the deadline, nobody to ask: nothing of the call ran
and the replay stopped there), ``not reached`` (the replay stopped before it)."""

REFUSED = ("denied", "withdrawn", "cancelled", "timeout")
"""``approval`` decisions that kept a replayed call from running (``screen_changed`` is asked again)."""


def _step_approvals(entries: list[dict[str, Any]]) -> dict[int, list[dict[str, Any]]]:
    """The replay run's ``approval`` lines on its calls (safety checks, confirmations of actions) by the
    step they came in (:data:`controller.run.replay.STEP_OF_CALL`)."""
    from controller.offline.call_ids import SCRIPT_CALL, STEP_OF_CALL

    found: dict[int, list[dict[str, Any]]] = {}
    step = 0
    for entry in entries:
        if entry["type"] == "computer_call":
            match = STEP_OF_CALL.match(str(entry.get("call_id") or ""))
            step = int(match.group(1)) if match else step
        elif entry["type"] == "approval" and entry.get("what") in ("safety_check", "action"):
            match = SCRIPT_CALL.match(str(entry.get("call_id") or ""))
            found.setdefault(int(match.group(1)) if match else step, []).append(entry)
    return found


def sign_in_note(replay: Any, entries: list[dict[str, Any]]) -> str:
    """What went otherwise than recorded in the replay's sign-in (its ``sign_in`` lines beside the
    recorded ones, in order): ``sign-in at ORIGIN: no_approver (the recorded run's: submitted by
    terminal)...``, or '' when each request the recorded run answered was answered again."""
    asked = [e for e in entries if e["type"] == "sign_in" and e.get("request_id")]
    for n, recorded in enumerate(replay.sign_ins):
        if not recorded.granted:
            continue
        if n >= len(asked):
            return (f"the recorded run's sign-in request {n + 1} ({recorded.text()}) was never asked: the page "
                    "showed no sign-in form")
        got = asked[n]
        if got.get("outcome") != "submitted":
            hint = ("; --sign-in FILE answers it unattended" if got.get("outcome") == "no_approver" else "")
            return clean(f"sign-in at {got.get('origin')}: {got.get('outcome')}"
                         + (f" by {got.get('by')}" if got.get("by") else "")
                         + (f" ({got.get('detail')})" if got.get("detail") else "")
                         + f"; the recorded run's: {recorded.text()}{hint}", 400)
    return ""


def step_states(replay: Any, entries: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """For each step of ``replay`` (a :class:`controller.run.replay.Replay`), ``(state, detail)`` of
    :data:`STATES` from the replay run's record ``entries``: the ``expectation`` line of its turn (given
    up on: diverged, with what was observed and, when the sign-in went otherwise, :func:`sign_in_note`),
    else its ``approval`` lines (a refusal the record has too: matched; another: denied), else whether
    its computer call ran (matched) or not (not reached)."""
    from controller.run.replay import BY_REPLAY

    by_turn = {e.get("turn"): e for e in entries if e["type"] == "expectation"}
    ran = {e.get("call_id") for e in entries if e["type"] == "computer_call"}
    approvals = _step_approvals(entries)
    signin = sign_in_note(replay, entries)
    states: list[tuple[str, str]] = []
    stopped = False
    for index, step in enumerate(replay.steps):
        exp = by_turn.get(index)
        refused = [a for a in approvals.get(index, []) if a.get("decision") in REFUSED]
        granted = [a for a in approvals.get(index, []) if a.get("decision") == "approved"]
        if stopped:
            states.append(("not reached", ""))
        elif exp is not None and not exp.get("met"):
            unmet = exp.get("unmet") or []
            seen = unmet[0].get("observed", "") if unmet else ""
            detail = f"{exp.get('reason') or ''}: {seen}".strip(": ")
            states.append(("diverged", f"{signin}; then {detail}" if signin else detail))
            stopped = True
        elif refused:
            last = refused[-1]
            what = "safety check" if last.get("what") == "safety_check" else f"action {last.get('action') or '?'}"
            answer = f"{what} {last.get('decision')} by {last.get('by')}" + (
                f" ({last.get('message')})" if last.get("decision") == "withdrawn" and last.get("message") else "")
            recorded = (step.safety if step.safety is not None and not step.safety.granted
                        else next((a for at, _kind, _granted, a in replay.action_refusals if at == index), None))
            if last.get("decision") == "withdrawn" and last.get("message") != f"cancelled by {BY_REPLAY}":
                states.append(("not reached", answer))  # the replay itself was cancelled there
            elif recorded is not None:  # refused as the recorded run was: it went the same way
                states.append(("matched", f"{answer}, as the recorded run's ({recorded.text()}): not performed"))
            else:
                was = f"; the recorded run's: {step.safety.text()}" if step.safety is not None else ""
                states.append(("denied", f"{answer}{was}"))
            stopped = True
        elif f"call_{index:04d}" in ran:
            detail = f"{step.regions} region(s)" + (f", {exp['waits']} waits" if exp and exp.get("waits") else "")
            detail += "".join(f", {'safety check' if a.get('what') == 'safety_check' else a.get('action')} "
                              f"approved by {a.get('by')}" for a in granted)
            states.append(("matched", detail))
        else:
            states.append(("not reached", signin))
            stopped = True
    return states


RECORD_WEB_KEY = re.compile(r"(?m)^[ \t]*(?:web|\"web\"|'web')[ \t]*=[^\n]*(?:\n|\Z)")
"""A ``web = ...`` line (the key bare or quoted, a comment after the value included)."""
RECORD_TABLE = re.compile(r"(?ms)^(\[[ \t]*record[ \t]*\][^\n]*\n)(.*?)(?=^[ \t]*\[|\Z)")
"""The ``[record]`` table: its header line, then its body up to the next table header."""


def without_record_web(text: str) -> str:
    """``text`` (a task file's TOML) without the ``web`` key of its ``[record]`` table, every other line as
    it was: a task that serves its ``[offline] web`` records nothing. Only the ``[record]`` table's own
    ``web = ...`` line goes; a task that says it otherwise (``record = {web = true}``) keeps it, and its
    run still serves rather than records (``[offline] web`` wins)."""
    return RECORD_TABLE.sub(lambda m: m.group(1) + RECORD_WEB_KEY.sub("", m.group(2)), text)


def task_destination(path: Path) -> Path:
    """``--write-task FILE`` checked before anything starts: its folder made when missing (as
    ``--runs-dir``, ``--json`` and ``--junit`` make theirs); refuses (exit 2, naming it) a FILE that is a
    folder, or a folder that cannot be made or written. Returns ``path``."""
    if path.is_dir():
        refuse(f"--write-task {path}: that is a folder; name the task file to write in it (e.g. {path / 'task.toml'})")
    folder = path.parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
        if not os.access(folder, os.W_OK | os.X_OK):
            raise PermissionError(errno.EACCES, "not writable")
    except OSError as exc:
        refuse(f"--write-task {path}: cannot write the task file in the folder {folder}: {exc.strerror or exc}")
    return path


def write_task(replay: Any, script: Path, destination: Path, web: Any = None) -> Path:
    """Write the recorded task as ``destination`` with its ``[offline]`` script replaced by the replay's
    (copied beside it as ``<stem>.offline.jsonl``): the task's own text, every other table as it was.
    ``web``: a verified web recording (:class:`controller.run.web.Recording`), copied beside it as
    ``<stem>.web`` and named by the ``[offline]`` table's ``web``; the task's ``[record] web`` is dropped
    then (:func:`without_record_web`). ``destination``'s folder must exist (:func:`task_destination`).
    Returns the task path; raises OSError."""
    text = replay.task_source.read_text(encoding="utf-8")
    # Drop the task's [offline] table (its header up to the next table header), then add the replay's.
    text = re.sub(r"(?ms)^\[offline\][^\n]*\n.*?(?=^\[|\Z)", "", text).rstrip() + "\n"
    if web is not None:  # served from its [offline] web, the task records nothing
        text = without_record_web(text)
    name = f"{destination.stem}.offline.jsonl"
    (destination.parent / name).write_text(script.read_text(encoding="utf-8"), encoding="utf-8")
    header = (f"# A replay of {toml_string(str(replay.record_dir))}: every step expects the screen the model had "
              f"when it chose it.\n# Run: desktop-sandbox run-task {toml_string(str(destination))} (the recorded "
              f"task's own notes follow)\n")
    offline = f"\n[offline]\nscript = {toml_string(name)}\n"
    if web is not None:
        from controller.run.web import copy_recording

        folder = f"{destination.stem}.web"
        copy_recording(web, destination.parent / folder)
        offline += f"web = {toml_string(folder)}\n"
    destination.write_text(header + text + offline, encoding="utf-8")
    return destination


def toml_string(text: str) -> str:
    """``text`` as a TOML basic string (quoted; quotes, backslashes and every control character escaped), so
    a file or folder name can never end its line or its string early."""
    return json.dumps(text, ensure_ascii=True).replace("\x7f", "\\u007f")


def recorded_web(replay: Any, task: Any, offline_web: bool) -> Any:
    """The web recording a replay serves (``offline_web``) or ``--write-task`` carries: the recorded run's
    ``runs/<id>/web``, else -- for a run that served its task's ``[offline] web`` -- that one; verified
    (:func:`controller.run.web.load_recording`). None when there is none and ``offline_web`` is off;
    refuses (exit 2) one that does not verify, or ``offline_web`` without one."""
    from controller.run.web import WEB_DIR, WebRecordingError, load_recording

    folder = replay.record_dir / WEB_DIR
    if not folder.exists():
        folder = task.offline_web_path()
    if folder is None:
        if offline_web:
            refuse(f"cannot replay {replay.record_dir} --offline-web: the recorded run kept no web recording "
                   "(record it with `run-task --record-web` or the task's [record] web = true)")
        return None
    try:
        return load_recording(folder)
    except WebRecordingError as exc:
        refuse(f"cannot replay {replay.record_dir}: its web recording is refused: {exc}")


def replay_run(record: Path, *, image_tag: Optional[str], backend: str, runs_dir: Path,
               write_task_to: Optional[Path], opener: Callable[..., Callable[[Any], Any]],
               attach_network: Optional[list[str]] = None, tolerance: Optional[int] = None,
               max_changed: Optional[float] = None, approve_safety_check: Sequence[str] = (),
               sign_in: Optional[Path] = None, approval_timeout: float = 300.0, terminal: bool = True,
               step_timeout: Optional[float] = None, offline_web: bool = False, video: bool = False) -> None:
    """Replay ``record`` (a run directory or its record.jsonl) on a fresh sandbox from
    ``opener(backend, image_tag)``, each step compared by the screen comparison rule with ``tolerance``
    and ``max_changed`` (None: the rule's defaults). Questions are asked as in any run: on the terminal
    (when ``terminal`` and stdin is one), ``approve_safety_check`` codes approved unattended, sign-in
    requests answered from ``sign_in`` (run-task's ``--sign-in`` file), ``approval_timeout`` seconds each;
    each step waits up to ``step_timeout`` seconds for its screen (None: the replay's default);
    what the recorded run was refused is refused again, never asked
    (:class:`controller.run.replay.ReplayAnswers`); ``offline_web``: the gateway serves the recorded run's
    web origins (:func:`recorded_web`) and fetches nothing; ``video``: record the replay's video (``--video``).
    Prints the per-step table and the checks; exits
    0 when every step matched and the run passed, 1 otherwise (a run that ends refused as the recorded
    one did included), 2 when the record cannot be replayed or an option is refused, 130 cancelled."""
    from controller.offline.script import ScriptError, load_task_script
    from controller.run.entries import Approval
    from controller.run.record import read_entries
    from controller.run.entries import REPLAY_RUNNER
    from controller.run.replay import ReplayAnswers, ReplayError, build
    from controller.run.bus import follow_entries
    from controller.run.runner import RunOptions, run_task
    from controller.run.video import VideoSettings
    from controller.run.tasks import TaskError, load_task

    from wire.screen_match import MatchRule

    backend_class(backend)
    if any(not code.strip() for code in approve_safety_check):
        refuse("--approve-safety-check needs a safety check code (e.g. sensitive_action)")
    if sign_in is not None:
        from controller.run.signin import SignInFileError, check_signin_file

        try:
            check_signin_file(sign_in)
        except SignInFileError as exc:
            refuse(f"--sign-in: {exc}")
    rule = MatchRule(**{k: v for k, v in (("tolerance", tolerance), ("max_changed", max_changed)) if v is not None})
    try:
        replay = build(record, rule) if step_timeout is None else build(record, rule, step_timeout_s=step_timeout)
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
    terminal = terminal and sys.stdin.isatty()
    if replay.signs_in and task.browser_channel and task.signin.enabled and sign_in is None and not terminal:
        refuse(f"cannot replay {record}: the recorded run signed in at {', '.join(replay.sign_in_origins)} and the "
               "replay asks again, with nobody here to answer: pass --sign-in FILE (run-task's format) or replay "
               "on a terminal")
    writable_runs_dir(runs_dir)
    if write_task_to is not None:
        task_destination(write_task_to)
    if attach_network and backend != "docker":
        refuse("--attach-network needs the docker backend")
    web = recorded_web(replay, task, offline_web) if offline_web or write_task_to is not None else None
    if not offline_web and (replay.record_dir / "web").is_dir():
        say("note: the recorded run kept its web origins; --offline-web serves them instead of fetching")
    answerers: list[ReplayAnswers] = []

    def answer_as_recorded(registry: Any, cancel_run: Callable[[str], None]) -> ReplayAnswers:
        answerers.append(ReplayAnswers(replay, registry, cancel_run, approve_codes=approve_safety_check))
        return answerers[-1]

    def opt_ins(run: Any) -> None:  # the opt-in lines run-task writes for its own codes, after run_started
        def after_start(entry: Any) -> None:
            if entry.type == "run_started":
                for code in approve_safety_check:
                    run.record.write(Approval(what="opt-in", decision="approved", by="command line", codes=[code],
                                              message=f"--approve-safety-check {code}"))

        follow_entries(run.bus, after_start, name="replay-opt-ins")

    with tempfile.TemporaryDirectory(prefix="ds-replay-") as tmp:
        script = replay.write_script(Path(tmp) / "replay.offline.jsonl")
        try:  # as the run will load it (the task's tools): a record it would refuse is refused here
            load_task_script(task, script)
        except ScriptError as exc:
            refuse(f"cannot replay {record}: {str(exc).replace(str(script), 'the replay script')}")
        if write_task_to is not None:
            refused = {n for n, step in enumerate(replay.steps, 1) if step.safety and not step.safety.granted}
            refused |= {at + 1 for at, _kind, _granted, _answer in replay.action_refusals}
            if refused:
                refuse(f"--write-task: the recorded run was refused step {', '.join(map(str, sorted(refused)))}: a "
                       "task file cannot carry that refusal (its run would ask again); replay the record instead")
            try:
                written = write_task(replay, script, write_task_to, web)
            except OSError as exc:
                refuse(f"--write-task {write_task_to}: cannot write it: {exc.strerror or exc}")
            say(f"task written: {written}")
        say(f"replaying {len(replay.steps)} steps of {clean(str(replay.record_dir), 300)}"
            + (f" ({sum(len(v) for v in replay.human.values())} actions of a person)" if replay.human else ""))
        open_sandbox = opener(backend, image_tag, **({"attach_networks": list(attach_network)} if attach_network else {}))
        options = RunOptions(runs_dir=runs_dir, live=False, script=script, human_actions=replay.human,
                             approval_timeout_s=approval_timeout, confirm_actions=sorted(replay.confirmed),
                             sign_in_file=sign_in, runner=REPLAY_RUNNER, terminal=None if terminal else False,
                             web_from=web.source if offline_web and web is not None else None,
                             video=VideoSettings() if video else None)
        outcome = run_task(task, open_sandbox, options, console=console,
                           views=[lambda run: run.answered_by(answer_as_recorded), opt_ins])
    entries = [e.as_json() for e in read_entries(outcome.record_dir / "record.jsonl")]  # step_states reads JSON
    states = step_states(replay, entries)
    table = Table(title=f"replay of {clean(str(replay.record_dir), 200)}", show_lines=False)
    for column in ("step", "recorded call", "state", "detail"):
        table.add_column(column, overflow="fold")
    for index, (step, (state, detail)) in enumerate(zip(replay.steps, states), 1):
        table.add_row(str(index), clean(step.call_id, 40), state, clean(detail, 400))
    console.print(table)
    matched = sum(state == "matched" for state, _ in states)
    say(f"{matched} of {len(states)} steps matched; checks: "
        f"{sum(bool(c.get('passed')) for c in outcome.checks)} of {len(outcome.checks)} passed; run {outcome.status} "
        f"(recorded: {clean(replay.status or 'unfinished', 20)})")
    typer.echo(str(outcome.record_dir / "record.jsonl"))
    cancelled_here = any(a.cancelled is not None for a in answerers)  # where the recorded run was cancelled
    if outcome.status == "cancelled" and not cancelled_here:
        raise typer.Exit(130)
    raise typer.Exit(0 if matched == len(states) and outcome.status == "passed" else 1)
