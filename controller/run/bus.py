"""One bus per run: what happens in a run is published once, and every view is a subscriber.

A run publishes four kinds of events (:data:`EVENT_KINDS`): a record entry as written
(:class:`EntryWritten`, a screenshot's with its image bytes), a change of an approval request
(:class:`ApprovalChanged`), each action about to reach the desktop (:class:`ActionSent`, screen px) and
a change of who controls the desktop (:class:`ControlChanged`); :class:`RunEnded` closes the stream.
The terminal progress, the web console, the Agents API, replay's answerers, the sign-in and approval
askers are subscribers; the record file is written before an entry is published, so every subscriber
sees only what the record holds.

Two ways to subscribe (:meth:`RunBus.subscribe`):

- **queued** (the default): the subscriber gets its own thread and a bounded queue (``capacity``
  events); the run never waits on it. One that falls behind -- its queue full -- is dropped: it gets
  no more events, and the run's record gets a ``view_dropped`` line naming it (:attr:`RunBus.on_dropped`).
- **inline**: called on the publishing thread, in publication order, for subscribers that must hold
  the run's pace (the terminal's lines, the record-driven replayer). An inline subscriber must not
  block; its exceptions are swallowed.

Late joiners (a console tab opened mid-run, an SSE client resuming with ``Last-Event-ID``) read the
recent events with :meth:`RunBus.since`. Sequence numbers start at 1 and increase by one per event.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

HISTORY = 4096
"""Events kept for :meth:`RunBus.since` (late joiners); older ones are gone for them."""
CAPACITY = 1024
"""A queued subscriber's queue (events); past it the subscriber is dropped."""
DRAIN_S = 5.0
"""At :meth:`RunBus.close`, the most the queued subscribers get, all together, to finish what they
were sent (seconds)."""


@dataclass(frozen=True)
class EntryWritten:
    """A record entry, as written (``entry``: the entry model with its ``ts``). A ``screenshot`` entry
    carries the image it names (``image``: the bytes sent to the model, ``mime``), so that a view can
    send it on without reading the file back."""

    entry: Any
    image: bytes | None = field(default=None, repr=False)
    mime: str | None = None


@dataclass(frozen=True)
class ApprovalChanged:
    """An approval request was opened, decided, withdrawn or answered (``request``: the registry's
    :class:`controller.run.registry.Request`, live; ``snapshot``: the registry's pending requests right
    after the change, as :meth:`controller.run.registry.ApprovalRegistry.snapshot`)."""

    request: Any
    snapshot: dict[str, Any] = field(default_factory=dict)
    changed: dict[str, Any] = field(default_factory=dict)
    """The request as it was at this change (``id``, ``kind``, ``state``, ``by``, ``origin``): ``request``
    itself may have changed again by the time a subscriber reads it."""


@dataclass(frozen=True)
class ActionSent:
    """An action about to reach the desktop (``action``: an agent action in screen px, as sent -- typed
    text included: a view shows its length only; or a browser tool call as the console draws it);
    ``by``: ``model`` or the person's view)."""

    action: dict[str, Any]
    by: str = "model"


@dataclass(frozen=True)
class ControlChanged:
    """Who controls the desktop changed (``state``: ``running``, ``pausing``, ``human``, ``finished``;
    ``by``: the view that asked, or None)."""

    state: str
    by: str | None = None


@dataclass(frozen=True)
class RunEnded:
    """The run ended with ``status`` (its record is finished); nothing is published after it."""

    status: str


EVENT_KINDS: dict[type, str] = {
    EntryWritten: "record",
    ApprovalChanged: "approvals",
    ActionSent: "action",
    ControlChanged: "control",
    RunEnded: "ended",
}
"""Every event type and its name (the console's event ``kind``); :meth:`RunBus.publish` refuses any other."""


@dataclass(frozen=True)
class Published:
    """An event with its sequence number on the bus."""

    seq: int
    event: Any

    @property
    def kind(self) -> str:
        return EVENT_KINDS[type(self.event)]


class _Queued:
    """A queued subscriber: its thread delivers events in order until the bus closes or it is dropped."""

    _END = object()

    def __init__(self, bus: "RunBus", handler: Callable[[Published], None], name: str, capacity: int,
                 accepts: Callable[[Any], bool] | None) -> None:
        self.name, self.handler, self.accepts = name, handler, accepts
        self.queue: queue.Queue[Any] = queue.Queue(maxsize=capacity)
        self.dropped = False
        self.done = False
        self.thread = threading.Thread(target=self._deliver, name=f"bus-{name}", daemon=True)
        self.thread.start()

    def offer(self, item: Published) -> bool:
        """Queue ``item``; False when the queue is full (the caller drops this subscriber)."""
        try:
            self.queue.put_nowait(item)
            return True
        except queue.Full:
            return False

    def drop(self) -> None:
        """Dropped for falling behind: what was queued is let go, the thread ends after the event it is
        handling."""
        self.dropped = True
        while True:
            try:
                self.queue.get_nowait()
            except queue.Empty:
                break
        self.end()

    def end(self) -> None:
        """No more events: the thread ends once the queue is empty (at once when dropped)."""
        self.done = True
        with contextlib.suppress(queue.Full):
            self.queue.put_nowait(self._END)

    def _deliver(self) -> None:
        while True:
            try:
                item = self.queue.get(timeout=0.25)  # the end marker may not fit a full queue: look at done
            except queue.Empty:
                if self.done:
                    return
                continue
            if item is self._END or self.dropped:
                return
            try:
                self.handler(item)
            except Exception:  # noqa: BLE001 - a broken view never stops the others
                pass


class Subscription:
    """What :meth:`RunBus.subscribe` returns: :meth:`close` stops the deliveries (a queued subscriber's
    thread ends once it has handled what was already queued)."""

    def __init__(self, bus: "RunBus", inline: tuple[Any, ...] | None, queued: _Queued | None) -> None:
        self._bus, self._inline, self._queued = bus, inline, queued

    @property
    def dropped(self) -> bool:
        """True once the bus dropped this subscriber for falling behind."""
        return self._queued is not None and self._queued.dropped

    def close(self) -> None:
        self._bus._remove(self._inline, self._queued)

    def join(self, timeout: float) -> None:
        """Wait (at most ``timeout`` seconds) for a queued subscriber's thread to end."""
        if self._queued is not None and self._queued.thread is not threading.current_thread():
            self._queued.thread.join(timeout)


class RunBus:
    """The run's one publish/subscribe mechanism (module docstring). Thread-safe.

    ``on_dropped(name, capacity)``: called once per dropped subscriber, outside the bus's lock (the
    run writes a ``view_dropped`` record line)."""

    def __init__(self, history: int = HISTORY) -> None:
        self._lock = threading.RLock()  # re-entrant: an inline subscriber may publish (a record line)
        self._cond = threading.Condition(self._lock)
        self._seq = 0
        self._history: deque[Published] = deque(maxlen=history)
        self._inline: list[tuple[Callable[[Published], None], Callable[[Any], bool] | None]] = []
        self._queued: list[_Queued] = []
        self._delivering = False  # an inline delivery is under way (on the thread holding the lock)
        self._nested: deque[Published] = deque()  # published by an inline subscriber meanwhile
        self.closed = False
        self.on_dropped: Callable[[str, int], None] | None = None

    @property
    def lock(self) -> threading.RLock:
        """The bus's lock: a source that changes its state and publishes the change (the record, the
        approval registry) holds it around both, taken before its own lock, so that the bus's order is
        the order of the changes."""
        return self._lock

    @property
    def last_seq(self) -> int:
        with self._lock:
            return self._seq

    def publish(self, event: Any) -> int:
        """Publish ``event`` (one of :data:`EVENT_KINDS`; TypeError otherwise) and return its sequence
        number; 0 once the bus is closed (the event goes nowhere). Inline subscribers have run when it
        returns (an event published by an inline subscriber is delivered after the one it reacted to,
        to every inline subscriber); queued ones have it in their queue, or are dropped."""
        if type(event) not in EVENT_KINDS:
            raise TypeError(f"not a bus event: {type(event).__name__}")
        dropped: list[_Queued] = []
        with self._lock:
            if self.closed:
                return 0
            self._seq += 1
            item = Published(self._seq, event)
            self._history.append(item)
            self._cond.notify_all()
            for sub in list(self._queued):
                if sub.accepts is not None and not sub.accepts(event):
                    continue
                if not sub.offer(item):
                    sub.dropped = True
                    self._queued.remove(sub)
                    sub.drop()
                    dropped.append(sub)
            if self._delivering:  # published by an inline subscriber: after the event under way
                self._nested.append(item)
            else:
                self._delivering = True
                try:
                    self._deliver_inline(item)
                    while self._nested:
                        self._deliver_inline(self._nested.popleft())
                finally:
                    self._delivering = False
                    self._nested.clear()
        for sub in dropped:
            if self.on_dropped is not None:
                with contextlib.suppress(Exception):
                    self.on_dropped(sub.name, sub.queue.maxsize)
        return item.seq

    def _deliver_inline(self, item: Published) -> None:
        for handler, accepts in list(self._inline):
            if accepts is not None and not accepts(item.event):
                continue
            try:
                handler(item)
            except Exception:  # noqa: BLE001 - a broken view never stops the run
                pass

    def subscribe(self, handler: Callable[[Published], None], *, name: str, inline: bool = False,
                  capacity: int = CAPACITY, accepts: Callable[[Any], bool] | None = None,
                  replay: bool = False) -> Subscription:
        """Deliver each event published from now on to ``handler(published)`` -- queued (its own
        thread, ``capacity`` events) or ``inline`` (module docstring). ``accepts(event)``: only events
        it returns True for are delivered (and count against the capacity). ``replay``: first deliver
        the events still kept (:data:`HISTORY`; a queued subscriber the last ``capacity`` of them), in
        order, none twice."""
        with self._lock:
            earlier = list(self._history) if replay else []
            if replay and not inline:
                earlier = [item for item in earlier if accepts is None or accepts(item.event)][-capacity:]
            if inline:
                entry = (handler, accepts)
                for item in earlier:
                    if accepts is None or accepts(item.event):
                        with contextlib.suppress(Exception):
                            handler(item)
                self._inline.append(entry)
                return Subscription(self, entry, None)
            sub = _Queued(self, handler, name, capacity, accepts)
            for item in earlier:
                if (accepts is None or accepts(item.event)) and not sub.offer(item):
                    break
            if self.closed:
                sub.end()
            else:
                self._queued.append(sub)
            return Subscription(self, None, sub)

    def since(self, seq: int, timeout: float = 0.0) -> list[Published]:
        """The events kept with a number above ``seq``, waiting up to ``timeout`` seconds for one when
        there is none yet ([] then, or at once once the bus is closed). A ``seq`` older than what is
        kept returns everything kept."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._seq <= seq and not self.closed:
                left = deadline - time.monotonic()
                if left <= 0:
                    return []
                self._cond.wait(left)
            return [item for item in self._history if item.seq > seq]

    def close(self, drain_s: float = DRAIN_S) -> None:
        """Publish nothing more; let the queued subscribers handle what they were sent (at most
        ``drain_s`` seconds all together) and end their threads. The events kept for late joiners lose
        their images (a screenshot stays named in its entry): a finished run holds no pixels."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
            subs, self._queued = list(self._queued), []
            self._inline.clear()
            for index, item in enumerate(self._history):
                if isinstance(item.event, EntryWritten) and item.event.image is not None:
                    self._history[index] = Published(item.seq, EntryWritten(item.event.entry, None, item.event.mime))
            self._cond.notify_all()
        for sub in subs:
            sub.end()
        deadline = time.monotonic() + drain_s
        for sub in subs:
            if sub.thread is not threading.current_thread():
                sub.thread.join(max(0.0, deadline - time.monotonic()))

    def _remove(self, inline: tuple[Any, ...] | None, queued: _Queued | None) -> None:
        with self._lock:
            if inline is not None and inline in self._inline:
                self._inline.remove(inline)
            if queued is not None and queued in self._queued:
                self._queued.remove(queued)
        if queued is not None:
            queued.end()


def of_kind(*types: type) -> Callable[[Any], bool]:
    """An ``accepts`` filter for :meth:`RunBus.subscribe`: events of these types only."""
    wanted: tuple[type, ...] = tuple(types)
    return lambda event: isinstance(event, wanted)


def entries_of(events: Iterable[Published]) -> list[Any]:
    """The record entries among ``events``, in order."""
    return [p.event.entry for p in events if isinstance(p.event, EntryWritten)]


def follow_entries(bus: RunBus, handler: Callable[[Any], None], *, name: str, inline: bool = True) -> Subscription:
    """Call ``handler(entry)`` with each record entry published on ``bus`` (inline by default: the
    terminal's lines, a replayer following the steps)."""
    return bus.subscribe(lambda published: handler(published.event.entry), name=name, inline=inline,
                         accepts=of_kind(EntryWritten))
