"""Origin access in a whole run: a local desktop whose guest traffic goes through the real gateway in
mode ``ask`` (mitmproxy, its control API on loopback). During the model's first step the guest opens a
connection to an ask-tier origin nobody answers: the model's next screenshot waits until the gateway's
timeout has decided it (``waited_for_origin_ms``), so the model sees the page after the decision.
During the second step the guest opens one to an origin given with ``--approve-origin``: approved at
once, ``by: command line``. The record holds the opt-in, an ``approval`` line per origin request and
``network`` lines with the same request ids, and reconciles: every request id in the gateway's log has
its approval line.

A control API the run cannot reach: one that refuses at first and answers 3 s later is waited for before
the task starts (its connection opened at launch is seen and answered); one that never answers, or goes
away during the run, ends the run ``error`` naming it."""

from __future__ import annotations

import io
import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from controller.gateway.policy import NetworkPolicy, Origin
from controller.run.record import read_entries
from controller.run.runner import RunOptions, run_task, watching
from controller.run.tasks import FileCheck, Launch, Task
from tests.controller.origin_gateway import AskGateway, ControlRelay, Fetch, start_ask_gateway, until
from tests.loop.local_sandbox import LocalSandbox


class _OpeningAgent:
    """The agent, with the guest opening a connection through the gateway (held: on a thread of its
    own) at each batch of the model's actions: what a page would do when clicked."""

    def __init__(self, agent: Any, sandbox: "AskSandbox") -> None:
        self._agent, self._sandbox = agent, sandbox

    def __getattr__(self, name: str) -> Any:
        return getattr(self._agent, name)

    def actions(self, actions: Any, *args: Any, **kwargs: Any) -> Any:
        if any(a.get("type") != "wait" for a in actions):  # not the driver's own settle before a screenshot
            self._sandbox.open_next()
        return self._agent.actions(actions, *args, **kwargs)

    def actions_screenshot(self, actions: Any, *args: Any, **kwargs: Any) -> Any:
        """A call's last action with its capture (``SandboxDriver.plan_calls``): the same opening first."""
        if any(a.get("type") != "wait" for a in actions):
            self._sandbox.open_next()
        return self._agent.actions_screenshot(actions, *args, **kwargs)


class AskSandbox(LocalSandbox):
    """A local sandbox behind a real gateway in mode ask: its decision log, its control API
    (``gateway_control_url`` / ``gateway_control_token``, as a backend gives them)."""

    def __init__(self, gateway: AskGateway, opens: list[str]) -> None:
        super().__init__()
        self.gateway = gateway
        self.gateway_control_url = gateway.control_url
        self.gateway_control_token = gateway.token
        self.opens = list(opens)
        self.fetches: list[Fetch] = []
        self.live: list[Any] = []  # the run as a view sees it (its approval registry)

    def open_next(self) -> None:
        """The guest opens the next connection; returns once the run's registry has its origin request
        (as it would have a moment after a click: this test is about what the run does then)."""
        if self.opens:
            name = self.opens.pop(0)
            self.fetches.append(self.gateway.fetch_later(self.gateway.url(name)))
            origin = self.gateway.origin(name)
            until(lambda: self.live and any(r.origin == origin for r in self.live[0].registry.all()),
                  what=f"the origin request for {origin} in the run's registry")

    @property
    def agent(self) -> Any:
        return _OpeningAgent(LocalSandbox.agent.fget(self), self)

    def decision_log(self) -> list[dict[str, Any]]:
        return self.gateway.decisions()


def test_the_screenshot_waits_for_the_gateways_decision_and_the_record_reconciles(tmp_path: Path):
    gateway = start_ask_gateway(tmp_path, ("ask", "other"), hold_timeout_s=2.0)
    try:
        task = Task(name="origins", instructions="x", network=NetworkPolicy.model_validate(gateway.policy),
                    checks=[FileCheck(kind="file", path="~/Documents/seed.txt", match="text", value="seed")])
        script = tmp_path / "script.jsonl"
        script.write_text("".join(json.dumps(t) + "\n" for t in [
            {"actions": [{"type": "move", "x": 10, "y": 10}]},
            {"actions": [{"type": "move", "x": 20, "y": 20}]},
            {"message": "done"}]))
        with AskSandbox(gateway, ["ask", "other"]) as sb:
            (sb.home / "Documents/seed.txt").write_text("seed\n")
            options = RunOptions(runs_dir=tmp_path / "runs", live=False, terminal=False, script=script,
                                 approve_origins=[Origin.parse(gateway.origin("other"))])
            outcome = run_task(task, lambda t: sb, options, views=[watching(sb.live.append)])
            statuses = [f.result(15) for f in sb.fetches]
        assert outcome.status == "passed", outcome.reason
        log = gateway.decisions()
    finally:
        gateway.stop()

    assert statuses == [403, 200]
    entries = read_entries(outcome.record_dir)
    approvals = [e for e in entries if e.type == "approval"]
    opt_in, *decided = approvals
    assert (opt_in.what, opt_in.by, opt_in.origin) == ("opt-in", "command line", gateway.origin("other"))
    assert [(a.what, a.origin, a.decision, a.by) for a in decided] == [
        ("origin_access", gateway.origin("ask"), "timeout", "timeout"),
        ("origin_access", gateway.origin("other"), "approved", "command line")]
    network = [e for e in entries if e.type == "network"]
    assert [(n.origin, n.decision, n.reason) for n in network] == [
        (gateway.origin("ask"), "deny", "timeout"), (gateway.origin("other"), "allow", "approved")]
    # the same ids end to end: the gateway's log, the network lines, the approval lines
    assert [n.request_id for n in network] == [d["request_id"] for d in log] == [a.request_id for a in decided]
    assert all(n.held_ms is not None for n in network)
    # the screenshot after the first step waited for the gateway's timeout, and came after the decision
    shots = [(i, e) for i, e in enumerate(entries) if e.type == "screenshot"]
    waited = [(i, e) for i, e in shots if e.waited_for_origin_ms is not None]
    assert waited, [e.waited_for_origin_ms for _, e in shots]
    first_wait, shot = waited[0]
    assert shot.waited_for_origin_ms >= 1000
    timeout_line = entries.index(decided[0])
    assert timeout_line < first_wait, "the screenshot was taken before the decision"
    # the first screenshot (before any step) waited for nothing
    assert shots[0][1].waited_for_origin_ms is None
    [netlog] = [e for e in entries if e.type == "network_log"]
    assert netlog.complete is True and netlog.decisions == 2
    assert not [a for a in approvals if a.by == "gateway_log"], "the watch missed nothing here"


# -- a control API that cannot be reached -----------------------------------------------------------------
class _LaunchOpeningAgent(_OpeningAgent):
    """The agent, with the guest opening its next connection (held, not waited for) as an app launches:
    what a page that fetches an origin as soon as it loads does."""

    def launch(self, *args: Any, **kwargs: Any) -> Any:
        pid = self._agent.launch(*args, **kwargs)
        sandbox = self._sandbox
        if sandbox.opens:
            sandbox.fetches.append(sandbox.gateway.fetch_later(sandbox.gateway.url(sandbox.opens.pop(0))))
        return pid


class _RelayedSandbox(AskSandbox):
    """An :class:`AskSandbox` whose control API is reached through ``relay`` (:class:`ControlRelay`); with
    ``at_launch`` the guest opens its connection as the task's app launches, else at the model's first
    action, after which the relay refuses (``cut_after_open``)."""

    def __init__(self, gateway: AskGateway, relay: ControlRelay, *, at_launch: bool = False,
                 cut_after_open: bool = False) -> None:
        super().__init__(gateway, ["ask"])
        self.gateway_control_url = relay.url
        self.relay, self.at_launch, self.cut_after_open = relay, at_launch, cut_after_open

    def open_next(self) -> None:
        if not self.at_launch:
            super().open_next()
            if self.cut_after_open:
                self.relay.refuse()

    @property
    def agent(self) -> Any:
        return _LaunchOpeningAgent(LocalSandbox.agent.fget(self), self)


def _run(tmp_path: Path, sb: _RelayedSandbox, gateway: AskGateway, launch: bool = False,
         approve: bool = True) -> tuple[Any, str]:
    """run-task's code path on ``sb`` (with ``approve`` the ask origin approved with ``--approve-origin``;
    with ``launch`` the task launches a terminal); the outcome and what the run printed."""
    body = {"name": "origins", "instructions": "x", "network": NetworkPolicy.model_validate(gateway.policy),
            "checks": [FileCheck(kind="file", path="~/Documents/seed.txt", match="text", value="seed")]}
    if launch:
        body["launch"] = [Launch(app="terminal")]
    script = tmp_path / "script.jsonl"
    script.write_text("".join(json.dumps(t) + "\n" for t in [{"actions": [{"type": "move", "x": 10, "y": 10}]},
                                                              {"message": "done"}]))
    (sb.home / "Documents/seed.txt").write_text("seed\n")
    out = io.StringIO()
    options = RunOptions(runs_dir=tmp_path / "runs", live=False, terminal=False, script=script,
                         approve_origins=[Origin.parse(gateway.origin("ask"))] if approve else [])
    outcome = run_task(Task(**body), lambda t: sb, options, console=Console(file=out, width=200),
                       views=[watching(sb.live.append)])
    return outcome, out.getvalue()


def test_a_control_api_that_refuses_at_first_is_waited_for_before_the_task_starts(tmp_path: Path):
    """The API answers only 3 s after the run began (longer than the gateway holds a connection): the run
    waits for it before it launches anything, so the connection the page opens at launch is seen and
    approved (``--approve-origin``), not refused at the deadline while nobody could see it."""
    gateway = start_ask_gateway(tmp_path, ("ask",), hold_timeout_s=1.5)
    relay = ControlRelay(gateway.control_url)
    late = threading.Timer(3.0, relay.accept)
    try:
        with _RelayedSandbox(gateway, relay, at_launch=True) as sb:
            late.start()
            outcome, printed = _run(tmp_path, sb, gateway, launch=True)
            statuses = [f.result(15) for f in sb.fetches]
    finally:
        late.cancel()
        relay.refuse()
        gateway.stop()
    assert outcome.status == "passed", (outcome.reason, printed[-2000:])
    assert "gateway control API: unreachable: GET /v1/origin-requests" in printed  # it was refused, then waited out
    assert statuses == [200]
    entries = read_entries(outcome.record_dir)
    approvals = [(e.what, e.decision, e.by) for e in entries if e.type == "approval"]
    assert approvals == [("opt-in", "approved", "command line"), ("origin_access", "approved", "command line")]


@pytest.mark.parametrize("when", ["at the start", "during the run"])
def test_a_control_api_that_stays_unreachable_ends_the_run_error_naming_it(tmp_path: Path, monkeypatch, when: str):
    """At the start (it never answers) nothing is launched; during the run (it goes away while the model's
    screenshot waits for a held connection) the run stops there. Either way the run ends ``error`` with
    the reason naming the control API and its last error, after :data:`UNREACHABLE_S` (1 s here)."""
    import controller.run.origins.access as access

    monkeypatch.setattr(access, "UNREACHABLE_S", 1.0)
    gateway = start_ask_gateway(tmp_path, ("ask",), hold_timeout_s=10.0)
    relay = ControlRelay(gateway.control_url)
    try:
        if when == "during the run":
            relay.accept()
        with _RelayedSandbox(gateway, relay, at_launch=when == "at the start", cut_after_open=True) as sb:
            started = time.monotonic()
            outcome, printed = _run(tmp_path, sb, gateway, launch=when == "at the start", approve=False)
            took = time.monotonic() - started
            fetched = list(sb.fetches)
    finally:
        relay.refuse()
        gateway.stop()
    assert outcome.status == "error", (outcome.status, outcome.reason, printed[-2000:])
    assert outcome.reason.startswith("gateway control API unreachable for 1s: unreachable: GET /v1/origin-requests"), \
        outcome.reason
    assert took < 8.0, took  # not the gateway's 10 s hold
    entries = read_entries(outcome.record_dir)
    if when == "at the start":
        assert fetched == [] and "launched" not in printed  # the task never started
        assert "model_response" not in [e.type for e in entries]
    else:
        origin = [(e.decision, e.message) for e in entries if e.type == "approval" and e.what == "origin_access"]
        assert origin == [("withdrawn", outcome.reason)]
