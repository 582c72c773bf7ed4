"""The event stream (SSE): the snapshot and state first, then every LiveRun event with its seq as the
id, replay from Last-Event-ID / ?after=, keep-alives, the end of a finished run."""

from __future__ import annotations

import json
import threading
import time
from typing import Any, Iterator

import httpx
import pytest

from controller.console import streams
from tests.console.conftest import LIVE_ID, Runner


def _events(resp: httpx.Response) -> Iterator[dict[str, Any]]:
    """Parse an SSE body into ``{"id", "event", "data", "comment"}`` dicts, one per blank-line block."""
    block: dict[str, Any] = {}
    for line in resp.iter_lines():
        if line == "":
            if block:
                yield block
            block = {}
        elif line.startswith(":"):
            block["comment"] = line[1:].strip()
        else:
            field, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            block[field] = json.loads(value) if field == "data" else value


def _take(events: Iterator[dict[str, Any]], n: int) -> list[dict[str, Any]]:
    return [next(events) for _ in range(n)]


def _stream(session, path: str, **headers: str):
    return session.client.stream("GET", path, headers=headers, timeout=httpx.Timeout(10.0))


def _fill(live) -> None:
    """Events 1..5: the run starts (control), two record entries, an approval opened and answered."""
    Runner(live).attach(None, (1280, 800))
    live.on_entry({"type": "run_started", "ts": "2030-01-01T00:00:00.000+00:00", "task": {"name": "t\x1b[31m"}})
    live.on_entry({"type": "action", "ts": "2030-01-01T00:00:01.000+00:00", "action": "click (1,2) left"})
    request = live.registry.open("action", "ok?")
    live.registry.answer(request.id, "deny", by="terminal")


def test_replay_from_last_event_id_after_the_snapshot_and_state(session, live):
    _fill(live)
    assert live.last_seq == 5
    with _stream(session, f"/runs/{LIVE_ID}/events", **{"Last-Event-ID": "2"}) as resp:
        assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream")
        assert resp.headers["cache-control"] == "no-store"
        events = _events(resp)
        retry, snapshot, state, *replayed = _take(events, 6)
    assert retry == {"retry": "2000"}
    assert snapshot["event"] == "approvals" and "id" not in snapshot
    assert snapshot["data"]["snapshot"] == live.registry.snapshot() and snapshot["data"]["snapshot"]["pending"] == []
    assert state["event"] == "state" and "id" not in state
    assert state["data"]["state"] == "running" and state["data"]["screen"] == [1280, 800] and state["data"]["last_seq"] == 5
    assert [(e["id"], e["event"]) for e in replayed] == [("3", "record"), ("4", "approvals"), ("5", "approvals")]
    assert replayed[0]["data"]["entry"]["action"] == "click (1,2) left"
    assert replayed[1]["data"]["snapshot"]["pending"][0]["question"] == "ok?"


def test_after_query_and_header_precedence_and_bad_ids(session, live):
    _fill(live)
    with _stream(session, f"/runs/{LIVE_ID}/events?after=3") as resp:
        first = _take(_events(resp), 5)[3:]
    assert [e["id"] for e in first] == ["4", "5"]
    with _stream(session, f"/runs/{LIVE_ID}/events?after=0", **{"Last-Event-ID": "4"}) as resp:
        assert _take(_events(resp), 4)[3]["id"] == "5"
    # the whole run from the start; a seq from an earlier console (beyond the last) starts over
    with _stream(session, f"/runs/{LIVE_ID}/events?after=999") as resp:
        assert [e.get("id") for e in _take(_events(resp), 8)][3:] == ["1", "2", "3", "4", "5"]
    for bad in ("-1", "abc", "1.5", "\u0661"):
        resp = session.get(f"/runs/{LIVE_ID}/events", params={"after": bad})
        assert resp.status_code == 400 and resp.json()["error"]["code"] == "invalid_event_id", bad


def test_new_events_arrive_and_the_stream_ends_when_the_run_finished(session, live):
    _fill(live)
    with _stream(session, f"/runs/{LIVE_ID}/events", **{"Last-Event-ID": "5"}) as resp:
        events = _events(resp)
        _take(events, 3)
        live.on_forward([{"type": "type", "text": "secret words"}])
        action = next(events)
        assert action["id"] == "6" and action["event"] == "action"
        assert action["data"]["action"] == {"type": "type", "text_length": 12} and "secret" not in json.dumps(action)
        live.finish("passed")
        control = next(events)
        assert control["event"] == "control" and control["data"]["state"] == "finished"
        end = next(events)
        assert end["event"] == "end" and end["data"] == {"status": "passed"}
        assert list(events) == []  # the server closed the stream
    # a finished run's stream: snapshot, state, then its end at once
    with _stream(session, f"/runs/{LIVE_ID}/events", **{"Last-Event-ID": "7"}) as resp:
        assert [e.get("event") for e in _events(resp)] == [None, "approvals", "state", "end"]


def test_keep_alive_comments_while_nothing_happens(session, live, monkeypatch):
    monkeypatch.setattr(streams, "KEEPALIVE_S", streams.WAIT_S)
    with _stream(session, f"/runs/{LIVE_ID}/events") as resp:
        events = _events(resp)
        _take(events, 3)
        assert next(events) == {"comment": "keep-alive"}


def test_a_client_that_leaves_frees_its_stream(session, live, console):
    """After many clients opened and left, the server still streams (no worker left blocked)."""
    for _ in range(50):
        with _stream(session, f"/runs/{LIVE_ID}/events") as resp:
            _take(_events(resp), 2)
    done = threading.Event()
    with _stream(session, f"/runs/{LIVE_ID}/events") as resp:
        events = _events(resp)
        _take(events, 3)
        live.on_entry({"type": "action", "ts": "2030-01-01T00:00:01.000+00:00", "action": "x"})
        assert next(events)["event"] == "record"
        done.set()
    assert done.is_set()


def test_stopping_the_console_ends_open_streams(session, live, console):
    Runner(live).attach(None, (1280, 800))
    with _stream(session, f"/runs/{LIVE_ID}/events") as events, \
            _stream(session, f"/runs/{LIVE_ID}/screen.mjpeg") as frames:
        assert events.status_code == 200 and frames.status_code == 200
        started = time.monotonic()
        console.stop()
        elapsed = time.monotonic() - started
        assert not console._thread.is_alive()
        # the streams end at their next turn (WAIT_S), not at uvicorn's graceful-shutdown timeout (3 s)
        assert elapsed < 2.5, f"stop took {elapsed:.1f} s with two streams open"
        assert [e.get("event") for e in _events(events)][:3] == [None, "approvals", "state"]
    with pytest.raises(httpx.ConnectError):
        httpx.get(console.base + "/", timeout=2)


def test_the_end_is_sent_even_when_the_console_stops_right_after_the_run(session, live, console):
    """run-task --ui stops its console as soon as the run returns: the page still gets ``end``."""
    Runner(live).attach(None, (1280, 800))
    with _stream(session, f"/runs/{LIVE_ID}/events") as resp:
        events = _events(resp)
        assert _take(events, 4)[3]["event"] == "control"
        live.finish("failed")
        console.state.closing.set()
        assert [(e.get("event"), e["data"].get("state") or e["data"].get("status")) for e in events] == [
            ("control", "finished"), ("end", "failed")]
