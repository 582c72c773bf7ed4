"""The driver's settle before a screenshot: one request (wait, then the screenshot) when the agent
client offers ``actions_screenshot``; the separate ``wait`` and screenshot otherwise, and whenever a
``before_capture`` hook has to run between them."""

from __future__ import annotations

import io
from typing import Any

from PIL import Image

from controller.agent_client import AgentScreenshot, AgentStep
from controller.run.driver import SandboxDriver, ScreenshotPolicy


def _png() -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (64, 40), (1, 2, 3)).save(buf, "PNG")
    return buf.getvalue()


SHOT = AgentScreenshot(_png(), "image/png", (64, 40), (0, 0, 64, 40), (64, 40))


class Agent:
    """Records the calls the driver makes."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def actions(self, actions: list[dict[str, Any]]) -> int:
        self.calls.append(("actions", [a["type"] for a in actions]))
        return len(actions)

    def screenshot(self, **kwargs: Any) -> AgentScreenshot:
        self.calls.append(("screenshot", kwargs["format"]))
        return SHOT

    def release(self) -> None:
        self.calls.append(("release", None))


class CombinedAgent(Agent):
    def actions_screenshot(self, actions: list[dict[str, Any]], **kwargs: Any) -> AgentStep:
        self.calls.append(("actions_screenshot", ([a["type"] for a in actions], kwargs["format"])))
        return AgentStep(len(actions), True, SHOT)


CLICK = {"type": "click", "x": 10, "y": 10, "button": "left"}


def test_the_settle_wait_and_the_screenshot_go_in_one_request():
    agent = CombinedAgent()
    driver = SandboxDriver(agent, ScreenshotPolicy(max_width=64, max_height=40))
    driver.screenshot()  # nothing happened yet: no settle
    driver.click(CLICK)
    shot = driver.screenshot()
    driver.screenshot()  # no input since: no settle
    assert shot["image_url"].startswith("data:image/png;base64,")
    assert agent.calls == [("screenshot", "png"), ("actions", ["click"]), ("actions_screenshot", (["wait"], "png")),
                           ("screenshot", "png")]


def test_without_the_combined_request_the_wait_comes_first():
    agent = Agent()
    driver = SandboxDriver(agent, ScreenshotPolicy(max_width=64, max_height=40))
    driver.capture()
    driver.click(CLICK)
    driver.screenshot()
    assert agent.calls == [("screenshot", "png"), ("actions", ["click"]), ("actions", ["wait"]),
                           ("screenshot", "png")]


def test_a_before_capture_hook_still_runs_between_the_wait_and_the_screenshot():
    agent = CombinedAgent()
    driver = SandboxDriver(agent, ScreenshotPolicy(max_width=64, max_height=40))
    driver.capture()
    hooked: list[list[tuple[str, Any]]] = []
    driver.before_capture = lambda: hooked.append(list(agent.calls)) or True
    driver.click(CLICK)
    driver.screenshot()
    assert hooked == [[("screenshot", "png"), ("actions", ["click"]), ("actions", ["wait"])]]
    assert agent.calls[3:] == [("actions", ["wait"]), ("screenshot", "png")]


def test_no_settle_policy_sends_no_wait():
    agent = CombinedAgent()
    driver = SandboxDriver(agent, ScreenshotPolicy(max_width=64, max_height=40, settle=False))
    driver.capture()
    driver.click(CLICK)
    driver.screenshot()
    assert agent.calls == [("screenshot", "png"), ("actions", ["click"]), ("screenshot", "png")]
