"""AttendedRun: a run whose steps are its caller's calls, not a model's responses.

The Python API (:class:`desktop_sandbox.Sandbox`), an MCP session (``desktop-sandbox mcp``) and the
Agents SDK's computer drive a sandbox one call at a time. Each such call is a step of a run like any
other: it goes through the same driver (:class:`controller.run.driver.SandboxDriver`: one mapping rule,
model px -> screen px), the same approvals (``--confirm-actions`` / step mode through
:class:`controller.run.approvals.ActionGate`, bound to the screen; origin requests and sign-in
requests from the run's registry), and lands in the run's record as a ``computer_call`` (its actions as
sent, model px, typed text redacted), one ``action`` line per driver call and a ``screenshot`` line per
image returned. ``run_started.mode`` is ``attended``, ``runner`` the surface (``python``, ``mcp``,
``agents-sdk``).

Lifetimes: the run is given a started sandbox and never removes it (its owner does). Its phases run on a
thread of its own (:meth:`AttendedRun.begin`); :meth:`AttendedRun.call` hands a callable to that thread
and waits for its result, so the driver is only ever used from one thread. :meth:`AttendedRun.end`
ends the run: the record finished (``passed``: ended by its caller, ``failed`` when the last run of
the task's checks, :meth:`AttendedRun.run_checks`, failed; ``cancelled``; ``error`` when the sandbox failed). Every wait is bounded: a call waits at most its
``timeout`` (then :class:`CallTimeout`; the call itself is stopped by the run's cancellation), the
start at most ``start_timeout_s``.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import replace
from typing import Any, Callable, TypeVar

from rich.console import Console

from controller.model.errors import DesktopSandboxError
from controller.run.cancel import RunStopped
from controller.run.driver import DriverError, ScreenshotPolicy, SentScreenshot
from controller.run.entries import Action, Check, ComputerCall
from controller.run.mapping import Frame, ModelSpace
from controller.run.record import recorded_action
from controller.run.runner import Run, RunOptions, RunOutcome
from controller.run.tasks import Task
from controller.run.verify import run_checks
from controller.text import clean
from wire.actions import ACTION_TYPES, ActionInvalid, parse_action

T = TypeVar("T")

_CLOSE = object()

RUNNERS = ("python", "mcp", "agents-sdk")
"""Who drives an attended run (``run_started.runner``)."""

NOBODY = {
    "python": "give Sandbox.start an approver",
    "mcp": "the MCP client declared no elicitation: use one that does, or start the server without "
           "--confirm-actions/--step",
    "agents-sdk": "give Sandbox.start an approver",
}
"""What to do when a confirmed action finds nobody to ask, by runner (one entry per :data:`RUNNERS`)."""
assert set(NOBODY) == set(RUNNERS), "every runner says what to do when nobody can be asked"

MAX_CALL_ACTIONS = 500
"""Most actions in one :meth:`AttendedRun.act` call (the guest agent's own limit per request)."""

END_CALL_GRACE_S = 5.0
"""Seconds :meth:`AttendedRun.end` lets a call under way finish before it cancels the run (a call
waiting on a question would otherwise hold the end for as long as the question may wait)."""


class AttendedRunError(DesktopSandboxError, RuntimeError):
    """The attended run cannot take calls: it did not start, or it has ended (the reason says which)."""


class CallTimeout(AttendedRunError):
    """A call did not finish within its timeout (the run is cancelled: nothing more runs on it)."""


class ActionDenied(DesktopSandboxError, PermissionError):
    """A person (or nobody, when nobody can be asked) refused an action: nothing of it reached the desktop."""


class AttendedRun(Run):
    """A :class:`Run` driven by its caller's calls (module docstring).

    ``task``: what the run records and verifies (screen, network policy, apps, checks; its model
    settings are the default screenshot policy); ``options``: as for :class:`Run` (``confirm_actions``,
    ``step``, ``approve_origins``, ``approval_timeout_s``, ``runs_dir``); ``runner``: one of
    :data:`RUNNERS`; ``client``: who is calling (the MCP client's name), kept as ``run_started.model``;
    ``sandbox_start_s``: seconds its owner took to start or claim the sandbox for it (the record's
    ``sandbox_start_s``), None when it was not started for this run.
    """

    def __init__(self, task: Task, options: RunOptions | None = None, console: Console | None = None, *,
                 runner: str = "python", client: str | None = None, asker: Any = None,
                 sandbox_start_s: float | None = None) -> None:
        if runner not in RUNNERS:
            raise ValueError(f"runner must be one of {RUNNERS}, got {runner!r}")
        options = replace(options or RunOptions(), runner=runner, live=True, terminal=False if asker is None else None)
        super().__init__(task, options, console or Console(quiet=True), asker=asker)
        self.mode, self.model = "attended", client or runner
        self._calls: queue.Queue[Any] = queue.Queue()
        self._up = threading.Event()
        self._thread: threading.Thread | None = None
        self.outcome: RunOutcome | None = None
        self.failure: BaseException | None = None
        self.approvals: Any = None
        self.hooks: Any = None
        self._call_seq = 0
        self._failure: str | None = None  # why the caller ended the run on an error (end(failure=...))
        self._sandbox_start_s = sandbox_start_s
        self._in_call = False

    # -- the run's thread ------------------------------------------------------------------------------
    def begin(self, sandbox: Any, *, start_timeout_s: float = 180.0) -> "AttendedRun":
        """Start the run on ``sandbox`` (started; not removed by the run) on a thread of its own and
        return once it takes calls: the task's apps launched and ready, a stable screen. Raises
        :class:`AttendedRunError` (with the run's reason) when it ended first or took longer than
        ``start_timeout_s`` seconds (then it is cancelled)."""
        self._thread = threading.Thread(target=self._main, args=(sandbox,), name=f"attended-{self.record.run_id}",
                                        daemon=True)
        self._thread.start()
        deadline = time.monotonic() + start_timeout_s
        while not self._up.wait(0.1):
            if not self._thread.is_alive():
                raise AttendedRunError(f"the run ended before it took a call: {self.reason}")
            if time.monotonic() > deadline:
                self.cancel_by_view("start timeout")
                raise AttendedRunError(f"the run was not ready within {start_timeout_s:g} s")
        return self

    def _main(self, sandbox: Any) -> None:
        try:
            self.outcome = self.execute(lambda _task: sandbox, own=False)
        except BaseException as exc:  # noqa: BLE001 - kept for end(); the thread must not die silently
            self.failure = exc
        finally:
            self._drain("the run has ended")

    def _open(self, sandbox_from: Callable[[Task], Any]) -> Any:
        sandbox = super()._open(sandbox_from)
        if self._sandbox_start_s is not None:  # the sandbox was started (or claimed) for this run by its owner
            self.timings["sandbox_start"] = round(self._sandbox_start_s, 3)
        return sandbox

    def drive(self) -> None:
        """The calls, one at a time, until :meth:`end` or a cancel: the run's status is ``passed``
        (ended by its caller) unless it was cancelled."""
        seam, hooks = self._driver()
        self.approvals = self._approvals(hooks, seam)
        self.hooks = hooks
        assert self.driver is not None
        width, height = self.task.screen.width, self.task.screen.height
        # model px are screen px until a screenshot of another size or region is taken
        self.driver.model_space = ModelSpace(width, height, Frame(0, 0, width, height))
        self.driver.capture_with_last_action = False
        self._up.set()
        t = time.monotonic()
        try:
            while not self.cancel():
                try:
                    item = self._calls.get(timeout=0.2)
                except queue.Empty:
                    continue
                if item is _CLOSE:
                    break
                fn, future = item
                if not future.set_running_or_notify_cancel():
                    continue
                self._in_call = True
                try:
                    future.set_result(fn())
                except BaseException as exc:  # noqa: BLE001 - handed to the caller
                    future.set_exception(exc)
                finally:
                    self._in_call = False
        finally:
            self.timings["loop"] = round(time.monotonic() - t, 3)
            with contextlib.suppress(Exception):
                self.driver.release()
        if self.cancel():
            raise RunStopped()
        if self._failure is not None:
            self.status, self.reason = "error", f"ended by its caller's error after {self._call_seq} calls: {self._failure}"
        else:
            self.status, self.reason = "passed", f"ended by its caller after {self._call_seq} calls"

    def verify(self) -> None:
        """Checks run when the caller asks (:meth:`run_checks`), not again at the end: the run's verdict
        follows the last time they ran (``failed`` when one failed), ``passed`` when they never ran."""
        if self.checks and not all(c["passed"] for c in self.checks):
            self.status = "failed"
            self.reason = f"{sum(not c['passed'] for c in self.checks)} of {len(self.checks)} checks failed"
        elif self.checks:
            self.reason = f"{self.reason}; {len(self.checks)} of {len(self.checks)} checks"

    def run_checks(self) -> list[dict[str, Any]]:
        """The task's checks on the guest as it is now (each result also a ``check`` line); the run's
        verdict follows the last of these."""
        self.checks = run_checks(self.task.checks, self.agent, home=self.home,
                                 on_result=lambda r: self.record.write(Check(**r)))
        return self.checks

    def _drain(self, why: str) -> None:
        while True:
            try:
                item = self._calls.get_nowait()
            except queue.Empty:
                return
            if item is not _CLOSE and item[1].set_running_or_notify_cancel():  # not withdrawn by its caller
                item[1].set_exception(AttendedRunError(why))

    # -- calls from other threads ------------------------------------------------------------------------
    def call(self, fn: Callable[[], T], timeout: float | None = 300.0) -> T:
        """Run ``fn()`` on the run's thread and return its result (its exception raised here). Raises
        :class:`AttendedRunError` when the run has ended, :class:`CallTimeout` after ``timeout`` seconds
        (the run is then cancelled: a call that does not return leaves the desktop in an unknown state).
        When the wait is interrupted (KeyboardInterrupt in the caller's thread) a call not yet begun is
        withdrawn and never runs; one under way cancels the run, so nothing of it runs later unasked."""
        if not self.takes_calls:
            raise AttendedRunError(f"the run has ended: {self.reason or 'ended'}")
        future: Future[T] = Future()
        self._calls.put((fn, future))
        try:
            return self._result(future, timeout)
        except BaseException:
            # The caller stopped waiting (KeyboardInterrupt, a timeout): a call not begun is withdrawn;
            # one under way cannot be taken back, so the run is cancelled rather than left to act later.
            if not future.done() and not future.cancel() and not self.cancel():
                self.cancel_by_view("an interrupted call")
            raise

    def _result(self, future: "Future[T]", timeout: float | None) -> T:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                return future.result(timeout=0.2)
            except TimeoutError:
                pass
            if not self.takes_calls and not future.running():
                future.cancel()
                raise AttendedRunError(f"the run has ended: {self.reason or 'ended'}")
            if deadline is not None and time.monotonic() > deadline:
                self.cancel_by_view("call timeout")
                raise CallTimeout(f"the call took longer than {timeout:g} s; the run is cancelled")

    def submit(self, fn: Callable[[], T]) -> "Future[T]":
        """Hand ``fn()`` to the run's thread and return its future at once (for an event loop, which must
        not block: ``asyncio.wrap_future``). The caller bounds its wait; a future it cancels before the
        call began never runs. Raises :class:`AttendedRunError` when the run takes no calls."""
        if not self.takes_calls:
            raise AttendedRunError(f"the run has ended: {self.reason or 'ended'}")
        future: Future[T] = Future()
        self._calls.put((fn, future))
        return future

    @property
    def takes_calls(self) -> bool:
        """Whether calls are taken (the run is up and neither ended nor cancelled)."""
        return self._up.is_set() and self._thread is not None and self._thread.is_alive() and not self.cancel()

    def end(self, timeout: float = 120.0, *, call_grace_s: float = END_CALL_GRACE_S,
            failure: str | None = None) -> RunOutcome | None:
        """End the run (record finished) and return its outcome; None when it never started. ``failure``:
        the caller ends it on an error of its own (an exception in its ``with`` block): the run ends
        ``error`` with it as the reason.
        Waits at most ``timeout`` seconds for the run's thread; a call still under way ``call_grace_s``
        seconds after the end was asked (one waiting on an approval, say) is cancelled then: the run
        ends ``cancelled`` and that call raises."""
        if self._thread is None:
            return None
        if failure is not None and self._failure is None:
            self._failure = clean(failure, 300)
        self._calls.put(_CLOSE)
        start = time.monotonic()
        while self._thread.is_alive() and time.monotonic() - start < timeout:
            self._thread.join(0.1)
            if self._in_call and time.monotonic() - start > call_grace_s and not self.cancel():
                self.cancel_by_view("an end during a call")
        if self._thread.is_alive():
            self.cancel_by_view("end timeout")
            self._thread.join(timeout)
        return self.outcome

    # -- steps (on the run's thread) ---------------------------------------------------------------------
    def act(self, actions: list[dict[str, Any]]) -> None:
        """One computer_call of ``actions`` (the openai action shapes, points in model px: the px of the
        last screenshot taken, screen px before any; at most :data:`MAX_CALL_ACTIONS`): recorded, each
        action checked first (schema, bounds), asked about when the gate covers its type, then sent; a
        ``screenshot`` action is recorded and skipped (as in a model's computer_call: :meth:`screenshot`
        takes the image). A call with a refused action sends nothing and is recorded with that action as
        ``{"type", "refused": true}`` and an ``action`` line saying why (never a typed text). Raises
        :class:`ActionDenied` when an approval is refused (nothing of that action or after it ran), the
        driver's errors (:class:`controller.run.driver.DriverError`,
        :class:`controller.run.mapping.OutOfModelBounds`) for bad input, :class:`AttendedRunError` when
        the run is cancelled between two actions, the agent client's ``AgentError`` for the guest's
        refusals."""
        assert self.driver is not None and self.hooks is not None
        self._call_seq += 1
        call_id = f"call_{self._call_seq}"
        self.hooks.current_call = call_id
        if not isinstance(actions, list) or not 0 < len(actions) <= MAX_CALL_ACTIONS:
            self.record.write(ComputerCall(call_id=call_id, form="actions", actions=[]))
            error = f"a call takes a list of 1 to {MAX_CALL_ACTIONS} actions"
            self.record.write(Action(call_id=call_id, action=None, duration_ms=0.0, error=f"refused: {error}"))
            raise DriverError(error)
        shown: list[Any] = []
        refused: tuple[int, Exception] | None = None
        for i, action in enumerate(actions):  # every action checked before any is sent
            try:
                self.driver.to_screen_action(action)
            except Exception as exc:  # noqa: BLE001 - recorded, then raised below
                shown.append(_refused_shape(action, self.typed_text))
                refused = refused or (i, exc)
            else:
                shown.append(recorded_action(action, self.typed_text) if isinstance(action, dict) else action)
        # a refused action is kept as its type only: what it carried (a mistyped action's text) is not recorded
        self.record.write(ComputerCall(call_id=call_id, form="actions", actions=shown))
        if refused is not None:
            i, exc = refused
            kind = shown[i]["type"]
            why = ("the type action is invalid (its text is not recorded)" if kind == "type" else
                   "not an action of a known type" if kind == "unknown" else str(exc))
            self.record.write(Action(call_id=call_id, action=kind, duration_ms=0.0, error=f"refused: {why}"[:300]))
            raise exc
        for action in actions:
            if self.cancel():
                self.record.write(Action(call_id=call_id, action=_kind(action), duration_ms=0.0, error="cancelled"))
                raise AttendedRunError(f"the run was cancelled ({self.cancel.signal}): the rest of the call "
                                       "did not run")
            if _kind(action) == "screenshot":  # as in a model's computer_call: the image is taken by screenshot()
                continue
            self._approve(call_id, action)
            member = str(action.get("type"))
            t = time.perf_counter()
            error = None
            try:
                getattr(self.driver, member)(action)
            except Exception as exc:
                error = self.driver.last_error or str(exc)
                raise
            finally:
                self.record.write(Action(call_id=call_id, action=member,
                                         duration_ms=round((time.perf_counter() - t) * 1000, 2),
                                         error=error[:300] if error else None))
                if self.network is not None:
                    self.network.release()
                    self.network.poke()

    def screenshot(self, policy: ScreenshotPolicy | None = None) -> SentScreenshot:
        """A screenshot under ``policy`` (default: the task's model settings), saved beside the record;
        it becomes the model space later points are read in."""
        assert self.driver is not None and self.hooks is not None
        previous = self.driver.policy
        if policy is not None:
            self.driver.policy = policy
        self._call_seq += 1
        self.hooks.current_call = f"call_{self._call_seq}"
        self.record.write(ComputerCall(call_id=self.hooks.current_call, form="actions",
                                       actions=[{"type": "screenshot"}]))
        try:
            self._approve(self.hooks.current_call, {"type": "screenshot"})
        except ActionDenied:
            self.driver.policy = previous
            raise
        t = time.perf_counter()
        error = None
        try:
            return self.driver.capture()
        except Exception as exc:
            error = self.driver.last_error or str(exc)
            self.driver.policy = previous  # a policy that failed is not kept for the next screenshot
            raise
        finally:
            self.record.write(Action(call_id=self.hooks.current_call, action="screenshot",
                                     duration_ms=round((time.perf_counter() - t) * 1000, 2),
                                     error=error[:300] if error else None))

    def _approve(self, call_id: str, action: dict[str, Any]) -> None:
        """Ask about ``action`` when the gate covers its type (``confirm_actions``, step mode: a screenshot
        too, as the SDK's loop passes a call's screenshot through it); :class:`ActionDenied` on a no, saying
        why when nobody could be asked."""
        kind = str(action.get("type"))
        gate = self.approvals.gate
        before = self.approvals.before_action
        if before is None or not gate.asks(kind):
            return
        nobody = not gate.anyone
        if before(action):
            return
        self.record.write(Action(call_id=call_id, action=kind, duration_ms=0.0, error="not approved"))
        if nobody:
            raise ActionDenied(f"{kind} needs a person's approval and nobody can be asked ({NOBODY[self.options.runner]}): "
                               "nothing of it ran")
        raise ActionDenied(f"{kind} was not approved: nothing of it ran")

    def launch(self, app: str, args: list[str]) -> int:
        """Start an allowlisted guest app (the agent's ``/v1/launch``); its pid."""
        return int(self.agent.launch(app, args))

    def read_file(self, path: str) -> bytes:
        """A guest file's bytes (under the agent's allowed roots, capped by the agent client)."""
        return bytes(self.agent.read_file(path))


def _kind(action: Any) -> str:
    kind = action.get("type") if isinstance(action, dict) else getattr(action, "type", None)
    return str(kind)


def _refused_shape(action: Any, typed_text: bool) -> dict[str, Any]:
    """How the record keeps an action :meth:`AttendedRun.act` refused, with ``refused: true``: as any
    action when it is one of the schema (refused for its bounds: its fields are bounded and known, typed
    text redacted), else only its type when it is a known one (``unknown`` otherwise), none of its
    fields (they may be anything: a mistyped action's text, a path of a million points)."""
    kind = action.get("type") if isinstance(action, dict) else getattr(action, "type", None)
    if isinstance(action, dict):
        try:
            parse_action({k: v for k, v in action.items() if v is not None})
        except ActionInvalid:
            pass
        else:
            return {**recorded_action(action, typed_text), "refused": True}
    return {"type": kind if isinstance(kind, str) and kind in ACTION_TYPES else "unknown", "refused": True}


def check_actions(actions: list[dict[str, Any]]) -> None:
    """Refuse a call that is not a list of known actions before it reaches a run (``ValueError``)."""
    if not isinstance(actions, list) or not actions:
        raise ValueError("actions must be a non-empty list")
    for action in actions:
        try:
            parse_action(action)
        except ActionInvalid as exc:
            raise ValueError(f"unsupported action: {exc}") from None
