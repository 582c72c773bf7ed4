"""Approvals asked by MCP elicitation: a session's pending questions, put to the client during its tool calls.

A question is a pending request of the session's run (:class:`controller.run.registry.ApprovalRegistry`:
an action under ``--confirm-actions`` / ``--step``, a safety check, an origin the gateway holds), of a
decision kind (:data:`controller.model.requests.REQUEST_KINDS`: approve / deny, origin requests also
cancel; sign-in forms are never asked here: their values must not pass through the client). When the
client declared the elicitation capability, every tool call under way asks the questions nobody asked
yet with ``elicitation/create`` (form mode) on its own request, so the question rides that call's stream
(the one that waits on it, for an action): each is asked once per session.

The form has one boolean field, ``approve``. The answer (:func:`verdict`):

========================================= ===================================================
the client's elicitation result           the answer given to the registry (``by="mcp"``)
========================================= ===================================================
``accept`` with ``approve: true``         ``approve``
``accept`` with ``approve`` false/absent  ``deny``
``decline``                               ``deny``
``cancel``                                ``cancel`` for a kind that takes it (origin), else ``deny``
an error, no answer within the deadline   ``deny``
========================================= ===================================================

Threads: :meth:`Elicitor.offer` and :meth:`Elicitor.withdraw` may be called from any thread (the run's
registry tells its subscribers on the thread that changed it); everything else runs on the server's
event loop. An answer is given on a worker thread (an origin answer goes to the gateway first).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field
from typing import Any, Callable

import anyio
import anyio.to_thread

from controller.model.requests import REQUEST_KINDS, request_kind
from controller.text import clean

log = logging.getLogger(__name__)

APPROVE_FIELD = "approve"
"""The one field of an approval form (boolean)."""

APPROVAL_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {APPROVE_FIELD: {"type": "boolean", "title": "Approve",
                                   "description": "true: let it happen; false: refuse it", "default": False}},
    "required": [APPROVE_FIELD],
}
"""The ``requestedSchema`` of every approval elicitation."""

MESSAGE_CHARS = 2000
"""Longest elicitation message (characters; every line escaped)."""

DEFAULT_DEADLINE_S = 300.0
"""How long an elicitation waits when its question has no deadline of its own (seconds)."""


def asked_kinds() -> tuple[str, ...]:
    """The request kinds asked by elicitation: every decision kind of the table (not a form's)."""
    return tuple(name for name, kind in REQUEST_KINDS.items() if not kind.form)


def verdict(action: str, content: Any, answers: tuple[str, ...]) -> str:
    """The registry answer for an elicitation result (module docstring): ``action`` (accept | decline
    | cancel), ``content`` (the form's values or None), ``answers`` (the kind's answers)."""
    if action == "accept" and isinstance(content, dict) and content.get(APPROVE_FIELD) is True:
        return "approve"
    if action == "cancel" and "cancel" in answers:
        return "cancel"
    return "deny"


@dataclass
class Question:
    """One question for the client: ``id`` (the registry's request id), ``kind``, ``message`` (what the
    person reads; escaped), ``answers`` (the kind's), ``deadline_s`` (seconds it waits; None: no
    deadline of its own), ``decide(word)`` (gives the answer; blocking; may raise, e.g. the registry's
    ``AnswerRefused`` when it was decided elsewhere first)."""

    id: str
    kind: str
    message: str
    answers: tuple[str, ...]
    deadline_s: float | None
    decide: Callable[[str], Any] = field(repr=False)


def question_of(request: Any, decide: Callable[[str], Any]) -> Question:
    """The :class:`Question` of a registry request (or a :class:`desktop_sandbox.ApprovalRequest`):
    its kind's label, its question and its actions (typed text included: a person is asked), each line
    escaped again, the whole cut to :data:`MESSAGE_CHARS`."""
    kind = request_kind(request.kind)
    lines = [f"desktop-sandbox asks ({kind.label}): {clean(request.question, 1000)}"]
    origin = getattr(request, "origin", None)
    if origin:
        lines.append(f"origin: {clean(origin, 300)}")
    lines += [f"- {clean(a, 500)}" for a in list(getattr(request, "actions", None) or ())[:20]]
    lines.append("Set approve to true to allow it; decline or false refuses it.")
    seconds = getattr(request, "seconds_left", None)
    left = seconds() if callable(seconds) else None
    return Question(id=str(request.id), kind=kind.name, message="\n".join(lines)[:MESSAGE_CHARS],
                    answers=tuple(kind.answers), deadline_s=left, decide=decide)


class Elicitor:
    """The questions of one MCP session and the asking of them (module docstring). ``loop``: the
    server's event loop (where :meth:`ask_during` runs)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._open: dict[str, Question] = {}
        self._asked: set[str] = set()
        self._changed = asyncio.Event()
        self.asked_ids: list[str] = []
        """Every question id put to the client, in order (what a test or a log may read)."""

    # -- from any thread ----------------------------------------------------------------------------
    def offer(self, question: Question) -> None:
        """Add a question to ask (once); a question with an id already known is ignored."""
        self._soon(self._add, question)

    def withdraw(self, question_id: str) -> None:
        """Forget a question that was decided elsewhere (an elicitation under way is left to finish;
        its answer is then refused by the registry and dropped)."""
        self._soon(self._drop, question_id)

    def _soon(self, fn: Callable[..., None], *args: Any) -> None:
        with contextlib.suppress(RuntimeError):  # the loop has closed: the session is over
            self.loop.call_soon_threadsafe(fn, *args)

    # -- on the loop ------------------------------------------------------------------------------------
    def _add(self, question: Question) -> None:
        if question.id not in self._open and question.id not in self._asked:
            self._open[question.id] = question
            self._changed.set()

    def _drop(self, question_id: str) -> None:
        self._open.pop(question_id, None)

    async def ask_during(self, session: Any, request_id: Any) -> None:
        """Ask every open question nobody asked yet, now and as they come, until cancelled (the tool
        call ``request_id`` of the client ``session`` (:class:`mcp.server.session.ServerSession`) ended).
        A question whose asking is cancelled before an answer may be asked again by another call."""
        async with anyio.create_task_group() as tg:
            while True:
                for question in list(self._open.values()):
                    if question.id not in self._asked:
                        self._asked.add(question.id)
                        tg.start_soon(self._ask, session, request_id, question)
                self._changed.clear()
                await self._changed.wait()

    async def _ask(self, session: Any, request_id: Any, question: Question) -> None:
        word = "deny"
        try:
            with anyio.fail_after(question.deadline_s if question.deadline_s is not None else DEFAULT_DEADLINE_S):
                self.asked_ids.append(question.id)
                result = await session.elicit_form(message=question.message, requested_schema=APPROVAL_SCHEMA,
                                                   related_request_id=request_id)
            word = verdict(str(result.action), result.content, question.answers)
        except anyio.get_cancelled_exc_class():
            self._asked.discard(question.id)  # the call ended first: another may ask it
            raise
        except Exception as exc:  # noqa: BLE001 - an error or no answer in time is a no
            log.warning("the client did not answer approval request %s (%s): denied", clean(question.id, 140),
                        clean(f"{type(exc).__name__}: {exc}", 300))
        self._open.pop(question.id, None)
        try:
            await anyio.to_thread.run_sync(question.decide, word)
        except Exception as exc:  # noqa: BLE001 - decided elsewhere first (the registry's 409), or withdrawn
            log.info("approval request %s: the answer %s was not taken (%s)", clean(question.id, 140), word,
                     clean(exc, 300))


__all__ = ["APPROVAL_SCHEMA", "APPROVE_FIELD", "Elicitor", "Question", "asked_kinds", "question_of", "verdict"]
