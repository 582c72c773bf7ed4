"""Origin access in a whole run: a local desktop whose guest traffic goes through the real gateway in
mode ``ask`` (mitmproxy, its control API on loopback). During the model's first step the guest opens a
connection to an ask-tier origin nobody answers: the model's next screenshot waits until the gateway's
timeout has decided it (``waited_for_origin_ms``), so the model sees the page after the decision.
During the second step the guest opens one to an origin given with ``--approve-origin``: approved at
once, ``by: command line``. The record holds the opt-in, an ``approval`` line per origin request and
``network`` lines with the same request ids, and reconciles: every request id in the gateway's log has
its approval line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from controller.gateway.policy import NetworkPolicy, Origin
from controller.run.record import read_record
from controller.run.runner import RunOptions, run_task
from controller.run.tasks import FileCheck, Task
from tests.controller.origin_gateway import AskGateway, Fetch, start_ask_gateway, until
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
            options = RunOptions(runs_dir=tmp_path / "runs", live=False, asker=None, script=script,
                                 approve_origins=[Origin.parse(gateway.origin("other"))], on_live=sb.live.append)
            outcome = run_task(task, lambda t: sb, options)
            statuses = [f.result(15) for f in sb.fetches]
        assert outcome.status == "passed", outcome.reason
        log = gateway.decisions()
    finally:
        gateway.stop()

    assert statuses == [403, 200]
    entries = read_record(outcome.record_dir)
    approvals = [e for e in entries if e["type"] == "approval"]
    opt_in, *decided = approvals
    assert (opt_in["what"], opt_in["by"], opt_in["origin"]) == ("opt-in", "command line", gateway.origin("other"))
    assert [(a["what"], a["origin"], a["decision"], a["by"]) for a in decided] == [
        ("origin_access", gateway.origin("ask"), "timeout", "timeout"),
        ("origin_access", gateway.origin("other"), "approved", "command line")]
    network = [e for e in entries if e["type"] == "network"]
    assert [(n["origin"], n["decision"], n["reason"]) for n in network] == [
        (gateway.origin("ask"), "deny", "timeout"), (gateway.origin("other"), "allow", "approved")]
    # the same ids end to end: the gateway's log, the network lines, the approval lines
    assert [n["request_id"] for n in network] == [d["request_id"] for d in log] == [a["request_id"] for a in decided]
    assert all(n["held_ms"] is not None for n in network)
    # the screenshot after the first step waited for the gateway's timeout, and came after the decision
    shots = [(i, e) for i, e in enumerate(entries) if e["type"] == "screenshot"]
    waited = [(i, e) for i, e in shots if e["waited_for_origin_ms"] is not None]
    assert waited, [e["waited_for_origin_ms"] for _, e in shots]
    first_wait, shot = waited[0]
    assert shot["waited_for_origin_ms"] >= 1000
    timeout_line = entries.index(decided[0])
    assert timeout_line < first_wait, "the screenshot was taken before the decision"
    # the first screenshot (before any step) waited for nothing
    assert shots[0][1]["waited_for_origin_ms"] is None
    [netlog] = [e for e in entries if e["type"] == "network_log"]
    assert netlog["complete"] is True and netlog["decisions"] == 2
    assert not [a for a in approvals if a["by"] == "gateway_log"], "the watch missed nothing here"
