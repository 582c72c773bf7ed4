"""A run's record holds the gateway's decisions in time order with the actions: a local desktop whose
guest traffic goes through the real gateway (mitmproxy, deny-all) during each action and during
verification; the record has each decision right after the action it came with, the one made during
verification before teardown's ``network_log``, every line of the gateway's log exactly once, and
``ts`` never decreasing. Also with the reads made late (:class:`LateReads`): a read asked for before an
action ran returns that action's decision while the action is still in flight, as a loaded machine can
order it; the decision still follows the action's line."""

from __future__ import annotations

import json
import subprocess
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from controller.run.record import read_entries, summarize
from controller.run.runner import RunOptions, run_task
from controller.run.tasks import FileCheck, Task
from tests.gateway.conftest import Gateway, start_gateway
from tests.loop.local_sandbox import LocalSandbox


class _RequestingAgent:
    """The agent, with a request through the gateway before each batch of actions and each file read
    (what a guest app would send when clicked, or while it is being verified)."""

    def __init__(self, agent: Any, request: Any, calls: list[str]) -> None:
        self._agent, self._request, self.calls = agent, request, calls

    def __getattr__(self, name: str) -> Any:
        return getattr(self._agent, name)

    def actions(self, actions: Any, *args: Any, **kwargs: Any) -> Any:
        if any(a.get("type") != "wait" for a in actions):  # not the driver's own settle before a screenshot
            self._request("step")
            self.calls.append("actions")
        return self._agent.actions(actions, *args, **kwargs)

    def actions_screenshot(self, actions: Any, *args: Any, **kwargs: Any) -> Any:
        """A call's last action with its capture (``SandboxDriver.plan_calls``): the same request first."""
        if any(a.get("type") != "wait" for a in actions):
            self._request("step")
            self.calls.append("actions_screenshot")
        return self._agent.actions_screenshot(actions, *args, **kwargs)

    def read_file(self, path: str, *args: Any, **kwargs: Any) -> Any:
        self._request("check")
        return self._agent.read_file(path, *args, **kwargs)


class GatewayedSandbox(LocalSandbox):
    """A local sandbox whose decision log is a real gateway's (read as the Docker backend reads it)."""

    def __init__(self, gateway: Gateway) -> None:
        super().__init__()
        self.gateway = gateway
        self.sent: list[str] = []
        self.calls: list[str] = []  # how the model's actions reached the agent
        self._opener = urllib.request.build_opener(
            urllib.request.ProxyHandler({"http": f"http://{gateway.host}:{gateway.port}"}))

    def request(self, what: str) -> None:
        url = f"http://{what}-{len(self.sent) + 1}.example.test/"
        self.sent.append(url.rstrip("/"))
        try:
            self._opener.open(url, timeout=10).close()
        except urllib.error.HTTPError as exc:  # the gateway answers 403 after logging its decision
            assert exc.code == 403, exc.code
        else:
            raise AssertionError(f"{url} was not refused")

    @property
    def agent(self) -> Any:
        return _RequestingAgent(LocalSandbox.agent.fget(self), self.request, self.calls)

    def decision_log(self) -> list[dict[str, Any]]:
        from controller.sandbox import parse_decision_log

        return parse_decision_log(self.gateway.log.read_text()) if self.gateway.log.exists() else []


STEPS = 3
WAIT_S = 20.0
"""Longest wait of :class:`LateReads` for the other side (seconds): a failed wait fails the test."""


class LateReads(GatewayedSandbox):
    """Reads of the decision log that land during the next action: a read of the run's tail finding
    nothing new before the last step waits until the next step's request was logged, and that step's action is sent to
    the agent only once a read returned its decision (the run's tail then has it while the action is
    in flight, before the action's line could be written)."""

    def __init__(self, gateway: Gateway) -> None:
        super().__init__(gateway)
        self._cond = threading.Condition()
        self.logged = 0  # lines the gateway logged (one a request)
        self.returned = 0  # lines a read handed to the run
        self.waits: list[str] = []  # what a bounded wait gave up on

    def _wait(self, ready: Any, what: str) -> None:
        with self._cond:
            if not self._cond.wait_for(ready, timeout=WAIT_S):
                self.waits.append(what)

    def request(self, what: str) -> None:
        super().request(what)
        with self._cond:
            self.logged += 1
            self._cond.notify_all()
        if what == "step":
            self._wait(lambda: self.returned >= self.logged, f"a read returning {self.sent[-1]}")

    def decisions_since(self, start: int, max_lines: int) -> list[Any]:
        tail = threading.current_thread().name == "decision-tail"  # the run's reads while it goes on
        if tail and start >= self.logged and len(self.sent) < STEPS:
            self._wait(lambda: self.logged > start, f"line {start + 1} to be logged")
        lines = self.decision_log()[start:start + max_lines]
        with self._cond:
            self.returned = max(self.returned, start + len(lines))
            self._cond.notify_all()
        return lines


@pytest.mark.parametrize("kind", [GatewayedSandbox, LateReads], ids=["reads", "late-reads"])
def test_network_decisions_are_recorded_in_time_order_with_the_actions_and_match_the_gateway_log(tmp_path, kind):
    gateway = start_gateway(tmp_path, {"mode": "deny-all"})
    try:
        task = Task(name="netorder", instructions="x",
                    checks=[FileCheck(kind="file", path="~/Documents/seed.txt", match="text", value="seed")])
        script = tmp_path / "script.jsonl"
        script.write_text("".join(json.dumps(t) + "\n" for t in [
            {"actions": [{"type": "move", "x": 10 * n, "y": 10}]} for n in range(1, STEPS + 1)] + [{"message": "done"}]))
        with kind(gateway) as sb:
            (sb.home / "Documents/seed.txt").write_text("seed\n")
            outcome = run_task(task, lambda t: sb, RunOptions(runs_dir=tmp_path / "runs", live=False, terminal=False,
                                                              script=script))
        assert outcome.status == "passed", outcome.reason
        log = gateway.decisions()
    finally:
        gateway.process.terminate()
        try:
            gateway.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            gateway.process.kill()

    assert not getattr(sb, "waits", []), sb.waits
    entries = read_entries(outcome.record_dir)
    stamps = [e.ts for e in entries]
    assert stamps == sorted(stamps), "ts went back"
    assert sb.sent == [f"http://step-{n}.example.test" for n in (1, 2, 3)] + ["http://check-4.example.test"]
    assert sb.calls == ["actions_screenshot"] * 3  # each call's one action went with its capture
    # each decision right after the action it came with, the verification's one after the check
    flow = [(e.type, getattr(e, "action", None) or getattr(e, "origin", None) or getattr(e, "target", None))
            for e in entries if e.type in ("action", "network", "check", "network_log")
            and getattr(e, "action", None) != "screenshot"]
    assert flow == [
        ("action", "move"), ("network", "http://step-1.example.test"),
        ("action", "move"), ("network", "http://step-2.example.test"),
        ("action", "move"), ("network", "http://step-3.example.test"),
        ("check", str(sb.home / "Documents/seed.txt")), ("network", "http://check-4.example.test"),
        ("network_log", None),
    ], flow
    # the gateway's log, line by line, exactly once, as the gateway wrote it
    recorded = [(e.seq, e.origin, e.decision, e.reason, e.via, e.at) for e in entries if e.type == "network"]
    assert recorded == [(n, d["origin"], d["decision"], d["reason"], d.get("via"), d["ts"])
                        for n, d in enumerate(log, 1)]
    [netlog] = [e for e in entries if e.type == "network_log"]
    assert netlog.complete is True and netlog.decisions == len(log) == 4
    assert summarize(entries)["network_denied"] == 4
    # the gateway's time (the same clock here) is before the time the controller read the decision
    for e in (e for e in entries if e.type == "network"):
        assert e.at <= e.ts, e
