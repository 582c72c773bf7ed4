"""A run's origin access as the runner uses it (:class:`OriginAccess`): the watcher, the terminal's
prompts and the ``--approve-origin`` opt-ins, from the sandbox's start to teardown; and where a
sandbox's gateway control API is (:func:`control_endpoint`).
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

from rich.console import Console

from controller.gateway.policy import Origin
from controller.run.approvals import OriginPrompter, TerminalAsker
from controller.run.entries import Approval
from controller.run.origins.bounds import MAX_PENDING, UNREACHABLE_S
from controller.run.origins.control import GatewayControl
from controller.model.errors import DesktopSandboxError
from controller.run.origins.decisions import reconcile_approvals
from controller.run.origins.watcher import GatewayWatcher
from controller.run.registry import ApprovalRegistry
from controller.text import clean


class ControlUnreachable(DesktopSandboxError):
    """The sandbox's gateway control API answered no call for :data:`UNREACHABLE_S` seconds at the run's
    start: nobody could see or answer the origin requests it holds. The message names it and its last
    error (``gateway control API unreachable for 15s: unreachable: GET ...: ConnectError ...``)."""


class OriginAccess:
    """A run's origin access, as the runner uses it: the :class:`GatewayWatcher`, the terminal's origin
    prompts (:class:`controller.run.approvals.OriginPrompter`) and the ``--approve-origin`` opt-ins
    (:meth:`start`); :meth:`stop` at the run's end, then :meth:`reconcile` once the gateway's decision
    log is read. Nothing at all when the sandbox's gateway has no control API (an older policy or
    backend)."""

    def __init__(self, watcher: GatewayWatcher, prompter: OriginPrompter | None) -> None:
        self.watcher, self.prompter = watcher, prompter

    @classmethod
    def start(cls, sandbox: Any, registry: ApprovalRegistry, record: Any, asker: Any, console: Console, *,
              approve: Iterable[Origin] = (), has_view: bool = False, asks: bool = True,
              max_pending: int | None = None, cancelled: Callable[[], bool] = lambda: False,
              on_lost: Callable[[str], None] | None = None) -> "OriginAccess | None":
        """Write one opt-in ``approval`` line per origin in ``approve`` (``--approve-origin``); when the
        sandbox's gateway has a control API (:func:`control_endpoint`), start mirroring its origin
        requests into ``registry``, each decision an ``approval`` line in ``record`` (a
        :class:`controller.run.record.RunRecord`), and asking about them on the terminal when
        ``asker`` is a :class:`controller.run.approvals.TerminalAsker`. ``has_view``: a console
        follows the run; ``asks``: the task's policy may ask (``[network] mode = "ask"``); ``max_pending``:
        its ``max_pending`` (the watcher's cap; None: :data:`MAX_PENDING`). Returns None
        when there is no control API or the policy never asks.

        Returns once the control API answered a call: a refusal at first (the gateway still starting,
        its port published anew after a network was attached) is retried for :data:`UNREACHABLE_S`
        seconds, or until ``cancelled()`` (then it returns at once); past that the watch is stopped and
        :class:`ControlUnreachable` raised. Later, ``on_lost(line)`` is called once (on the watch's
        thread) when every call failed for that long again: the run's questions can no longer be seen."""
        approve = list(approve)
        for origin in approve:
            record.write(Approval(what="opt-in", decision="approved", by="command line", origin=clean(origin, 300),
                                  message=clean(f"--approve-origin {origin}", 400)))
        endpoint = control_endpoint(sandbox) if asks else None
        if endpoint is None:
            if approve:
                why = "no control API" if asks else "the task's [network] mode is not \"ask\""
                console.print(f"--approve-origin: this sandbox's gateway asks about no origin ({why}); "
                              "the option has no effect", style="yellow", markup=False, emoji=False, highlight=False)
            return None

        def say(problem: str) -> None:
            console.print(f"gateway control API: {clean(problem, 300)}", style="yellow", markup=False, emoji=False,
                          highlight=False)

        try:
            control = GatewayControl(*endpoint)
        except ValueError as exc:  # a backend's URL or token this client does not take: nothing can ask
            say(f"not used: {exc}")
            return None
        watcher = GatewayWatcher(control, registry, approve=approve, max_pending=max_pending or MAX_PENDING,
                                 on_decision=lambda d: record.write(Approval(**d.as_record())), on_problem=say,
                                 unreachable_s=UNREACHABLE_S)
        prompter = None
        if isinstance(asker, TerminalAsker):
            prompter = OriginPrompter(asker, registry, console=console, skip=watcher.approves).start()
        elif not has_view:
            others = "requests for other origins" if approve else "origin requests"
            hint = "" if approve else " (--approve-origin ORIGIN approves one unattended)"
            console.print(f"{others}: no terminal and no console to answer them: the gateway refuses each at "
                          f"its deadline{hint}", markup=False, emoji=False, highlight=False)
        watcher.start()
        access = cls(watcher, prompter)
        if not watcher.wait_reached(UNREACHABLE_S, cancelled) and not cancelled():
            last = watcher.problems[-1] if watcher.problems else "no call was answered"
            access.stop("the gateway control API is unreachable")
            control.close()
            raise ControlUnreachable(clean(f"gateway control API unreachable for {UNREACHABLE_S:g}s: {last}", 400))
        watcher.on_lost = on_lost  # from now on a loss ends the run where it is
        return access

    def cancelled_by(self, by: str) -> None:
        """A view cancelled the run: pending origin requests are cancelled at the gateway by it."""
        if by in ("console", "terminal", "command line"):
            self.watcher.cancel_by = by

    def stop(self, reason: str) -> None:
        """Stop asking and watching; what is still pending is withdrawn and cancelled at the gateway."""
        if self.prompter is not None:
            self.prompter.stop()
        self.watcher.stop(reason)

    def reconcile(self, record: Any, network: Any) -> None:
        """Every origin request the gateway's decision log names (``network``: the run's
        :class:`controller.run.recording.DecisionTail`, read to its end) gets an ``approval`` line in
        ``record`` (written now, ``by="gateway_log"``, for one the watch missed); then the control
        API is closed."""
        try:
            if network is not None and network.requests:
                reconcile_approvals(network.requests, self.watcher.reported,
                                    lambda d: record.write(Approval(**d.as_record())), fetch=self.watcher.control.get)
        finally:
            self.watcher.control.close()


def control_endpoint(sandbox: Any) -> tuple[str, str] | None:
    """The sandbox's gateway control API as ``(url, token)``, or None when its gateway has none (an
    older policy or backend): the sandbox's own ``gateway_control_url`` / ``gateway_control_token``,
    else its topology's (:meth:`controller.sandbox.Sandbox.topology`)."""
    for source in (sandbox, None):
        if source is None:
            topology = getattr(sandbox, "topology", None)
            try:
                source = topology() if callable(topology) else None
            except Exception:  # noqa: BLE001 - a backend that cannot say has no control API for us
                return None
        url = getattr(source, "gateway_control_url", None)
        token = getattr(source, "gateway_control_token", None)
        if isinstance(url, str) and url and isinstance(token, str) and token:
            return url, token
    return None
