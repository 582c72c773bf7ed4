"""Replay a recorded run as a regression test: the record's computer calls as an offline script whose
every step expects the screen the model had when it chose that step (docs/ARCHITECTURE.md, "Replay").

:func:`build` reads ``runs/<id>/record.jsonl`` (and the screenshots beside it) into a :class:`Replay`:

* one script turn per computer call the model made, its actions as recorded (model px, with the
  screen size and crop the run had, which the replay's task keeps); the scripted model's own ``wait``
  answers of the recorded run (``call_NNNN_wait_MMM``) are not steps and are left out; for an offline
  record whose script is at hand, each step also keeps what the scripted model waited for before it
  chose the call (its colour expectations and ``expect_retry``, :func:`_carried`), so the replay waits
  for the same reactions of the guest (a paste that has shown) and redoes a step as the run did;
* each turn ``expect``s, before it is answered, the screen the model was shown when it chose the call:
  one ``matches`` expectation (contract 3) per region the call's actions touch, by the screen comparison
  rule (:mod:`wire.screen_match`: the same regions and tolerance that bind an approval), the region's
  pixels cut from the recorded screenshot; while they do not match, the scripted model waits, as it does
  for any expectation, and after ``timeout_s`` the step has **diverged** and the replay stops;
* typed text: the record keeps typed text as its length only; a record written with
  ``run-task --record-typed-text`` (or the task's ``[record] typed_text = true``) carries it, and an
  offline run's text is taken from its script, whose turn ``NNNN`` is call ``call_NNNN``, when the length
  agrees. Text that cannot be known makes the record unreplayable (:class:`ReplayError`);
* a person's actions during a takeover (``human_action`` lines with their ``input``, screen px) are
  performed again at the same step boundary, as a person's (:attr:`Replay.human`): after the actions of
  the step they followed, before that step's screenshot (the one the model chose its next step on).

Screenshots are read by the rule of every reader of a record's files (:mod:`controller.run.shots`). Raises
:class:`ReplayError` (one line) for a record that cannot be replayed, before anything starts.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from PIL import Image

from controller.offline.script import ScriptError, load_script, validate_first_turn, validate_turn
from controller.run.live import HUMAN_ACTIONS
from controller.run.record import read_record
from controller.run.shots import load_shot
from controller.text import clean
from wire.actions import ActionInvalid, first_outside, parse_action
from wire.screen_match import MatchRule, encode_crop, regions_for

SCRIPTED_WAIT = re.compile(r"^call_\d{4}_(wait|read)_\d+$")
"""Call ids of the scripted model's own waits (contract 3): not steps of the run, unless they carry a
turn's ``expect_retry`` actions."""
SCRIPT_CALL = re.compile(r"^call_(\d{4})$")
"""A scripted model's call id for script turn ``NNNN``."""
DEFAULT_STEP_TIMEOUT_S = 30.0
"""Seconds a replayed step waits for the screen to match (times the sandbox's ``time_scale``)."""


class ReplayError(ValueError):
    """A record that cannot be replayed (one line: why, and what to do)."""


@dataclass
class Step:
    """One recorded computer call: ``call_id`` (the recorded run's), ``actions`` (model px, typed text
    filled in), ``screenshot`` (the file of the screenshot the model chose it on), ``regions`` compared."""

    call_id: str
    actions: list[dict[str, Any]]
    screenshot: str | None
    regions: int = 0


@dataclass
class Replay:
    """What :func:`build` made of a record: ``task_source`` (the recorded task file), ``task_sha256``,
    ``steps``, ``turns`` (the offline script, contract 3), ``human`` (step index -> a person's actions,
    screen px, performed after that step's actions and before its screenshot; -1: before the first
    step's actions), ``final_message``."""

    record_dir: Path
    task_source: Path
    task_sha256: str | None
    steps: list[Step] = field(default_factory=list)
    turns: list[dict[str, Any]] = field(default_factory=list)
    human: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    final_message: str | None = None

    def write_script(self, path: Path) -> Path:
        """Write :attr:`turns` as a JSONL offline script at ``path``; returns it."""
        path.write_text("".join(json.dumps(t, ensure_ascii=True) + "\n" for t in self.turns), encoding="utf-8")
        return path


def _script_turns(started: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Call id ``call_NNNN`` -> script turn NNNN, for an offline record whose script is still readable
    (empty for a live record, or when the script is gone or no longer loads)."""
    script = started.get("script")
    if started.get("mode") != "offline" or not script:
        return {}
    try:
        turns = load_script(script)
    except (ScriptError, OSError):
        return {}
    return {f"call_{n:04d}": t for n, t in enumerate(turns)}


CARRIED_KINDS = ("color", "not_color")
"""The kinds of an offline script's own expectations a replayed step keeps (``changed`` compares with
the previous script turn, which the replay's numbering need not keep)."""


def _carried(turn: dict[str, Any] | None) -> dict[str, Any]:
    """What a replayed step keeps of its offline script turn: the conditions the scripted model waited
    for before it chose the call (``expect`` of :data:`CARRIED_KINDS`, ``expect_timeout_s``) and its
    ``expect_retry`` (the same redone step when they do not come), so the replay waits for the same
    reactions of the guest, and redoes the same step, as the recorded run did."""
    if not turn:
        return {}
    kept = [e for e in turn.get("expect") or [] if isinstance(e, dict) and e.get("kind") in CARRIED_KINDS]
    carried: dict[str, Any] = {"expect": kept} if kept else {}
    if kept and "expect_timeout_s" in turn:
        carried["expect_timeout_s"] = turn["expect_timeout_s"]
    if kept and turn.get("expect_retry"):
        carried["expect_retry"] = turn["expect_retry"]
    return carried


def _texts(turns: dict[str, dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Call id -> the actions (with their text) the scripted model sent under it: each turn's, and its
    ``expect_retry``'s under the turn's wait ids."""
    texts = {call_id: list(t.get("actions") or []) for call_id, t in turns.items()}
    for call_id, t in turns.items():
        retry = (t.get("expect_retry") or {}).get("actions")
        if retry:
            texts[f"{call_id}_retry"] = list(retry)
    return texts


def _fill_text(call_id: str, index: int, action: dict[str, Any], scripted: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    if action.get("type") != "type" or "text" in action:
        return action
    length = action.get("text_length")
    wait = SCRIPTED_WAIT.match(call_id)
    source = scripted.get(call_id[:9] + "_retry" if wait else call_id, [])
    if index < len(source) and source[index].get("type") == "type" and isinstance(source[index].get("text"), str):
        text = source[index]["text"]
        if len(text) == length:
            return {"type": "type", "text": text}
    raise ReplayError(f"{call_id}: the record holds typed text as its length only ({length} characters); "
                      "record the run with `run-task --record-typed-text` to replay it")


def _points(actions: list[dict[str, Any]]) -> list[tuple[int, int]]:
    points: list[tuple[int, int]] = []
    for action in actions:
        try:
            points += parse_action(action).points()
        except ActionInvalid:
            continue
    return points


def build(record_dir: str | Path, rule: MatchRule | None = None, *,
          step_timeout_s: float = DEFAULT_STEP_TIMEOUT_S) -> Replay:
    """The :class:`Replay` of the run recorded in ``record_dir`` (module docstring). ``rule``: the
    comparison rule (default :class:`wire.screen_match.MatchRule`'s). Raises :class:`ReplayError`: no
    record, no computer call, browser calls (their element refs belong to the recorded documents),
    typed text that cannot be known, a screenshot that cannot be read by the rule of every reader of a
    record's screenshots (:mod:`controller.run.shots`), a recorded action the offline script or a
    person's replay would refuse."""
    rule = rule or MatchRule()
    record_dir = Path(record_dir)
    try:
        entries = read_record(record_dir / "record.jsonl" if record_dir.is_dir() else record_dir)
    except (OSError, ValueError) as exc:
        raise ReplayError(f"cannot read the record: {exc}") from None
    record_dir = record_dir if record_dir.is_dir() else record_dir.parent
    shots_dir = record_dir.resolve()  # the directory the user named; its screenshots by the rule of run.shots
    started = entries[0]
    task = started.get("task") or {}
    if not task.get("source"):
        raise ReplayError("the record does not say which task file it ran")
    replay = Replay(record_dir, Path(task["source"]), task.get("sha256"))
    if any(e["type"] == "browser_call" for e in entries):
        raise ReplayError("the run used browser tools: their element refs belong to the recorded pages, so "
                          "only computer calls can be replayed")
    turns = _script_turns(started)
    scripted = _texts(turns)
    shown: str | None = None
    sizes: dict[str, Image.Image] = {}
    pending_human: list[dict[str, Any]] = []
    last_point: tuple[int, int] | None = None
    for entry in entries:
        kind = entry["type"]
        if kind == "screenshot":
            shown = entry["file"]
        elif kind == "human_action":
            data = entry.get("input")
            if not isinstance(data, dict):
                raise ReplayError("a person's action during a takeover is recorded as its description only "
                                  "(a record of an older format): it cannot be performed again")
            if data.get("type") == "type" and "text" not in data:
                raise ReplayError("a person typed during a takeover and the record holds the text's length only; "
                                  "record the run with `run-task --record-typed-text` to replay it")
            pending_human.append(data)
        elif kind == "computer_call":
            call_id = str(entry.get("call_id") or "")
            recorded = entry.get("actions") or []
            if SCRIPTED_WAIT.match(call_id) and (turns or all(a.get("type") == "wait" for a in recorded)):
                # the scripted model waiting for its expectations (or, with its script at hand, redoing a
                # step: the replayed turn carries the same expect_retry); without the script a retry's
                # actions are a step of their own
                continue
            actions = [_fill_text(call_id, i, dict(a), scripted) for i, a in enumerate(recorded)]
            actions = [{k: v for k, v in a.items() if k != "text_length"} for a in actions]
            turn: dict[str, Any] = {"comment": f"step {len(replay.steps) + 1}: {call_id} as recorded",
                                    "actions": actions}
            step = Step(call_id, actions, shown)
            if shown is not None:
                image = sizes.get(shown)
                if image is None:
                    image, why = load_shot(shots_dir, shown)
                    if image is None:
                        raise ReplayError(f"the screenshot {clean(shown, 80)} of {clean(call_id, 80)} cannot be "
                                          f"read: {why}")
                    sizes[shown] = image
                regions = regions_for(_points(actions), image.size, rule, fallback=last_point)
                expect = [{"kind": "matches", "x": r.x, "y": r.y, "w": r.w, "h": r.h, "png": encode_crop(image, r),
                           "tolerance": rule.tolerance, "fraction": round(1 - rule.max_changed, 6)} for r in regions]
                carried = _carried(turns.get(call_id))
                expect = carried.pop("expect", []) + expect
                if expect:
                    turn["expect"] = expect
                    turn["expect_timeout_s"] = max(step_timeout_s, carried.pop("expect_timeout_s", 0))
                    turn.update(carried)
                step.regions = len(regions)
            points = _points(actions)
            if points:
                last_point = points[-1]
            if pending_human:
                replay.human[len(replay.turns) - 1] = pending_human
                pending_human = []
            replay.steps.append(step)
            replay.turns.append(turn)
        elif kind == "run_finished":
            replay.final_message = entry.get("final_message")
    if not replay.steps:
        raise ReplayError("the record holds no computer call to replay")
    if pending_human:
        replay.human[len(replay.turns) - 1] = pending_human
    replay.turns.append({"message": replay.final_message or "replayed every recorded step"})
    _check(replay)
    return replay


def _check(replay: Replay) -> None:
    """Raise :class:`ReplayError` unless every turn of ``replay`` is one the offline script takes
    (contract 3, :func:`controller.offline.script.validate_turn`) and every recorded action of a person
    one a person may send (:data:`controller.run.live.HUMAN_ACTIONS`, no negative point): a record that
    cannot be replayed is refused before anything starts, never found out by a run that fails."""
    for index, turn in enumerate(replay.turns):
        where = (f"recorded call {clean(replay.steps[index].call_id, 80)}" if index < len(replay.steps)
                 else "the final message")
        try:
            validate_turn(turn, where)
            if index == 0:
                validate_first_turn(turn, where)
        except ScriptError as exc:
            raise ReplayError(str(exc)) from None
    for step, actions in replay.human.items():
        where = "before the first step" if step < 0 else f"after step {step + 1}"
        for action in actions:
            try:  # as recorded: a typed text's length beside the text itself, which the agent passes over
                parsed = parse_action({k: v for k, v in action.items() if k != "text_length"})
            except ActionInvalid as exc:
                raise ReplayError(f"a person's action {where}: {clean(str(exc), 200)}") from None
            if parsed.type not in HUMAN_ACTIONS:
                raise ReplayError(f"a person's action {where}: a person may send {', '.join(HUMAN_ACTIONS)}, "
                                  f"not {parsed.type}")
            outside = first_outside(parsed)
            if outside is not None:
                raise ReplayError(f"a person's action {where}: point {outside} is negative (screen px)")


class HumanReplayer:
    """Performs a recorded person's actions again at their step boundary (a takeover replayed as such):
    after the actions of step ``k`` (the replay's computer call ``call_NNNN`` with NNNN = k) and before
    that step's screenshot, each action of ``actions[k]`` (screen px) goes to the agent alone, written as
    ``takeover`` (human), one ``human_action`` each (``by: replay``), ``takeover`` (model), as a person's
    would be. ``actions[-1]`` run before the first step's first action.

    ``agent``: the agent client; ``write``: writes a record entry; ``typed_text``: whether the run keeps
    typed text; ``then``: the driver's earlier ``before_step`` hook (a view's take-over gate), still
    called after. Install :meth:`on_entry` as a record listener and :meth:`before_step` as the driver's
    ``before_step``."""

    def __init__(self, agent: Any, actions: dict[int, list[dict[str, Any]]], *, write: Any, typed_text: bool,
                 then: Any = None) -> None:
        self.agent, self.actions, self.write, self.typed_text, self.then = agent, dict(actions), write, typed_text, then
        self._step: int | None = None  # the replay step whose actions run now

    def on_entry(self, entry: Any) -> None:
        """The record's listener: a ``computer_call`` of the scripted model's turn ``NNNN`` starts step NNNN."""
        if getattr(entry, "type", None) == "computer_call":
            match = SCRIPT_CALL.match(str(getattr(entry, "call_id", "") or ""))
            if match:
                self._step = int(match.group(1))

    def before_step(self, screenshot: bool) -> Any:
        """The driver's hook: before a screenshot, the person's actions that followed the current step;
        before the first action of all, those that came before it. True when actions were performed (the
        screen must be captured anew)."""
        due = self._step if screenshot else (-1 if self._step is None else None)
        performed = False
        if due is not None and due in self.actions:
            self._perform(self.actions.pop(due))
            performed = True
        earlier = self.then(screenshot) if self.then is not None else None
        return bool(performed or earlier)

    def _perform(self, actions: list[dict[str, Any]]) -> None:
        from controller.run.entries import HumanAction, Takeover
        from controller.run.record import recorded_action
        from controller.text import clean
        from wire.actions import describe

        self.write(Takeover(control="human", by="replay"))
        try:
            for action in actions:
                self.agent.actions([action])
                self.write(HumanAction(action=describe(action, clean=clean, redact=True),
                                       input=recorded_action(action, self.typed_text), by="replay"))
        finally:
            self.write(Takeover(control="model", by="replay"))
