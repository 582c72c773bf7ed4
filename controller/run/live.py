"""A run as a view sees it while it goes on: events, the live screen, take over, cancel.

:class:`LiveRun` is the one object the runner shares with a view (the web console,
``controller.console``); the runner never imports a view. It holds:

* **events**, numbered from 1 (``seq``), each a JSON-ready dict with a ``kind``:

  - ``record``: ``{"entry": <record entry as written>}`` -- every line of the run record, strings
    escaped (:func:`clean_json`), typed text never present (the record has none); a ``browser_call``
    entry's event also has ``text``, its one line (:func:`controller.run.progress.browser_call_text`:
    member, arguments with typed text as its length, what it returned or why it failed, as the
    terminal and the HTML report show it);
  - ``approvals``: ``{"snapshot": {"version", "pending": [...]}, "changed": {"id", "kind", "state",
    "by", "origin"}}`` -- after every change in the approval registry
    (:meth:`controller.run.registry.ApprovalRegistry.snapshot`); ``changed`` names the request that
    changed and its kind (safety_check | action | origin_access: a question of the gateway's, with
    its ``origin``);
  - ``action``: ``{"by": "model" | "human", "action": {...}, "screen": [w, h]}`` -- each action as
    sent to the agent, in **screen px**, typed text replaced by ``text_length``; and each call of the
    browser tools the record got (a ``browser_call`` entry), as the action ``{"type": "browser_call",
    "member", "call_id", "ok", "box"}``: ``box`` the element it acted on (``{x, y, width, height}``,
    **screen px**, :func:`browser_box`; None when the call named no element or it lies outside the
    tab's viewport);
  - ``control``: ``{"state": ..., "by": ...}`` -- the run's state (:data:`STATES`).

  They are the run's bus (:class:`controller.run.bus.RunBus`) seen as JSON: ``seq`` is the bus's
  sequence number (a number whose event a view does not show -- a ``wait`` action -- is skipped). A
  view reads them with :meth:`LiveRun.events_after` (blocking up to a timeout), so a view that
  reconnects replays from the last ``seq`` it saw. At most :data:`MAX_EVENTS` are kept; a view that
  falls further behind gets the approvals snapshot again (``approvals`` events carry the full state).

* **take over**: :meth:`LiveRun.take_over` asks the model loop to pause at its next step boundary:
  before the screenshot that ends a computer_call (:meth:`LiveRun.checkpoint`, called by the
  driver). The actions the model chose for that call run first -- they were chosen on the screen as it
  still is -- and none is held across the person's turn, where it would act on a screen the model
  never saw; the screenshot after Resume is the model's next look. There the loop waits, the state is
  ``human``, and :meth:`LiveRun.human_action` forwards a person's pointer and keyboard actions
  (screen px) through the same agent with the same validation (:func:`wire.actions.parse_action`,
  bounds against the screen). :meth:`LiveRun.resume` hands control back; the screenshot the loop
  then takes shows what the person did. Human actions go to the record as ``human_action`` entries
  (described, typed text as its length only).

* **cancel**: :meth:`LiveRun.cancel` cancels the run as Ctrl-C does (the runner's flag) and withdraws
  every pending approval.

* **the live screen**: :meth:`LiveRun.frame` -- one JPEG from the agent (at most ``max_width`` px wide),
  for a viewer only: frames never reach the model or the record. The bytes come from the guest: the
  agent client caps their size and time, and the result must start as a JPEG does.

Threads: the run's thread calls :meth:`checkpoint`; views call the rest from theirs. The state is
under one condition variable; the events are the bus's.
"""

from __future__ import annotations

import math
import threading
import time
from pathlib import Path
from typing import Any, Callable

from controller.run.bus import (
    HISTORY, ActionSent, ApprovalChanged, ControlChanged, EntryWritten, Published, RunBus, follow_entries,
)
from controller.model.errors import DesktopSandboxError
from controller.redaction import hold_for_typing, typing_done
from controller.run.progress import browser_call_text
from controller.run.registry import ApprovalRegistry
from controller.text import clean
from wire.actions import MODELS, ActionInvalid, describe, first_outside, parse_action

STATES = ("starting", "running", "pausing", "human", "finished")
"""``starting``: no sandbox yet; ``running``: the model drives; ``pausing``: take over asked, the loop
has not reached a step boundary; ``human``: the loop waits and a person drives; ``finished``."""

MAX_EVENTS = HISTORY
"""Events kept for views that connect late or reconnect (the bus's history)."""

HUMAN_ACTIONS = tuple(kind for kind, model in MODELS.items() if model.by_person)
"""What a person may do from a view (``wire.actions.BaseAction.by_person``: no ``wait`` / ``screenshot``,
those are the loop's)."""

JPEG_MAGIC = b"\xff\xd8\xff"


class NotInControl(DesktopSandboxError):
    """A human action while the model has control (the view answers 409 ``not_in_control``)."""


class RunOver(DesktopSandboxError):
    """Take over, resume, an action or a frame after the run finished (409 ``run_finished``)."""


class HumanActionInvalid(DesktopSandboxError, ValueError):
    """A human action the schema or the screen refuses (the view answers 400 ``invalid_action``)."""


def clean_json(value: Any, limit: int = 4000) -> Any:
    """``value`` with every string (keys too) passed through :func:`controller.text.clean`."""
    if isinstance(value, str):
        return clean(value, limit)
    if isinstance(value, dict):
        return {clean(str(k), 200): clean_json(v, limit) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean_json(v, limit) for v in value]
    return value


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def browser_box(target: Any, viewport: Any) -> dict[str, float] | None:
    """Where a browser call's element is on the screen: ``target`` (``{x, y, width, height}``, viewport
    CSS px, as a ``browser_call`` entry has it) placed at ``viewport`` (``{x, y, width, height}``, where
    the tab's viewport lies on the screen, screen px) and cut to the viewport; the agent's chromium runs
    at device scale 1, so one CSS px is one screen px. Returns ``{x, y, width, height}`` in screen px,
    or None when either box is missing or malformed, or nothing of the element is inside the viewport."""
    if not isinstance(target, dict) or not isinstance(viewport, dict):
        return None
    t = [_finite(target.get(k)) for k in ("x", "y", "width", "height")]
    v = [_finite(viewport.get(k)) for k in ("x", "y", "width", "height")]
    if None in t or None in v or t[2] <= 0 or t[3] <= 0 or v[2] <= 0 or v[3] <= 0:
        return None
    left, top = max(v[0] + t[0], v[0]), max(v[1] + t[1], v[1])
    right, bottom = min(v[0] + t[0] + t[2], v[0] + v[2]), min(v[1] + t[1] + t[3], v[1] + v[3])
    if right <= left or bottom <= top:
        return None
    return {"x": round(left, 1), "y": round(top, 1), "width": round(right - left, 1), "height": round(bottom - top, 1)}


def shown_action(action: dict[str, Any]) -> dict[str, Any]:
    """An action (screen px) as views see it: typed text replaced by ``text_length``, strings escaped."""
    shown = {k: v for k, v in action.items() if k != "text"}
    if action.get("type") == "type":
        shown["text_length"] = len(action.get("text") or "")
    return clean_json(shown, 200)


class LiveRun:
    """One run in progress, for views (see the module docstring).

    ``run_id``; ``record_dir``: where the record and screenshots go; ``registry``: the run's approval
    registry (its changes become ``approvals`` events).
    """

    def __init__(self, run_id: str, record_dir: Path, registry: ApprovalRegistry) -> None:
        self.run_id = run_id
        self.record_dir = Path(record_dir)
        self.registry = registry
        self.bus: RunBus = registry.bus
        self.task_name: str | None = None
        self.state = "starting"
        self.status: str | None = None
        self.screen: tuple[int, int] | None = None
        self._agent: Any = None
        self._cancel: Callable[[str], None] | None = None
        self._record_human: Callable[[dict[str, Any]], None] | None = None
        self._record_control: Callable[[str], None] | None = None
        self._cond = threading.Condition()
        self._want_human = False
        self._human = False  # a person may act: set and read under _agent_lock
        self._agent_lock = threading.Lock()
        self._last_action: dict[str, Any] | None = None
        self._last_lock = threading.Lock()  # never held while publishing, nor taken with _cond
        # a browser call the record got is also an action drawn on the live screen
        follow_entries(self.bus, self._browser_action, name="live-browser-actions")
        self.bus.subscribe(self._note_action, name="live-last-action", inline=True,
                           accepts=lambda event: isinstance(event, ActionSent))

    # -- events ----------------------------------------------------------------------------------
    def view_event(self, published: Published) -> dict[str, Any] | None:
        """One bus event as a view gets it (the module docstring), or None for one views do not show."""
        event = published.event
        if isinstance(event, EntryWritten):
            data = event.entry.as_json() if hasattr(event.entry, "as_json") else dict(event.entry)
            shown: dict[str, Any] = {"seq": published.seq, "kind": "record", "entry": clean_json(data)}
            if data.get("type") == "browser_call":
                shown["text"] = browser_call_text(data)
            return shown
        if isinstance(event, ApprovalChanged):
            return {"seq": published.seq, "kind": "approvals", "snapshot": event.snapshot, "changed": event.changed}
        if isinstance(event, ActionSent):
            if event.action.get("type") in ("wait", "screenshot"):
                return None
            return {"seq": published.seq, "kind": "action", "by": event.by, "action": self._shown(event),
                    "screen": list(self.screen or (0, 0))}
        if isinstance(event, ControlChanged):
            return {"seq": published.seq, "kind": "control", "state": event.state, "by": event.by}
        return None

    def events_after(self, seq: int, timeout: float = 15.0) -> list[dict[str, Any]]:
        """Events numbered above ``seq``, waiting up to ``timeout`` seconds for one to come; [] when
        none came (at once when the run finished and none is left). A ``seq`` older than what is kept
        returns everything kept."""
        deadline = time.monotonic() + timeout
        while True:
            published = self.bus.since(seq, max(0.0, deadline - time.monotonic()))
            shown = [e for e in map(self.view_event, published) if e is not None]
            if shown:
                return shown
            if published:  # only events views do not show: look past them, and only them
                seq = max(seq, published[-1].seq)
            if time.monotonic() >= deadline or self.bus.closed or (
                    self.state == "finished" and self.bus.last_seq <= seq):
                return []

    @property
    def last_seq(self) -> int:
        return self.bus.last_seq

    @property
    def last_action(self) -> dict[str, Any] | None:
        """The last action sent (an ``action`` event's data), for a view that connects late."""
        with self._last_lock:
            return self._last_action

    @staticmethod
    def _shown(event: ActionSent) -> dict[str, Any]:
        return event.action if event.action.get("type") == "browser_call" else shown_action(event.action)

    def _note_action(self, published: Published) -> None:
        event = published.event
        if event.action.get("type") in ("wait", "screenshot"):
            return
        shown = {"by": event.by, "action": self._shown(event), "screen": list(self.screen or (0, 0))}
        with self._last_lock:  # an inline subscriber runs under the bus's lock: never _cond here
            self._last_action = shown

    def _browser_action(self, entry: Any) -> None:
        data = entry.as_json() if hasattr(entry, "as_json") else dict(entry)
        if data.get("type") != "browser_call":
            return
        action = {"type": "browser_call", "member": clean(str(data.get("member")), 40),
                  "call_id": clean(str(data["call_id"]), 80) if data.get("call_id") is not None else None,
                  "ok": data.get("ok") is True, "box": browser_box(data.get("target"), data.get("viewport"))}
        self.bus.publish(ActionSent(action, "model"))

    def _set_state(self, state: str, by: str | None = None) -> None:
        # the state and its event change together: a view that sees ``finished`` also sees its event
        with self._cond:
            if self.state == state or self.state == "finished":
                return
            self.state = state
            self.bus.publish(ControlChanged(state, by))

    # -- hooks the runner calls ------------------------------------------------------------------
    def attach(self, agent: Any, screen: tuple[int, int], *, cancel: Callable[[str], None],
               record_human: Callable[[dict[str, Any]], None],
               record_control: Callable[[str], None] | None = None, task_name: str | None = None) -> None:
        """The sandbox is up: ``agent`` (an ``AgentClient``), its ``screen`` size (screen px),
        ``cancel(by)`` (cancels the run), ``record_human({"action", "input", "by"})`` (writes a
        ``human_action`` entry; ``input``: the action sent, screen px, its typed text redacted there), ``record_control(control)`` (writes a ``takeover`` entry: human | model)."""
        self._agent, self.screen, self._cancel, self._record_human = agent, tuple(screen), cancel, record_human
        self._record_control = record_control
        self.task_name = task_name
        self._set_state("running")

    def on_entry(self, entry: Any) -> None:
        """Publish ``entry`` (a record entry model, or its JSON as a dict) as the record would: for a
        view fed without a run record. A run's record publishes its own entries."""
        self.bus.publish(EntryWritten(entry))

    def on_forward(self, actions: list[dict[str, Any]], by: str = "model") -> None:
        """Publish actions about to be sent to the agent (screen px), one event each."""
        for action in actions:
            self.bus.publish(ActionSent(dict(action), by))

    def checkpoint(self, cancelled: Callable[[], bool], *, screenshot: bool) -> bool:
        """The loop's step boundary (the driver calls it before a screenshot, ``screenshot=True``,
        and before each action, ``False``). When a person asked to take over, the loop waits here --
        before the screenshot ending a call, never between a call's actions or before them (see the
        module docstring) -- until :meth:`resume` or ``cancelled()``. True when it waited (the person
        may have changed the screen), else False."""
        if not screenshot:
            return False
        with self._cond:
            if not self._want_human:
                return False
        with self._agent_lock:  # the person's actions start after the record says who has control
            if self._record_control is not None:
                self._record_control("human")
            self._human = True
        self._set_state("human", by="console")
        with self._cond:
            while self._want_human and not cancelled():
                self._cond.wait(0.1)  # poll interval: the cancellation flag is a plain attribute
        with self._agent_lock:  # an action of the person's under way ends before the model goes on
            self._human = False
            if not cancelled():  # control goes back to the model: what the person left is its to see
                typing_done(self._agent)
            # cancelled: the loop still takes its screenshot on the way out and the video grabs until the
            # run settles, so what the person typed stays held until the run's end (finish)
            if self._record_control is not None:
                self._record_control("model")
        if not cancelled():
            self._set_state("running", by="console")
        return True

    def finish(self, status: str) -> None:
        """The run ended with ``status``; a waiting loop (none by then) and every view are released,
        and the registry takes no more answers (every pending request withdrawn)."""
        self.registry.close("run ended")
        with self._cond:
            self.status = status
            self._want_human = False
            typing_done(self._agent)
            self._agent = None
            self._set_state("finished")
            self._cond.notify_all()

    # -- what a view may do ----------------------------------------------------------------------
    def take_over(self, by: str = "console") -> str:
        """Ask the loop to pause at its next step boundary; returns the state (``pausing`` or
        ``human`` when it already waits). :class:`RunOver` after the run finished."""
        if self._ask_for_human(True) != "human":
            self._set_state("pausing", by=by)
        return self.state

    def resume(self, by: str = "console") -> str:
        """Hand control back to the model; returns the state."""
        if self._ask_for_human(False) == "pausing":
            self._set_state("running", by=by)
        return self.state

    def _ask_for_human(self, want: bool) -> str:
        """Set whether the loop should hand control to a person at its next step boundary and wake it;
        returns the state at that moment. :class:`RunOver` after the run finished."""
        with self._cond:
            if self.state == "finished":
                raise RunOver("the run has finished")
            self._want_human = want
            self._cond.notify_all()
            return self.state

    def cancel(self, by: str = "console") -> None:
        """Cancel the run (as Ctrl-C does) and withdraw every pending approval."""
        if self._cancel is None:
            raise RunOver("the run has not started or has finished")
        self._cancel(by)
        self.registry.withdraw_all("run cancelled")
        with self._cond:
            self._want_human = False
            self._cond.notify_all()

    def human_action(self, raw: Any, by: str = "console") -> dict[str, Any]:
        """Perform one action a person sent (screen px) while they have control; returns it as shown.

        Validated like the model's (:func:`wire.actions.parse_action`, agent form), restricted to
        :data:`HUMAN_ACTIONS`, every point inside the screen. Raises :class:`HumanActionInvalid`,
        :class:`NotInControl`, :class:`RunOver`, or the agent client's ``AgentError`` (which the
        agent's own validation may raise)."""
        try:
            parsed = parse_action(raw)
        except ActionInvalid as exc:
            raise HumanActionInvalid(clean(str(exc), 300)) from None
        if parsed.type not in HUMAN_ACTIONS:
            raise HumanActionInvalid(f"a person may send {', '.join(HUMAN_ACTIONS)}, not {parsed.type}")
        with self._cond:
            if self.state == "finished" or self._agent is None:
                raise RunOver("the run has finished")
            agent, screen = self._agent, self.screen
        outside = first_outside(parsed, screen)
        if outside is not None:
            raise HumanActionInvalid(f"point {outside} is outside the {screen[0]}x{screen[1]} screen")
        wire = parsed.to_wire()
        # checked, sent and recorded under one lock that the loop takes before it goes on: no action
        # of the person's runs or is recorded after control went back to the model
        with self._agent_lock:
            if not self._human:
                raise NotInControl("take over first: the model has control")
            hold_for_typing(agent, wire)  # what a person types stays out of every picture
            agent.actions([wire])
            if self._record_human is not None:
                self._record_human({"action": describe(wire, clean=clean, redact=True), "input": dict(wire), "by": by})
        self.on_forward([wire], by="human")
        return shown_action(wire)

    def frame(self, max_width: int = 1280, quality: int = 60) -> bytes:
        """One JPEG of the screen now (at most ``max_width`` px wide), for a viewer. Raises
        :class:`RunOver` when there is no sandbox, ``AgentError`` when the agent fails, ValueError when
        the guest answered something that is not a JPEG."""
        with self._cond:
            agent = self._agent
        if agent is None:
            raise RunOver("no live screen: the run has not started or has finished")
        shot = agent.screenshot(format="jpeg", quality=quality, max_width=max_width)
        if not shot.data.startswith(JPEG_MAGIC):
            raise ValueError("the guest's screenshot is not a JPEG")
        return shot.data

    def describe(self) -> dict[str, Any]:
        """``{run_id, task, state, status, screen, last_seq}`` for a view's first paint."""
        with self._cond:
            return {"run_id": self.run_id, "task": clean(self.task_name or "", 200), "state": self.state,
                    "status": self.status, "screen": list(self.screen) if self.screen else None,
                    "last_seq": self.bus.last_seq}
