"""The console's two long answers: the run's events (SSE) and the live screen (MJPEG).

**Events** (``text/event-stream``), from a given ``seq`` (``Last-Event-ID``, else ``?after=``, else 0):

1. ``retry: 2000`` (the browser's reconnect delay, ms);
2. ``event: approvals`` -- ``{"snapshot": {"version", "pending": [...]}}``, the registry now (no ``id``);
3. ``event: state`` -- :meth:`LiveRun.describe` plus ``last_action`` (an ``action`` event's data or
   None) (no ``id``);
4. every :class:`LiveRun` event after ``seq``, in order: ``id: <seq>``, ``event: <kind>``, ``data:
   <the event as JSON>`` (``record``, ``approvals``, ``action``, ``control``; see controller.run.live);
5. ``: keep-alive`` comments after :data:`KEEPALIVE_S` without an event;
6. ``event: end`` once the run has finished and every event was sent; then the stream closes.

The data lines are ASCII JSON (``ensure_ascii``): no line break of any kind can split an event.

**Live screen** (``multipart/x-mixed-replace; boundary=frame``): one JPEG part per tick at ``fps``
frames per second, each pulled from :meth:`LiveRun.frame` while the client stays connected; a frame
that fails is skipped (the next tick tries again); the stream ends when the run finishes.

Both stop when the client disconnects (Starlette cancels them) or the console stops (``closing``).
:meth:`LiveRun.events_after` and :meth:`LiveRun.frame` block, so they run in worker threads: the
event loop never waits on them. The event waits have their own pool (``waits``): each call lasts at
most :data:`WAIT_S`, so streams beyond its size take turns instead of starving frames and input.
"""

from __future__ import annotations

import asyncio
import json
import math
import threading
from concurrent.futures import Executor
from typing import Any, AsyncIterator

from controller.run.live import LiveRun, RunOver

WAIT_S = 1.0
"""Longest wait of one :meth:`LiveRun.events_after` call (seconds). It cannot be woken from outside,
so this bounds how long a worker thread outlives a client that left or a console that stops."""

KEEPALIVE_S = 15.0
"""Seconds without an event before a keep-alive comment (proxies and browsers drop silent streams)."""

FPS_DEFAULT, FPS_MIN, FPS_MAX = 5.0, 1.0, 10.0
BOUNDARY = "frame"


def sse(kind: str, data: Any, seq: int | None = None) -> str:
    """One server-sent event: optional ``id``, ``event`` and a one-line ASCII JSON ``data``."""
    head = f"id: {seq}\n" if seq is not None else ""
    return f"{head}event: {kind}\ndata: {json.dumps(data, ensure_ascii=True, separators=(',', ':'))}\n\n"


def state_of(live: LiveRun) -> dict[str, Any]:
    """The ``state`` event's data: ``describe()`` plus ``last_action``."""
    return {**live.describe(), "last_action": live.last_action}


def start_seq(last_event_id: str | None, after: str | None, live: LiveRun) -> int:
    """Where a stream starts: ``Last-Event-ID`` (the browser's reconnect), else ``?after=``, else 0.
    ValueError when the one given is not a decimal integer >= 0. A ``seq`` beyond the run's last
    (a page from an earlier console) starts over at 0."""
    given = last_event_id if last_event_id not in (None, "") else after
    if given in (None, ""):
        return 0
    if not given.isascii() or not given.isdigit() or len(given) > 18:
        raise ValueError("Last-Event-ID and after must be a decimal event number")
    seq = int(given)
    return 0 if seq > live.last_seq else seq


async def event_stream(live: LiveRun, seq: int, closing: threading.Event,
                       waits: Executor | None = None) -> AsyncIterator[str]:
    """The events of ``live`` after ``seq`` as SSE text (see the module docstring). ``waits``: the
    executor whose threads wait in :meth:`LiveRun.events_after` (None: the loop's default)."""
    loop = asyncio.get_running_loop()
    yield "retry: 2000\n\n"
    yield sse("approvals", {"snapshot": live.registry.snapshot()})
    yield sse("state", state_of(live))
    quiet = 0.0
    while True:
        events = await loop.run_in_executor(waits, live.events_after, seq, WAIT_S)
        for event in events:
            seq = event["seq"]
            yield sse(event["kind"], event, seq)
        if live.state == "finished" and seq >= live.last_seq:
            yield sse("end", {"status": live.status})  # before ``closing``: a run's end closes its console
            return
        if closing.is_set():
            # the console stops (a run's end closes its console): what the run said last still goes out
            for event in live.events_after(seq, 0):
                seq = event["seq"]
                yield sse(event["kind"], event, seq)
            if live.state == "finished" and seq >= live.last_seq:
                yield sse("end", {"status": live.status})
            return
        if events:
            quiet = 0.0
            continue
        quiet += WAIT_S
        if quiet >= KEEPALIVE_S:
            quiet = 0.0
            yield ": keep-alive\n\n"


def clamp_fps(value: float | None) -> float:
    """``?fps=`` bounded to :data:`FPS_MIN`..:data:`FPS_MAX` (default :data:`FPS_DEFAULT`)."""
    if value is None or not math.isfinite(value):
        return FPS_DEFAULT
    return min(FPS_MAX, max(FPS_MIN, float(value)))


PART_HEAD = f"--{BOUNDARY}\r\nContent-Type: image/jpeg\r\n\r\n".encode()
"""What opens each part. No Content-Length: the part ends at the next boundary."""


def mjpeg_part(jpeg: bytes) -> bytes:
    """One frame and the head of the next part. A browser shows a part of ``multipart/x-mixed-replace``
    only once it sees where the part ends, that is once the next boundary arrives: sent with the frame,
    the frame shows at once instead of one frame period later (measured: action-to-pixels p50 from
    about 310 ms to about 110 ms at 5 fps). The stream starts with :data:`PART_HEAD`."""
    return jpeg + b"\r\n" + PART_HEAD


async def mjpeg_stream(live: LiveRun, fps: float, closing: threading.Event,
                       frames: Executor | None = None) -> AsyncIterator[bytes]:
    """JPEG frames of ``live`` at ``fps`` while connected (see the module docstring); ``frames``: the
    executor whose threads fetch them (None: the loop's default)."""
    loop = asyncio.get_running_loop()
    period = 1.0 / fps
    opened = False
    while not closing.is_set() and live.state != "finished":
        started = loop.time()
        try:
            jpeg = await loop.run_in_executor(frames, live.frame)
        except RunOver:
            jpeg = None  # not started yet (or just finished: the loop condition ends the stream)
        except Exception:  # noqa: BLE001 - AgentError, a non-JPEG answer: skip this tick
            jpeg = None
        if jpeg is not None:
            if not opened:
                opened = True
                yield PART_HEAD
            yield mjpeg_part(jpeg)
        # the frame rate itself: a viewer asked for fps frames a second, not for a condition
        await asyncio.sleep(max(0.0, period - (loop.time() - started)))
