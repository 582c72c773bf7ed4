"""run-task: one task's run on a sandbox it is given, through the SDK's loop, then verification and the record.

Three lifetimes (docs/ARCHITECTURE.md, "Sandbox, run, session"): a **sandbox** is opened and removed by
its owner (``run-task``'s :func:`run_task`, an Agents API session, later a pool); a **run**
(:class:`Run`) is one task's loop on a sandbox it is given; a **session** holds one sandbox and a
conversation across many runs (:attr:`RunOptions.conversation`). A run never removes its sandbox: when
the caller owns it through :func:`run_task`, that function removes it between the run's settle and
finish phases, so the record still says how the teardown went.

A run's phases (:meth:`Run.execute`), each a method: **prepare** (the offline scripted server) ->
**attach** (``run_started``, the gateway's decision tail and origin requests, a view's hold on the
agent) -> **ready** (the task's apps launched, ``[[ready]]`` files, a stable screen) -> **drive** (the
driver, the approvals, the model client, then the loop: ``openai.ComputerToolset(driver).run(...)``, or
for a task with ``[model] tools`` holding ``browser`` the SDK's ``ResponsesToolRunner`` with its
``BrowserToolset`` over :class:`controller.run.browser_driver.GuestBrowserDriver`, or a loop given to
the run -- ``run-task --runner agent-framework``) -> **verify** (the task's checks from the guest's
files) -> **settle** (origin requests still pending withdrawn, the rest of the gateway's decisions,
reconciled with the ``approval`` lines) -> **finish** (``run_finished``, the summary).

Everything a run does is published once on its bus (:class:`controller.run.bus.RunBus`): the record's
entries, approval changes, actions sent, control changes. The terminal's lines, the web console
(:meth:`Run.watch`), the Agents API, replay's answerers and the sign-in and approval askers are
subscribers; the driver has one seam (:class:`controller.run.seam.RunSeam`).

Status: ``cancelled`` (Ctrl-C / SIGTERM: the loop stops between driver calls, inputs are released,
the sandbox is torn down, no verification), ``error`` (the loop or the sandbox failed), ``failed``
(a check failed, the task has no checks, a safety check / action was denied, or the offline scripted
model gave up on a screen expectation: an ``expectation`` entry says which), ``passed`` (loop
completed and every check passed -- at least one). Exit code: 0 ``passed``, 1 ``failed`` or
``error``, 130 ``cancelled`` (the shell's convention for an interrupted command).

Cancellation (:class:`controller.run.cancel.Cancellation`): SIGINT, SIGTERM and SIGHUP are handled from
the first line to the last; one that comes at any moment before ``run_finished`` is written ends the
run ``cancelled``, and none cuts the teardown or the record short. Whatever the run waits for then
ends within about 0.1 s: pending requests are withdrawn with the signal as reason.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from openai import ComputerToolset
from openai.lib.computer import ComputerUseError
from openai.lib.responses_tool_runner import ToolRunnerCancelledError, ToolRunnerError
from rich.console import Console
from rich.markup import escape

from controller.redaction import Redactor
from controller.run.approvals import ActionGate, SafetyCheckApprover, terminal_asker
from controller.run.binding import BoundApprovals
from controller.run.browser_driver import GuestBrowserDriver, UrlRules
from controller.run.bus import RunBus, follow_entries
from controller.run.cancel import Cancellation, RunStopped
from controller.run.conversation import ConversationTail
from controller.run.driver import SandboxDriver, ScreenChanged, ScreenshotPolicy
from controller.run.entries import Approval, Check, HumanAction, PolicySwap, Redaction, Takeover, Video, ViewDropped
from controller.run.live import LiveRun
from controller.run.loops import browser_loop, browser_params, build_params
from controller.run.model_client import live_client, offline_client
from controller.run.origins import ControlUnreachable, OriginAccess, wait_for_origins
from controller.run.progress import RunPrinter, clean, fitted, make_console, print_fitted
from controller.run.ready import ready_line, wait_ready
from controller.run.record import RunRecord, new_run_id, print_summary, read_entries, recorded_action
from controller.run.recording import (
    BodyMeter, DecisionTail, RecordingHooks, decision_reader, expectation_recorder, run_started_entry,
)
from controller.run.registry import ApprovalRegistry
from controller.run.replay import HumanReplayer
from controller.run.seam import RunSeam
from controller.run.signin import SignInFile, SignInFlow, SignInPrompter
from controller.run.tasks import Task
from controller.run.verify import run_checks
from controller.run.video import VideoRecorder, VideoSettings
from controller.run.web import RunWeb, WebRecordingError, load_recording
from controller.offline.expectations import INPUT_KINDS
from controller.offline.script import load_task_script
from controller.offline.scripted_server import ScriptedModel, ScriptedServer
from controller.sandbox.signals import SandboxInterrupted

__all__ = ["DEFAULT_MODEL", "EXIT_CODES", "Run", "RunOptions", "RunOutcome", "build_params", "browser_params",
           "run_task", "watching"]

DEFAULT_MODEL = "gpt-6-astra"
from controller.sandbox.guest import GUEST_HOME  # noqa: E402 - the guest user's home, in this namespace
EXIT_CODES = {"passed": 0, "failed": 1, "error": 1, "cancelled": 130}
"""Exit status of ``run-task`` per run status (130: cancelled, as a shell reports an interrupted command)."""
STOP_CALL_GRACE_S = 0.5
"""Once the run is stopping, the most an agent call may take (seconds): the call under way is cut then,
and each call of the teardown gets no more (:meth:`controller.agent_client.AgentClient.stop_calls`), so
an agent stalled by the desktop (a program holding the X server grabbed) cannot hold a signal's exit."""

_UNSET: Any = object()
INPUT_EXPECTATIONS = frozenset(kind.model_fields["kind"].annotation.__args__[0] for kind in INPUT_KINDS)
"""The offline script's expectations on a request's input (``expect_input``), by kind."""


@dataclass
class RunOptions:
    """How to run a task: data only (who answers, who watches and which loop drives are given to
    :class:`Run` / :func:`run_task`).

    ``live``: None -> live when ``OPENAI_API_KEY`` is set, else the offline exercise. ``model``: the
    live model (default ``$OPENAI_MODEL`` or :data:`DEFAULT_MODEL`). ``script``: override the task's
    offline script. ``approve_codes``: safety-check codes approved unattended (opt-in, logged).
    ``confirm_actions``: action types to confirm; ``step``: confirm every action.
    ``approval_timeout_s``: seconds a question waits for an answer before it is denied (None: no
    deadline). ``approve_origins``: origins (``controller.gateway.policy.Origin``) whose origin requests
    are approved at once, unattended (``--approve-origin``; logged as opt-in lines).
    """

    runs_dir: Path = Path("runs")
    live: bool | None = None
    model: str | None = None
    max_steps: int | None = None
    script: Path | None = None
    legacy: bool | None = None
    approve_codes: list[str] = field(default_factory=list)
    approve_origins: list[Any] = field(default_factory=list)
    confirm_actions: list[str] = field(default_factory=list)
    step: bool = False
    terminal: bool | None = None
    """Whether questions are asked on the terminal: None when there is one, False never (unattended:
    the console, ``--sign-in`` or nobody answers). A person asking otherwise is given to :class:`Run`."""
    home: str | None = None
    ready_timeout_s: float = 90.0
    approval_timeout_s: float | None = 300.0
    signals_before: list[int] = field(default_factory=list)
    """Signals that came before the run (the CLI notes them while it prepares): when this list holds
    one once the run's own handlers are in place, the run ends ``cancelled`` before anything starts."""
    runner: str | None = None
    """The name of the model loop, for the record's ``run_started`` (``agent-framework`` with a loop
    given to :class:`Run`); None: ``sdk`` without one, ``custom`` with one."""
    sign_in_file: Path | None = None
    """``--sign-in FILE``: answers sign-in requests from this 0600 TOML file (contract 8)."""
    conversation: list[dict[str, Any]] = field(default_factory=list)
    """The model conversation this run continues (a session's earlier runs: :class:`RunOutcome.conversation`
    of the last one); its first request is these items, then the run's own user message
    (:mod:`controller.run.conversation`)."""
    record_typed_text: bool = False
    """``--record-typed-text``: keep typed text in the record (as the task's ``[record] typed_text``)."""
    human_actions: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    """A person's actions to perform again (``desktop-sandbox replay``: step index -> actions in screen px,
    :class:`controller.run.replay.HumanReplayer`)."""
    video: VideoSettings | None = None
    """``--video``: record a video of the run (``runs/<id>/run.webm``, :mod:`controller.run.video`) with these
    settings; None: only when the task's ``[record] video`` asks (then with the default settings)."""
    record_web: bool = False
    """``--record-web``: keep the plain-HTTP responses the policy let through in ``runs/<id>/web``
    (as the task's ``[record] web``; :mod:`controller.run.web`)."""
    web_from: Path | None = None
    """``replay --offline-web``: serve this web recording's folder instead of fetching (as the task's
    ``[offline] web``, which it takes precedence over); a run that serves one records none."""


@dataclass
class RunOutcome:
    """What a run ended with: status, reason, record directory, check results, exit code."""

    status: str
    reason: str
    record_dir: Path
    checks: list[dict[str, Any]]
    final_message: str | None = None
    timings: dict[str, float] = field(default_factory=dict)
    scripted_requests: list[dict[str, Any]] | None = None
    conversation: list[dict[str, Any]] = field(default_factory=list)
    """The conversation the run leaves: its last request's input items and the model's last answer
    ([] when no answer came); a session's next run continues from it (:attr:`RunOptions.conversation`)."""

    @property
    def exit_code(self) -> int:
        """0 passed, 1 failed or error, 130 cancelled (:data:`EXIT_CODES`)."""
        return EXIT_CODES.get(self.status, 1)


Loop = Callable[..., "str | None"]
"""A model loop in place of the SDK's ``ComputerToolset.run`` (``run-task --runner agent-framework``:
:func:`controller.af.loop.run_loop`), called with the keywords ``driver``, ``params`` (the first
request), ``max_steps``, ``approver``, ``before_action`` (None when inactive), ``cancelled``, ``hooks``,
``meter``, ``base_url`` and ``api_key`` (the scripted server's URL and key; None live) and ``console``;
returns the model's final message, raises ``ComputerUseError`` when it stops short."""

View = Callable[["Run"], Any]
"""Something that follows a run, given the :class:`Run` before it starts (it subscribes to
:attr:`Run.bus`, takes :meth:`Run.watch`, adds an answerer with :meth:`Run.answered_by`)."""


def watching(on_live: Callable[[LiveRun], Any]) -> View:
    """A :data:`View` handing ``on_live`` the run's console view (:meth:`Run.watch`)."""
    return lambda run: on_live(run.watch())


class Run:
    """One task's run on a sandbox it is given (module docstring): phases as methods, each short, and a
    bus every view subscribes to.

    ``asker``: who answers questions on the terminal (default: the terminal when there is one, else
    nobody); ``loop``: a model loop in place of the SDK's (:data:`Loop`). Before :meth:`execute`, views
    may subscribe to :attr:`bus`, take :meth:`watch` and add answerers (:meth:`answered_by`).
    """

    def __init__(self, task: Task, options: RunOptions | None = None, console: Console | None = None, *,
                 asker: Any = _UNSET, loop: Loop | None = None) -> None:
        self.task, self.options = task, options or RunOptions()
        self.console = console or make_console(stderr=True)
        opts = self.options
        self.live = opts.live if opts.live is not None else bool(os.environ.get("OPENAI_API_KEY"))
        self.model = opts.model or os.environ.get("OPENAI_MODEL") or DEFAULT_MODEL
        if opts.legacy is not None:
            self.legacy = opts.legacy
        elif self.live:  # the preview model speaks only the legacy computer_use_preview tool
            self.legacy = self.model.startswith("computer-use-preview")
        else:
            self.legacy = bool(task.offline and task.offline.legacy)
        self.mode = "live" if self.live else "offline"
        if asker is not _UNSET:
            self.asker = asker
        else:
            self.asker = None if opts.terminal is False else terminal_asker(self.console)
        self.loop_fn = loop
        self.max_steps = opts.max_steps or task.max_steps
        self.typed_text = opts.record_typed_text or task.record.typed_text
        self.video_settings = opts.video or (VideoSettings() if task.record.video else None)
        self.video: VideoRecorder | None = None
        self.web_from = opts.web_from or task.offline_web_path()
        self.web: RunWeb | None = None
        self.cancel = Cancellation()
        self.bus = RunBus()
        self.registry = ApprovalRegistry(opts.approval_timeout_s, bus=self.bus)
        self.record = RunRecord(opts.runs_dir, new_run_id(task.name), bus=self.bus)
        self.bus.on_dropped = self._dropped
        self.printer = RunPrinter(self.console)
        follow_entries(self.bus, self.printer, name="terminal")
        self.view: LiveRun | None = None
        self._answerers: list[Any] = []
        self.timings: dict[str, float] = {}
        self.checks: list[dict[str, Any]] = []
        self.status, self.reason, self.final_message = "error", "", None
        self.sandbox: Any = None
        self.agent: Any = None
        self.home = opts.home or GUEST_HOME
        self.network: DecisionTail | None = None
        self.origins: OriginAccess | None = None
        self.scripted: ScriptedModel | None = None
        self.server: ScriptedServer | None = None
        self.client: Any = None
        self.driver: SandboxDriver | None = None
        self.tail = ConversationTail()
        self._restore_agent: Callable[[], None] = lambda: None
        self._t0 = time.monotonic()

    # -- views -------------------------------------------------------------------------------------
    def watch(self) -> LiveRun:
        """The run as the web console sees it (one per run); questions then wait for the console too,
        also without a terminal. Take it before :meth:`execute`."""
        if self.view is None:
            self.view = LiveRun(self.record.run_id, self.record.dir, self.registry)
            self.view.task_name = self.task.name
            self.registry.views.add("console")
        return self.view

    def answered_by(self, start: Callable[[ApprovalRegistry, Callable[[str], None]], Any]) -> Any:
        """Add an answerer of the run's questions, started now as ``start(registry, cancel_run)``
        (``cancel_run(by)`` cancels the run as a view does: ``cancelled by BY``); its ``on_entry``, when
        it has one, follows the record, and its ``stop()`` is called at the run's end
        (``desktop-sandbox replay``: :class:`controller.run.replay.ReplayAnswers`). Returns it."""
        answerer = start(self.registry, self.cancel_by_view)
        self._answerers.append(answerer)
        if callable(getattr(answerer, "on_entry", None)):
            follow_entries(self.bus, answerer.on_entry, name=type(answerer).__name__)
        return answerer

    def cancel_by_view(self, by: str) -> None:
        """Cancel the run from a view (``cancelled by BY``); every pending question is withdrawn."""
        if self.origins is not None:
            self.origins.cancelled_by(by)
        self.cancel.set_by_view(by, self.registry)

    def _dropped(self, name: str, capacity: int) -> None:
        with contextlib.suppress(ValueError):  # the record is closed: the run is over
            self.record.write(ViewDropped(view=clean(name, 80), queued=capacity))

    # -- the whole run -------------------------------------------------------------------------------
    def execute(self, sandbox_from: Callable[[Task], Any], *, own: bool) -> RunOutcome:
        """Run every phase on the sandbox ``sandbox_from(task)`` returns (started) and return the
        outcome; writes ``runs/<id>/record.jsonl`` and prints a summary. ``own``: the sandbox is this
        call's (``run-task``): it is removed once the run has settled, before the record finishes;
        otherwise it is the caller's and stays as the run left it (an Agents API session).

        Never raises for a run that went wrong (the status says so); KeyboardInterrupt from a second
        Ctrl-C still ends the run ``cancelled`` after teardown. Signals: module docstring."""
        with self.cancel.installed(self.console, interruptible=False):
            if self.options.signals_before:
                self.cancel.set(signal.Signals(self.options.signals_before[0]).name)
            self.cancel.withdraw_on_cancel(self.registry)
            try:
                with self.cancel.installed(self.console):
                    self.prepare()
                    self.attach(self._open(sandbox_from))
                    self.ready()
                    self.drive()
                    self.verify()
            except (RunStopped, KeyboardInterrupt) as exc:
                self._stopped(exc)
            except BaseException as exc:  # noqa: BLE001 - recorded, then re-raised when not an Exception
                self._failed(exc)
                if not isinstance(exc, (Exception, SandboxInterrupted)):  # a signal during a start: cancelled
                    try:
                        self._end(own)
                    finally:
                        raise
            return self._end(own)

    def _open(self, sandbox_from: Callable[[Task], Any]) -> Any:
        if self.cancel():
            raise RunStopped()
        t = time.monotonic()
        try:
            with self.cancel.installed(self.console, interruptible=False):  # no Ctrl-C inside a start
                sandbox = sandbox_from(self.task)
        finally:
            self.timings["sandbox_start"] = round(time.monotonic() - t, 3)
        self.sandbox = sandbox
        return sandbox

    def _end(self, own: bool) -> RunOutcome:
        try:
            if self.video is not None:  # the grabs end before the sandbox goes; the encoder goes on
                self.video.stop_grabbing()
            self.settle()
            teardown_s = self._teardown(own)
            return self.finish(teardown_s)
        finally:
            if self.video is not None:  # the file closed whatever went wrong above (at once when it is)
                self.video.finish(cancelled=self.cancel)
            self.registry.close("run ended")
            self._restore_agent()
            for answerer in self._answerers:
                with contextlib.suppress(Exception):
                    answerer.stop()
            if self.view is not None:
                self.view.finish(self.status)
            self.bus.close()

    # -- phases -------------------------------------------------------------------------------------
    def prepare(self) -> None:
        """The run's first line (``run-suite`` reads the record's folder from it) and, offline, the
        scripted model's server. Raises :class:`RunStopped` when a signal came first."""
        shown = clean(f"{self.task.name} ({self.mode}) -> {self.record.dir}", 500)
        self.console.print(f"[bold]run-task[/] {escape(shown)}", emoji=False)  # printed whole, however wide
        if self.cancel():  # a signal before the run began: nothing is started
            raise RunStopped()
        if not self.live:
            self.scripted = ScriptedModel(load_task_script(self.task, self.options.script),
                                          on_expectation=expectation_recorder(self.record))
            self.server = ScriptedServer(self.scripted).start()
        if self.web_from is not None:  # read and verified before any sandbox starts
            self.web = RunWeb("serve", load_recording(self.web_from))
        elif self.options.record_web or self.task.record.web:
            self.web = RunWeb("record")
        if self.cancel():
            raise RunStopped()

    def attach(self, sandbox: Any) -> None:
        """The sandbox is up: ``run_started``, the gateway's decisions followed, its origin requests
        mirrored into the run's questions, the agent's calls cut short once the run stops, a view's
        hold on the agent. Raises :class:`RunStopped` (also when the gateway's control API stays
        unreachable: the run then ends ``error``)."""
        if self.cancel():
            raise RunStopped()
        self._write_started()
        self.network = DecisionTail(self.record, decision_reader(sandbox)).start()
        try:  # returns once the gateway's control API answered: the run's questions can be seen
            self.origins = OriginAccess.start(
                sandbox, self.registry, self.record, self.asker, self.console, approve=self.options.approve_origins,
                has_view=self.view is not None, asks=self.task.network.mode == "ask",
                max_pending=self.task.network.max_pending, cancelled=self.cancel, on_lost=self.cancel.fail)
        except ControlUnreachable as exc:
            self.cancel.fail(str(exc))
            raise RunStopped() from None
        if self.web is not None:  # before anything is launched: nothing fetched live, nothing missed
            try:
                self.web.start(sandbox, self.cancel)
            except WebRecordingError as exc:
                self.cancel.fail(f"web recording: {exc}")
                raise RunStopped() from None
        if self.cancel():
            raise RunStopped()
        self.time_scale = float(getattr(sandbox, "time_scale", 1.0) or 1.0)
        if self.scripted is not None:
            self.scripted.time_scale = self.time_scale
        self.agent = sandbox.agent
        self.home = self.options.home or getattr(sandbox, "guest_home", None) or GUEST_HOME
        restore_calls = _stop_agent_calls(self.agent, self.cancel)
        restore_redactions = _record_redactions(self.agent, self.record)

        def restore_agent() -> None:
            restore_redactions()
            restore_calls()

        self._restore_agent = restore_agent
        if self.view is not None:
            self.view.attach(self.agent, (self.task.screen.width, self.task.screen.height), task_name=self.task.name,
                             cancel=self.cancel_by_view, record_human=self._record_human,
                             record_control=lambda control: self.record.write(Takeover(control=control)))
        if self.video_settings is not None:
            self.video = VideoRecorder(self.agent, (self.task.screen.width, self.task.screen.height),
                                       self.record.dir, self.bus, self.video_settings).start()

    def _record_human(self, data: dict[str, Any]) -> None:
        self.record.write(HumanAction(**_human_recorded(data, self.typed_text)))

    def ready(self) -> None:
        """The task's browser rule, its apps launched, its ``[[ready]]`` files, a stable screen."""
        t = time.monotonic()
        if self.task.browser_channel:  # every request of the agent's chromium is judged by the task's rule
            self.agent.browser_rule(self._url_rules().guest_rule())
        if (getattr(self.sandbox, "provenance", None) or {}).get("launched"):
            print_fitted(self.console, fitted("apps launched by the warm pool before the claim"))
        else:
            for launch in self.task.launch:
                pid = self.agent.launch(launch.app, launch.args)
                print_fitted(self.console, fitted(f"launched {clean(launch.app, 80)} (pid {pid})"))
        observed = wait_ready(self.agent, self.task, self.home, self.options.ready_timeout_s, self.time_scale,
                              self.cancel)
        self.timings["launch_ready"] = round(time.monotonic() - t, 3)
        print_fitted(self.console, fitted(*ready_line(observed, self.timings["launch_ready"], self.home)))
        assert self.network is not None
        self.network.poll()
        if self.cancel():
            raise RunStopped()

    def _url_rules(self) -> UrlRules:
        return UrlRules.for_task(self.task, _topology(self.sandbox), getattr(self.agent, "base_url", None))

    def drive(self) -> None:
        """The model loop, from its first request to its final message (or the reason it stopped):
        sets the run's status, reason and final message; inputs are released after it."""
        seam, hooks = self._driver()
        approvals = self._approvals(hooks, seam)
        meter = BodyMeter(hooks.on_request, self.tail.observe)
        # the model requests stop with the run: a signal or a cancel ends one in flight within 0.1 s
        self.client = (offline_client(self.server.base_url, meter, api_key=self.server.key, stopping=self.cancel)
                       if self.server else live_client(meter, stopping=self.cancel))
        t = time.monotonic()
        try:
            self.final_message = self._loop(hooks, meter, approvals)
            self.status, self.reason = "passed", "loop completed"
        except RunStopped:
            raise
        except Exception as exc:  # API, driver and agent errors; a denial; a void approval
            self._loop_stopped(exc, approvals.denials)
        except ToolRunnerCancelledError as exc:  # an asyncio.CancelledError: not an Exception
            self._loop_stopped(exc, approvals.denials)
        finally:
            self.timings["loop"] = round(time.monotonic() - t, 3)
            with contextlib.suppress(Exception):
                self.driver.release()
        self.status, self.reason = _expectation_verdict(self.scripted, self.status, self.reason)
        said = f"; model said: {clean(repr(self.final_message), 200)}" if self.final_message else ""
        print_fitted(self.console, fitted(clean(self.reason, 400), said))
        if self.cancel():
            raise RunStopped()

    def _loop_stopped(self, exc: BaseException, denials: list[Any]) -> None:
        """Why the loop stopped short: ``failed`` on a person's denial (or an approval the screen made
        void), ``error`` otherwise; :class:`RunStopped` when the run is being cancelled."""
        if self.cancel():
            raise RunStopped() from None
        if isinstance(exc, (ComputerUseError, ToolRunnerError, ScreenChanged)) and (
                denials or isinstance(exc, ScreenChanged)):
            self.status = "failed"
            self.reason = _denial_reason(denials[-1]) if denials else f"loop stopped: {exc}"
        elif isinstance(exc, (ComputerUseError, ToolRunnerError)):
            self.status, self.reason = "error", f"loop stopped: {exc}"
        else:
            self.status, self.reason = "error", f"loop stopped: {type(exc).__name__}: {exc}"

    def _driver(self) -> tuple[RunSeam, RecordingHooks]:
        """The driver with the run's seam: the record's hooks, the console's take-over, a replay's
        person's actions, the origin wait and the sign-in flow."""
        m = self.task.model
        policy = ScreenshotPolicy(format=m.format, quality=m.quality, max_width=m.max_width,
                                  max_height=m.max_height, crop=m.crop, max_bytes=m.max_bytes)
        seam = RunSeam(self.bus)
        seam.network = self.network
        self.driver = SandboxDriver(self.agent, policy, seam=seam, bind_rule=self.task.approvals.rule())
        hooks = RecordingHooks(self.record, self.driver, self.network)
        hooks.typed_text = self.typed_text
        seam.on_screenshot = hooks.on_screenshot
        if self.options.human_actions:
            replayer = HumanReplayer(self.agent, self.options.human_actions, write=self.record.write,
                                     typed_text=self.typed_text)
            follow_entries(self.bus, replayer.on_entry, name="replayer")
            seam.gates.append(replayer.before_step)
        if self.view is not None:
            view = self.view
            seam.gates.append(lambda screenshot: view.checkpoint(self.cancel, screenshot=screenshot))
        if self.origins is not None:
            seam.waits.append(_origin_wait(self.registry, hooks, self.cancel))
        if self.task.browser_channel and self.task.signin.enabled:
            seam.waits.append(SignInFlow(
                self.agent, self.registry, allows=_policy_allows(self.task, self.registry), write=self.record.write,
                answerable=lambda: bool(self.asker or self.registry.views or self.options.sign_in_file),
                cancelled=self.cancel, screenshot=lambda: hooks.last_screenshot))
            if self.asker is not None:
                self._answerers.append(SignInPrompter(self.asker, self.registry, self.console))
            if self.options.sign_in_file is not None:
                self._answerers.append(SignInFile(self.options.sign_in_file, self.registry, self.console))
        return seam, hooks

    def _approvals(self, hooks: RecordingHooks, seam: RunSeam) -> "_Approvals":
        """The safety-check approver, the action gate and their binding to the screen."""
        assert self.driver is not None
        denials: list[Any] = []  # approvals answered no: the loop's stop is then the task's failure

        def on_decision(decision: Any) -> None:
            if decision.decision == "denied":
                denials.append(decision)
            hooks.on_decision(decision)

        override: list[str | None] = [None]  # the screen an approval is asked again on (bound approvals)

        def shown() -> str | None:
            return override[0] or hooks.last_screenshot

        opts = self.options
        approver = SafetyCheckApprover(asker=self.asker, auto_codes=opts.approve_codes, console=self.console,
                                       on_decision=on_decision, registry=self.registry, screenshot=shown)
        for code in opts.approve_codes:
            self.record.write(Approval(what="opt-in", decision="approved", by="command line", codes=[code],
                                       message=f"--approve-safety-check {code}"))
        gate = ActionGate(confirm=opts.confirm_actions, step=opts.step, asker=self.asker, console=self.console,
                          on_decision=on_decision, registry=self.registry, screenshot=shown)
        self.driver.capture_with_last_action = not gate.asks("screenshot")  # else the screenshot waits for it
        bound = BoundApprovals(self.driver, approver, gate, write=self.record.write,
                               save_image=self.record.save_image, shown_override=override)
        seam.rebind = bound.on_screen_changed
        return _Approvals(bound.approve_safety_checks, bound.before_action if gate.active else None, gate, denials)

    def _loop(self, hooks: RecordingHooks, meter: BodyMeter, approvals: "_Approvals") -> str | None:
        """One of the loops (module docstring); returns the model's final message."""
        assert self.driver is not None
        steps = self.max_steps + (self.scripted.wait_allowance if self.scripted else 0)
        conversation = self.options.conversation
        if self.task.browser_tools:
            if self.loop_fn is not None:
                raise ValueError("a task with browser tools runs on the SDK's ResponsesToolRunner only "
                                 "(--runner drives computer tools)")
            browser = GuestBrowserDriver(self.agent, rules=self._url_rules(), gate=approvals.gate)
            hooks.browser = browser
            return browser_loop(self.task, self.model, self.legacy, self.driver, browser, self.client, steps=steps,
                                approver=approvals.approve, before_action=approvals.before_action,
                                cancel=self.cancel, hooks=hooks, conversation=conversation)
        params = build_params(self.task, self.model, self.driver.capture(), self.legacy, conversation)
        if self.loop_fn is not None:
            return self.loop_fn(driver=self.driver, params=params, max_steps=steps, approver=approvals.approve,
                                before_action=approvals.before_action, cancelled=self.cancel, hooks=hooks,
                                meter=meter, base_url=self.server.base_url if self.server else None,
                                api_key=self.server.key if self.server else None, console=self.console)
        response = ComputerToolset(self.driver).run(
            self.client, params, max_steps=steps, approve_safety_checks=approvals.approve,
            before_action=approvals.before_action, cancelled=self.cancel, on_diagnostic=hooks.on_diagnostic)
        return response.output_text

    def verify(self) -> None:
        """The task's checks, from the guest's files; the status follows them."""
        t = time.monotonic()
        self.checks = run_checks(self.task.checks, self.agent, home=self.home,
                                 on_result=lambda r: self.record.write(Check(**r)))
        self.timings["verify"] = round(time.monotonic() - t, 3)
        checks = self.checks
        if self.status == "passed" and not checks:
            self.status, self.reason = "failed", "the task has no checks: nothing was verified"
        elif self.status == "passed" and not all(c["passed"] for c in checks):
            self.status = "failed"
            self.reason = f"{sum(not c['passed'] for c in checks)} of {len(checks)} checks failed"
        elif self.status == "passed":
            self.reason = f"{len(checks)} of {len(checks)} checks"

    def settle(self) -> None:
        """Origin requests still pending withdrawn, the network decisions not yet recorded (the run's
        tail of the gateway's log, then one ``network_log`` line saying whether the whole log is in the
        record) and the origin requests it names reconciled with the ``approval`` lines; the run's web
        recording read back (``web_recording``, :mod:`controller.run.web`)."""
        self._write_started()
        if self.origins is not None:
            why = self.cancel.reason
            self.origins.stop(why or ("run cancelled" if self.status == "cancelled" else "run ended"))
        if self.sandbox is None:
            return
        network = self.network or DecisionTail(self.record, decision_reader(self.sandbox))
        netlog = network.finish()
        if self.origins is not None:
            self.origins.reconcile(self.record, network)
        if self.web is not None and self.web.started:
            web = self.web.finish(self.record, self.cancel)
            if not web.complete:
                print_fitted(self.console, fitted(f"web recording: {clean(web.error, 500)}", style="yellow"))
        if not netlog.complete:
            print_fitted(self.console, fitted(f"gateway decision log: {clean(netlog.error, 500)}", style="yellow"))
        self.printer.flush()  # the decisions, deduplicated, before any teardown message

    def _teardown(self, own: bool) -> float:
        """The model client closed, the sandbox removed when this call owns it, the scripted server
        stopped; returns the seconds it took. A failure is printed, never raised."""
        t = time.monotonic()
        for closer in (getattr(self.client, "close", None), self.sandbox.close if own and self.sandbox else None,
                       getattr(self.server, "stop", None)):
            if closer is None:
                continue
            try:
                closer()
            except Exception as exc:  # noqa: BLE001 - teardown goes on; the error may quote the guest's output
                print_fitted(self.console, fitted(f"teardown: {clean(exc, 1000)}", style="yellow"))
        return round(time.monotonic() - t, 3)

    def finish(self, teardown_s: float | None = None) -> RunOutcome:
        """``run_finished`` (``cancelled`` when a signal came before it, whatever the run had reached),
        the summary; returns the outcome."""
        if teardown_s is not None:
            self.timings["teardown"] = teardown_s
        if self.cancel() and self.cancel.signal is not None and self.status != "cancelled":
            self.status, self.reason = ("cancelled", f"cancelled by {self.cancel.signal} after the run had "
                                                     f"{self.status}: {self.reason}")
        if self.video is not None:  # the encoder takes what is queued and closes the file (bounded)
            self.record.write(self.video.finish(cancelled=self.cancel))
        elif self.video_settings is not None:
            self.record.write(Video(fps=self.video_settings.fps, error="the run ended before its sandbox was up"))
        self.record.finish(self.status, self.reason, final_message=self.final_message, timings=self.timings,
                           wall_s=round(time.monotonic() - self._t0, 3))
        self.record.close()
        print_summary(read_entries(self.record.path), self.record.path, console=self.console)
        return RunOutcome(status=self.status, reason=self.reason, record_dir=self.record.dir, checks=self.checks,
                          final_message=self.final_message, timings=self.timings,
                          scripted_requests=self.scripted.requests if self.scripted else None,
                          conversation=self.tail.items())

    # -- how it ended early ----------------------------------------------------------------------------
    def _stopped(self, exc: BaseException) -> None:
        if isinstance(exc, KeyboardInterrupt):
            self.cancel.set("SIGINT")
        if self.cancel.signal is None and self.cancel.failure is not None:  # a service stayed unreachable
            self.status, self.reason = "error", self.cancel.failure
        else:
            self.status, self.reason = "cancelled", f"cancelled by {self.cancel.signal or 'SIGINT'}"
        if self.driver is not None:
            with contextlib.suppress(Exception):
                self.driver.release()

    def _failed(self, exc: BaseException) -> None:
        if isinstance(exc, SandboxInterrupted):
            self.status, self.reason = "cancelled", str(exc)
        else:
            self.status, self.reason = "error", f"{type(exc).__name__}: {exc}"

    def _write_started(self) -> None:
        if self.record.started:
            return
        self.record.started = True
        opts = self.options
        script = opts.script or (self.task.offline_script_path() if not self.live and self.task.offline else None)
        self.record.write(run_started_entry(
            self.task, self.sandbox, mode=self.mode, model=self.model if self.live else "scripted",
            legacy=self.legacy, max_steps=self.max_steps, script=script,
            sandbox_start_s=self.timings.get("sandbox_start"),
            runner=opts.runner or ("sdk" if self.loop_fn is None else "custom"), typed_text=self.typed_text))
        swapped = getattr(self.sandbox, "policy_swap", None)
        if isinstance(swapped, dict):
            self.record.write(PolicySwap(**swapped, why="claim"))


@dataclass
class _Approvals:
    """What the loop is given to ask people: the SDK's ``approve_safety_checks`` and ``before_action``
    (None when nothing is confirmed), the gate, and the denials so far."""

    approve: Callable[[Any], bool]
    before_action: Callable[[Any], bool] | None
    gate: ActionGate
    denials: list[Any]


def run_task(task: Task, open_sandbox: Callable[[Task], Any], options: RunOptions | None = None,
             console: Console | None = None, *, views: Iterable[View] = (), asker: Any = _UNSET,
             loop: Loop | None = None) -> RunOutcome:
    """Run ``task`` on the sandbox ``open_sandbox(task)`` returns (a ``controller.sandbox.Sandbox``,
    already started), owned by this call: it is removed before the record finishes. ``views``: what
    follows the run (:data:`View`, e.g. :func:`watching`); ``asker`` and ``loop``: see :class:`Run`.
    Never raises for a run that went wrong (:meth:`Run.execute`)."""
    run = Run(task, options, console, asker=asker, loop=loop)
    for view in views:
        view(run)
    return run.execute(open_sandbox, own=True)


def _topology(sandbox: Any) -> Any:
    """The sandbox's ``NetworkTopology`` (the gateway's and the agent's addresses), or None."""
    try:
        return sandbox.topology()
    except Exception:  # noqa: BLE001 - a backend without one (a sandbox made of parts): the rules do without
        return None


def _origin_wait(registry: ApprovalRegistry, hooks: RecordingHooks, cancel: Callable[[], bool]) -> Callable[[], bool]:
    """The driver's ``before_capture``: wait for pending origin requests (bounded, polling ``cancel``);
    the milliseconds waited go on the screenshot's record line. True when it waited."""

    def wait() -> bool:
        hooks.waited_for_origin_ms = wait_for_origins(registry, cancel)
        return hooks.waited_for_origin_ms is not None

    return wait


def _policy_allows(task: Task, registry: ApprovalRegistry) -> Callable[[str], bool]:
    """Whether the task's policy lets ``origin`` through: its ``allow`` tier, or an ``ask`` origin a person
    approved in this run (an approved ``origin_access`` request for it). Never for what cannot be parsed."""
    from controller.gateway.origin import Origin

    def allows(text: str) -> bool:
        try:
            origin = Origin.parse(text)
        except ValueError:
            return False
        if task.network.admits_origin(origin):
            return True
        return any(r.kind == "origin_access" and r.state == "approved" and r.origin == str(origin)
                   for r in registry.all())

    return allows


def _denial_reason(decision: Any) -> str:
    """Why a run stopped on a denial: ``safety check sensitive_action denied by console`` or ``action
    type <5 chars> denied by timeout (no answer within 300s (--approval-timeout))``."""
    if decision.what == "safety_check":
        what = "safety check " + (", ".join(c or "(no code)" for c in decision.codes) or "(none)")
    else:
        what = f"action {decision.action or '?'}"
    why = f" ({decision.message})" if decision.message and decision.by in ("timeout", "no-approver", "replay") else ""
    return clean(f"{what} denied by {decision.by}{why}", 400)


def _human_recorded(data: dict[str, Any], typed_text: bool) -> dict[str, Any]:
    """A person's action (``{"action", "input", "by"}`` from the console) as the record keeps it
    (:func:`controller.run.record.recorded_action` on its ``input``)."""
    raw = data.get("input")
    return {**data, "input": recorded_action(raw, typed_text)} if isinstance(raw, dict) else data


def _expectation_verdict(scripted: ScriptedModel | None, status: str, reason: str) -> tuple[str, str]:
    """``failed`` with the unmet screen expectation when the scripted model gave up on one (it then
    answered a final message, so the loop itself completed); otherwise ``(status, reason)`` unchanged."""
    unmet = scripted.unmet if scripted is not None else None
    if unmet is None or status != "passed":
        return status, reason
    first = (unmet.get("unmet") or [{}])[0]
    what = "input" if first.get("kind") in INPUT_EXPECTATIONS else "screen"
    return "failed", (f"{what} expectation unmet at turn {unmet.get('turn')} ({unmet.get('reason')}): "
                      f"{first.get('expected')}; observed {first.get('observed')}")



def _record_redactions(agent: Any, record: Any) -> Callable[[], None]:
    """Each region ``agent``'s screen starts to keep out of pictures (:mod:`controller.redaction`) is a
    ``redaction`` line, those held since before the run first (``held_before``); returns what stops
    writing them, to call once the run has ended (the sandbox and its redactor may outlive the run): it
    also lets go a ``sign_in`` region a fill left held because its end was never seen
    (:class:`controller.run.signin.SignInFlow`), once nothing of the run takes pictures any more."""
    redactor = getattr(agent, "redactor", None)
    if not isinstance(redactor, Redactor):
        return lambda: None
    for why, box in redactor.held():
        record.write(Redaction(why=why, box=box, held_before=True))

    def written(why: str, box: Any) -> None:
        if getattr(record, "finished", None) is None:  # never after run_finished, the last line
            record.write(Redaction(why=why, box=box))

    redactor.on_hold = written

    def restore() -> None:
        redactor.on_hold = None
        redactor.release_all("sign_in")

    return restore


def _stop_agent_calls(agent: Any, cancel: Cancellation) -> Callable[[], None]:
    """Once the run is stopping, ``agent``'s calls get :data:`STOP_CALL_GRACE_S` at most (the one under
    way is cut then); returns what gives them their own deadlines again (the sandbox may outlive the
    run: an Agents API session's next turn), to call once the run has ended."""
    stop_calls = getattr(agent, "stop_calls", None)
    if not callable(stop_calls):
        return lambda: None
    cancel.on_stop(lambda: stop_calls(STOP_CALL_GRACE_S))

    def restore() -> None:
        cancel.join_watch()
        stop_calls(None)

    return restore


