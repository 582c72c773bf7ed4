"""Bounds on everything a hostile gateway controls (:mod:`controller.run.origins`).

The gateway's container shares a network with the guest, so its control API is treated as hostile.
These tests run the watcher against :class:`HostileControl`, a small threaded HTTP server on 127.0.0.1
that speaks the control API's shapes but floods, stalls and lies. It is a test double on purpose: the
real gateway never misbehaves like this (it holds at most ``max_pending`` requests, answers at once and
keeps its deadlines within ``hold_timeout_s``), which is exactly why the bounds need a fake to be seen.

Each test proves one bound: a flood of ``created`` events leaves at most the cap pending; slow answers
to the fetches by id keep one reconciliation within its budget; :meth:`GatewayWatcher.stop` returns
within its bound with both threads ended; a far-off ``deadline_at`` is cut to the longest hold.
"""

from __future__ import annotations

import datetime as _dt
import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

import pytest

from controller.gateway.tiers import MAX_HOLD_TIMEOUT_S, MAX_PENDING_LIMIT
from controller.run import origins
from controller.run.origins import (
    CALL_TIMEOUT_S, MAX_DEADLINE_S, MAX_PENDING, RECONCILE_BUDGET_S, STOP_TIMEOUT_S, GatewayControl, GatewayWatcher,
)
from controller.run.registry import ApprovalRegistry
from tests.controller.origin_gateway import until
from tests.helpers import reply_json

SLACK_S = 1.0
"""Seconds allowed past a bound for scheduling on a busy test machine."""


def _iso(when: _dt.datetime) -> str:
    return when.isoformat(timespec="milliseconds")


def item(rid: str, *, deadline_s: float = 60.0, created_s: float = 0.0, state: str = "pending") -> dict[str, Any]:
    """An OriginRequest (the control API's shape): deadline ``deadline_s`` seconds from now, created
    ``created_s`` seconds ago."""
    now = _dt.datetime.now(_dt.timezone.utc)
    return {"id": rid, "origin": "https://flood.test", "reason": "hostile", "via": "http", "held": 1,
            "created_at": _iso(now - _dt.timedelta(seconds=created_s)),
            "deadline_at": _iso(now + _dt.timedelta(seconds=deadline_s)), "state": state, "by": None,
            "decided_at": None}


def sse(name: str, data: Any, eid: int | None = None) -> bytes:
    head = f"id: {eid}\n" if eid is not None else ""
    return f"{head}event: {name}\ndata: {json.dumps(data)}\n\n".encode()


class HostileControl:
    """A fake, hostile gateway control API on 127.0.0.1 (a test double, see the module docstring).

    ``stream(write)``: writes the event stream's body (``write(bytes)``) after its head; it returns to
    end the stream. ``stall_events``: the event stream never sends its head. ``pending``: what a list
    answers; ``get_delay_s`` / ``post_delay_s`` / ``list_delay_s``: seconds before each answer.
    ``gets`` / ``posts``: the ids asked for / answered, in order.
    """

    def __init__(self) -> None:
        self.stream: Callable[[Callable[[bytes], None]], None] = lambda write: write(sse("snapshot", {
            "seq": 0, "pending": []}, 0))
        self.stall_events = False
        self.pending: list[dict[str, Any]] = []
        self.get_delay_s = self.post_delay_s = self.list_delay_s = 0.0
        self.gets: list[str] = []
        self.posts: list[str] = []
        self.closed = threading.Event()
        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"

            def log_message(self, *_args: Any) -> None:
                pass

            def _json(self, status: int, body: Any) -> None:
                reply_json(self, status, body)

            def do_GET(self) -> None:  # noqa: N802 - the http.server API
                if self.path.startswith("/v1/origin-requests/events"):
                    if api.stall_events:
                        api.closed.wait()
                        return
                    self.send_response(200)
                    self.send_header("Content-Type", "text/event-stream")
                    self.end_headers()

                    def write(data: bytes) -> None:
                        self.wfile.write(data)
                        self.wfile.flush()

                    api.stream(write)
                    return
                if self.path.startswith("/v1/origin-requests?"):
                    api.closed.wait(api.list_delay_s)
                    self._json(200, {"seq": 0, "data": api.pending})
                    return
                found = re.fullmatch(r"/v1/origin-requests/(oreq_[A-Za-z0-9_-]+)", self.path)
                if found:
                    api.gets.append(found.group(1))
                    api.closed.wait(api.get_delay_s)
                    self._json(200, item(found.group(1)))  # "still pending", whatever the snapshot said
                    return
                self._json(404, {"error": {"code": "not_found", "message": "no such path"}})

            def do_POST(self) -> None:  # noqa: N802 - the http.server API
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                found = re.fullmatch(r"/v1/origin-requests/(oreq_[A-Za-z0-9_-]+)/decision", self.path)
                api.posts.append(found.group(1) if found else self.path)
                api.closed.wait(api.post_delay_s)
                self._json(202, {})

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            block_on_close = False

            def handle_error(self, request: Any, client_address: Any) -> None:
                pass  # a client that gave up (its deadline) breaks the pipe: expected here

        self.server = Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, name="hostile-control", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.closed.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def hostile():
    api = HostileControl()
    yield api
    api.close()


class Watch:
    """A registry and a watcher on ``api``; ``problems``: what ``on_problem`` got; ``most``: the most
    origin requests ever pending at once in the registry."""

    def __init__(self, api: HostileControl, **kwargs: Any) -> None:
        self.registry = ApprovalRegistry()
        self.control = GatewayControl(api.url, "token")
        self.problems: list[str] = []
        self.most = 0
        self.registry.subscribe(self._count)
        self.watcher = GatewayWatcher(self.control, self.registry, on_problem=self.problems.append, **kwargs)

    def _count(self, _request: Any) -> None:
        self.most = max(self.most, len(self.pending()))

    def pending(self) -> list[Any]:
        return [r for r in self.registry.pending() if r.kind == "origin_access"]

    def close(self) -> None:
        self.watcher.stop(timeout_s=2.0)
        self.control.close()


def test_the_constants_are_the_policys_limits():
    """The cap and the deadline bound are the policy's own upper limits, not copies of them."""
    assert MAX_PENDING == MAX_PENDING_LIMIT == 100
    assert MAX_DEADLINE_S == MAX_HOLD_TIMEOUT_S == 600.0
    assert STOP_TIMEOUT_S >= CALL_TIMEOUT_S and RECONCILE_BUDGET_S < 2 * CALL_TIMEOUT_S
    with pytest.raises(ValueError):
        GatewayWatcher(GatewayControl("http://127.0.0.1:1", "t"), ApprovalRegistry(), max_pending=MAX_PENDING_LIMIT + 1)


@pytest.mark.parametrize("max_pending", [None, 3])
def test_a_flood_of_created_events_leaves_at_most_the_cap_pending(hostile, max_pending):
    """2,000 ``created`` events, then a snapshot that names none of them (and fetches by id that say
    "pending"): never more than the cap are pending in the registry (each one is a prompt and a
    card); each one past it is reported once, escaped, and not mirrored."""
    flood = 2000
    cap = MAX_PENDING if max_pending is None else max_pending

    def stream(write: Callable[[bytes], None]) -> None:
        write(b"".join(sse("created", item(f"oreq_f{i}"), i + 1) for i in range(flood)))
        write(sse("snapshot", {"seq": flood + 1, "pending": []}, flood + 1))
        hostile.closed.wait()

    hostile.stream = stream
    watch = Watch(hostile, **({} if max_pending is None else {"max_pending": max_pending}))
    try:
        watch.watcher.start()
        until(lambda: watch.watcher.last_seq == flood + 1, timeout=60, what="the flood and the snapshot")
        until(lambda: len(hostile.gets) >= cap, timeout=30, what="the reconciliation's fetches")
        assert watch.most <= cap and len(watch.pending()) == cap
        over = [p for p in watch.problems if p.startswith("too_many_pending")]
        assert len(over) == 1, "the flood is reported once, not once per request"  # on_problem
        listed = [p for p in watch.watcher.problems if p.startswith("too_many_pending")]
        assert len(listed) == len(set(listed)) and len(watch.watcher.problems) <= 100
        assert all(origins.clean(p, 300) == p for p in listed)
        # room again (the gateway decided some): a re-sent pending one is mirrored
        for request in watch.pending()[:1]:
            watch.registry.resolve(request.id, "expired", by="timeout")
        assert watch.watcher.take(item("oreq_f1999")) is not None and len(watch.pending()) == cap
        assert watch.watcher.take(item("oreq_late")) is None and len(watch.pending()) == cap
    finally:
        watch.close()


def test_a_flood_of_decided_requests_is_mirrored_up_to_the_total_cap(hostile, monkeypatch):
    """Requests the gateway reports already decided prompt nobody, but each would be a registry entry
    and an ``approval`` line: past :data:`MAX_MIRRORED` (lowered here to keep the test short) no more
    are mirrored, and that is said once; a request already known is still updated."""
    monkeypatch.setattr(origins.watcher, "MAX_MIRRORED", 50)
    watch = Watch(hostile)
    try:
        taken = [watch.watcher.take(item(f"oreq_d{i}", state="denied")) for i in range(200)]
        assert sum(1 for t in taken if t is not None) == 50
        assert len([r for r in watch.registry.all() if r.kind == "origin_access"]) == 50
        assert len([p for p in watch.problems if p.startswith("too_many_requests")]) == 1
        assert watch.watcher.take(item("oreq_d0", state="denied")) is not None  # known: still taken
    finally:
        watch.close()


def test_slow_fetches_by_id_keep_a_reconciliation_within_its_budget(hostile):
    """Ten requests pending here that the gateway's list leaves out, each fetch answered after 1.5 s:
    one reconciliation returns within :data:`RECONCILE_BUDGET_S` (not 10 x 1.5 s, nor 10 x the call
    deadline), and the next round checks those the first one did not reach."""
    hostile.get_delay_s = 1.5
    watch = Watch(hostile)
    try:
        for i in range(10):
            assert watch.watcher.take(item(f"oreq_s{i}")) is not None
        started = time.monotonic()
        watch.watcher.reconcile([])
        assert time.monotonic() - started <= RECONCILE_BUDGET_S + SLACK_S
        first = list(hostile.gets)
        assert 1 <= len(first) < 10
        started = time.monotonic()
        watch.watcher.reconcile([])
        assert time.monotonic() - started <= RECONCILE_BUDGET_S + SLACK_S
        second = hostile.gets[len(first):]
        assert second and not set(second) & set(first), "the next round starts with those left unchecked"
    finally:
        watch.close()


def test_stop_returns_within_its_bound_and_both_threads_end(hostile):
    """The gateway lists slowly (4 s) and takes each ``cancel`` slowly (3 s), five requests pending:
    :meth:`GatewayWatcher.stop` returns within :data:`STOP_TIMEOUT_S` with the watch thread and the
    answers thread ended; every request is withdrawn, the cancels it had no time for are left to the
    gateway's deadline (reported once)."""
    five = [item(f"oreq_c{i}") for i in range(5)]
    hostile.pending = five
    hostile.list_delay_s, hostile.post_delay_s = 4.0, 3.0
    hostile.stream = lambda write: write(sse("snapshot", {"seq": 1, "pending": five}, 1))  # then the stream ends
    watch = Watch(hostile)
    try:
        watch.watcher.start()
        until(lambda: len(watch.pending()) == 5, timeout=20, what="five pending")
        time.sleep(0.5)  # the stream has ended: a slow list is under way
        threads = list(watch.watcher._threads)
        assert [t.name for t in threads] == ["origin-watch", "origin-answers"]
        started = time.monotonic()
        watch.watcher.stop("run ended")
        took = time.monotonic() - started
        assert took <= STOP_TIMEOUT_S + SLACK_S, f"stop() took {took:.1f} s"
        assert not any(t.is_alive() for t in threads), "a watcher thread outlived stop()"
        assert not watch.pending()
        assert 1 <= len(hostile.posts) < 5
        assert any("not sent within the stop's time" in p for p in watch.problems)
        sent = len(hostile.posts)
        time.sleep(1.0)
        assert len(hostile.posts) == sent, "a cancel was sent after stop() returned"
    finally:
        watch.close()


def test_stop_is_bounded_when_the_event_stream_never_answers(hostile):
    """The event stream's connection is accepted but its head never comes (there is no socket to
    shut down yet): the watch thread still ends within one call deadline, and stop() within its bound."""
    hostile.stall_events = True
    watch = Watch(hostile)
    try:
        watch.watcher.start()
        time.sleep(0.5)  # the stream's request is out, waiting for the head
        threads = list(watch.watcher._threads)
        started = time.monotonic()
        watch.watcher.stop()
        assert time.monotonic() - started <= min(STOP_TIMEOUT_S, CALL_TIMEOUT_S) + SLACK_S
        assert not any(t.is_alive() for t in threads)
    finally:
        watch.close()


def test_a_far_off_deadline_is_clamped_to_the_longest_hold(hostile):
    """A ``deadline_at`` ten years ahead (created five years ago): the mirrored request's deadline is at
    most :data:`MAX_DEADLINE_S` from now, so the screenshot's wait is not stretched by it."""
    far = item("oreq_far", deadline_s=10 * 365 * 86400.0, created_s=5 * 365 * 86400.0)
    hostile.stream = lambda write: (write(sse("snapshot", {"seq": 1, "pending": [far]}, 1)), hostile.closed.wait())
    hostile.pending = [far]
    watch = Watch(hostile)
    try:
        watch.watcher.start()
        (request,) = until(watch.pending, timeout=20, what="the far-off request")
        assert 0 < request.seconds_left() <= MAX_DEADLINE_S + SLACK_S
        assert request.deadline_mono - time.monotonic() <= MAX_DEADLINE_S + SLACK_S
        deadline = _dt.datetime.fromisoformat(request.deadline_at)
        assert deadline <= _dt.datetime.now(_dt.timezone.utc) + _dt.timedelta(seconds=MAX_DEADLINE_S + SLACK_S)
        # a near deadline is left as the gateway gave it
        near = item("oreq_near", deadline_s=30.0)
        mirrored = watch.watcher.take(near)
        assert mirrored is not None and mirrored.seconds_left() == pytest.approx(30.0, abs=SLACK_S)
    finally:
        watch.close()
