"""The OpenAI Agents SDK over a desktop sandbox (the ``desktop-sandbox[agents]`` extra).

* :class:`AsyncDesktopComputer` (``agents.AsyncComputer``) and :class:`DesktopComputer`
  (``agents.Computer``) give ``ComputerTool`` a sandbox's desktop: each call of the SDK is a call of the
  sandbox (:class:`desktop_sandbox.Sandbox`: recorded, asked about under ``confirm_actions``, mapped by
  the driver's one rule). Screenshots are PNG, scaled to fit ``max_width`` x ``max_height`` (model px;
  default the sandbox task's model settings, 1280x800); the model's points are read in the px of the
  last screenshot, which is what the SDK's computer tool sends.
* the ``SandboxAgent`` client lives in :mod:`desktop_sandbox.agents_sandbox`.

Importing this module needs ``openai-agents``; without it the ImportError names the extra.
"""

from __future__ import annotations

import base64
import io
from typing import Any

try:
    from agents.computer import AsyncComputer, Computer
except ImportError as exc:  # pragma: no cover - the extra is missing
    raise ImportError("desktop_sandbox.agents needs the OpenAI Agents SDK: pip install 'desktop-sandbox[agents]'") \
        from exc

from desktop_sandbox._async import AsyncSandbox
from wire.actions import ACTION_TYPES
from desktop_sandbox._sandbox import Sandbox, Screenshot

ENVIRONMENT = "ubuntu"
"""The preview computer tool's ``environment`` for this desktop (a Debian guest: the closest the SDK names)."""


def _png_base64(shot: Screenshot) -> str:
    """The screenshot as base64 PNG (the SDK labels every computer screenshot ``image/png``): an image the
    size cap re-encoded as JPEG is converted back, at the same size."""
    data = shot.data
    if shot.mime != "image/png":
        from PIL import Image

        with Image.open(io.BytesIO(data)) as img:
            buf = io.BytesIO()
            img.convert("RGB").save(buf, format="PNG")
            data = buf.getvalue()
    return base64.b64encode(data).decode("ascii")


class _Shape:
    """What both computers share: the screenshot settings and the dimensions they give the SDK."""

    def _setup(self, screen_size: tuple[int, int], task_model: Any, max_width: int | None,
               max_height: int | None) -> None:
        from controller.run.mapping import fit_size

        self.max_width = max_width if max_width is not None else task_model.max_width
        self.max_height = max_height if max_height is not None else task_model.max_height
        self._dimensions = fit_size(screen_size[0], screen_size[1], self.max_width, self.max_height)

    @property
    def environment(self) -> Any:
        """``ubuntu`` (only the preview tool sends it)."""
        return ENVIRONMENT

    @property
    def dimensions(self) -> tuple[int, int]:
        """The screenshots' size in model px (width, height): what the preview tool declares."""
        return self._dimensions

    def _shot_args(self) -> dict[str, Any]:
        return {"max_width": self.max_width, "max_height": self.max_height, "format": "png"}


def _action(kind: str, **fields: Any) -> dict[str, Any]:
    keys = fields.pop("keys", None)
    action = {"type": kind, **fields}
    if keys:
        action["keys"] = list(keys)
    return action


class DesktopComputer(_Shape, Computer):
    """``agents.Computer`` over a :class:`desktop_sandbox.Sandbox` (blocking calls).

    ``sandbox``: a started sandbox (not closed by this object); ``max_width``/``max_height``: the model
    image's bounding box in model px (None: the task's). Points are model px of the last screenshot.
    Errors are the sandbox's (``OutOfModelBounds``, ``ActionDenied``, ``AgentError``).
    """

    def __init__(self, sandbox: Sandbox, *, max_width: int | None = None, max_height: int | None = None) -> None:
        self.sandbox = sandbox
        self._setup(sandbox.screen_size, sandbox.task.model, max_width, max_height)

    def screenshot(self) -> str:
        """A base64 PNG of the screen, scaled to :attr:`dimensions`."""
        return _png_base64(self.sandbox.screenshot(**self._shot_args()))

    def click(self, x: int, y: int, button: Any = "left", *, keys: list[str] | None = None) -> None:
        self.sandbox.actions([_action("click", x=x, y=y, button=button, keys=keys)])

    def double_click(self, x: int, y: int, *, keys: list[str] | None = None) -> None:
        self.sandbox.actions([_action("double_click", x=x, y=y, keys=keys)])

    def scroll(self, x: int, y: int, scroll_x: int, scroll_y: int, *, keys: list[str] | None = None) -> None:
        self.sandbox.actions([_action("scroll", x=x, y=y, scroll_x=scroll_x, scroll_y=scroll_y, keys=keys)])

    def type(self, text: str) -> None:
        self.sandbox.actions([_action("type", text=text)])

    def wait(self) -> None:
        self.sandbox.actions([_action("wait")])

    def move(self, x: int, y: int, *, keys: list[str] | None = None) -> None:
        self.sandbox.actions([_action("move", x=x, y=y, keys=keys)])

    def keypress(self, keys: list[str]) -> None:
        self.sandbox.actions([{"type": "keypress", "keys": list(keys)}])

    def drag(self, path: list[tuple[int, int]], *, keys: list[str] | None = None) -> None:
        self.sandbox.actions([_action("drag", path=[{"x": x, "y": y} for x, y in path], keys=keys)])


class AsyncDesktopComputer(_Shape, AsyncComputer):
    """``agents.AsyncComputer`` over a :class:`desktop_sandbox.AsyncSandbox` (or a :class:`Sandbox`,
    whose calls then run on worker threads). Same units and errors as :class:`DesktopComputer`."""

    def __init__(self, sandbox: AsyncSandbox | Sandbox, *, max_width: int | None = None,
                 max_height: int | None = None) -> None:
        self.sandbox = sandbox if isinstance(sandbox, AsyncSandbox) else AsyncSandbox(sandbox)
        self._setup(self.sandbox.screen_size, self.sandbox.sync.task.model, max_width, max_height)

    async def screenshot(self) -> str:
        """A base64 PNG of the screen, scaled to :attr:`dimensions`."""
        return _png_base64(await self.sandbox.screenshot(**self._shot_args()))

    async def click(self, x: int, y: int, button: Any = "left", *, keys: list[str] | None = None) -> None:
        await self.sandbox.actions([_action("click", x=x, y=y, button=button, keys=keys)])

    async def double_click(self, x: int, y: int, *, keys: list[str] | None = None) -> None:
        await self.sandbox.actions([_action("double_click", x=x, y=y, keys=keys)])

    async def scroll(self, x: int, y: int, scroll_x: int, scroll_y: int, *, keys: list[str] | None = None) -> None:
        await self.sandbox.actions([_action("scroll", x=x, y=y, scroll_x=scroll_x, scroll_y=scroll_y, keys=keys)])

    async def type(self, text: str) -> None:
        await self.sandbox.actions([_action("type", text=text)])

    async def wait(self) -> None:
        await self.sandbox.actions([_action("wait")])

    async def move(self, x: int, y: int, *, keys: list[str] | None = None) -> None:
        await self.sandbox.actions([_action("move", x=x, y=y, keys=keys)])

    async def keypress(self, keys: list[str]) -> None:
        await self.sandbox.actions([{"type": "keypress", "keys": list(keys)}])

    async def drag(self, path: list[tuple[int, int]], *, keys: list[str] | None = None) -> None:
        await self.sandbox.actions([_action("drag", path=[{"x": x, "y": y} for x, y in path], keys=keys)])


assert all(callable(getattr(c, kind, None)) for c in (DesktopComputer, AsyncDesktopComputer) for kind in ACTION_TYPES), \
    "every action of the schema (wire.actions) is a method of both computers"

__all__ = ["AsyncDesktopComputer", "DesktopComputer", "ENVIRONMENT"]
