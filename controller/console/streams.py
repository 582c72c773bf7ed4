"""The console's long answers: the run's events (SSE), the live screen (MJPEG), and both on one
WebSocket (what a run page holds: one connection per tab).

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
frames per second, each the run's shared feed's newest frame (:class:`controller.console.frames.FrameFeed`:
one grab loop per run, whatever the number of viewers); a tick without a frame is skipped; the stream
ends when the run finishes.

**The run page's socket** (:func:`live_socket`, a WebSocket; ``?after=`` as for the events): the
browser allows a handful of HTTP/1.1 connections per host (six in chromium) and every tab holding two
streams would soon leave none for the POSTs that answer approvals; a WebSocket is not counted among
them. The server sends

* text messages, one JSON object each, ``{"event": kind, "id": seq | null, "data": {...}}``: the same
  events, in the same order, as the event stream (1. to 6. above, without ``retry`` and keep-alives:
  the WebSocket's pings keep it open); after ``end`` it closes (1000);
* binary messages, one JPEG each (a frame of the live screen), only as asked for: the client sends
  ``{"frames": F}`` (text, JSON) to ask for the next frame at F frames a second (1..10), ``{"frames":
  0}`` to stop. One frame is sent per request, grabbed no sooner than 1/F s after the one before, so
  a page asks for the next once it has shown one, and a tab hidden or too slow to keep up costs no grab;
* ``{"event": "error", "id": null, "data": {"code": "invalid_message", "message"}}`` for a client
  message of any other shape, then the socket closes (1008). A message over
  :data:`MAX_CLIENT_MESSAGE` bytes closes it (1009, the server's ``ws_max_size``).

A client that stops reading holds little: its socket's kernel send buffer is fixed at
:data:`SEND_BUFFER` bytes (:class:`PageSocketProtocol`; the kernel would otherwise grow it to megabytes),
so the server's sends wait once that and the transport's buffer are full; no frame is grabbed for it
meanwhile, and a send that does not complete within :data:`SEND_TIMEOUT_S` drops the client.

All stop when the client disconnects (Starlette cancels them) or the console stops (``closing``).
:meth:`LiveRun.events_after` and :meth:`LiveRun.frame` block, so they run in worker threads: the
event loop never waits on them. The event waits have their own pool (``waits``): each call lasts at
most :data:`WAIT_S`, so streams beyond its size take turns instead of starving frames and input.
"""

from __future__ import annotations

import asyncio
import json
import math
import socket
import threading
from concurrent.futures import Executor
from typing import Any, AsyncIterator

from starlette.websockets import WebSocket, WebSocketDisconnect
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

from controller.console.frames import FPS_DEFAULT, FPS_MAX, FPS_MIN, FrameFeed, clamp_fps
from controller.run.live import LiveRun

__all__ = ["BOUNDARY", "FPS_DEFAULT", "FPS_MAX", "FPS_MIN", "KEEPALIVE_S", "MAX_CLIENT_MESSAGE", "PART_HEAD",
           "PageSocketProtocol", "SEND_BUFFER", "SEND_TIMEOUT_S", "WAIT_S", "clamp_fps", "event_stream",
           "frames_asked", "live_socket", "mjpeg_part", "mjpeg_stream", "run_events", "sse", "start_seq",
           "state_of"]

WAIT_S = 1.0
"""Longest wait of one :meth:`LiveRun.events_after` call, and of one :meth:`FrameFeed.next` call
(seconds). It cannot be woken from outside, so this bounds how long a worker thread outlives a client
that left or a console that stops."""

KEEPALIVE_S = 15.0
"""Seconds without an event before a keep-alive comment (proxies and browsers drop silent streams)."""

SEND_TIMEOUT_S = 30.0
"""Longest a message to a WebSocket client may take to go out (seconds): a client that reads nothing
for that long is dropped."""

MAX_CLIENT_MESSAGE = 4096
"""Largest message a WebSocket client may send (bytes; the server's ``ws_max_size``)."""

SEND_BUFFER = 128 * 1024
"""Kernel send buffer of a page's socket (bytes, ``SO_SNDBUF``): a frame or two."""


class PageSocketProtocol(WebSocketsSansIOProtocol):
    """uvicorn's WebSocket protocol (the ``websockets`` library, sans I/O) with the connection's kernel
    send buffer fixed at :data:`SEND_BUFFER` (module docstring)."""

    def connection_made(self, transport: Any) -> None:
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER)
        super().connection_made(transport)

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


async def run_events(live: LiveRun, seq: int, closing: threading.Event,
                     waits: Executor | None = None) -> AsyncIterator[tuple[str, Any, int | None] | None]:
    """The events of ``live`` after ``seq`` (module docstring, 2. to 6.) as ``(kind, data, seq or
    None)``, and None after each :data:`WAIT_S` without an event. ``waits``: the executor whose threads
    wait in :meth:`LiveRun.events_after` (None: the loop's default)."""
    loop = asyncio.get_running_loop()
    yield "approvals", {"snapshot": live.registry.snapshot()}, None
    yield "state", state_of(live), None
    while True:
        events = await loop.run_in_executor(waits, live.events_after, seq, WAIT_S)
        for event in events:
            seq = event["seq"]
            yield event["kind"], event, seq
        if live.state == "finished" and seq >= live.last_seq:
            yield "end", {"status": live.status}, None  # before ``closing``: a run's end closes its console
            return
        if closing.is_set():
            # the console stops (a run's end closes its console): what the run said last still goes out
            for event in live.events_after(seq, 0):
                seq = event["seq"]
                yield event["kind"], event, seq
            if live.state == "finished" and seq >= live.last_seq:
                yield "end", {"status": live.status}, None
            return
        if not events:
            yield None


async def event_stream(live: LiveRun, seq: int, closing: threading.Event,
                       waits: Executor | None = None) -> AsyncIterator[str]:
    """The events of ``live`` after ``seq`` as SSE text (see the module docstring). ``waits``: the
    executor whose threads wait in :meth:`LiveRun.events_after` (None: the loop's default)."""
    yield "retry: 2000\n\n"
    quiet = 0.0
    async for item in run_events(live, seq, closing, waits):
        if item is not None:
            quiet = 0.0
            yield sse(*item)
            continue
        quiet += WAIT_S
        if quiet >= KEEPALIVE_S:
            quiet = 0.0
            yield ": keep-alive\n\n"


PART_HEAD = f"--{BOUNDARY}\r\nContent-Type: image/jpeg\r\n\r\n".encode()
"""What opens each part. No Content-Length: the part ends at the next boundary."""


def mjpeg_part(jpeg: bytes) -> bytes:
    """One frame and the head of the next part. A browser shows a part of ``multipart/x-mixed-replace``
    only once it sees where the part ends, that is once the next boundary arrives: sent with the frame,
    the frame shows at once instead of one frame period later (measured: action-to-pixels p50 from
    about 310 ms to about 110 ms at 5 fps). The stream starts with :data:`PART_HEAD`."""
    return jpeg + b"\r\n" + PART_HEAD


async def mjpeg_stream(feed: FrameFeed, fps: float, closing: threading.Event) -> AsyncIterator[bytes]:
    """JPEG frames of ``feed``'s run at ``fps`` while connected (see the module docstring)."""
    loop = asyncio.get_running_loop()
    period = 1.0 / fps
    last, due, opened = 0, -math.inf, False
    while not closing.is_set() and feed.live.state != "finished":
        # the frame rate itself, one period after the last frame's grab began (so viewers at one rate
        # share grabs): a viewer asked for fps frames a second, not for a condition
        await asyncio.sleep(max(0.0, due - loop.time()))
        frame = await feed.next(last, period, WAIT_S)
        if frame is None:
            continue
        last, due = frame.number, frame.taken_at + period
        if not opened:
            opened = True
            yield PART_HEAD
        yield mjpeg_part(frame.jpeg)


def frames_asked(text: str | None) -> float | None:
    """The frame rate a client message asks for (``{"frames": F}``: 0 stops, else F bounded by
    :func:`clamp_fps`); ValueError, with the reason, for any other message."""
    try:
        message = json.loads(text) if text is not None else None
    except ValueError:
        raise ValueError("a message must be one JSON object") from None
    value = message.get("frames") if isinstance(message, dict) and set(message) == {"frames"} else None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ValueError('a message must be {"frames": F}, F a number >= 0 (0 stops the frames)')
    return 0.0 if value == 0 else clamp_fps(float(value))


async def live_socket(socket: WebSocket, feed: FrameFeed, seq: int, closing: threading.Event,
                      waits: Executor | None = None) -> None:
    """Serve one run page's WebSocket (module docstring): ``feed``'s run's events after ``seq`` and,
    as the client asks for them, its frames; returns once the run ended, the client left or broke the
    protocol, a send took over :data:`SEND_TIMEOUT_S`, or the console stops."""
    live = feed.live
    loop = asyncio.get_running_loop()
    sending = asyncio.Lock()
    asked = asyncio.Event()  # the client waits for a frame
    rate = [FPS_DEFAULT]
    await socket.accept()

    async def send(message: dict[str, Any]) -> None:
        async with sending:
            await asyncio.wait_for(socket.send(message), SEND_TIMEOUT_S)

    def text(kind: str, data: Any, seq: int | None) -> dict[str, Any]:
        payload = {"event": kind, "id": seq, "data": data}
        return {"type": "websocket.send", "text": json.dumps(payload, ensure_ascii=True, separators=(",", ":"))}

    async def events() -> int:
        async for item in run_events(live, seq, closing, waits):
            if item is not None:
                await send(text(*item))
                if item[0] == "end":
                    return 1000
        return 1001  # the console stops

    async def frames() -> int:
        last, taken_at = 0, -math.inf
        while True:
            await asked.wait()  # ends with the socket (the task is cancelled)
            # the frame rate the client asks for, one period after the last frame's grab began (so
            # viewers at one rate share grabs): pacing, not a wait for a condition
            await asyncio.sleep(max(0.0, taken_at + 1.0 / rate[0] - loop.time()))
            if not asked.is_set():
                continue  # the client stopped meanwhile
            frame = await feed.next(last, 1.0 / rate[0], WAIT_S)
            if frame is None or not asked.is_set():
                continue  # no frame yet (the run's events say why), or the client stopped meanwhile
            asked.clear()
            last, taken_at = frame.number, frame.taken_at
            await send({"type": "websocket.send", "bytes": frame.jpeg})

    async def receive() -> int:
        while True:
            message = await socket.receive()
            if message["type"] == "websocket.disconnect":
                return 1000
            try:
                fps = frames_asked(message.get("text"))
            except ValueError as exc:
                await send(text("error", {"code": "invalid_message", "message": str(exc)}, None))
                return 1008
            if fps:
                rate[0] = fps
                asked.set()
            else:
                asked.clear()

    tasks = [loop.create_task(job()) for job in (events, frames, receive)]
    try:
        done, _pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    first = next(iter(done))
    failed = None if first.cancelled() else first.exception()
    # a client that reads nothing (a send past its deadline) is dropped as one that broke the protocol
    code = 1008 if isinstance(failed, TimeoutError) else 1011 if first.cancelled() or failed else first.result()
    try:
        await asyncio.wait_for(socket.close(code), SEND_TIMEOUT_S)
    except (OSError, RuntimeError, TimeoutError, WebSocketDisconnect):
        pass  # already closed by the client, or gone
