"""An Agent Framework agent, or a workflow around one, driving the sandbox through
:class:`controller.af.executor.ComputerCallExecutor`.

* :class:`AgentComputerUse` -- a plain agent on one ``AgentSession``: send a message, run the computer
  calls the response asks for (``AgentResponse.user_input_requests``), send their results back in one
  ``tool`` message on the **same** session, until a response asks for none. A batch that stops (a
  denial, a cancellation, a call already attempted) sends nothing: the turn ends there and the next
  turn starts on a new session.
* :class:`WorkflowComputerUse` -- a workflow whose agent's computer calls pause it as ``request_info``
  events (the request id is the call's item id). Each call's result is sent as soon as it ran (a
  checkpoint then keeps it); a batch that stops is cancelled through the framework
  (``Workflow.cancel_pending_requests``), which cancels every pending request of that agent's batch,
  keeps the results already sent in its output and starts the agent's next turn on a new session.
  After ``workflow.run(checkpoint_id=...)`` (this process or another) the restored requests come back
  with their ids, action order and checks; the executor's record check keeps a call whose actions were
  already attempted from running twice.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agent_framework import Content, Message

from controller.af.executor import COMPUTER_CALL, BatchOutcome, ComputerCallExecutor
from controller.model.errors import DesktopSandboxError
from controller.text import clean


class UnansweredRequest(DesktopSandboxError, RuntimeError):
    """The agent asked for input this module does not answer (anything but a computer call, e.g. a
    function approval): ``requests`` holds those Contents."""

    def __init__(self, requests: list[Any]) -> None:
        kinds = sorted({clean(getattr(r, "type", "?"), 40) for r in requests})
        super().__init__(f"the agent asked for input other than computer calls: {', '.join(kinds)}")
        self.requests = requests


@dataclass
class Turn:
    """One user turn of :meth:`AgentComputerUse.run`: the last ``response`` (an ``AgentResponse``),
    ``responses`` (model responses the turn took: agent runs), ``batches`` (the outcome of each batch
    of computer calls, in order) and ``stopped`` (the batch that stopped the turn, None when the model
    ended it with a response that asks for nothing)."""

    response: Any
    responses: int = 0
    batches: list[BatchOutcome] = field(default_factory=list)
    stopped: BatchOutcome | None = None


class StepLimit(DesktopSandboxError, RuntimeError):
    """The model still asked for computer calls after the turn's limit of responses."""


class AgentComputerUse:
    """Runs an Agent Framework ``agent``'s computer calls with ``executor``, one user turn at a time.

    ``agent``: any Agent Framework agent whose tools include the native computer tool
    (``client.get_computer_tool()``); ``executor``: a :class:`ComputerCallExecutor` on the sandbox;
    ``session``: the ``AgentSession`` to start on (default: a new one); ``options``: chat options for
    every run (e.g. ``{"truncation": "auto"}``). :attr:`session` is the session the next turn uses.
    """

    def __init__(self, agent: Any, executor: ComputerCallExecutor, *, session: Any = None,
                 options: dict[str, Any] | None = None) -> None:
        self.agent = agent
        self.executor = executor
        self.session = session if session is not None else agent.create_session()
        self.options = dict(options or {})

    async def _run(self, message: Any) -> Any:
        if self.options:
            return await self.agent.run(message, session=self.session, options=self.options)
        return await self.agent.run(message, session=self.session)

    async def run(self, message: Any, *, max_responses: int = 20) -> Turn:
        """Send ``message`` (anything ``agent.run`` takes), then answer computer calls until a response
        asks for none (returned in :class:`Turn`), a batch stops (``Turn.stopped``: nothing of it was
        sent, and :attr:`session` is a new session from here on), or ``max_responses`` responses asked
        for more (:class:`StepLimit`). Raises :class:`UnansweredRequest` for a request that is not a
        computer call (nothing of that response runs), and what the executor raises."""
        if max_responses < 1:
            raise ValueError("max_responses must be at least 1")
        turn = Turn(response=await self._run(message), responses=1)
        while True:
            requests = list(turn.response.user_input_requests)
            if not requests:
                return turn
            others = [r for r in requests if getattr(r, "type", None) != COMPUTER_CALL]
            if others:
                raise UnansweredRequest(others)
            if turn.responses >= max_responses:
                raise StepLimit(f"the model still asked for computer actions after {max_responses} responses")
            outcome = await self.executor.run_batch(requests)
            turn.batches.append(outcome)
            if not outcome.complete:
                turn.stopped = outcome
                self.session = self.agent.create_session()
                return turn
            turn.response = await self._run(Message(role="tool", contents=list(outcome.results)))
            turn.responses += 1


def computer_requests(events: Any) -> list[Any]:
    """The pending computer calls among a workflow's events (a ``WorkflowRunResult`` or any iterable of
    events): its ``request_info`` events whose data is a ``computer_tool_call`` Content, in order."""
    found = events.get_request_info_events() if hasattr(events, "get_request_info_events") else \
        [e for e in events if getattr(e, "type", None) == "request_info"]
    return [e for e in found if isinstance(getattr(e, "data", None), Content) and e.data.type == COMPUTER_CALL]


class WorkflowComputerUse:
    """Answers a ``workflow``'s pending computer calls with ``executor`` (see the module docstring).

    ``workflow``: an Agent Framework ``Workflow``; ``executor``: a :class:`ComputerCallExecutor`.
    :attr:`outcomes` keeps each batch's :class:`BatchOutcome`.
    """

    def __init__(self, workflow: Any, executor: ComputerCallExecutor) -> None:
        self.workflow = workflow
        self.executor = executor
        self.outcomes: list[BatchOutcome] = []

    async def answer(self, result: Any) -> Any:
        """Run the pending computer calls of ``result`` (the events of the workflow's last run) and
        return the workflow's next ``WorkflowRunResult``. The calls of one agent (``source_executor_id``)
        are one batch, run in their order: each result is sent as soon as its call ran; a batch that
        stops (a denial, a cancellation, a call already attempted, or a driver failure -- then the
        exception is raised after the cancellation) is cancelled. ``result`` itself when it holds no
        computer call. Requests of other kinds are left to the caller (the agent resumes only once they
        are answered too)."""
        batches: dict[Any, list[Any]] = {}
        for event in computer_requests(result):
            batches.setdefault(getattr(event, "source_executor_id", None), []).append(event)
        for events in batches.values():
            result = await self._answer_batch(events, result)
        return result

    async def _answer_batch(self, events: list[Any], result: Any) -> Any:
        latest: list[Any] = [result]
        sent: set[str] = set()

        async def send(index: int, content: Any) -> None:
            sent.add(events[index].request_id)
            latest[0] = await self.workflow.run(responses={events[index].request_id: content})

        try:
            outcome = await self.executor.run_batch([e.data for e in events], on_result=send)
        except Exception:
            unsent = [e.request_id for e in events if e.request_id not in sent]
            if unsent:  # the driver failed: the batch is cancelled, the model must look again
                await self.workflow.cancel_pending_requests(unsent[:1])
            raise
        self.outcomes.append(outcome)
        if outcome.complete:
            return latest[0]
        # The framework widens this to every pending request of the agent's batch (ids it no longer
        # holds are ignored) and starts the agent's next turn on a new session.
        return await self.workflow.cancel_pending_requests([events[outcome.stopped_at].request_id])

    async def run(self, message: Any = None, *, checkpoint_id: str | None = None,
                  checkpoint_storage: Any = None, max_batches: int = 20) -> Any:
        """Start the workflow with ``message`` (or restore ``checkpoint_id`` from ``checkpoint_storage``)
        and answer its computer calls until a run pauses on none; returns the last
        ``WorkflowRunResult``. Raises :class:`StepLimit` after ``max_batches`` batches."""
        if checkpoint_id is not None:
            result = await self.workflow.run(checkpoint_id=checkpoint_id, checkpoint_storage=checkpoint_storage)
        else:
            result = await self.workflow.run(message)
        for _ in range(max_batches):
            if not computer_requests(result):
                return result
            result = await self.answer(result)
        if computer_requests(result):
            raise StepLimit(f"the workflow still asked for computer actions after {max_batches} batches")
        return result


__all__ = ["AgentComputerUse", "StepLimit", "Turn", "UnansweredRequest", "WorkflowComputerUse", "computer_requests"]
