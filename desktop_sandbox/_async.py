"""AsyncSandbox: :class:`desktop_sandbox.Sandbox` for asyncio (each call on a worker thread)."""

from __future__ import annotations

import asyncio
import functools
from pathlib import Path
from typing import Any, Sequence

from desktop_sandbox._sandbox import Button, RunResult, Sandbox, Screenshot, _action_list
from wire.actions import ACTION_TYPES


class AsyncSandbox:
    """The asyncio form of :class:`Sandbox`: the same methods and units, as coroutines. Start it with
    ``async with await AsyncSandbox.start(...) as sb:`` (or ``sb = await AsyncSandbox.start(...)`` and
    ``await sb.close()``). Calls are carried out one at a time, in the order they are awaited."""

    def __init__(self, sandbox: Sandbox) -> None:
        self.sync = sandbox
        """The :class:`Sandbox` underneath (its blocking methods)."""

    @classmethod
    async def start(cls, **kwargs: Any) -> "AsyncSandbox":
        """:meth:`Sandbox.start` with the same keyword arguments, on a worker thread."""
        return cls(await asyncio.to_thread(functools.partial(Sandbox.start, **kwargs)))

    async def __aenter__(self) -> "AsyncSandbox":
        return self

    async def __aexit__(self, *_exc: Any) -> None:
        await self.close()

    async def close(self) -> None:
        """:meth:`Sandbox.close`."""
        await asyncio.to_thread(self.sync.close)

    @property
    def id(self) -> str:
        return self.sync.id

    @property
    def screen_size(self) -> tuple[int, int]:
        """The guest screen's (width, height) in screen px."""
        return self.sync.screen_size

    @property
    def record_dir(self) -> Path | None:
        return self.sync.record_dir

    async def _do(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        return await asyncio.to_thread(functools.partial(fn, *args, **kwargs))

    async def _on_run(self, fn: Any, blocking: Any) -> Any:
        """``fn(run)`` on the attended run's thread, awaited without a worker thread in between when the run
        is up; else ``blocking()`` on a worker thread (it starts what is missing)."""
        future = self.sync._submit(fn)
        if future is None:
            return await asyncio.to_thread(blocking)
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            if not future.done() and not future.cancel():  # under way: it cannot be taken back: the run is cancelled
                self.sync.cancel("an interrupted call")
            raise

    async def screenshot(self, **kwargs: Any) -> Screenshot:
        """:meth:`Sandbox.screenshot` (model px size; ``crop`` in screen px)."""
        policy = Sandbox._screenshot_policy(**kwargs)
        return await self._on_run(lambda run: Screenshot._of(run.screenshot(policy)),
                                  functools.partial(self.sync.screenshot, **kwargs))

    async def actions(self, actions: list[dict[str, Any]]) -> None:
        """:meth:`Sandbox.actions`."""
        acts = _action_list(actions)
        await self._on_run(lambda run: run.act(acts), functools.partial(self.sync.actions, acts))

    async def click(self, x: int, y: int, button: Button = "left", *, keys: Sequence[str] | None = None) -> None:
        """:meth:`Sandbox.click` (model px)."""
        await self._do(self.sync.click, x, y, button, keys=keys)

    async def double_click(self, x: int, y: int, *, keys: Sequence[str] | None = None) -> None:
        """:meth:`Sandbox.double_click` (model px)."""
        await self._do(self.sync.double_click, x, y, keys=keys)

    async def move(self, x: int, y: int) -> None:
        """:meth:`Sandbox.move` (model px)."""
        await self._do(self.sync.move, x, y)

    async def scroll(self, x: int, y: int, scroll_x: int = 0, scroll_y: int = 0) -> None:
        """:meth:`Sandbox.scroll` (model px)."""
        await self._do(self.sync.scroll, x, y, scroll_x, scroll_y)

    async def drag(self, path: Sequence[tuple[int, int]]) -> None:
        """:meth:`Sandbox.drag` (model px)."""
        await self._do(self.sync.drag, path)

    async def keypress(self, keys: Sequence[str]) -> None:
        """:meth:`Sandbox.keypress`."""
        await self._do(self.sync.keypress, keys)

    async def type(self, text: str) -> None:
        """:meth:`Sandbox.type`."""
        await self._do(self.sync.type, text)

    async def wait(self) -> None:
        """:meth:`Sandbox.wait`."""
        await self._do(self.sync.wait)

    async def launch(self, app: str, *args: str) -> int:
        """:meth:`Sandbox.launch`."""
        return await self._do(self.sync.launch, app, *args)

    async def read_file(self, path: str) -> bytes:
        """:meth:`Sandbox.read_file`."""
        return await self._do(self.sync.read_file, path)

    async def write_file(self, path: str, data: bytes) -> str:
        """:meth:`Sandbox.write_file`."""
        return await self._do(self.sync.write_file, path, data)

    async def set_policy(self, policy: Any) -> dict[str, Any]:
        """:meth:`Sandbox.set_policy`."""
        return await self._do(self.sync.set_policy, policy)

    async def run(self, task: Any, **kwargs: Any) -> RunResult:
        """:meth:`Sandbox.run`."""
        return await self._do(self.sync.run, task, **kwargs)

    async def check(self) -> list[dict[str, Any]]:
        """:meth:`Sandbox.check`."""
        return await self._do(self.sync.check)

    async def snapshot(self, **kwargs: Any) -> Any:
        """:meth:`Sandbox.snapshot`."""
        return await self._do(self.sync.snapshot, **kwargs)

    async def fork(self, count: int = 1, **kwargs: Any) -> list["AsyncSandbox"]:
        """:meth:`Sandbox.fork`: each fork an :class:`AsyncSandbox`."""
        return [AsyncSandbox(s) for s in await self._do(self.sync.fork, count, **kwargs)]


assert all(callable(getattr(AsyncSandbox, kind, None)) for kind in ACTION_TYPES), \
    "every action of the schema (wire.actions) is a method of AsyncSandbox"
