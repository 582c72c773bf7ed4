"""The sandbox as the computer of an Agent Framework agent of your own.

:class:`SandboxComputer` puts together what ``run-task`` gives its own loop, for a sandbox you started
(``desktop-sandbox up`` prints its agent URL and token file) and an agent you already have: the
driver (model px to screen px, one screenshot per call), the approval registry with the terminal
prompt (safety checks need a person's explicit yes; without a terminal the answer is no unless
``approve_codes`` opts a code in), a run record (``runs/<id>/record.jsonl``, typed text as its length
only) with the progress lines on the console, and the :class:`ComputerCallExecutor` that runs the
agent's calls with all of them. The model's own requests are the agent's; the record holds the calls
it ran, their approvals, actions and screenshots.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Iterable

from rich.console import Console

from controller.af.executor import ComputerCallExecutor
from controller.run.approvals import ActionGate, SafetyCheckApprover, terminal_asker
from controller.run.bus import follow_entries
from controller.run.driver import SandboxDriver, ScreenshotPolicy
from controller.run.entries import RunStarted, TaskRef
from controller.run.progress import RunPrinter, make_console
from controller.run.record import RunRecord, new_run_id
from controller.run.recording import RecordingHooks
from controller.run.registry import ApprovalRegistry
from controller.run.seam import RunSeam

_TERMINAL: Any = object()


class SandboxComputer:
    """A running sandbox's agent as an Agent Framework agent's computer (see the module docstring).

    ``agent``: a :class:`controller.agent_client.AgentClient` (or anything with its ``actions``,
    ``screenshot`` and ``release``); ``runs_dir`` / ``name``: where the record goes
    (``<runs_dir>/<time>-<name>-<hex>/``); ``asker``: who answers questions (default: the terminal
    when stdin is one, else nobody: every safety check is then denied); ``approve_codes``: safety-check
    codes approved unattended (logged, as ``--approve-safety-check``); ``confirm_actions`` /
    ``step``: action types to confirm / confirm every action; ``approval_timeout_s``: seconds a question
    waits before it is denied; ``policy``: the screenshots' :class:`ScreenshotPolicy`;
    ``earlier_records``: records of this session's earlier processes (after a checkpoint restore: calls
    they attempted never run again); ``sandbox_id``: what the record calls the sandbox (default: the
    agent's URL). Use as a context manager, or call :meth:`finish`.
    """

    def __init__(self, agent: Any, *, runs_dir: str | Path = "runs", name: str = "agent-framework",
                 asker: Any = _TERMINAL, approve_codes: Iterable[str] = (), confirm_actions: Iterable[str] = (),
                 step: bool = False, approval_timeout_s: float | None = 300.0, policy: ScreenshotPolicy | None = None,
                 earlier_records: Iterable[str | Path] = (), sandbox_id: str | None = None,
                 console: Console | None = None) -> None:
        self.console = console or make_console(stderr=True)
        asker = terminal_asker(self.console) if asker is _TERMINAL else asker
        Path(runs_dir).mkdir(parents=True, exist_ok=True)
        self.record = RunRecord(runs_dir, new_run_id(name))
        self.registry = ApprovalRegistry(approval_timeout_s, bus=self.record.bus)
        follow_entries(self.record.bus, RunPrinter(self.console), name="terminal")
        self.record.write(RunStarted(task=TaskRef(name=name), mode="live",
                                     sandbox=sandbox_id or getattr(agent, "base_url", None) or "external"))
        self.record.started = True
        seam = RunSeam(self.record.bus)
        self.driver = SandboxDriver(agent, policy or ScreenshotPolicy(), seam=seam)
        self.hooks = RecordingHooks(self.record, self.driver)
        seam.on_screenshot = self.hooks.on_screenshot
        self._cancelled = threading.Event()
        shown = lambda: self.hooks.last_screenshot  # noqa: E731
        self.approver = SafetyCheckApprover(asker=asker, auto_codes=approve_codes, console=self.console,
                                            on_decision=self.hooks.on_decision, registry=self.registry,
                                            screenshot=shown)
        gate = ActionGate(confirm=confirm_actions, step=step, asker=asker, console=self.console,
                          on_decision=self.hooks.on_decision, registry=self.registry, screenshot=shown)
        self.driver.capture_with_last_action = not gate.asks("screenshot")  # else the screenshot waits for it
        self.executor = ComputerCallExecutor(self.driver, self.approver, before_action=gate if gate.active else None,
                                             hooks=self.hooks, cancelled=self._cancelled.is_set,
                                             earlier_records=earlier_records, console=self.console)

    @property
    def record_dir(self) -> Path:
        """The run directory (``record.jsonl`` and the screenshots)."""
        return self.record.dir

    def first_message(self, text: str) -> Any:
        """A user ``Message`` with ``text`` and a fresh screenshot of the desktop (the image the model's
        coordinates then refer to: model px), saying its size in pixels."""
        from agent_framework import Content, Message

        shot = self.driver.capture()
        w, h = shot.image_size
        return Message(role="user", contents=[
            Content.from_text(f"{text}\n\nThe screenshot is {w}x{h} pixels; give coordinates in its pixels."),
            Content.from_uri(shot.data_url, media_type=shot.mime, additional_properties={"detail": "high"})])

    def cancel(self) -> None:
        """Stop: pending questions are withdrawn, the call under way stops between driver calls."""
        self.registry.close("cancelled", then=self._cancelled.set)

    def finish(self, status: str = "passed", reason: str = "agent session ended") -> None:
        """Release every key and button held in the guest and end the record with ``run_finished``
        (``status``: passed | failed | cancelled | error). Nothing here verifies a task: the status is
        the caller's. Idempotent."""
        self.registry.close("session ended")
        try:
            self.driver.release()
        finally:
            self.record.finish(status, reason)
            self.record.close()

    def __enter__(self) -> "SandboxComputer":
        return self

    def __exit__(self, kind: Any, exc: Any, _tb: Any) -> None:
        if kind is None:
            self.finish()
        elif issubclass(kind, KeyboardInterrupt):
            self.finish("cancelled", "interrupted")
        else:
            self.finish("error", f"{kind.__name__}: {exc}")


__all__ = ["SandboxComputer"]
