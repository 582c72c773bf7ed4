"""The live screen of a run, shared by every viewer: one grab loop per run, frames fanned out.

A :class:`FrameFeed` belongs to one :class:`~controller.run.live.LiveRun` (the console keeps one per
run, :meth:`controller.console.app.ConsoleState.feed`). Viewers -- each WebSocket of a run page and each
``screen.mjpeg`` stream -- ask it for a frame with :meth:`FrameFeed.next`; nothing is pushed:

* one loop task per run grabs a JPEG (:meth:`LiveRun.frame`, in a worker thread of ``executor``) only
  while at least one viewer waits in :meth:`FrameFeed.next`, at most :data:`FPS_MAX` times a second
  whatever the number of viewers, and ends once nobody waited for :data:`IDLE_S` seconds;
* the feed keeps the newest frame only (its number, the time it was taken); a viewer gets the newest
  frame numbered above the last it got, if it was taken at most one of the viewer's frame periods
  before it asked, else it waits for the next grab. Each viewer asks for its next frame one period
  after the last one's grab began, so viewers at the same rate fall in step and share grabs: five
  viewers at 5 fps cost 5 grabs a second, not 25, and once in step each gets a frame grabbed as it asks;
* a viewer that does not read (its socket's buffer full) is not waiting, so it drives no grab and is
  simply skipped: it holds nothing but its connection and, at most, the one frame it is sending.

All of it runs on the console's event loop (uvicorn's thread): the feed's state needs no thread lock.
"""

from __future__ import annotations

import asyncio
import math
import threading
from concurrent.futures import Executor
from typing import NamedTuple

from controller.run.live import LiveRun

FPS_DEFAULT, FPS_MIN, FPS_MAX = 5.0, 1.0, 10.0
"""Frames per second a viewer may ask for: default, least, most (also the feed's own ceiling)."""

IDLE_S = 1.0
"""Seconds the loop waits for a viewer before it ends (a viewer that comes later starts it again)."""


def clamp_fps(value: float | None) -> float:
    """A viewer's frame rate bounded to :data:`FPS_MIN`..:data:`FPS_MAX` (default :data:`FPS_DEFAULT`)."""
    if value is None or not math.isfinite(value):
        return FPS_DEFAULT
    return min(FPS_MAX, max(FPS_MIN, float(value)))


class Frame(NamedTuple):
    """A frame of the feed: ``number`` (from 1, in the order grabbed), ``jpeg``, ``taken_at`` (the event
    loop's time when its grab started, seconds)."""

    number: int
    jpeg: bytes
    taken_at: float


class FrameFeed:
    """One run's live screen for all its viewers (module docstring). ``grabs``: frames grabbed so far
    (the guest's screenshots this feed cost)."""

    def __init__(self, live: LiveRun, executor: Executor | None, closing: threading.Event) -> None:
        self.live = live
        self._executor = executor
        self._closing = closing
        self._changed = asyncio.Condition()
        self._frame: Frame | None = None
        self._tried_at = -math.inf  # loop time the last grab started, whatever came of it
        self._waiting = 0  # viewers in next()
        self._wanted = False  # one of them waits for a frame newer than the newest
        self._task: asyncio.Task[None] | None = None
        self.grabs = 0

    @property
    def running(self) -> bool:
        """Whether the grab loop runs now."""
        return self._task is not None and not self._task.done()

    def _fresh(self, after: int, since: float) -> bool:
        return self._frame is not None and self._frame.number > after and self._frame.taken_at >= since

    async def next(self, after: int, max_age: float, timeout: float) -> Frame | None:
        """The newest frame numbered above ``after`` and taken at most ``max_age`` seconds before this
        call (or since), waiting up to ``timeout`` seconds for the loop to grab one; None when none came
        (the run has not started or has ended, the guest failed, the console stops). A viewer that paces
        itself from the frame's ``taken_at`` falls in step with the others at its rate: they share grabs."""
        since = asyncio.get_running_loop().time() - max_age
        async with self._changed:
            if not self._fresh(after, since):
                self._waiting += 1
                self._wanted = True
                try:
                    if not self.running:
                        self._task = asyncio.get_running_loop().create_task(self._run())
                    self._changed.notify_all()  # a loop waiting for a viewer goes on
                    await asyncio.wait_for(self._changed.wait_for(lambda: self._fresh(after, since)), timeout)
                except TimeoutError:
                    return None
                finally:
                    self._waiting -= 1
            return self._frame

    async def _run(self) -> None:
        """The grab loop: while a viewer waits for a newer frame, one frame at a time, at most
        :data:`FPS_MAX` a second; every viewer waiting then gets it."""
        loop = asyncio.get_running_loop()
        period = 1.0 / FPS_MAX
        while not self._closing.is_set() and self.live.state != "finished":
            async with self._changed:
                try:
                    await asyncio.wait_for(self._changed.wait_for(lambda: self._wanted and self._waiting > 0),
                                           IDLE_S)
                except TimeoutError:
                    return  # nobody watches
            # the feed's own ceiling: a frame rate, not a wait for a condition
            await asyncio.sleep(max(0.0, self._tried_at + period - loop.time()))
            started = self._tried_at = loop.time()
            try:
                jpeg = await loop.run_in_executor(self._executor, self.live.frame)
            except Exception:  # noqa: BLE001 - RunOver (no sandbox yet), AgentError, not a JPEG: try again
                continue
            self.grabs += 1
            async with self._changed:
                number = self._frame.number + 1 if self._frame is not None else 1
                self._frame, self._wanted = Frame(number, jpeg, started), False  # it is newer than any waited for
                self._changed.notify_all()
