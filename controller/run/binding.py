"""Approvals bound to the screen the person was shown (docs/ARCHITECTURE.md, contract 6, "Bound
approvals"): a computer call approved on a screenshot runs only while the screen still shows, where its
actions land, what that screenshot showed.

:class:`BoundApprovals` wraps the run's two approval callbacks: the SDK's ``approve_safety_checks``
(:class:`controller.run.approvals.SafetyCheckApprover`: a person on the terminal or in the console, the
Agents API, or ``--approve-safety-check``) and ``before_action`` (:class:`controller.run.approvals.ActionGate`
for ``--confirm-actions`` and ``--step``). When one approves, the call's first action (the action, for the
gate) is bound to the screenshot the model had -- the one the person was shown -- through
:meth:`controller.run.driver.SandboxDriver.bind_next`: the agent compares the regions the actions touch
by the screen comparison rule (:mod:`wire.screen_match`) under the input lock before anything runs. When
the screen changed there (the agent's 409 ``screen_changed``), nothing ran: the approval is void (an
``approval`` line, ``decision: screen_changed``, with the new screen), and the person is asked again on the
new screenshot; a yes binds the action to that one and it is sent again, a no stops the run as a denial
does. At most :data:`MAX_ASKS` times a call.
"""

from __future__ import annotations

from typing import Any, Callable

from controller.run.approvals import describe_action
from controller.run.entries import Approval
from controller.text import clean

MAX_ASKS = 3
"""Most times one approval is asked again after the screen changed; then the call does not run."""


def _actions_of(call: Any) -> list[Any]:
    actions = getattr(call, "actions", None)
    if actions:
        return list(actions)
    action = getattr(call, "action", None)
    return [action] if action is not None else []


def _type_of(action: Any) -> str | None:
    return action.get("type") if isinstance(action, dict) else getattr(action, "type", None)


class BoundApprovals:
    """The run's approval callbacks, bound to the screen (module docstring).

    ``driver``: the run's :class:`controller.run.driver.SandboxDriver` (its ``bind_rule`` None: nothing is
    bound, the callbacks are the plain ones); ``approver`` / ``gate``: the run's
    :class:`~controller.run.approvals.SafetyCheckApprover` and :class:`~controller.run.approvals.ActionGate`;
    ``write``: writes a record entry; ``save_image(data, mime)``: stores an image beside the record and
    returns its file name; ``shown_override``: a one-element list whose item, while set, is the screenshot
    file the questions show instead of the model's last one."""

    def __init__(self, driver: Any, approver: Callable[[Any], bool], gate: Any, *, write: Callable[[Any], Any],
                 save_image: Callable[[bytes, str], str], shown_override: list[str | None]) -> None:
        self.driver, self.approver, self.gate = driver, approver, gate
        self.write, self.save_image, self.override = write, save_image, shown_override
        self._subject: tuple[str, Any, list[Any]] | None = None
        self._asks = 0

    @property
    def active(self) -> bool:
        """Whether approvals are bound at all (the task's ``[approvals] bind_screen``)."""
        return self.driver.bind_rule is not None

    def approve_safety_checks(self, call: Any) -> bool:
        """The SDK's ``approve_safety_checks``: the approver's answer; a yes to pending safety checks binds
        the call's first action to the screenshot the person was shown."""
        approved = self.approver(call)
        if approved is True and self.active and getattr(call, "pending_safety_checks", None):
            self._bind(("safety_check", call, _actions_of(call)))
        return approved

    def before_action(self, action: Any) -> bool:
        """The SDK's ``before_action``: the gate's answer; a yes the gate asked a person for binds that
        action to the screenshot they were shown."""
        approved = self.gate(action)
        kind = _type_of(action)
        if approved is True and self.active and kind not in (None, "screenshot") and self.gate.asks(kind):
            self._bind(("action", action, [action]))
        return approved

    def _bind(self, subject: tuple[str, Any, list[Any]]) -> None:
        self._subject, self._asks = subject, 0
        self.driver.bind_next(subject[2])

    def on_screen_changed(self, error: Any) -> bool:
        """The driver's hook when the agent refused the bound action (``screen_changed``): record the void
        approval with the screen as it is now, ask again on it; True (bound anew) to send the action
        again, False to stop."""
        if self._subject is None:
            return False
        what, subject, actions = self._subject
        shot = self.driver.look()
        file = self.save_image(shot.data, shot.mime)
        about: dict[str, Any] = {}
        if what == "safety_check":  # which question was made void: the call and its checks, as asked
            checks = list(getattr(subject, "pending_safety_checks", None) or [])
            about = dict(call_id=getattr(subject, "call_id", None), codes=[c.code or "" for c in checks],
                         check_ids=[c.id for c in checks])
        else:
            about = dict(action=describe_action(subject, redact=True))
        self.write(Approval(what=what, decision="screen_changed", by="agent",
                            message=clean(getattr(error, "message", str(error)), 300), screenshot=file, **about))
        self._asks += 1
        if self._asks > MAX_ASKS:
            self._subject = None
            return False
        self.override[0] = file
        try:
            again = self.approver(subject) if what == "safety_check" else self.gate(subject)
        finally:
            self.override[0] = None
        if again is not True:
            self._subject = None
            return False
        self.driver.bind_next(actions, shot)
        return True
