"""A run record's steps: one model response and what came of it, assembled in one place.

:func:`steps` turns a record's entries (the models of :mod:`controller.run.entries`, in record order,
as :func:`controller.run.record.read_entries` returns them) into steps (:class:`Step`). Entries are told
apart by their ``type`` (the record's own discriminator) and read by the field names of the record
format; nothing here imports the run layer, reads a file or keeps state.

**What belongs to a step** (the one rule every reader of steps goes by):

1. Step ``n`` (``n`` >= 1) begins at the record's ``n``-th ``model_response`` and holds what was
   written after it and before the next one: its calls (``computer_call``, ``browser_call``), the driver
   calls (``action``) and the screenshots (``screenshot``) they made, the decisions asked
   (``approval``), the gateway's decisions read meanwhile (``network``), a person's actions and the
   changes of control around them (``human_action``, ``takeover``: control changes hands at a step
   boundary, so they follow the actions of the step they are written in), sign-ins (``sign_in``) and
   any other entry (``agents_event``, ``view_dropped``). What was written before the first response is
   step 0, the **opening** (``response`` None: the first screenshot, opt-ins, the calls of a process
   restored from a checkpoint, decisions made before the model answered); it is there only when
   something belongs to it.
2. Three kinds of entry go where they point rather than where they were written:

   * an ``approval`` or an ``action`` naming the ``call_id`` of a ``computer_call`` a model response
     sent belongs to that call's step (the last such step, should two hold a call of that id; a call
     in the opening draws nothing to it);
   * otherwise an ``approval`` of ``what`` ``opt-in`` (given on the command line, about no step)
     belongs to the opening;
   * an ``expectation`` (a script turn's screen expectations, resolved before the model answers)
     belongs to the step of the call it names, else to the step after the one it was written in (the
     step it held back), else -- the record's last step -- to the one it was written in.
3. The run's own entries -- ``run_started``, ``run_finished``, ``check``, ``network_log``, ``policy``,
   ``web_recording``, ``video`` -- belong to no
   step. Every other entry belongs to exactly one step, which holds its entries in record order.

A record cut short (no ``run_finished``: a killed run, a record still being written) has the steps it
got to; its last step is the last one written, whatever it holds.

Screens: each step keeps, per entry, the last ``screenshot`` written before it in the record (what the
model had last been sent then; :meth:`Step.screens`), and as :attr:`Step.shown` the screen the
model chose the step's calls on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Optional, Protocol

RUN_ENTRIES = frozenset({"run_started", "run_finished", "check", "network_log", "policy", "web_recording",
                         "video"})
"""Entry types of the run as a whole: in no step."""
PLACED_BY_CALL = frozenset({"approval", "action", "expectation"})
"""Entry types that belong to the step of the ``computer_call`` whose ``call_id`` they name."""
OPENING = 0
"""``n`` of the opening: what was written before the first model response."""


class RecordEntry(Protocol):
    """What every record entry has (:mod:`controller.run.entries`): ``type`` and ``ts``. The fields a
    step reads besides are those of the entry's type: ``call_id``, ``what``, ``decision``,
    ``http_status``."""

    type: str
    ts: Optional[str]


def _call_id(entry: RecordEntry) -> Optional[str]:
    call_id = getattr(entry, "call_id", None)
    return call_id if isinstance(call_id, str) else None


@dataclass(frozen=True)
class Step:
    """One step of a run (see the module's rule).

    ``n``: 0 for the opening, else the model response's number (1-based, failed requests counted);
    ``response``: that ``model_response`` entry (None for the opening); ``entries``: the step's other
    entries in record order; ``before``: per entry of ``entries``, the last ``screenshot`` entry written
    before it in the record (None when none was); ``shown``: the screenshot the model chose the step's
    calls on -- the last one written before the step's first ``computer_call``, before its response when
    it sent none, and None when no screenshot came before (or for an opening without calls)."""

    n: int
    response: Optional[RecordEntry]
    entries: tuple[RecordEntry, ...] = ()
    before: tuple[Optional[RecordEntry], ...] = field(default=(), repr=False)
    shown: Optional[RecordEntry] = None

    def of(self, *types: str) -> tuple[Any, ...]:
        """The step's entries whose ``type`` is one of ``types``, in record order."""
        return tuple(e for e in self.entries if e.type in types)

    @property
    def opening(self) -> bool:
        """Whether this is the opening (what came before the first model response)."""
        return self.response is None

    @property
    def ok(self) -> bool:
        """Whether the model answered: a response whose ``http_status`` is below 400 (or not given).
        False for the opening and for a failed request."""
        status = getattr(self.response, "http_status", None)
        return self.response is not None and (status if isinstance(status, int) else 200) < 400

    @property
    def calls(self) -> tuple[Any, ...]:
        """The ``computer_call`` entries."""
        return self.of("computer_call")

    @property
    def call_ids(self) -> frozenset[str]:
        """The call ids of the step's computer calls (those that have one)."""
        return frozenset(c for c in map(_call_id, self.calls) if c is not None)

    @property
    def actions(self) -> tuple[Any, ...]:
        """The driver calls (``action`` entries: input actions and the SDK's screenshot calls)."""
        return self.of("action")

    @property
    def screenshots(self) -> tuple[Any, ...]:
        """The images sent to the model during the step (after a computer call, or a browser call's)."""
        return self.of("screenshot")

    @property
    def approvals(self) -> tuple[Any, ...]:
        """The ``approval`` entries: decisions on the step's calls and actions, origin requests decided
        during it (and, in the opening, the opt-ins)."""
        return self.of("approval")

    @property
    def network(self) -> tuple[Any, ...]:
        """The gateway's decisions read during the step (``network`` entries)."""
        return self.of("network")

    @property
    def browser_calls(self) -> tuple[Any, ...]:
        """The calls of the browser tools (``browser_call`` entries)."""
        return self.of("browser_call")

    @property
    def human(self) -> tuple[Any, ...]:
        """A person's turn after the step's actions: ``takeover`` and ``human_action`` entries in order."""
        return self.of("takeover", "human_action")

    @property
    def expectations(self) -> tuple[Any, ...]:
        """The script turn expectations resolved for this step (``expectation`` entries)."""
        return self.of("expectation")

    @property
    def sign_ins(self) -> tuple[Any, ...]:
        """The sign-in requests and what came of them (``sign_in`` entries)."""
        return self.of("sign_in")

    @property
    def attempted(self) -> frozenset[str]:
        """The call ids the step shows as attempted: a driver call was made for them (an ``action``) or
        their safety checks were approved (their actions were released to run)."""
        ids = set()
        for entry in self.entries:
            if entry.type == "action" or (entry.type == "approval" and getattr(entry, "what", None) == "safety_check"
                                          and getattr(entry, "decision", None) == "approved"):
                call_id = _call_id(entry)
                if call_id is not None:
                    ids.add(call_id)
        return frozenset(ids)

    def screens(self) -> Iterator[tuple[Any, Optional[Any]]]:
        """``(entry, screen)`` for each of :attr:`entries` in order: ``screen`` is the last ``screenshot``
        written before that entry in the record (what the model had last been sent then; None when no
        screenshot came before)."""
        return zip(self.entries, self.before)


def steps(entries: Iterable[RecordEntry]) -> list[Step]:
    """The steps of a record's ``entries`` (entry models in record order), by the module's rule: the
    opening first when anything belongs to it, then one step per ``model_response``. Pure; the
    entries are held, not copied."""
    responses: list[Optional[RecordEntry]] = [None]
    shown: list[Optional[RecordEntry]] = [None]
    has_call = [False]
    call_step: dict[str, int] = {}
    written: list[tuple[RecordEntry, int, Optional[RecordEntry]]] = []  # (entry, step written in, screen before)
    latest: Optional[RecordEntry] = None
    for entry in entries:
        kind = entry.type
        if kind in RUN_ENTRIES:
            continue
        if kind == "model_response":
            responses.append(entry)
            shown.append(latest)
            has_call.append(False)
            continue
        at = len(responses) - 1
        if kind == "computer_call":
            if not has_call[at]:
                has_call[at], shown[at] = True, latest
            call_id = _call_id(entry)
            if call_id is not None and at != OPENING:
                call_step[call_id] = at
        written.append((entry, at, latest))
        if kind == "screenshot":
            latest = entry
    last = len(responses) - 1
    held: list[list[tuple[RecordEntry, Optional[RecordEntry]]]] = [[] for _ in responses]
    for entry, at, screen in written:
        held[_placed(entry, at, last, call_step)].append((entry, screen))
    return [Step(n=n, response=responses[n], entries=tuple(e for e, _ in held[n]),
                 before=tuple(s for _, s in held[n]), shown=shown[n])
            for n in range(len(responses)) if n != OPENING or held[OPENING]]


def _placed(entry: RecordEntry, at: int, last: int, call_step: dict[str, int]) -> int:
    """The step ``entry``, written in step ``at`` of a record whose last step is ``last``, belongs to
    (rule 2 of the module)."""
    kind = entry.type
    if kind not in PLACED_BY_CALL:
        return at
    call_id = _call_id(entry)
    if call_id is not None and call_id in call_step:
        return call_step[call_id]
    if kind == "approval" and getattr(entry, "what", None) == "opt-in":
        return OPENING
    if kind == "expectation" and at < last:
        return at + 1
    return at


__all__ = ["OPENING", "PLACED_BY_CALL", "RUN_ENTRIES", "RecordEntry", "Step", "steps"]
