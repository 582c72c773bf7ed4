"""The run's bus (controller/run/bus.py): one publication per event, in order to every subscriber; a slow
subscriber is dropped with a record line and never holds the publisher; late joiners read what is kept."""

from __future__ import annotations

import threading
import time

import pytest

from controller.run.bus import (
    ActionSent, ApprovalChanged, ControlChanged, EntryWritten, Published, RunBus, RunEnded, follow_entries,
    of_kind,
)
from controller.run.entries import Check, ViewDropped
from controller.run.record import RunRecord, read_entries
from controller.run.registry import ApprovalRegistry


def test_every_subscriber_gets_every_event_once_in_order():
    bus = RunBus()
    inline: list[int] = []
    queued: list[int] = []
    done = threading.Event()
    bus.subscribe(lambda p: inline.append(p.seq), name="inline", inline=True)

    def slowish(p):
        queued.append(p.seq)
        if p.seq == 200:
            done.set()

    bus.subscribe(slowish, name="queued")
    seqs = [bus.publish(ControlChanged("running")) for _ in range(200)]
    assert seqs == list(range(1, 201))
    assert inline == seqs  # inline: delivered before publish returned
    assert done.wait(5) and queued == seqs


def test_a_subscriber_that_falls_behind_is_dropped_and_the_record_says_so(tmp_path):
    """The publisher never waits: with a subscriber stuck on its first event, 50 publications return at
    once, the subscriber is dropped when its queue (8) is full, and a ``view_dropped`` line names it."""
    bus = RunBus()
    record = RunRecord(tmp_path, "r", bus=bus)
    bus.on_dropped = lambda name, capacity: record.write(ViewDropped(view=name, queued=capacity))
    stuck = threading.Event()
    got: list[int] = []

    def stall(p):
        got.append(p.seq)
        stuck.wait(10)

    sub = bus.subscribe(stall, name="slow-view", capacity=8, accepts=of_kind(ControlChanged))
    t = time.monotonic()
    for _ in range(50):
        bus.publish(ControlChanged("running"))
    assert time.monotonic() - t < 1.0
    assert sub.dropped
    stuck.set()
    sub.join(5)
    assert len(got) <= 1  # nothing handed to it after the drop
    record.close()
    dropped = [e for e in read_entries(record.path) if e.type == "view_dropped"]
    assert [(e.view, e.queued) for e in dropped] == [("slow-view", 8)]


def test_a_subscriber_that_raises_stops_nothing():
    bus = RunBus()
    seen: list[int] = []
    bus.subscribe(lambda p: 1 / 0, name="broken", inline=True)
    bus.subscribe(lambda p: seen.append(p.seq), name="fine", inline=True)
    bus.publish(ControlChanged("running"))
    assert seen == [1]


def test_late_joiners_read_what_is_kept_and_a_closed_bus_answers_at_once():
    bus = RunBus(history=5)
    for _ in range(8):
        bus.publish(ControlChanged("running"))
    assert [p.seq for p in bus.since(0)] == [4, 5, 6, 7, 8]  # older than what is kept: everything kept
    assert [p.seq for p in bus.since(6)] == [7, 8]
    t = time.monotonic()
    assert bus.since(8, timeout=0.3) == []
    assert time.monotonic() - t >= 0.25
    threading.Timer(0.2, lambda: bus.publish(RunEnded("passed"))).start()
    assert [p.kind for p in bus.since(8, timeout=5)] == ["ended"]
    bus.close()
    t = time.monotonic()
    assert bus.since(9, timeout=5) == [] and time.monotonic() - t < 1
    assert bus.publish(ControlChanged("running")) == 0  # nothing after the close


def test_replay_hands_a_new_subscriber_the_events_kept_then_the_new_ones():
    bus = RunBus()
    bus.publish(ControlChanged("running"))
    bus.publish(ActionSent({"type": "click", "x": 1, "y": 2}))
    seen: list[str] = []
    bus.subscribe(lambda p: seen.append(p.kind), name="late", inline=True, replay=True)
    bus.publish(ControlChanged("human"))
    assert seen == ["control", "action", "control"]


def test_close_lets_queued_subscribers_finish_what_they_were_sent():
    bus = RunBus()
    got: list[int] = []
    bus.subscribe(lambda p: (time.sleep(0.01), got.append(p.seq)), name="slow")
    for _ in range(20):
        bus.publish(ControlChanged("running"))
    bus.close()
    assert got == list(range(1, 21))


def test_only_bus_events_are_published():
    with pytest.raises(TypeError):
        RunBus().publish({"kind": "record"})


def test_the_record_and_the_registry_publish_on_one_bus(tmp_path):
    """An entry (with a screenshot's bytes) and an approval change reach one subscriber, in the order
    they happened: the record's listener and the registry's listeners are the same mechanism."""
    bus = RunBus()
    record = RunRecord(tmp_path, "r", bus=bus)
    registry = ApprovalRegistry(30, bus=bus)
    registry.views.add("console")
    seen: list[object] = []
    bus.subscribe(lambda p: seen.append(p.event), name="all", inline=True)
    record.write(Check(kind="file", target="~/x", passed=True))
    record.save_screenshot(b"\x89PNG\r\n\x1a\nrest", "image/png", image_size=(1, 1), frame=(0, 0, 1, 1))
    request = registry.open("action", "Run click?", actions=["click"])
    assert isinstance(seen[0], EntryWritten) and seen[0].entry.type == "check"
    assert isinstance(seen[1], EntryWritten) and seen[1].image == b"\x89PNG\r\n\x1a\nrest"
    assert isinstance(seen[2], ApprovalChanged) and seen[2].request.id == request.id
    assert seen[2].snapshot["pending"][0]["id"] == request.id
    entries: list[str] = []
    follow_entries(bus, lambda entry: entries.append(entry.type), name="entries")
    record.write(Check(kind="file", target="~/y", passed=False))
    assert entries == ["check"]
    record.close()


def _all_end(threads: list[threading.Thread], within_s: float) -> bool:
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + within_s
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    return not any(thread.is_alive() for thread in threads)


def test_a_view_taking_over_while_actions_are_published_never_deadlocks(tmp_path):
    """The console's take over, resume and first paint (LiveRun's state lock, then the bus) while the
    run publishes actions and record lines (the bus, then the inline subscribers): no lock is ever
    taken in the other order."""
    from controller.run.live import LiveRun

    sys_interval = __import__("sys").getswitchinterval()
    __import__("sys").setswitchinterval(1e-5)
    try:
        bus = RunBus()
        record = RunRecord(tmp_path, "r", bus=bus)
        registry = ApprovalRegistry(30, bus=bus)
        live = LiveRun(record.run_id, record.dir, registry)
        live.attach(object(), (1280, 800), cancel=lambda by: None, record_human=lambda data: None)
        stop = time.monotonic() + 1.5

        def actions():
            while time.monotonic() < stop:
                live.on_forward([{"type": "click", "x": 1, "y": 2}])
                record.write(Check(kind="file", target="~/x", passed=True))

        def views():
            while time.monotonic() < stop:
                live.take_over()
                live.describe()
                live.resume()

        threads = [threading.Thread(target=actions, daemon=True) for _ in range(2)]
        threads += [threading.Thread(target=views, daemon=True) for _ in range(2)]
        assert _all_end(threads, 20), "deadlocked"
        record.close()
    finally:
        __import__("sys").setswitchinterval(sys_interval)


def test_an_event_published_by_an_inline_subscriber_comes_after_the_one_it_reacted_to():
    """A registry listener that opens a request while told of another (as a replay's answerer does):
    every inline subscriber sees the first request's change before the second's."""
    bus = RunBus()
    registry = ApprovalRegistry(30, bus=bus)
    registry.views.add("console")
    opened: list[str] = []

    def chain(request):
        if request.pending and request.question == "first?":
            opened.append(registry.open("action", "second?").id)

    registry.subscribe(chain)
    seen: list[str] = []
    bus.subscribe(lambda p: seen.append(p.event.request.question), name="later", inline=True,
                  accepts=of_kind(ApprovalChanged))
    registry.open("action", "first?")
    assert seen == ["first?", "second?"]
    assert [p.event.request.question for p in bus.since(0)] == ["first?", "second?"]


def test_the_bus_order_is_the_record_order_and_each_request_is_pending_before_decided(tmp_path):
    """Writers and answerers on several threads: the bus publishes record entries in the order of their
    lines, and a request's pending change before its decision."""
    import sys

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    try:
        bus = RunBus(history=100000)
        record = RunRecord(tmp_path, "r", bus=bus)
        registry = ApprovalRegistry(30, bus=bus)
        registry.views.add("console")

        def write(n):
            for i in range(400):
                record.write(Check(kind="file", target=f"~/{n}-{i}", passed=True))

        def ask():
            for _ in range(150):
                registry.open("action", "go?")

        def answer():
            for _ in range(3000):
                for request in registry.pending():
                    try:
                        registry.answer(request.id, "deny", by="console")
                    except Exception:  # noqa: BLE001 - another answerer was first
                        pass

        threads = [threading.Thread(target=write, args=(n,)) for n in range(3)]
        threads += [threading.Thread(target=ask), threading.Thread(target=answer)]
        assert _all_end(threads, 60)
        record.close()
        published = [p.event.entry.target for p in bus.since(0) if isinstance(p.event, EntryWritten)]
        assert published == [e.target for e in read_entries(record.path)]
        states: dict[str, list[str]] = {}
        for p in bus.since(0):
            if isinstance(p.event, ApprovalChanged):
                states.setdefault(p.event.changed["id"], []).append(p.event.changed["state"])
        assert states and all(s[0] == "pending" for s in states.values())
        versions = [p.event.snapshot["version"] for p in bus.since(0) if isinstance(p.event, ApprovalChanged)]
        assert versions == sorted(versions)
    finally:
        sys.setswitchinterval(interval)


def test_a_closed_bus_keeps_no_pixels_and_a_dropped_subscriber_lets_its_queue_go(tmp_path):
    bus = RunBus()
    record = RunRecord(tmp_path, "r", bus=bus)
    stuck = threading.Event()
    sub = bus.subscribe(lambda p: stuck.wait(10), name="stuck", capacity=4)
    for _ in range(10):
        record.save_screenshot(b"\x89PNG\r\n\x1a\n" + b"x" * 1000, "image/png", image_size=(1, 1), frame=(0, 0, 1, 1))
    assert sub.dropped and not [item for item in sub._queued.queue.queue if isinstance(item, Published)]
    stuck.set()
    record.close()
    bus.close()
    kept = [p.event for p in bus.since(0) if isinstance(p.event, EntryWritten)]
    assert len(kept) == 10 and all(e.image is None and e.entry.file.startswith("shot-") for e in kept)


def test_a_view_reading_past_hidden_events_misses_none_published_meanwhile(tmp_path):
    """The console's feed skips the events it does not show (a ``wait`` action) by their own numbers:
    a control change published right after them still reaches the view."""
    from controller.run.live import LiveRun

    registry = ApprovalRegistry(30)
    live = LiveRun("r", tmp_path, registry)
    bus = live.bus
    bus.publish(ActionSent({"type": "wait"}))
    since, once = bus.since, []

    def racing(seq, timeout=0.0):
        out = since(seq, timeout)
        if out and not once:  # the run goes on between the view's two reads
            once.append(bus.publish(ControlChanged("running", "console")))
        return out

    bus.since = racing
    events = live.events_after(0, timeout=2)
    assert [(e["kind"], e.get("state")) for e in events] == [("control", "running")]
