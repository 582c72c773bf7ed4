"""SandboxDriver as a conformance target (``tests/conformance``):

    pytest tests/conformance --conformance-target=tests.controller.driver_target:make_driver_target

Actions go through the driver's validation and model -> screen mapping, with the model space set to
a full-size screenshot (identity), so the suite's screen-px expectations hold; then they reach the
agent as one request, as the agent API defines. Screenshots go through the driver's capture.
"""

from __future__ import annotations

import io
from typing import Any

from PIL import Image

from controller.agent_client import AgentError
from controller.run.driver import DriverError, SandboxDriver, ScreenshotPolicy
from controller.run.mapping import Frame, ModelSpace, OutOfModelBounds
from tests.conformance.harness import AgentDesktop, Shot, TargetError


class DriverTarget:
    """Conformance target wrapping :class:`controller.run.driver.SandboxDriver`."""

    def __init__(self, desktop: AgentDesktop) -> None:
        self.client = desktop.client
        info = self.client.display()
        self.screen_size = (info["width"], info["height"])
        self.driver = SandboxDriver(self.client, ScreenshotPolicy(max_width=None, max_height=None, settle=False))
        self._identity = ModelSpace(self.screen_size[0], self.screen_size[1], Frame(0, 0, *self.screen_size))

    def run(self, actions: list[dict[str, Any]]) -> None:
        self.driver.model_space = self._identity
        try:
            mapped = []
            for index, action in enumerate(actions):
                try:
                    mapped.append(self.driver.to_screen_action(action))
                except OutOfModelBounds as exc:
                    raise TargetError("out_of_bounds", str(exc), index, 400) from exc
                except (DriverError, TypeError, KeyError) as exc:
                    raise TargetError("invalid_action", str(exc), index, 400) from exc
            self.driver._send(mapped)
        except AgentError as exc:
            raise TargetError(exc.code, exc.message, exc.index, exc.status) from exc

    def screenshot(self, format: str = "png", quality: int | None = None, max_width: int | None = None,
                   max_height: int | None = None, crop: tuple[int, int, int, int] | None = None) -> Shot:
        self.driver.policy = ScreenshotPolicy(format=format, quality=quality or 85, max_width=max_width,
                                              max_height=max_height, crop=crop, settle=False,
                                              max_bytes=64 * 1024 * 1024)
        try:
            shot = self.driver.capture()
        except AgentError as exc:
            raise TargetError(exc.code, exc.message, exc.index, exc.status) from exc
        image = Image.open(io.BytesIO(shot.data))
        image.load()
        f = shot.frame
        return Shot(image, shot.mime, shot.screen_size, (f.x, f.y, f.w, f.h), shot.data)

    def release(self) -> None:
        self.driver.release()


def make_driver_target(desktop: AgentDesktop) -> DriverTarget:
    """Factory for ``--conformance-target``."""
    return DriverTarget(desktop)
