"""Replay a recorded run as a regression test: the record's computer calls as an offline script whose
every step expects the screen the model had when it chose that step (docs/ARCHITECTURE.md, "Replay").

:func:`build` reads ``runs/<id>/record.jsonl`` (and the screenshots beside it), step by step
(:func:`controller.model.steps.steps`), into a :class:`Replay`:

* one script turn per computer call the model made, its actions as recorded (model px, with the
  screen size and crop the run had, which the replay's task keeps); the scripted model's own ``wait``
  answers of the recorded run (``call_NNNN_wait_MMM``) are not steps and are left out; for an offline
  record whose script is at hand, each step also keeps what the scripted model waited for before it
  chose the call (its colour expectations and ``expect_retry``, :func:`_carried`), so the replay waits
  for the same reactions of the guest (a paste that has shown) and redoes a step as the run did; so
  does the closing message (what the script's last turn waited for: a person's command that has run);
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
  the step they followed, before that step's screenshot (the one the model chose its next step on);
* a call that carried pending safety checks carries the same checks (id, code, message), so the replay's
  run asks for them as any run does; what the recorded run decided on its questions -- safety checks,
  confirmations of actions, origin requests, sign-in requests -- is kept (:class:`Recorded`): whatever
  it was refused, :class:`ReplayAnswers` refuses again as the question opens, before anyone is asked,
  so a replay never does more than the recorded run did and was allowed.

Screenshots are read by the rule of every reader of a record's files (:mod:`controller.run.shots`). Raises
:class:`ReplayError` (one line) for a record that cannot be replayed, before anything starts.
"""

from __future__ import annotations

import json
import queue
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from PIL import Image

from controller.offline.script import ScriptError, load_script, validate_first_turn, validate_turn
from controller.offline.call_ids import SCRIPT_CALL, SCRIPTED_WAIT, STEP_OF_CALL
from controller.model.steps import steps
from controller.run.entries import Approval, HumanAction, RunFinished, RunStarted
from controller.run.live import HUMAN_ACTIONS
from controller.run.record import read_entries
from controller.run.registry import ORIGIN, SIGN_IN, ApprovalRegistry, AnswerRefused, Request
from controller.model.errors import DesktopSandboxError
from controller.run.shots import load_shot
from controller.text import clean
from wire.actions import ACTION_TYPES, ActionInvalid, first_outside, parse_action
from wire.screen_match import MatchRule, encode_crop, regions_for

BY_REPLAY = "replay"
"""``by`` of an answer the replay gives itself (a refusal the recorded run had): in ``approval`` and
``sign_in`` lines, and the reason of a run it cancels (``cancelled by replay``)."""
GRANTED = {"safety_check": "approved", "action": "approved", ORIGIN: "approved", SIGN_IN: "submitted"}
"""Per kind of question, the one recorded answer a replay asks about again; every other (denied,
withdrawn, cancelled, timeout, expired, screen_changed, no answer at all...) is a refusal it repeats."""
DEFAULT_STEP_TIMEOUT_S = 30.0  # replay --step-timeout's help names it
"""Seconds a replayed step waits for the screen to match (times the sandbox's ``time_scale``)."""


class ReplayError(DesktopSandboxError, ValueError):
    """A record that cannot be replayed (one line: why, and what to do)."""


@dataclass(frozen=True)
class Recorded:
    """One answer of the recorded run to a question: ``decision`` (an ``approval`` line's, a ``sign_in``
    line's ``outcome``, or ``unanswered`` when the record has none), ``by`` and ``message`` as recorded.
    ``kind``: the question's (``safety_check``, ``action``, ``origin_access``, ``browser_authentication``)."""

    kind: str
    decision: str
    by: str | None = None
    message: str | None = None

    @property
    def granted(self) -> bool:
        """Whether the recorded run was allowed to go on (:data:`GRANTED`): the replay then asks again."""
        return GRANTED.get(self.kind) == self.decision

    def text(self) -> str:
        """``denied by no-approver``, ``withdrawn by cancel (cancelled by SIGTERM)`` (escaped, one line)."""
        why = f" ({self.message})" if self.message and self.decision == "withdrawn" else ""
        return clean(self.decision + (f" by {self.by}" if self.by else "") + why, 160)


@dataclass
class Step:
    """One recorded computer call: ``call_id`` (the recorded run's), ``actions`` (model px, typed text
    filled in), ``screenshot`` (the file of the screenshot the model chose it on), ``regions`` compared,
    ``pending_checks`` (its pending safety checks, ``{"id", "code", "message"}``, carried by its turn) and
    ``safety`` (the recorded run's last answer on them; None without checks)."""

    call_id: str
    actions: list[dict[str, Any]]
    screenshot: str | None
    regions: int = 0
    pending_checks: list[dict[str, Any]] = field(default_factory=list)
    safety: Recorded | None = None


@dataclass
class Replay:
    """What :func:`build` made of a record: ``task_source`` (the recorded task file), ``task_sha256``,
    ``steps``, ``turns`` (the offline script, contract 3), ``human`` (step index -> a person's actions,
    screen px, performed after that step's actions and before its screenshot; -1: before the first
    step's actions), ``final_message``.

    What the recorded run was asked and answered: ``confirmed`` (the action types it confirmed before
    running them: ``--confirm-actions`` / ``--step``, which the replay confirms again),
    ``action_refusals`` (``(step, action type, earlier, answer)`` per confirmation it was refused: at
    that step (:data:`STEP_OF_CALL`), after ``earlier`` confirmations of the type there that were
    granted), ``origins`` (origin -> its origin requests' answers, in order), ``sign_ins`` (each sign-in
    request's answer, in order), ``sign_in_origins`` (the origins it signed in at), ``status`` /
    ``reason`` (its verdict)."""

    record_dir: Path
    task_source: Path
    task_sha256: str | None
    steps: list[Step] = field(default_factory=list)
    turns: list[dict[str, Any]] = field(default_factory=list)
    human: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    final_message: str | None = None
    confirmed: set[str] = field(default_factory=set)
    action_refusals: list[tuple[int, str, int, Recorded]] = field(default_factory=list)
    origins: dict[str, list[Recorded]] = field(default_factory=dict)
    sign_ins: list[Recorded] = field(default_factory=list)
    sign_in_origins: list[str] = field(default_factory=list)
    status: str | None = None
    reason: str | None = None

    @property
    def signs_in(self) -> bool:
        """Whether a person (or a ``--sign-in`` file) answered a sign-in request of the recorded run."""
        return any(s.granted for s in self.sign_ins)

    def write_script(self, path: Path) -> Path:
        """Write :attr:`turns` as a JSONL offline script at ``path``; returns it."""
        path.write_text("".join(json.dumps(t, ensure_ascii=True) + "\n" for t in self.turns), encoding="utf-8")
        return path


def _script_turns(started: RunStarted) -> dict[str, dict[str, Any]]:
    """Call id ``call_NNNN`` -> script turn NNNN, for an offline record whose script is still readable
    (empty for a live record, or when the script is gone or no longer loads)."""
    script = started.script
    if started.mode != "offline" or not script:
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


def _checks(call_id: str, raw: Any) -> list[dict[str, Any]]:
    """A recorded call's pending safety checks as its replayed turn carries them (``id``, ``code``,
    ``message``); :class:`ReplayError` for one that cannot be asked again (no string id, another field
    not a string)."""
    if not raw:
        return []
    if not isinstance(raw, list):
        raise ReplayError(f"{clean(call_id, 80)}: its pending safety checks are not a list")
    checks = []
    for check in raw:
        if not isinstance(check, dict) or not isinstance(check.get("id"), str) or any(
                check.get(k) is not None and not isinstance(check[k], str) for k in ("code", "message")):
            raise ReplayError(f"{clean(call_id, 80)}: a pending safety check without a string id, code or "
                              "message cannot be asked again")
        checks.append({k: check.get(k) for k in ("id", "code", "message")})
    return checks


def _note_approval(replay: Replay, entry: Approval, position: int, safety: dict[str, Recorded],
                   granted: dict[tuple[int, str], int]) -> None:
    """Keep one recorded ``approval`` line in ``replay`` (``position``: the step it came in; ``safety``:
    call id -> last safety-check answer; ``granted``: confirmations granted per step and action type, an
    approval the screen then made void not counted)."""
    what, decision = entry.what, str(entry.decision)
    answer = Recorded(str(what), decision, entry.by, entry.message)
    if what == "safety_check":
        safety[str(entry.call_id or "")] = answer
    elif what == ORIGIN:
        replay.origins.setdefault(str(entry.origin or ""), []).append(answer)
    elif what == "action":
        kind = str(entry.action or "").split(" ", 1)[0]
        if kind in ACTION_TYPES:
            replay.confirmed.add(kind)
        key = (position, kind)
        if decision == "approved":
            granted[key] = granted.get(key, 0) + 1
        elif decision == "screen_changed":  # that approval went void: the one asked again counts
            granted[key] = max(0, granted.get(key, 0) - 1)
        else:
            replay.action_refusals.append((position, kind, granted.get(key, 0), answer))


def _human_input(entry: HumanAction) -> dict[str, Any]:
    """A person's recorded action as it is performed again (its ``input``, screen px); :class:`ReplayError`
    when the record holds its description only (an older format) or its typed text as a length only."""
    data = entry.input
    if not isinstance(data, dict):
        raise ReplayError("a person's action during a takeover is recorded as its description only "
                          "(a record of an older format): it cannot be performed again")
    if data.get("type") == "type" and "text" not in data:
        raise ReplayError("a person typed during a takeover and the record holds the text's length only; "
                          "record the run with `run-task --record-typed-text` to replay it")
    return data


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
        entries = read_entries(record_dir / "record.jsonl" if record_dir.is_dir() else record_dir)
    except (OSError, ValueError) as exc:
        raise ReplayError(f"cannot read the record: {exc}") from None
    record_dir = record_dir if record_dir.is_dir() else record_dir.parent
    shots_dir = record_dir.resolve()  # the directory the user named; its screenshots by the rule of run.shots
    started = entries[0] if entries and isinstance(entries[0], RunStarted) else None
    if started is None or not started.task.source:
        raise ReplayError("the record does not say which task file it ran")
    replay = Replay(record_dir, Path(started.task.source), started.task.sha256)
    record_steps = steps(entries)
    if any(step.browser_calls for step in record_steps):
        raise ReplayError("the run used browser tools: their element refs belong to the recorded pages, so "
                          "only computer calls can be replayed")
    turns = _script_turns(started)
    scripted = _texts(turns)
    sizes: dict[str, Image.Image] = {}
    pending_human: list[dict[str, Any]] = []
    last_point: tuple[int, int] | None = None
    safety: dict[str, Recorded] = {}  # recorded call id -> its last safety-check answer
    position = 0  # the replay step the record's lines belong to (STEP_OF_CALL's numbering)
    granted: dict[tuple[int, str], int] = {}  # (step, action type) -> confirmations granted there
    for record_step in record_steps:
        for entry, screen in record_step.screens():
            kind = entry.type
            if kind == "approval":
                _note_approval(replay, entry, position, safety, granted)
            elif kind == "sign_in" and entry.request_id:
                answer = Recorded(SIGN_IN, str(entry.outcome), entry.by, entry.detail)
                replay.sign_ins.append(answer)
                if answer.granted and entry.origin not in replay.sign_in_origins:
                    replay.sign_in_origins.append(str(entry.origin))
            elif kind == "human_action":
                pending_human.append(_human_input(entry))
            elif kind == "computer_call":
                call_id = str(entry.call_id or "")
                recorded = entry.actions
                if SCRIPTED_WAIT.match(call_id) and (turns or all(a.get("type") == "wait" for a in recorded)):
                    # the scripted model waiting for its expectations (or, with its script at hand, redoing a
                    # step: the replayed turn carries the same expect_retry); without the script a retry's
                    # actions are a step of their own
                    position = len(replay.steps)  # the waits belong to the step they come before
                    continue
                position = len(replay.steps)
                shown = screen.file if screen is not None else None  # the screen the model chose the call on
                actions = [_fill_text(call_id, i, dict(a), scripted) for i, a in enumerate(recorded)]
                actions = [{k: v for k, v in a.items() if k != "text_length"} for a in actions]
                turn: dict[str, Any] = {"comment": f"step {len(replay.steps) + 1}: {call_id} as recorded",
                                        "actions": actions}
                step = Step(call_id, actions, shown, pending_checks=_checks(call_id, entry.pending_checks))
                if step.pending_checks:  # asked again as any run asks: the same checks
                    turn["pending_safety_checks"] = step.pending_checks
                if shown is not None:
                    image = sizes.get(shown)
                    if image is None:
                        image, why = load_shot(shots_dir, shown)
                        if image is None:
                            raise ReplayError(f"the screenshot {clean(shown, 80)} of {clean(call_id, 80)} cannot "
                                              f"be read: {why}")
                        sizes[shown] = image
                    regions = regions_for(_points(actions), image.size, rule, fallback=last_point)
                    expect = [{"kind": "matches", "x": r.x, "y": r.y, "w": r.w, "h": r.h,
                               "png": encode_crop(image, r), "tolerance": rule.tolerance,
                               "fraction": round(1 - rule.max_changed, 6)} for r in regions]
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
    finished = next((e for e in reversed(entries) if isinstance(e, RunFinished)), None)
    if finished is not None:
        replay.final_message, replay.status, replay.reason = finished.final_message, finished.status, finished.reason
    if not replay.steps:
        raise ReplayError("the record holds no computer call to replay")
    for step in replay.steps:
        if step.pending_checks:
            step.safety = safety.get(step.call_id) or Recorded("safety_check", "unanswered", None,
                                                               "the record has no answer to its safety checks")
    if pending_human:
        replay.human[len(replay.turns) - 1] = pending_human
    final: dict[str, Any] = {"message": replay.final_message or "replayed every recorded step"}
    last = list(turns.values())[-1] if turns else None
    if last is not None and not last.get("actions"):  # the script's closing message waited for the guest too
        carried = _carried(last)
        if carried.get("expect"):
            final["expect"] = carried["expect"]
            final["expect_timeout_s"] = max(step_timeout_s, carried.get("expect_timeout_s", 0))
    replay.turns.append(final)
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


class ReplayAnswers:
    """A replay's own answers (docs/ARCHITECTURE.md, "Replay"): subscribed to the run's approval
    registry, it refuses each question the recorded run was refused, as the question opens, so that
    nobody is asked and nothing of it runs; a question the recorded run granted is left to whoever
    answers any run's (the terminal, ``--sign-in``...), and a safety check every one of whose codes is in
    ``approve_codes`` (``--approve-safety-check``) is approved ``by="opt-in"``, as run-task's opt-in does,
    but only after the refusals (the replay's run gets no opt-in codes of its own: an opt-in there would
    approve before any question opens). Refusals are ``by`` :data:`BY_REPLAY`, with the recorded answer
    as their reason.

    * a safety check on step ``NNNN`` (call ``call_NNNN``): :attr:`Step.safety` refused -> denied; a
      recorded ``withdrawn`` (the recorded run stopped while it was pending) cancels the run
      (``cancel_run``), which withdraws it as the recorded run's stop did;
    * a confirmation of an action (``action``): refused from the step of a recorded refusal of its type
      on (:attr:`Replay.action_refusals`; at that step after as many granted ones as the record has);
    * the ``k``-th origin request for an origin: its recorded ``k``-th answer, when a refusal: ``deny``
      again for ``denied``, else ``cancel`` (the held connections refused, nothing remembered);
    * the ``k``-th sign-in request: cancelled when the recorded ``k``-th was not submitted.

    ``on_entry`` follows the run's record (a ``computer_call`` tells the step, :data:`STEP_OF_CALL`);
    :meth:`stop` at the run's end. :attr:`cancelled`: the recorded answer the run was cancelled for."""

    def __init__(self, replay: Replay, registry: ApprovalRegistry, cancel_run: Any, *,
                 approve_codes: Iterable[str] = ()) -> None:
        self.replay, self.registry, self.cancel_run = replay, registry, cancel_run
        self.approve_codes = set(approve_codes)
        self.step = 0
        self.cancelled: Recorded | None = None
        self._asked: dict[tuple[str, str], int] = {}  # (kind, about) -> questions of it so far
        self._seen: set[str] = set()
        self._lock = threading.Lock()
        self._answers: queue.Queue[tuple[Request, str] | None] = queue.Queue()  # origin answers, for the gateway
        self._thread = threading.Thread(target=self._send, name="replay-refusals", daemon=True)
        self._thread.start()
        self._unsubscribe = registry.subscribe(self._on_change)

    def on_entry(self, entry: Any) -> None:
        """The record's listener: a replayed ``computer_call`` tells the step the run is at."""
        if getattr(entry, "type", None) == "computer_call":
            match = STEP_OF_CALL.match(str(getattr(entry, "call_id", "") or ""))
            if match:
                self.step = int(match.group(1))

    def _count(self, kind: str, about: str) -> int:
        with self._lock:
            n = self._asked.get((kind, about), 0)
            self._asked[(kind, about)] = n + 1
        return n

    def refusal(self, request: Request) -> Recorded | None:
        """The recorded refusal ``request`` meets again, or None (a question to ask). Counts it."""
        if request.kind == "safety_check":
            match = SCRIPT_CALL.match(request.call_id or "")
            index = int(match.group(1)) if match else -1
            answer = self.replay.steps[index].safety if 0 <= index < len(self.replay.steps) else None
        elif request.kind == "action":
            kind = (request.actions[0] if request.actions else "").split(" ", 1)[0]
            earlier = self._count(f"action@{self.step}", kind)
            answer = next((a for step, k, granted, a in self.replay.action_refusals
                           if k == kind and (step < self.step or (step == self.step and earlier >= granted))), None)
        elif request.kind == ORIGIN:
            answers = self.replay.origins.get(request.origin or "", [])
            n = self._count(ORIGIN, request.origin or "")
            answer = answers[n] if n < len(answers) else None
        elif request.kind == SIGN_IN:
            n = self._count(SIGN_IN, "")
            answer = self.replay.sign_ins[n] if n < len(self.replay.sign_ins) else None
        else:
            answer = None
        return None if answer is None or answer.granted else answer

    def _on_change(self, request: Request) -> None:
        with self._lock:
            if not request.pending or request.id in self._seen:
                return
            self._seen.add(request.id)
        answer = self.refusal(request)
        if answer is None:
            if request.kind == "safety_check" and request.checks and all(
                    c.get("code") and c["code"] in self.approve_codes for c in request.checks):
                try:
                    self.registry.answer(request.id, "approve", by="opt-in")
                except AnswerRefused:
                    pass  # decided meanwhile (the run's end): that decision stands
            return
        reason = f"as recorded: {answer.text()}"
        if request.kind == ORIGIN:  # forwarded to the gateway: not on the thread that mirrored it
            self._answers.put((request, "deny" if answer.decision == "denied" else "cancel"))
        elif request.kind == SIGN_IN:
            self.registry.resolve(request.id, "cancelled", by=BY_REPLAY, reason=reason)
        elif answer.decision == "withdrawn":
            self.cancelled = answer
            self.cancel_run(BY_REPLAY)
        else:
            self.registry.deny(request, by=BY_REPLAY, reason=reason)

    def _send(self) -> None:
        while (job := self._answers.get()) is not None:
            request, answer = job
            try:
                self.registry.answer(request.id, answer, by=BY_REPLAY)
            except AnswerRefused:
                pass  # decided meanwhile (the gateway's deadline, the run's end): that decision stands

    def stop(self) -> None:
        """Stop answering."""
        self._unsubscribe()
        self._answers.put(None)
        self._thread.join(5.0)


class HumanReplayer:
    """Performs a recorded person's actions again at their step boundary (a takeover replayed as such):
    after the actions of step ``k`` (the replay's computer call ``call_NNNN`` with NNNN = k) and before
    that step's screenshot, each action of ``actions[k]`` (screen px) goes to the agent alone, written as
    ``takeover`` (human), one ``human_action`` each (``by: replay``), ``takeover`` (model), as a person's
    would be. ``actions[-1]`` run before the first step's first action.

    ``agent``: the agent client; ``write``: writes a record entry; ``typed_text``: whether the run keeps
    typed text. Follow the record with :meth:`on_entry` (a bus subscriber) and add :meth:`before_step` to
    the driver's seam's gates (:class:`controller.run.seam.RunSeam`)."""

    def __init__(self, agent: Any, actions: dict[int, list[dict[str, Any]]], *, write: Any, typed_text: bool) -> None:
        self.agent, self.actions, self.write, self.typed_text = agent, dict(actions), write, typed_text
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
        return performed

    def _perform(self, actions: list[dict[str, Any]]) -> None:
        from controller.redaction import hold_for_typing, typing_done
        from controller.run.entries import HumanAction, Takeover
        from controller.run.record import recorded_action
        from controller.text import clean
        from wire.actions import describe

        self.write(Takeover(control="human", by="replay"))
        try:
            for action in actions:
                hold_for_typing(self.agent, action)
                self.agent.actions([action])
                self.write(HumanAction(action=describe(action, clean=clean, redact=True),
                                       input=recorded_action(action, self.typed_text), by="replay"))
        finally:
            typing_done(self.agent)
            self.write(Takeover(control="model", by="replay"))
