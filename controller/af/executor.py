"""One batch of an Agent Framework agent's native computer calls, run on the sandbox.

Agent Framework (``agent-framework-core``) gives a model's ``computer_call`` items to the application as
``Content`` items of type ``computer_tool_call``: an item ``id`` (the workflow's request id), a
separate ``call_id``, the ordered ``actions`` and optional ``pending_safety_checks``. The application
runs them and answers each with ``Content.from_computer_tool_result(call_id, screenshot,
acknowledged_safety_checks)``; the framework never acknowledges a check by itself.

:class:`ComputerCallExecutor` is that application part for this project:

* **the native call is rebuilt from the content's fields** (:func:`native_call`) -- never from
  ``raw_representation``, which a checkpoint does not keep -- and validated, without coercion, as
  openai's ``ResponseComputerToolCall``;
* **it runs through the SDK's** ``ComputerToolset.execute`` on the run's :class:`SandboxDriver`, with
  the run's approval callbacks (:class:`controller.run.approvals.SafetyCheckApprover`, optionally
  :class:`controller.run.approvals.ActionGate`): the same strict-``True`` rule, the same terminal prompt
  and console card (the approval registry), the same ``approval``, ``action`` and ``screenshot`` lines
  in the run record as ``run-task``;
* **the result** (:func:`computer_result`) holds exactly one screenshot, a ``data:image/png|jpeg;base64,``
  URL, and the acknowledged checks as the SDK returned them: all of the call's pending checks, and
  only after the approval callback returned exactly ``True`` for that call (a person's approval, or the
  run's ``--approve-safety-check`` opt-in, as in ``run-task``). A partial or unapproved acknowledgement
  is never built: :func:`check_acknowledgement` refuses it;
* **a batch** (the calls of one model response) runs call by call in its original order
  (:meth:`ComputerCallExecutor.run_batch`). A denial, a cancellation, or a call the run record shows
  as already attempted stops it: nothing more of the batch runs, the calls not run get an ``approval``
  line ``withdrawn`` (``by: cancel``), and the caller sends no result for the batch
  (:class:`BatchOutcome`);
* **a call already attempted** -- the run record (this run's, or the records named in
  ``earlier_records``, e.g. the run a checkpoint was saved in) has an ``action`` line for its
  ``call_id``, or an approved safety-check decision (its actions were released) -- is never run again:
  its side effects may already have happened, so the batch is cancelled and the person is told to look
  at the screen again (:func:`attempted_calls`).

Text from the model (call ids, check codes and messages, typed text) is shown escaped
(:func:`controller.text.clean`); typed text enters the record as its length only.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import inspect
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable, Iterable, Sequence

from agent_framework import Content
from openai import ComputerToolset
from openai.lib.computer import ComputerUseError
from openai.types.responses import ResponseComputerToolCall
from pydantic import ValidationError
from rich.console import Console

from controller.model.steps import steps
from controller.run.approvals import ActionGate, Decision, SafetyCheckApprover, describe_action
from controller.run.driver import SandboxDriver, driver_actions
from controller.model.errors import DesktopSandboxError
from controller.run.entries import ComputerCall, problem
from controller.run.record import read_entries, redact_action
from controller.run.recording import RecordingHooks
from controller.text import clean

COMPUTER_CALL = "computer_tool_call"
"""The ``Content.type`` of a native computer call."""

SCREENSHOT_MIMES = ("image/png", "image/jpeg")
"""What a result's screenshot may be (a ``data:`` URL of one of these, base64)."""

LOOK_AGAIN = ("its actions were already attempted (the run record has them): it is not run again and its "
              "batch is cancelled; look at the screen again before going on")
"""What the person is told, and the record says, about a call that was already attempted."""


class AcknowledgementError(DesktopSandboxError, ValueError):
    """A computer result that does not acknowledge exactly its call's pending safety checks, was not
    approved, or has no valid screenshot: it is never sent."""


def native_call(content: Any) -> ResponseComputerToolCall:
    """The native ``computer_call`` of a ``computer_tool_call`` Content, rebuilt from its fields.

    Uses ``id``, ``call_id``, ``status`` (``"completed"`` when absent), the ordered ``actions`` and
    ``pending_safety_checks`` (``[]`` when absent), never ``raw_representation``; validated strictly
    (no coercion: a coordinate ``"1"`` is refused) as ``openai.types.responses.ResponseComputerToolCall``.
    Raises ValueError (escaped text) for another content type, a call without actions, or fields the
    model type refuses.
    """
    if getattr(content, "type", None) != COMPUTER_CALL:
        raise ValueError(f"not a {COMPUTER_CALL} content: {clean(getattr(content, 'type', type(content).__name__), 40)}")
    actions, checks = getattr(content, "actions", None), getattr(content, "pending_safety_checks", None)
    if not isinstance(actions, list) or not actions:
        raise ValueError(f"computer call {clean(getattr(content, 'call_id', None), 80)} has no actions")
    if checks is not None and not isinstance(checks, list):
        raise ValueError("pending_safety_checks must be a list")
    try:
        data = {"type": "computer_call", "id": content.id, "call_id": content.call_id,
                "status": content.status or "completed", "actions": [dict(a) for a in actions],
                "pending_safety_checks": [dict(c) for c in checks or []]}
        return ResponseComputerToolCall.model_validate(data, strict=True)
    except ValidationError as exc:
        raise ValueError(f"not a valid computer call: {clean(problem(exc), 300)}") from None
    except (TypeError, ValueError) as exc:  # an action or check that is not a mapping
        raise ValueError(f"not a valid computer call: {clean(exc, 300)}") from None


def _check_ids(checks: Any) -> list[Any]:
    return [c.get("id") if isinstance(c, dict) else getattr(c, "id", None) for c in checks or []]


def check_acknowledgement(call: Any, result: Any) -> None:
    """Refuse (:class:`AcknowledgementError`) a ``computer_tool_result`` Content ``result`` that does not
    answer ``call`` (a ``computer_tool_call`` Content or a ``ResponseComputerToolCall``) exactly: the same
    ``call_id``, the acknowledged check ids equal to the pending ones in the same order (all or, when none
    is pending, none: never a part), and one screenshot that is a ``data:image/png|jpeg;base64,`` URI
    whose bytes are that image type. Returns None when it does."""
    if getattr(result, "type", None) != "computer_tool_result":
        raise AcknowledgementError("not a computer_tool_result")
    if result.call_id != call.call_id:
        raise AcknowledgementError(f"the result answers call {clean(result.call_id, 80)}, not "
                                   f"{clean(call.call_id, 80)}")
    pending, acked = _check_ids(call.pending_safety_checks), _check_ids(result.acknowledged_safety_checks)
    if acked != pending:
        raise AcknowledgementError(f"call {clean(call.call_id, 80)} acknowledges {clean(acked, 200)} but its pending "
                                   f"safety checks are {clean(pending, 200)}: exactly those, or nothing is sent")
    shot = result.screenshot
    uri = getattr(shot, "uri", None)
    if getattr(shot, "type", None) not in ("data", "uri") or not isinstance(uri, str):
        raise AcknowledgementError("a computer result needs exactly one screenshot")
    _screenshot_mime(uri)


def _screenshot_mime(url: str) -> str:
    """The mime of a ``data:image/png|jpeg;base64,`` URL whose bytes are that image; AcknowledgementError
    otherwise."""
    head, sep, payload = url.partition(",")
    mime = head[len("data:"):-len(";base64")] if head.startswith("data:") and head.endswith(";base64") else ""
    if not sep or mime not in SCREENSHOT_MIMES:
        raise AcknowledgementError(f"the screenshot is not a data:image/png|jpeg;base64 URL ({clean(head, 40)})")
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise AcknowledgementError("the screenshot's data URL is not base64") from None
    magic = b"\x89PNG\r\n\x1a\n" if mime == "image/png" else b"\xff\xd8\xff"
    if not data.startswith(magic):
        raise AcknowledgementError("the screenshot's bytes are not the image type its data URL names")
    return mime


def computer_result(call: ResponseComputerToolCall, output: dict[str, Any], *, approved: bool) -> Any:
    """The ``computer_tool_result`` Content answering ``call`` from the SDK's ``computer_call_output``
    ``output`` (``ComputerToolset.execute``'s return): its one screenshot as ``Content.from_uri(<data
    URL>, media_type=<its mime>)`` and its ``acknowledged_safety_checks`` as the SDK returned them.
    ``approved``: whether the approval callback returned exactly ``True`` for this call. Raises
    :class:`AcknowledgementError` when the call has pending checks and was not approved, or when the
    result would not answer the call exactly (:func:`check_acknowledgement`)."""
    if call.pending_safety_checks and not approved:
        raise AcknowledgementError(f"call {clean(call.call_id, 80)} has pending safety checks that nobody approved")
    screenshot = output.get("output") if isinstance(output, dict) else None
    url = screenshot.get("image_url") if isinstance(screenshot, dict) else None
    if not isinstance(url, str):
        raise AcknowledgementError("the SDK's output has no screenshot image_url")
    acked = [dict(c) for c in output.get("acknowledged_safety_checks") or []]
    result = Content.from_computer_tool_result(
        call_id=call.call_id, screenshot=Content.from_uri(url, media_type=_screenshot_mime(url)),
        acknowledged_safety_checks=acked)
    check_acknowledgement(call, result)
    return result


def attempted_calls(records: Iterable[str | Path]) -> set[str]:
    """The call ids that ``records`` (run records: ``record.jsonl`` files or run directories) show as
    attempted: those their steps show attempted (:attr:`controller.model.steps.Step.attempted`: a call
    with an ``action`` line, a driver call was made for it, or an approved ``safety_check`` decision, its
    actions were released to run). Raises OSError or ValueError (as
    :func:`controller.run.record.read_entries`) when a record cannot be read: then nothing may run."""
    return {call_id for path in records for step in steps(read_entries(path)) for call_id in step.attempted}


def _recorded_calls(records: Iterable[str | Path]) -> set[str]:
    """The call ids of the ``computer_call`` lines of ``records``."""
    return {call_id for path in records for step in steps(read_entries(path)) for call_id in step.call_ids}


def _invoke(callback: Callable[..., Any], arg: Any, cancelled: Callable[[], bool] | None) -> Any:
    """``callback(arg, cancelled=cancelled)`` when it takes ``cancelled`` (as the SDK passes it), else
    ``callback(arg)``."""
    try:
        params = inspect.signature(callback).parameters.values()
    except (TypeError, ValueError):
        params = []  # type: ignore[assignment]
    if any(p.name == "cancelled" or p.kind is p.VAR_KEYWORD for p in params):
        return callback(arg, cancelled=cancelled)
    return callback(arg)


@dataclass
class BatchOutcome:
    """What :meth:`ComputerCallExecutor.run_batch` did with one batch.

    ``results``: the ``computer_tool_result`` Contents of the calls that ran, in the batch's order
    (``ran``: their indexes in the batch). ``stopped``: None when every call ran (send ``results``);
    else why the batch stopped -- ``denied`` (a person, the deadline or nobody-to-ask said no),
    ``cancelled`` (the run was cancelled), ``already_attempted`` (the record shows the call's actions
    were tried before) -- with ``stopped_at`` (the index of that call), ``message`` (escaped) and
    ``not_run`` (the call ids that did not run, the stopping one included). A stopped batch's results
    are never to be sent as the batch's answer: in a workflow cancel it through the framework, with a
    plain agent start a new session.
    """

    results: list[Any] = field(default_factory=list)
    ran: list[int] = field(default_factory=list)
    stopped: str | None = None
    stopped_at: int | None = None
    message: str | None = None
    not_run: list[str] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        """Whether every call of the batch ran (``results`` then answers the whole batch)."""
        return self.stopped is None


OnResult = Callable[[int, Any], Awaitable[None]]
"""``on_result(index, result)``: awaited after each call of a batch ran (``index`` in the batch)."""


class ComputerCallExecutor:
    """Runs ``computer_tool_call`` Contents on the sandbox (see the module docstring).

    ``driver``: the run's :class:`SandboxDriver`; ``approver``: its ``approve_safety_checks`` callback
    (a :class:`SafetyCheckApprover` on the run's approval registry); ``before_action``: its optional
    :class:`ActionGate`; ``hooks``: the run's :class:`RecordingHooks` (the ``action`` lines, the
    record this executor reads and writes; None: nothing recorded, nothing checked); ``cancelled``: the
    run's cancellation flag, polled between driver calls; ``earlier_records``: records of earlier
    processes of the same run (a checkpoint's), whose attempts count as this run's; ``console``: where
    the person is told about calls not run (default: the approver's).

    Calls run in a worker thread (the SDK's loop is synchronous), one at a time.
    """

    def __init__(self, driver: SandboxDriver, approver: SafetyCheckApprover | Callable[..., Any], *,
                 before_action: ActionGate | Callable[..., Any] | None = None, hooks: RecordingHooks | None = None,
                 cancelled: Callable[[], bool] | None = None, earlier_records: Iterable[str | Path] = (),
                 console: Console | None = None) -> None:
        self.driver = driver
        self.approver = approver
        self.before_action = before_action
        self.hooks = hooks
        self.cancelled = cancelled or (lambda: False)
        self.earlier_records = [Path(p) for p in earlier_records]
        self.console = console or getattr(approver, "console", None) or Console(stderr=True, emoji=False)
        self._toolset = ComputerToolset(driver)
        self._approved: dict[str, bool] = {}
        self._refused: set[str] = set()
        self._started: set[str] = set()
        """Call ids this executor began to run (whatever the records say: a run without hooks has none)."""

    # -- the record ------------------------------------------------------------------------------
    def _records(self) -> list[Path]:
        own = [self.hooks.record.path] if self.hooks is not None else []
        return [*self.earlier_records, *own]

    def attempted(self) -> set[str]:
        """Call ids already attempted: in this run's records (:func:`attempted_calls`) or begun by this
        executor."""
        return attempted_calls(self._records()) | self._started

    def _say(self, text: str) -> None:
        self.console.print(text, markup=False, emoji=False, highlight=False)

    def _emit(self, decision: Decision) -> None:
        on_decision = getattr(self.approver, "on_decision", None)
        if on_decision is not None:
            on_decision(decision)
        elif self.hooks is not None:
            self.hooks.on_decision(decision)

    def _withdrawn(self, call: ResponseComputerToolCall, message: str) -> None:
        """The ``approval`` line of a call of a stopped batch that did not run."""
        checks = list(call.pending_safety_checks or [])
        what = "safety_check" if checks else "action"
        action = None if checks else clean("; ".join(describe_action(a, redact=True) for a in call.actions or []), 500)
        self._emit(Decision(what=what, decision="withdrawn", by="cancel", call_id=call.call_id,
                            codes=[c.code or "" for c in checks], check_ids=[c.id for c in checks],
                            action=action, message=clean(message, 500)))

    # -- callbacks -------------------------------------------------------------------------------
    def _approve(self, call: ResponseComputerToolCall, cancelled: Callable[[], bool] | None = None) -> bool:
        answer = _invoke(self.approver, call, cancelled)
        self._approved[call.call_id] = answer is True
        if answer is not True:
            self._refused.add(call.call_id)
        return answer

    def _gate(self, call_id: str) -> Callable[..., bool] | None:
        gate = self.before_action
        if gate is None or not getattr(gate, "active", True):
            return None

        def before_action(action: Any, cancelled: Callable[[], bool] | None = None) -> bool:
            answer = _invoke(gate, action, cancelled)
            if answer is not True:
                self._refused.add(call_id)
            return answer

        return before_action

    # -- running ---------------------------------------------------------------------------------
    def _execute(self, call: ResponseComputerToolCall) -> dict[str, Any]:
        """One call through the SDK (worker thread): approvals, the actions in order, one screenshot."""
        if self.hooks is not None:
            self.hooks.current_call = call.call_id
        self._approved.pop(call.call_id, None)
        self._refused.discard(call.call_id)
        plan = getattr(self.driver, "plan_calls", None)
        if plan is not None:  # its last action goes with its screenshot (SandboxDriver.plan_calls)
            plan([driver_actions(call.actions if call.actions is not None else [call.action])])
        return self._toolset.execute(call, approve_safety_checks=self._approve,
                                     before_action=self._gate(call.call_id), cancelled=self.cancelled,
                                     on_diagnostic=self.hooks.on_diagnostic if self.hooks is not None else None)

    def _note_call(self, call: ResponseComputerToolCall, recorded: set[str]) -> None:
        """A ``computer_call`` line for a call the record does not have yet (one restored from a
        checkpoint, or one the model's responses were not recorded for)."""
        if self.hooks is None or call.call_id in recorded:
            return
        self.hooks.record.write(ComputerCall(
            call_id=call.call_id, form="actions",
            actions=[redact_action(a.model_dump(mode="json", exclude_none=True)) for a in call.actions or []],
            pending_checks=[c.model_dump(mode="json", exclude_none=True) for c in call.pending_safety_checks or []]))

    async def run_batch(self, requests: Sequence[Any], on_result: OnResult | None = None) -> BatchOutcome:
        """Run one batch of ``computer_tool_call`` Contents in their order; returns the
        :class:`BatchOutcome`. ``on_result`` is awaited after each call that ran (a workflow sends that
        call's result then, so a checkpoint keeps it).

        Every call is validated first (:func:`native_call`; ValueError for any invalid one, before
        anything runs). A call is not run when the records show it attempted; a denial or a
        cancellation stops the batch. Raises what the driver or the guest raised (the batch's later
        calls did not run; the caller cancels the batch) and :class:`AcknowledgementError` (never for a
        call the SDK ran after an approval)."""
        calls = [native_call(content) for content in requests]
        seen: set[str] = set()
        for call in calls:
            for key in {call.call_id, call.id}:
                if key in seen:  # one call given twice would run its actions twice
                    raise ValueError(f"computer call {clean(key, 80)} appears twice in the batch")
                seen.add(key)
        outcome = BatchOutcome()
        if calls and self.driver.model_space is None:
            # A process that sent the model nothing yet (one restored from a checkpoint): the model's px
            # are those of the screen as the screenshot policy shows it, so one capture sets them.
            await asyncio.to_thread(self.driver.capture)
        for index, call in enumerate(calls):
            if call.call_id in self.attempted():
                outcome.stopped, outcome.message = "already_attempted", LOOK_AGAIN
                self._say(f"computer_call {clean(call.call_id, 80)}: {LOOK_AGAIN}")
                self._withdrawn(call, LOOK_AGAIN)
            else:
                self._note_call(call, _recorded_calls(self._records()) if self.hooks is not None else set())
                self._started.add(call.call_id)
                try:
                    output = await asyncio.to_thread(self._execute, call)
                except ComputerUseError:
                    if self.cancelled():
                        outcome.stopped, outcome.message = "cancelled", "the run was cancelled"
                    elif call.call_id in self._refused:
                        outcome.stopped = "denied"
                        outcome.message = f"computer_call {clean(call.call_id, 80)} was not approved"
                    else:  # the SDK refused the call itself (not completed, an invalid action)
                        raise
                else:
                    result = computer_result(call, output, approved=self._approved.get(call.call_id, False))
                    outcome.results.append(result)
                    outcome.ran.append(index)
                    if on_result is not None:
                        await on_result(index, result)
                    continue
            outcome.stopped_at = index
            outcome.not_run = [c.call_id for c in calls[index:]]
            reason = f"batch cancelled: computer_call {clean(call.call_id, 80)} {outcome.stopped.replace('_', ' ')}"
            for later in calls[index + 1:]:
                self._withdrawn(later, reason)
            if len(calls) > index + 1:
                self._say(f"{reason}: {len(calls) - index - 1} more call(s) of its batch not run")
            return outcome
        return outcome


__all__ = [
    "AcknowledgementError", "BatchOutcome", "COMPUTER_CALL", "ComputerCallExecutor", "LOOK_AGAIN",
    "attempted_calls", "check_acknowledgement", "computer_result", "native_call",
]
