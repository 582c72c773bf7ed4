"""Origin access against the real gateway (mitmproxy and the policy addon, with its control API) on
loopback: a held connection becomes an ``origin_access`` request in the registry with the gateway's id;
an answer in the registry reaches the gateway, which lets the connection through or refuses it; the
gateway's timeout decides the entry; a dropped event stream loses and duplicates nothing; the run's
end cancels what is pending; the teardown reconciliation gives every request in the gateway's log an
``approval`` line."""

from __future__ import annotations

from typing import Any

import pytest

from controller.run.origins import (
    GatewayControl, GatewayError, GatewayWatcher, origin_decision, reconcile_approvals, wait_for_origins,
)
from controller.run.recording import DecisionTail
from controller.run.registry import AnswerRefused, ApprovalRegistry, Request
from tests.controller.origin_gateway import AskGateway, start_ask_gateway, until


@pytest.fixture
def gateway(tmp_path):
    gw = start_ask_gateway(tmp_path, ("ask", "other"), hold_timeout_s=20)
    yield gw
    gw.stop()


@pytest.fixture
def short_gateway(tmp_path):
    """Holds for 1.5 s only: nobody answers in time."""
    gw = start_ask_gateway(tmp_path, ("ask",), hold_timeout_s=1.5)
    yield gw
    gw.stop()


class Watch:
    """A registry and a started watcher on ``gateway``; ``decisions``: what it reported."""

    def __init__(self, gateway: AskGateway, **kwargs: Any) -> None:
        self.gateway = gateway
        self.registry = ApprovalRegistry()
        self.decisions: list[Any] = []
        self.control = GatewayControl(gateway.control_url, gateway.token)
        self.watcher = GatewayWatcher(self.control, self.registry, on_decision=self.decisions.append, **kwargs)

    def start(self) -> "Watch":
        self.watcher.start()
        until(self.watcher.connected.is_set, what="the event stream's snapshot")
        return self

    def pending(self, origin: str, timeout: float = 20.0) -> Request:
        """The pending origin request for ``origin`` (waited for)."""
        return until(lambda: next((r for r in self.registry.pending()
                                   if r.kind == "origin_access" and r.origin == origin), None),
                     timeout=timeout, what=f"a pending request for {origin}")

    def close(self) -> None:
        self.watcher.stop()
        self.control.close()


@pytest.fixture
def watch(gateway):
    w = Watch(gateway).start()
    yield w
    w.close()


@pytest.mark.parametrize("answer, status, hits, state", [("approve", 200, 1, "approved"),
                                                         ("deny", 403, 0, "denied"),
                                                         ("cancel", 403, 0, "cancelled")])
def test_a_held_connection_is_a_registry_request_and_its_answer_decides_the_connection(
        gateway, watch, answer, status, hits, state):
    fetch = gateway.fetch_later(gateway.url("ask"))
    request = watch.pending(gateway.origin("ask"))
    assert request.id.startswith("oreq_") and request.via == "http" and request.held == 1
    assert "plain-HTTP" in request.origin_reason and request.deadline_at and 0 < request.seconds_left() <= 20
    assert fetch.result(0.3) is None, "the gateway lets nothing through before an answer"
    watch.registry.answer(request.id, answer, by="console")
    assert fetch.result(15) == status
    assert len(gateway.origins["ask"].hits) == hits
    # the gateway holds the same decision, by the same view, under the same id
    at_gateway = watch.control.get(request.id)
    assert at_gateway["state"] == state and at_gateway["by"] == "console"
    assert request.state == state and request.by == "console"
    until(lambda: watch.decisions, what="the approval line")
    (line,) = watch.decisions
    assert (line.what, line.decision, line.by, line.request_id, line.origin) == (
        "origin_access", state, "console", request.id, gateway.origin("ask"))
    # the same answer again is accepted; another one is refused
    assert watch.registry.answer(request.id, answer, by="terminal").state == state
    other = "deny" if answer != "deny" else "approve"
    with pytest.raises(AnswerRefused) as refused:
        watch.registry.answer(request.id, other, by="terminal")
    assert (refused.value.status, refused.value.code) == (409, "already_decided")
    # remembered or not: deny is (no new question), cancel is not (the next attempt asks again)
    again = gateway.fetch_later(gateway.url("ask"))
    if answer == "cancel":
        second = watch.pending(gateway.origin("ask"))
        assert second.id != request.id
        watch.registry.answer(second.id, "deny", by="console")
    assert again.result(15) == (200 if answer == "approve" else 403)
    assert len([r for r in watch.registry.all() if r.kind == "origin_access"]) == (2 if answer == "cancel" else 1)


def test_an_answer_given_at_the_gateway_by_another_client_decides_the_entry(gateway, watch):
    fetch = gateway.fetch_later(gateway.url("ask"))
    request = watch.pending(gateway.origin("ask"))
    other = GatewayControl(gateway.control_url, gateway.token)
    try:
        other.decide(request.id, "approve", "terminal")
    finally:
        other.close()
    assert fetch.result(15) == 200
    until(lambda: not request.pending, what="the entry decided")
    assert (request.state, request.by) == ("approved", "terminal")
    with pytest.raises(AnswerRefused) as refused:
        watch.registry.answer(request.id, "deny", by="console")
    assert refused.value.code == "already_decided"


def test_the_gateways_timeout_decides_the_entry_and_a_late_answer_gets_409_expired(short_gateway):
    watch = Watch(short_gateway).start()
    try:
        fetch = short_gateway.fetch_later(short_gateway.url("ask"))
        request = watch.pending(short_gateway.origin("ask"))
        assert request.deadline_s == pytest.approx(1.5, abs=0.01)  # the gateway's deadline, not ours
        assert fetch.result(15) == 403
        until(lambda: not request.pending, what="the entry decided by the gateway's timeout")
        assert (request.state, request.by) == ("expired", "timeout")
        with pytest.raises(AnswerRefused) as refused:
            watch.registry.answer(request.id, "approve", by="console")
        assert (refused.value.status, refused.value.code) == (409, "expired")
        until(lambda: watch.decisions, what="the approval line")
        assert [(d.decision, d.by) for d in watch.decisions] == [("timeout", "timeout")]
        assert short_gateway.origins["ask"].hits == []
    finally:
        watch.close()


def test_an_answer_that_reaches_the_gateway_after_its_timeout_passes_409_expired_through(short_gateway):
    """The watcher has not heard of the timeout yet (it is not watching): the gateway's 409 ``expired``
    is what tells the registry, which marks the entry expired."""
    registry = ApprovalRegistry()
    control = GatewayControl(short_gateway.control_url, short_gateway.token)
    watcher = GatewayWatcher(control, registry)
    try:
        fetch = short_gateway.fetch_later(short_gateway.url("ask"))
        until(lambda: watcher.poll() and registry.pending(), what="the request mirrored by a poll")
        (request,) = registry.pending()
        assert fetch.result(15) == 403
        assert control.get(request.id)["state"] == "timeout" and request.pending
        with pytest.raises(AnswerRefused) as refused:
            registry.answer(request.id, "approve", by="console")
        assert (refused.value.status, refused.value.code) == (409, "expired")
        assert (request.state, request.by) == ("expired", "timeout")
    finally:
        watcher.stop()
        control.close()


def test_a_dropped_event_stream_reconnects_and_loses_or_repeats_nothing(gateway, monkeypatch):
    """The stream is cut (its socket shut down) and stays down for a while: requests created and
    decided meanwhile are caught by polling and by the replay after the reconnect (Last-Event-ID), and
    each is in the registry once, reported once."""
    import controller.run.origins as origins

    monkeypatch.setattr(origins.watcher, "BACKOFF_S", (2.0, 2.0))
    watch = Watch(gateway).start()
    try:
        first = gateway.fetch_later(gateway.url("ask"))
        a = watch.pending(gateway.origin("ask"))
        seen = watch.watcher.last_seq
        watch.control.interrupt()
        until(lambda: not watch.watcher.connected.is_set(), what="the stream down")
        # while it is down: A is decided at the gateway, B is created
        direct = GatewayControl(gateway.control_url, gateway.token)
        try:
            direct.decide(a.id, "approve", "terminal")
        finally:
            direct.close()
        second = gateway.fetch_later(gateway.url("other"))
        until(lambda: watch.watcher.connections >= 2, what="the reconnection")
        b = watch.pending(gateway.origin("other"))
        assert first.result(15) == 200
        until(lambda: not a.pending, what="A decided")
        assert (a.state, a.by) == ("approved", "terminal")
        # the replay after the reconnection (Last-Event-ID) brought both events of the gap again
        until(lambda: watch.watcher.last_seq >= seen + 2, what="the replayed events")
        watch.registry.answer(b.id, "approve", by="console")
        assert second.result(15) == 200
        until(lambda: len(watch.decisions) == 2, what="two approval lines")
        ids = [r.id for r in watch.registry.all()]
        assert sorted(ids) == sorted({a.id, b.id}) and len(ids) == 2
        assert sorted(d.request_id for d in watch.decisions) == sorted([a.id, b.id])
    finally:
        watch.close()


def test_the_runs_end_withdraws_what_is_pending_and_cancels_it_at_the_gateway(gateway):
    watch = Watch(gateway).start()
    try:
        fetch = gateway.fetch_later(gateway.url("ask"))
        request = watch.pending(gateway.origin("ask"))
        watch.watcher.cancel_by = "console"
        watch.watcher.stop("run cancelled")
        assert (request.state, request.by, request.reason) == ("withdrawn", "cancel", "run cancelled")
        assert fetch.result(15) == 403 and gateway.origins["ask"].hits == []
        assert watch.control.get(request.id)["state"] == "cancelled"
        assert watch.control.get(request.id)["by"] == "console"
        assert [(d.decision, d.by) for d in watch.decisions] == [("withdrawn", "cancel")]
    finally:
        watch.close()


def test_approve_origin_answers_at_once_by_the_command_line(gateway):
    from controller.gateway.policy import Origin

    watch = Watch(gateway, approve=[Origin.parse(gateway.origin("ask"))]).start()
    try:
        assert gateway.fetch(gateway.url("ask")) == 200
        until(lambda: watch.decisions, what="the approval line")
        assert [(d.decision, d.by) for d in watch.decisions] == [("approved", "command line")]
        held = gateway.fetch_later(gateway.url("other"))  # not opted in: asked, not answered
        request = watch.pending(gateway.origin("other"))
        assert held.result(0.3) is None and request.pending
        watch.registry.answer(request.id, "deny", by="console")
        assert held.result(15) == 403
    finally:
        watch.close()


def test_the_screenshot_waits_for_a_pending_origin_request_until_it_is_decided(gateway, watch):
    import threading

    assert wait_for_origins(watch.registry, lambda: False) is None  # nothing pending: no wait at all
    fetch = gateway.fetch_later(gateway.url("ask"))
    request = watch.pending(gateway.origin("ask"))
    waited: list[Any] = []
    thread = threading.Thread(target=lambda: waited.append(wait_for_origins(watch.registry, lambda: False)),
                              daemon=True)
    thread.start()
    thread.join(0.5)
    assert thread.is_alive(), "the wait ended while the request was still pending"
    watch.registry.answer(request.id, "approve", by="console")
    thread.join(5)
    assert not thread.is_alive() and waited[0] >= 500
    assert fetch.result(15) == 200
    # the cancel flag ends a wait at once
    again = gateway.fetch_later(gateway.url("other"))
    other = watch.pending(gateway.origin("other"))
    assert wait_for_origins(watch.registry, lambda: True) < 1000 and other.pending
    watch.registry.answer(other.id, "deny", by="console")
    assert again.result(15) == 403


def test_teardown_reconciliation_writes_an_approval_line_for_every_request_in_the_log(gateway):
    """Requests decided while nobody watched (an SSE gap, a watcher that never started) have no
    approval line: reconciliation adds one, by gateway_log, with the outcome the gateway gives, or
    the log's reason when it cannot be asked; a request already reported is not repeated."""
    control = GatewayControl(gateway.control_url, gateway.token)
    watched = Watch(gateway).start()
    try:
        seen_fetch = gateway.fetch_later(gateway.url("ask"))
        seen = watched.pending(gateway.origin("ask"))
        watched.registry.answer(seen.id, "approve", by="console")
        assert seen_fetch.result(15) == 200
        until(lambda: watched.decisions, what="the reported line")
        watched.close()
        unseen_fetch = gateway.fetch_later(gateway.url("other"))
        unseen = until(lambda: control.list("pending")[1], what="the unseen request")[0]
        control.decide(unseen["id"], "deny", "terminal")
        assert unseen_fetch.result(15) == 403

        class Lines:  # the record's writer: the lines the tail writes, kept in order
            def __init__(self) -> None:
                self.entries: list[Any] = []

            def write(self, entry: Any) -> Any:
                self.entries.append(entry)
                return entry

        lines = Lines()
        tail = DecisionTail(lines, lambda start, n: gateway.decisions()[start:start + n])  # type: ignore[arg-type]
        tail.finish()
        assert set(tail.requests) == {seen.id, unseen["id"]}
        network = [e for e in lines.entries if e.type == "network"]
        assert {(e.request_id, e.reason) for e in network} == {(seen.id, "approved"), (unseen["id"], "user_denied")}
        assert all(e.held_ms is not None for e in network)
        reported = {d.request_id for d in watched.decisions}
        written: list[Any] = []
        reconcile_approvals(tail.requests, reported, written.append, fetch=control.get)
        assert [(d.request_id, d.decision, d.by, d.origin) for d in written] == [
            (unseen["id"], "denied", "gateway_log", gateway.origin("other"))]
        # without the gateway (torn down already): the log's reason decides
        from_log: list[Any] = []
        reconcile_approvals(tail.requests, set(), from_log.append)
        assert sorted((d.request_id, d.decision) for d in from_log) == sorted(
            [(seen.id, "approved"), (unseen["id"], "denied")])
        # an unknown reason, and a fetch that fails: the outcome is said to be unknown
        unknown: list[Any] = []

        def gone(_rid: str) -> Any:
            raise GatewayError(0, "unreachable", "torn down")

        reconcile_approvals({"oreq_x": {"origin": "http://x.test", "reason": "client_gone"}}, (), unknown.append,
                            fetch=gone)
        assert [(d.decision, d.by) for d in unknown] == [("withdrawn", "gateway_log")]
    finally:
        watched.close()
        control.close()


def test_the_control_client_refuses_a_wrong_token_and_oversized_or_malformed_answers(gateway):
    bad = GatewayControl(gateway.control_url, "not-the-token")
    try:
        with pytest.raises(GatewayError) as refused:
            bad.list()
        assert (refused.value.status, refused.value.code) == (401, "unauthorized")
    finally:
        bad.close()
    with pytest.raises(ValueError):
        GatewayControl("file:///etc/passwd", "t")


def test_origin_decision_maps_states_to_record_decisions():
    registry = ApprovalRegistry()
    for state, decision in (("approved", "approved"), ("denied", "denied"), ("cancelled", "cancelled"),
                            ("expired", "timeout"), ("withdrawn", "withdrawn")):
        request, _ = registry.mirror(f"oreq_{state}", origin="https://a.test", reason="r")
        registry.resolve(request.id, state, by="gateway")  # type: ignore[arg-type]
        assert origin_decision(request).decision == decision
