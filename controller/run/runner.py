"""run-task: one task on a sandbox, through the SDK's computer loop, then verification and the record.

Order: start the sandbox -> launch the task's apps -> wait for readiness (task ``[[ready]]`` files,
then a stable screen) -> first screenshot -> ``openai.ComputerToolset(driver).run(...)`` (the SDK
owns the loop; a task with ``[model] tools`` holding ``browser`` runs the SDK's ``ResponsesToolRunner``
instead, its ``BrowserToolset`` over :class:`controller.run.browser_driver.GuestBrowserDriver` and the
``ComputerToolset`` only when ``computer`` is among the tools, the first screenshot only then)
against the live API or the offline scripted server -> release inputs -> verify from
the guest's files -> the rest of the network decisions -> tear down -> ``run_finished``. The gateway's
decisions are copied into the record while the loop goes, after each model response and each driver
call (:mod:`controller.run.recording`), so the record holds them in time order with the actions.
With a task in ``[network] mode = "ask"`` the gateway's origin requests are mirrored into the run's
approval registry from the sandbox's start to teardown (:class:`controller.run.origins.OriginAccess`):
answered on the terminal, in the console or by ``--approve-origin``, each an ``approval`` line; every
screenshot waits for pending ones (the driver's ``before_capture``), and so does the browser state the
model gets after each step's browser calls; at teardown what is pending is
cancelled at the gateway and every request in its decision log is reconciled with the approval lines.

Status: ``cancelled`` (Ctrl-C / SIGTERM: the loop stops between driver calls, inputs are released,
the sandbox is torn down, no verification), ``error`` (the loop or the sandbox failed), ``failed``
(a check failed, the task has no checks, a safety check / action was denied, or the offline scripted
model gave up on a screen expectation: an ``expectation`` entry says which), ``passed`` (loop
completed and every check passed -- at least one). Exit code: 0 ``passed``, 1 ``failed`` or
``error``, 130 ``cancelled`` (the shell's convention for an interrupted command).

The console shows the run as it goes: the record's listener (:class:`controller.run.progress.RunPrinter`)
prints one line per record entry (sandbox start, model steps, computer_calls with their actions
summarised -- typed text only as a length --, approvals, network decisions, checks), the runner adds
the launch and readiness lines, and the summary table ends the run.

Over 400 lines: one run's sequence, with the cancellation rule (no signal cuts a step in half; the
record is always finished) threaded through every phase, reads best as one function beside its helpers;
the record's entries and their writing are in :mod:`controller.run.recording`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from openai import ComputerToolset
from openai.lib.browser import BrowserToolset
from openai.lib.computer import ComputerUseError
from openai.lib.responses_tool_runner import ResponsesToolRunner, ToolRunnerCancelledError, ToolRunnerError
from rich.console import Console
from rich.markup import escape

from controller.run.approvals import ActionGate, Asker, SafetyCheckApprover, terminal_asker
from controller.run.browser_driver import GuestBrowserDriver, UrlRules
from controller.run.live import LiveRun
from controller.run.origins import ControlUnreachable, OriginAccess, wait_for_origins
from controller.run.registry import ApprovalRegistry
from controller.run.signin import SignInFile, SignInFlow, SignInPrompter
from controller.run.binding import BoundApprovals
from controller.run.driver import SandboxDriver, ScreenChanged, ScreenshotPolicy, SentScreenshot, wait_for_stable_screen
from controller.run.replay import HumanReplayer
from controller.run.entries import Approval, Check, HumanAction, Takeover
from controller.run.model_client import live_client, offline_client
from controller.run.progress import RunPrinter, clean, fitted, make_console, print_fitted
from controller.run.record import RunRecord, new_run_id, print_summary, read_entries, recorded_action
from controller.run.recording import (
    BodyMeter, DecisionTail, RecordingHooks, decision_reader, expectation_recorder, run_started_entry,
)
from controller.offline.script import load_task_script
from controller.offline.scripted_server import ScriptedModel, ScriptedServer
from controller.run.tasks import Task
from controller.run.verify import GuestFileMissing, guest_path, run_checks
from controller.sandbox.signals import SandboxInterrupted

DEFAULT_MODEL = "gpt-6-astra"
GUEST_HOME = "/home/sandbox"
EXIT_CODES = {"passed": 0, "failed": 1, "error": 1, "cancelled": 130}
"""Exit status of ``run-task`` per run status (130: cancelled, as a shell reports an interrupted command)."""
WITHDRAW_POLL_S = 0.1
"""How often the run's cancellation thread looks at the signal handler's flag (seconds): the longest a
pending question stays pending after a signal (:meth:`_Cancel.withdraw_on_cancel`)."""
STOP_CALL_GRACE_S = 0.5
"""Once the run is stopping, the most an agent call may take (seconds): the call under way is cut then,
and each call of the teardown gets no more (:meth:`controller.agent_client.AgentClient.stop_calls`), so
an agent stalled by the desktop (a program holding the X server grabbed) cannot hold a signal's exit."""

_UNSET: Any = object()


@dataclass
class RunOptions:
    """How to run a task.

    ``live``: None -> live when ``OPENAI_API_KEY`` is set, else the offline exercise. ``model``: the
    live model (default ``$OPENAI_MODEL`` or :data:`DEFAULT_MODEL`). ``script``: override the task's
    offline script. ``approve_codes``: safety-check codes approved unattended (opt-in, logged).
    ``confirm_actions``: action types to confirm; ``step``: confirm every action. ``asker``: who
    answers questions on the terminal (default: the terminal when there is one, else nobody).
    ``approval_timeout_s``: seconds a question waits for an answer before it is denied (None: no
    deadline). ``on_live``: called once with the run's :class:`controller.run.live.LiveRun` when a
    view (the web console) follows the run; questions then wait for the console too, also without a
    terminal. ``approve_origins``: origins (``controller.gateway.policy.Origin``) whose origin requests
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
    asker: Any = _UNSET
    home: str | None = None
    ready_timeout_s: float = 90.0
    approval_timeout_s: float | None = 300.0
    on_live: Callable[[LiveRun], None] | None = None
    signals_before: list[int] = field(default_factory=list)
    """Signals that came before the run (the CLI notes them while it prepares): when this list holds
    one once run_task's own handlers are in place, the run ends ``cancelled`` before anything starts."""
    runner: str | None = None
    """The name of the model loop, for the record's ``run_started`` (``agent-framework`` with
    :attr:`loop` set by ``run-task --runner``); None: ``sdk`` without a ``loop``, ``custom`` with one."""
    loop: Callable[..., str | None] | None = None
    """The model loop in place of the SDK's ``ComputerToolset.run`` (``run-task --runner agent-framework``:
    :func:`controller.af.loop.run_loop`), called with the keywords ``driver``, ``params`` (the first
    request), ``max_steps``, ``approver``, ``before_action`` (None when inactive), ``cancelled``, ``hooks``,
    ``meter``, ``base_url`` and ``api_key`` (the scripted server's URL and key; None live) and ``console``;
    returns the model's final message, raises ``ComputerUseError`` when it stops short (after a denial: the
    run fails)."""
    on_record: Callable[[RunRecord], None] | None = None
    """Called once with the run's record right after its ``run_started`` line (``desktop-sandbox serve``
    writes the events of its session's turn into it)."""
    sign_in_file: Path | None = None
    """``--sign-in FILE``: answers sign-in requests from this 0600 TOML file (contract 8)."""
    before_finish: Callable[[str, str, str | None, list[dict[str, Any]]], None] | None = None
    """Called with the run's final ``(status, reason, final_message, checks)`` after teardown, just before
    ``run_finished`` is written (the record still takes entries); its exceptions are ignored."""
    record_typed_text: bool = False
    """``--record-typed-text``: keep typed text in the record (as the task's ``[record] typed_text``)."""
    human_actions: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    """A person's actions to perform again (``desktop-sandbox replay``: step index -> actions in screen px,
    :class:`controller.run.replay.HumanReplayer`)."""
    answerers: list[Callable[[ApprovalRegistry, Callable[[str], None]], Any]] = field(default_factory=list)
    """More answerers of the run's questions, each started as ``start(registry, cancel_run)`` once the
    run's approval registry exists (``cancel_run(by)`` cancels the run as a view does: ``cancelled by
    BY``); the answerer's ``on_entry``, when it has one, follows the record, and its ``stop()`` is called
    at the run's end (``desktop-sandbox replay``: :class:`controller.run.replay.ReplayAnswers`)."""


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

    @property
    def exit_code(self) -> int:
        """0 passed, 1 failed or error, 130 cancelled (:data:`EXIT_CODES`)."""
        return EXIT_CODES.get(self.status, 1)


class _Cancel:
    """Cooperative cancellation: first Ctrl-C (or SIGTERM, SIGHUP) sets the flag the SDK polls; a second
    Ctrl-C raises KeyboardInterrupt, but only while ``installed(interruptible=True)`` (the run's body):
    before it and during teardown and the record every signal only sets the flag, so nothing is cut
    short. Signal handlers are installed only in the main thread. The handler only notes; what it
    has to say is printed at the next poll (``announce``), and the pending questions are withdrawn by
    :meth:`withdraw_on_cancel`'s thread (the handler must take no lock). :meth:`fail` stops the run the
    same way when a service it needs stays unreachable; it then ends ``error``."""

    def __init__(self) -> None:
        self.is_set = False  # a plain flag, not a threading.Event: its lock could deadlock the handler
        self.signal: str | None = None
        self.failure: str | None = None
        self.interruptible = False
        self._notes: list[str] = []
        self._console: Console | None = None
        self._on_stop: list[Callable[[], None]] = []  # run by the cancellation thread once the flag is set
        self._stop_ran = False
        self._hooks = threading.Lock()  # between the main thread and the cancellation thread, never the handler
        self._watch: threading.Thread | None = None

    def __call__(self) -> bool:
        self.announce()
        return self.is_set

    @property
    def reason(self) -> str | None:
        """Why the run is stopping (``cancelled by SIGTERM``, ``cancelled by console``, or the
        :meth:`fail` reason); None while it goes on. A request withdrawn on the way out carries it
        (:meth:`controller.run.registry.ApprovalRegistry.wait` reads it from its ``cancelled``)."""
        if self.signal is not None:
            return f"cancelled by {self.signal}"
        return self.failure

    def fail(self, reason: str) -> None:
        """Stop the run as a cancellation does, but to end it ``error`` with ``reason`` (one line naming
        the service that stayed unreachable). From any thread; nothing once the run is stopping."""
        if self.is_set:
            return
        self.failure = clean(reason, 400)
        self.is_set = True
        self._notes.append(f"stopping the run: {self.failure}")

    def withdraw_on_cancel(self, registry: ApprovalRegistry) -> threading.Thread:
        """Start the thread that closes ``registry`` with :attr:`reason` once the flag is set (a signal,
        :meth:`fail`): every pending question is withdrawn within :data:`WITHDRAW_POLL_S`, whoever waits
        for it -- the loop in the main thread (whether or not its callback polls the flag), a terminal
        prompt, the console -- and one asked later is withdrawn as it opens. The thread ends once the
        registry is closed, by it or by the run's end; returns it."""

        def watch() -> None:
            while registry.closed is None:
                if self.is_set:
                    self._stopping()
                    registry.close(self.reason or "run cancelled")
                    return
                time.sleep(WITHDRAW_POLL_S)  # poll interval: the signal handler sets a plain flag only

        thread = threading.Thread(target=watch, name="run-cancel", daemon=True)
        thread.start()
        self._watch = thread
        return thread

    def on_stop(self, hook: Callable[[], None]) -> None:
        """Call ``hook()`` once the run is stopping: from :meth:`withdraw_on_cancel`'s thread within
        :data:`WITHDRAW_POLL_S` of the flag, or now when that thread already saw it."""
        with self._hooks:
            if not self._stop_ran:
                self._on_stop.append(hook)
                return
        with contextlib.suppress(Exception):
            hook()

    def _stopping(self) -> None:
        with self._hooks:
            self._stop_ran = True
            hooks, self._on_stop = self._on_stop, []
        for hook in hooks:
            with contextlib.suppress(Exception):  # a hook that fails stops nothing else
                hook()

    def join_watch(self, timeout: float = 1.0) -> None:
        """Wait for :meth:`withdraw_on_cancel`'s thread to end (it does within :data:`WITHDRAW_POLL_S`
        of the registry's close): no hook runs after this."""
        if self._watch is not None and self._watch is not threading.current_thread():
            self._watch.join(timeout)

    def announce(self) -> None:
        """Print the lines the handler noted. Never from the handler itself: printing there can re-enter
        the console's stream or an import the main thread is in the middle of (rich's emoji table)."""
        while self._notes and self._console is not None:
            self._console.print(self._notes.pop(0), style="yellow", markup=False, emoji=False, highlight=False)

    def set(self, why: str) -> None:
        self.signal = self.signal or why
        self.is_set = True

    def set_by_view(self, by: str, registry: ApprovalRegistry) -> None:
        """Cancel from a view (the web console's **Cancel run**): as a first Ctrl-C, and every pending
        approval is withdrawn at once."""
        registry.close(f"cancelled by {by}", then=lambda: self.set(by))
        self._notes.append(f"{by}: cancelling: the action under way is stopped, inputs released, the sandbox removed")

    @contextlib.contextmanager
    def installed(self, console: Console, interruptible: bool = True) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def handler(signum: int, _frame: object) -> None:
            name = signal.Signals(signum).name
            if self.is_set and signum == signal.SIGINT and self.interruptible:
                raise KeyboardInterrupt
            self.set(name)
            self._notes.append(f"{name}: cancelling: the action under way is stopped, inputs released, the "
                               "sandbox removed" + (" (Ctrl-C again to stop at once)" if signum == signal.SIGINT else "")
                               if self.interruptible else
                               f"{name}: cancelling; the sandbox is removed and the record finished first")

        self._console = console
        previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
        was, self.interruptible = self.interruptible, interruptible
        try:
            yield
        finally:
            self.interruptible = was
            for s, h in previous.items():
                signal.signal(s, h)


def _wait_ready(agent: Any, task: Task, home: str, timeout_s: float, time_scale: float = 1.0,
                cancelled: Callable[[], bool] = lambda: False) -> dict[str, Any]:
    """Wait for each ``[[ready]]`` file (its ``timeout_s``, at most ``timeout_s``, both times the
    sandbox's ``time_scale``), then for a stable screen. Returns what was observed. ``cancelled()`` is
    polled between reads (every 0.1 s): raises ``_Cancelled`` once it is true."""
    observed: dict[str, Any] = {}
    for ready in task.ready:
        path = guest_path(ready.file, home)
        limit = min(ready.timeout_s, timeout_s) * time_scale
        deadline = time.monotonic() + limit
        started = time.monotonic()
        while True:
            if cancelled():
                raise _Cancelled()
            try:
                agent.read_file(path)
                observed[path] = round(time.monotonic() - started, 3)
                break
            except GuestFileMissing:
                pass
            except Exception as exc:  # 404 from the agent client
                if getattr(exc, "status", None) != 404:
                    raise
            if time.monotonic() > deadline:
                raise TimeoutError(f"ready file {path} did not appear within {limit:g}s")
            time.sleep(0.1)  # poll interval: the file is looked for, and the flag, every 0.1 s
    started = time.monotonic()
    observed["screen_stable"] = wait_for_stable_screen(agent, timeout_s=10.0 * time_scale, cancelled=cancelled)
    observed["screen_stable_s"] = round(time.monotonic() - started, 3)
    if cancelled():
        raise _Cancelled()
    return observed


def _ready_line(observed: dict[str, Any], took_s: float, home: str = "") -> list[str]:
    """``ready in 0.3s: ~/.cache/terminal-ready 0.11s, screen stable 0.22s`` in parts for
    :func:`controller.run.progress.fitted` (a path apart from its time, so that a long path gives way
    first); a path in the guest's ``home`` is shown from ``~``."""
    parts = [f"ready in {took_s:.1f}s: "]
    for path, s in observed.items():
        if path not in ("screen_stable", "screen_stable_s"):
            shown = "~" + path[len(home):] if home and path.startswith(home.rstrip("/") + "/") else path
            parts += [clean(shown, 500), f" {s:.2f}s, "]
    stable = "screen stable" if observed.get("screen_stable") else "screen still changing"
    return [*parts, f"{stable} {observed.get('screen_stable_s', 0.0):.2f}s"]


def build_params(task: Task, model: str, first: SentScreenshot, legacy: bool) -> dict[str, Any]:
    """The Responses request the loop starts from: instructions plus the first screenshot (model px)."""
    if legacy:
        tool: dict[str, Any] = {"type": "computer_use_preview", "display_width": first.image_size[0],
                                "display_height": first.image_size[1], "environment": "linux"}
    else:
        tool = {"type": "computer"}
    text = (f"{task.instructions}\n\nThe screenshot is {first.image_size[0]}x{first.image_size[1]} pixels; "
            "give coordinates in its pixels.")
    return {
        "model": model,
        "tools": [tool],
        "input": [{
            "role": "user",
            "content": [
                {"type": "input_text", "text": text},
                {"type": "input_image", "image_url": first.data_url, "detail": "high"},
            ],
        }],
        "truncation": "auto",
    }


def browser_params(task: Task, model: str, first: SentScreenshot | None, legacy: bool) -> dict[str, Any]:
    """The first request of a task with the browser tools (``[model] tools`` has ``browser``): the
    instructions, and with the computer tool too its declaration and the first screenshot (model px) as
    :func:`build_params` gives them. The ``browser_*`` function tools are the ``ResponsesToolRunner``'s
    to add (from the ``BrowserToolset``)."""
    about = "\n\nThe browser tools (browser_*) drive the web browser open on the desktop."
    params: dict[str, Any] = {"model": model}
    if first is not None:
        computer = build_params(task, model, first, legacy)
        params["tools"] = computer["tools"]
        content = computer["input"][0]["content"]
        content[0]["text"] += about
    else:
        content = [{"type": "input_text", "text": task.instructions + about}]
    params["input"] = [{"role": "user", "content": content}]
    params["truncation"] = "auto"
    return params


def _browser_loop(task: Task, model: str, legacy: bool, driver: SandboxDriver, browser: GuestBrowserDriver,
                  client: Any, *, steps: int, approver: Callable[[Any], bool],
                  before_action: Callable[[Any], bool] | None, cancel: Callable[[], bool],
                  hooks: RecordingHooks) -> str | None:
    """The model loop of a task with the browser tools: the SDK's ``ResponsesToolRunner`` with a
    ``BrowserToolset`` over ``browser`` (the task's members, ``confirm`` and ``url_policy`` the driver's)
    and, when the task also has the computer tool, a ``ComputerToolset`` over ``driver``; the same
    approvals, cancellation and diagnostics (the record) as the computer loop. The run's
    ``before_capture`` chain (``driver.before_capture``: the origin wait, the sign-in flow) also runs on
    the browser path, once per model step before the SDK reads the state that follows the step's browser
    calls (:class:`controller.run.browser_driver.StepObservation`): the loop goes through the runner's
    turns (``iterate``, as its ``run`` does) to tell the driver each step's calls before they run.
    A browser call a person denied (``--confirm-actions``, ``--step``) ends the loop before the model's
    next turn runs anything (``ToolRunnerError``; the run is then ``failed`` on that denial), as a denied
    computer action does. Returns the model's final message; raises what the runner raises
    (``ToolRunnerError`` when it stops short)."""
    computer = task.computer_tools
    first = driver.capture() if computer else None
    params = browser_params(task, model, first, legacy)
    toolset = BrowserToolset(browser, members=list(task.browser_members), confirm=browser.confirm,
                             url_policy=browser.url_policy)
    names = [tool["name"] for tool in toolset.tools]
    browser.before_observe = _browser_observe(driver.before_capture, hooks)
    runner = ResponsesToolRunner(browser=toolset, computer=ComputerToolset(driver) if computer else None)

    def on_diagnostic(event: dict[str, Any]) -> None:
        browser.on_diagnostic(event)
        hooks.on_diagnostic(event)

    turns = runner.iterate(client, params, max_steps=steps, approve_safety_checks=approver if computer else None,
                           before_action=before_action if computer else None, cancelled=cancel,
                           on_diagnostic=on_diagnostic)
    try:
        for turn in turns:
            if browser.denied is not None:  # a person said no: the run stops there, as for a computer action
                raise ToolRunnerError(f"{browser.denied} was denied", [], [])
            browser.plan_step(turn.response.output, names)  # before the turn's tools run
            if turn.final:
                return turn.response.output_text
    finally:
        turns.close()
    raise ToolRunnerError("the tool runner ended without a final turn", [], [])


def _browser_observe(before: Callable[[], bool] | None, hooks: RecordingHooks) -> Callable[[], bool] | None:
    """The browser path's ``before_observe``: the run's ``before_capture`` chain (None: nothing to run).
    The milliseconds the origin wait noted for the next screenshot line are dropped after it: no
    screenshot follows a browser state read to carry them."""
    if before is None:
        return None

    def observe() -> bool:
        try:
            return before()
        finally:
            hooks.waited_for_origin_ms = None

    return observe


def _topology(sandbox: Any) -> Any:
    """The sandbox's ``NetworkTopology`` (the gateway's and the agent's addresses), or None."""
    topology = getattr(sandbox, "topology", None)
    if not callable(topology):
        return None
    try:
        return topology()
    except Exception:  # noqa: BLE001 - a backend without one: the rules do without
        return None


def run_task(task: Task, open_sandbox: Callable[[Task], Any], options: RunOptions | None = None,
             console: Console | None = None) -> RunOutcome:
    """Run ``task`` on the sandbox ``open_sandbox(task)`` returns (a ``controller.sandbox.Sandbox``,
    already started) and return the outcome. Writes ``runs/<id>/record.jsonl`` and prints a summary.

    Never raises for a run that went wrong (the status says so); KeyboardInterrupt from a second
    Ctrl-C still ends the run as ``cancelled`` after teardown. SIGINT, SIGTERM and SIGHUP are handled
    from the first line to the last: one that comes at any moment before ``run_finished`` is written
    (also during verification or teardown, or in ``options.signals_before``) ends the run ``cancelled``,
    and none cuts the teardown or the record short. Whatever the run waits for then -- a person's answer
    (terminal, console), an origin request, a sign-in request, a ready condition -- ends within about
    0.1 s: pending requests are withdrawn with the signal as reason (``cancelled by SIGTERM``).
    """
    options = options or RunOptions()
    console = console or make_console(stderr=True)
    cancel = _Cancel()
    with cancel.installed(console, interruptible=False):
        if options.signals_before:
            cancel.set(signal.Signals(options.signals_before[0]).name)
        return _run_task(task, open_sandbox, options, console, cancel)


def _stop_agent_calls(agent: Any, cancel: _Cancel) -> Callable[[], None]:
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


def _run_task(task: Task, open_sandbox: Callable[[Task], Any], options: RunOptions, console: Console,
              cancel: _Cancel) -> RunOutcome:
    run_t0 = time.monotonic()
    options = options or RunOptions()
    console = console or make_console(stderr=True)
    live = options.live if options.live is not None else bool(os.environ.get("OPENAI_API_KEY"))
    model = options.model or os.environ.get("OPENAI_MODEL") or DEFAULT_MODEL
    if options.legacy is not None:
        legacy = options.legacy
    elif live:  # the preview model speaks only the legacy computer_use_preview tool
        legacy = model.startswith("computer-use-preview")
    else:
        legacy = bool(task.offline and task.offline.legacy)
    asker: Asker | None = terminal_asker(console) if options.asker is _UNSET else options.asker
    max_steps = options.max_steps or task.max_steps
    registry = ApprovalRegistry(options.approval_timeout_s)
    answerers: list[Any] = []  # the sign-in answerers started for the run (terminal, --sign-in file)
    printer = RunPrinter(console)
    record = RunRecord(options.runs_dir, new_run_id(task.name), on_entry=printer)
    view: LiveRun | None = None  # what the web console follows
    if options.on_live is not None:
        view = LiveRun(record.run_id, record.dir, registry)
        view.task_name = task.name
        registry.views.add("console")
        record.on_entry = _Both(printer, view.on_entry)
        options.on_live(view)
    for start in options.answerers:
        answerer = start(registry, lambda by: cancel.set_by_view(by, registry))
        answerers.append(answerer)
        if callable(getattr(answerer, "on_entry", None)):
            record.on_entry = _Both(record.on_entry, answerer.on_entry)
    timings: dict[str, float] = {}
    checks: list[dict[str, Any]] = []
    status, reason, final_message = "error", "", None
    sandbox = None
    network: DecisionTail | None = None
    server: ScriptedServer | None = None
    client = None
    driver: SandboxDriver | None = None
    scripted: ScriptedModel | None = None
    origins: OriginAccess | None = None
    restore_agent: Callable[[], None] = lambda: None  # the agent's calls their own deadlines again
    mode = "live" if live else "offline"
    # printed whole, however wide: run-suite reads the record's folder from this line (controller.suite)
    console.print(f"[bold]run-task[/] {escape(clean(f'{task.name} ({mode}) -> {record.dir}', 500))}", emoji=False)

    def phase(name: str, started: float) -> None:
        timings[name] = round(time.monotonic() - started, 3)

    typed_text = options.record_typed_text or task.record.typed_text

    def write_started(sb: Any) -> None:
        if record.started:
            return
        record.started = True
        script = options.script or (task.offline_script_path() if not live and task.offline else None)
        record.write(run_started_entry(task, sb, mode=mode, model=model if live else "scripted", legacy=legacy,
                                       max_steps=max_steps, script=script,
                                       sandbox_start_s=timings.get("sandbox_start"),
                                       runner=options.runner or ("sdk" if options.loop is None else "custom"),
                                       typed_text=typed_text))
        if options.on_record is not None:  # after run_started: the record's first line stays the first
            options.on_record(record)

    cancel.withdraw_on_cancel(registry)
    try:
        with cancel.installed(console):
            if cancel():  # a signal before the run began: nothing is started
                raise _Cancelled()
            t = time.monotonic()
            try:
                if not live:
                    scripted = ScriptedModel(load_task_script(task, options.script),
                                             on_expectation=expectation_recorder(record))
                    server = ScriptedServer(scripted).start()
                if cancel():
                    raise _Cancelled()
                with cancel.installed(console, interruptible=False):  # no Ctrl-C between its start and here
                    sandbox = open_sandbox(task)
            finally:
                phase("sandbox_start", t)
            if cancel():
                raise _Cancelled()
            write_started(sandbox)
            network = DecisionTail(record, decision_reader(sandbox)).start()
            try:  # returns once the gateway's control API answered: the run's questions can be seen
                origins = OriginAccess.start(sandbox, registry, record, asker, console,
                                             approve=options.approve_origins, has_view=view is not None,
                                             asks=task.network.mode == "ask", max_pending=task.network.max_pending,
                                             cancelled=cancel, on_lost=cancel.fail)
            except ControlUnreachable as exc:
                cancel.fail(str(exc))
                raise _Cancelled() from None
            if cancel():
                raise _Cancelled()
            time_scale = float(getattr(sandbox, "time_scale", 1.0) or 1.0)
            if scripted is not None:
                scripted.time_scale = time_scale
            agent = sandbox.agent
            restore_agent = _stop_agent_calls(agent, cancel)
            if view is not None:
                view.attach(agent, (task.screen.width, task.screen.height), task_name=task.name,
                            cancel=lambda by: (origins is not None and origins.cancelled_by(by),
                                               cancel.set_by_view(by, registry)),
                            record_human=lambda data: record.write(HumanAction(**_human_recorded(data, typed_text))),
                            record_control=lambda control: record.write(Takeover(control=control)))
            home = options.home or getattr(sandbox, "guest_home", None) or GUEST_HOME
            t = time.monotonic()
            if task.browser_channel:  # every request of the agent's chromium is judged by the task's rule
                rules = UrlRules.for_task(task, _topology(sandbox), getattr(agent, "base_url", None))
                agent.browser_rule(rules.guest_rule())
            for launch in task.launch:
                pid = agent.launch(launch.app, launch.args)
                print_fitted(console, fitted(f"launched {clean(launch.app, 80)} (pid {pid})"))
            ready = _wait_ready(agent, task, home, options.ready_timeout_s, time_scale, cancel)
            phase("launch_ready", t)
            print_fitted(console, fitted(*_ready_line(ready, timings["launch_ready"], home)))
            network.poll()
            if cancel():
                raise _Cancelled()
            policy = ScreenshotPolicy(format=task.model.format, quality=task.model.quality,
                                      max_width=task.model.max_width, max_height=task.model.max_height,
                                      crop=task.model.crop, max_bytes=task.model.max_bytes)
            driver = SandboxDriver(agent, policy)
            driver.bind_rule = task.approvals.rule()
            hooks = RecordingHooks(record, driver, network)
            hooks.typed_text = typed_text
            driver.on_screenshot = hooks.on_screenshot
            if view is not None:
                driver.on_forward = view.on_forward
                driver.before_step = lambda screenshot: view.checkpoint(cancel, screenshot=screenshot)
            if options.human_actions:
                replayer = HumanReplayer(agent, options.human_actions, write=record.write, typed_text=typed_text,
                                         then=driver.before_step)
                record.on_entry = _Both(record.on_entry, replayer.on_entry)
                driver.before_step = replayer.before_step
            if origins is not None:
                driver.before_capture = _origin_wait(registry, hooks, cancel)
            if task.browser_channel and task.signin.enabled:
                driver.before_capture = _with_signin(driver.before_capture, SignInFlow(
                    agent, registry, allows=_policy_allows(task, registry), write=record.write,
                    answerable=lambda: bool(asker or registry.views or options.sign_in_file),
                    cancelled=cancel, screenshot=lambda: hooks.last_screenshot))
                if asker is not None:
                    answerers.append(SignInPrompter(asker, registry, console))
                if options.sign_in_file is not None:
                    answerers.append(SignInFile(options.sign_in_file, registry, console))
            meter = BodyMeter(hooks.on_request)
            # the model requests stop with the run: a signal or a cancel ends one in flight within 0.1 s
            client = (offline_client(server.base_url, meter, api_key=server.key, stopping=cancel) if server
                      else live_client(meter, stopping=cancel))
            denials: list[Any] = []  # approvals answered no: the loop's stop is then the task's failure

            def on_decision(decision: Any) -> None:
                if decision.decision == "denied":
                    denials.append(decision)
                hooks.on_decision(decision)

            override: list[str | None] = [None]  # the screen an approval is asked again on (bound approvals)

            def shown() -> str | None:
                return override[0] or hooks.last_screenshot

            approver = SafetyCheckApprover(asker=asker, auto_codes=options.approve_codes, console=console,
                                           on_decision=on_decision, registry=registry, screenshot=shown)
            for code in options.approve_codes:
                record.write(Approval(what="opt-in", decision="approved", by="command line", codes=[code],
                                      message=f"--approve-safety-check {code}"))
            gate = ActionGate(confirm=options.confirm_actions, step=options.step, asker=asker, console=console,
                              on_decision=on_decision, registry=registry, screenshot=shown)
            driver.capture_with_last_action = not gate.asks("screenshot")  # else the screenshot waits for it
            bound = BoundApprovals(driver, approver, gate, write=record.write, save_image=record.save_image,
                                   shown_override=override)
            approve_calls = bound.approve_safety_checks
            before_action = bound.before_action if gate.active else None
            browser: GuestBrowserDriver | None = None
            if task.browser_tools:
                browser = GuestBrowserDriver(agent, rules=UrlRules.for_task(task, _topology(sandbox),
                                                                            getattr(agent, "base_url", None)),
                                             gate=gate)
                hooks.browser = browser
            t = time.monotonic()
            try:
                steps = max_steps + (scripted.wait_allowance if scripted else 0)
                if browser is not None:
                    if options.loop is not None:
                        raise ValueError("a task with browser tools runs on the SDK's ResponsesToolRunner only "
                                         "(--runner drives computer tools)")
                    final_message = _browser_loop(task, model, legacy, driver, browser, client, steps=steps,
                                                  approver=approve_calls, before_action=before_action, cancel=cancel,
                                                  hooks=hooks)
                else:
                    first = driver.capture()
                    params = build_params(task, model, first, legacy)
                    if options.loop is not None:
                        final_message = options.loop(
                            driver=driver, params=params, max_steps=steps, approver=approve_calls,
                            before_action=before_action, cancelled=cancel, hooks=hooks, meter=meter,
                            base_url=server.base_url if server else None,
                            api_key=server.key if server else None, console=console)
                    else:
                        response = ComputerToolset(driver).run(
                            client, params, max_steps=steps, approve_safety_checks=approve_calls,
                            before_action=before_action, cancelled=cancel,
                            on_diagnostic=hooks.on_diagnostic,
                        )
                        final_message = response.output_text
                status, reason = "passed", "loop completed"
            except (ComputerUseError, ToolRunnerError) as exc:
                if cancel():
                    raise _Cancelled() from None
                status = "failed" if denials else "error"
                reason = _denial_reason(denials[-1]) if denials else f"loop stopped: {exc}"
            except ToolRunnerCancelledError as exc:  # an asyncio.CancelledError: not an Exception
                if cancel():
                    raise _Cancelled() from None
                status, reason = "error", f"loop stopped: {type(exc).__name__}: {exc}"
            except _Cancelled:
                raise
            except ScreenChanged as exc:  # an approval made void by the screen and not given again
                if cancel():
                    raise _Cancelled() from None
                status = "failed"
                reason = _denial_reason(denials[-1]) if denials else f"loop stopped: {exc}"
            except Exception as exc:  # API errors, driver errors, agent errors
                if cancel():
                    raise _Cancelled() from None
                status, reason = "error", f"loop stopped: {type(exc).__name__}: {exc}"
            finally:
                phase("loop", t)
                with contextlib.suppress(Exception):
                    driver.release()
            status, reason = _expectation_verdict(scripted, status, reason)
            said = f"; model said: {clean(repr(final_message), 200)}" if final_message else ""
            print_fitted(console, fitted(clean(reason, 400), said))
            if cancel():
                raise _Cancelled()
            t = time.monotonic()
            checks = run_checks(task.checks, agent, home=home,
                                on_result=lambda r: record.write(Check(**r)))
            phase("verify", t)
            if status == "passed" and not checks:
                status, reason = "failed", "the task has no checks: nothing was verified"
            elif status == "passed" and not all(c["passed"] for c in checks):
                status = "failed"
                reason = f"{sum(not c['passed'] for c in checks)} of {len(checks)} checks failed"
            elif status == "passed":
                reason = f"{len(checks)} of {len(checks)} checks"
    except (_Cancelled, KeyboardInterrupt) as exc:
        if isinstance(exc, KeyboardInterrupt):
            cancel.set("SIGINT")
        if cancel.signal is None and cancel.failure is not None:  # a service the run needs stayed unreachable
            status, reason = "error", cancel.failure
        else:
            status, reason = "cancelled", f"cancelled by {cancel.signal or 'SIGINT'}"
        if driver is not None:
            with contextlib.suppress(Exception):
                driver.release()
    except BaseException as exc:  # noqa: BLE001 - record whatever stopped the run, then re-raise below
        if isinstance(exc, SandboxInterrupted):
            status, reason = "cancelled", str(exc)
        else:
            status, reason = "error", f"{type(exc).__name__}: {exc}"
            if not isinstance(exc, Exception):
                write_started(sandbox)
                try:
                    _finish(record, sandbox, server, client, status, reason, timings, final_message, console,
                            run_t0, cancel, network, origins, before_finish=options.before_finish, checks=checks)
                finally:
                    registry.close("run ended")
                    restore_agent()
                    _stop_all(answerers)
                    if view is not None:
                        view.finish(status)
                raise
    write_started(sandbox)
    try:
        status, outcome_reason = _finish(record, sandbox, server, client, status, reason, timings, final_message,
                                         console, run_t0, cancel, network, origins,
                                         before_finish=options.before_finish, checks=checks)
    finally:
        registry.close("run ended")
        restore_agent()
        _stop_all(answerers)
        if view is not None:
            view.finish(status)
    return RunOutcome(status=status, reason=outcome_reason, record_dir=record.dir, checks=checks,
                      final_message=final_message, timings=timings,
                      scripted_requests=scripted.requests if scripted else None)


def _origin_wait(registry: ApprovalRegistry, hooks: RecordingHooks, cancel: Callable[[], bool]) -> Callable[[], bool]:
    """The driver's ``before_capture``: wait for pending origin requests (bounded, polling ``cancel``);
    the milliseconds waited go on the screenshot's record line. True when it waited."""

    def wait() -> bool:
        hooks.waited_for_origin_ms = wait_for_origins(registry, cancel)
        return hooks.waited_for_origin_ms is not None

    return wait


def _with_signin(before: Callable[[], bool] | None, signin: SignInFlow) -> Callable[[], bool]:
    """The driver's ``before_capture`` with the sign-in step after the origin wait (both run; True when
    either waited or asked: the screen is then captured anew)."""

    def step() -> bool:
        waited = before() if before is not None else False
        return signin() or waited

    return step


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


def _stop_all(answerers: list[Any]) -> None:
    for answerer in answerers:
        with contextlib.suppress(Exception):
            answerer.stop()


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


class _Both:
    """Two record listeners, in order; ``flush`` reaches the first's (the terminal printer)."""

    def __init__(self, first: Any, second: Callable[[Any], None]) -> None:
        self.first, self.second = first, second

    def __call__(self, entry: Any) -> None:
        try:
            self.first(entry)
        finally:
            self.second(entry)

    def flush(self) -> None:
        self.first.flush()


class _Cancelled(Exception):
    """Internal: the run was cancelled (the flag was set)."""


def _expectation_verdict(scripted: ScriptedModel | None, status: str, reason: str) -> tuple[str, str]:
    """``failed`` with the unmet screen expectation when the scripted model gave up on one (it then
    answered a final message, so the loop itself completed); otherwise ``(status, reason)`` unchanged."""
    unmet = scripted.unmet if scripted is not None else None
    if unmet is None or status != "passed":
        return status, reason
    first = (unmet.get("unmet") or [{}])[0]
    return "failed", (f"screen expectation unmet at turn {unmet.get('turn')} ({unmet.get('reason')}): "
                      f"{first.get('expected')}; observed {first.get('observed')}")


def _finish(record: RunRecord, sandbox: Any, server: ScriptedServer | None, client: Any, status: str,
            reason: str, timings: dict[str, float], final_message: str | None, console: Console,
            run_t0: float, cancel: _Cancel | None = None,
            network: DecisionTail | None = None, origins: OriginAccess | None = None,
            before_finish: Callable[..., None] | None = None,
            checks: list[dict[str, Any]] | None = None) -> tuple[str, str]:
    """Origin requests still pending withdrawn (``origins``), the network decisions not yet recorded
    (``network``: the run's tail of the gateway's log) and the origin requests it names reconciled with
    the ``approval`` lines, teardown, the caller's ``before_finish(status, reason, final_message,
    checks)`` (:attr:`RunOptions.before_finish`), ``run_finished``, summary. Returns the final status and reason:
    ``cancelled`` when a signal came (``cancel``) before ``run_finished``, whatever the run had reached."""
    if origins is not None:
        why = cancel.reason if cancel is not None else None
        origins.stop(why or ("run cancelled" if status == "cancelled" else "run ended"))
    if sandbox is not None:
        # The decisions not yet recorded, then one ``network_log`` entry saying whether the whole log
        # is in the record: one whose decisions could not be collected says so instead of looking like
        # a run without traffic.
        network = network or DecisionTail(record, decision_reader(sandbox))
        netlog = network.finish()
        if origins is not None:
            origins.reconcile(record, network)
        if not netlog.complete:
            print_fitted(console, fitted(f"gateway decision log: {clean(netlog.error, 500)}", style="yellow"))
        flush = getattr(record.on_entry, "flush", None)
        if flush is not None:
            flush()  # the decisions, deduplicated, before any teardown message
    t = time.monotonic()
    for closer in (getattr(client, "close", None), getattr(sandbox, "close", None),
                   getattr(server, "stop", None)):
        if closer is not None:
            try:
                closer()
            except Exception as exc:  # noqa: BLE001 - teardown goes on
                # the error may quote the guest's or a container's output
                print_fitted(console, fitted(f"teardown: {clean(exc, 1000)}", style="yellow"))
    timings["teardown"] = round(time.monotonic() - t, 3)
    if cancel is not None and cancel() and cancel.signal is not None and status != "cancelled":
        status, reason = "cancelled", f"cancelled by {cancel.signal} after the run had {status}: {reason}"
    if before_finish is not None:  # the caller's last entries, before run_finished
        try:
            before_finish(status, reason, final_message, list(checks or []))
        except Exception:  # noqa: BLE001 - a caller's hook never keeps the record from finishing
            pass
    record.finish(status, reason, final_message=final_message, timings=timings,
                  wall_s=round(time.monotonic() - run_t0, 3))
    record.close()
    print_summary(read_entries(record.path), record.path, console=console)
    return status, reason
