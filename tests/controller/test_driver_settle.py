"""The driver's step in one request: the last action of a planned computer_call, the settle ``wait``
and the call's capture go together when the agent client offers ``actions_screenshot``; the settle
``wait`` and the screenshot together otherwise; earlier actions run alone, in order; a pause at the
step boundary, a gate before the screenshot or a ``before_capture`` hook that waited take a new image.
The agent here is a test double that records the driver's calls (the real agent's side is in
tests/loop and the conformance suite)."""

from __future__ import annotations

import io
from typing import Any

from PIL import Image

from tests.helpers import FnSeam
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
    driver.click(CLICK)  # no plan: the action goes alone
    shot = driver.screenshot()
    driver.screenshot()  # no input since: no settle
    assert shot["image_url"].startswith("data:image/png;base64,")
    assert agent.calls == [("screenshot", "png"), ("actions", ["click"]), ("actions_screenshot", (["wait"], "png")),
                           ("screenshot", "png")]


def test_a_planned_calls_last_action_goes_with_its_capture():
    agent = CombinedAgent()
    forwarded: list[list[str]] = []
    driver = SandboxDriver(agent, ScreenshotPolicy(max_width=64, max_height=40),
                           seam=FnSeam(forward=lambda actions: forwarded.append([a["type"] for a in actions])))
    driver.capture()
    driver.plan_calls([3, 0, 1])  # three calls: three actions, only a screenshot, one action
    driver.click(CLICK)
    driver.type({"type": "type", "text": "hi"})
    assert agent.calls[1:] == [("actions", ["click"]), ("actions", ["type"])]
    driver.keypress({"type": "keypress", "keys": ["ENTER"]})  # the last: it ran, the screen captured
    assert agent.calls[3:] == [("actions_screenshot", (["keypress", "wait"], "png"))]
    driver.screenshot()  # hands over that image
    assert len(agent.calls) == 4
    driver.screenshot()  # the second call: no action, nothing happened since: a plain capture
    driver.move({"type": "move", "x": 5, "y": 5})
    driver.screenshot()
    assert agent.calls[4:] == [("screenshot", "png"), ("actions_screenshot", (["move", "wait"], "png"))]
    assert forwarded == [["click"], ["type"], ["keypress"], ["move"]]


def test_a_wrong_plan_costs_a_capture_never_a_stale_image():
    agent = CombinedAgent()
    driver = SandboxDriver(agent, ScreenshotPolicy(max_width=64, max_height=40, settle=False))
    driver.capture()
    driver.plan_calls([1])  # the call really holds two actions
    driver.click(CLICK)
    driver.click(CLICK)  # the image taken with the first no longer counts
    driver.screenshot()
    assert agent.calls[1:] == [("actions_screenshot", (["click"], "png")), ("actions", ["click"]),
                               ("screenshot", "png")]


def test_a_gate_before_the_screenshot_keeps_them_apart():
    agent = CombinedAgent()
    driver = SandboxDriver(agent, ScreenshotPolicy(max_width=64, max_height=40))
    driver.capture_with_last_action = False
    driver.capture()
    driver.plan_calls([1])
    driver.click(CLICK)
    driver.screenshot()
    assert agent.calls[1:] == [("actions", ["click"]), ("actions_screenshot", (["wait"], "png"))]


def test_without_the_combined_request_the_wait_comes_first():
    agent = Agent()
    driver = SandboxDriver(agent, ScreenshotPolicy(max_width=64, max_height=40))
    driver.capture()
    driver.plan_calls([1])
    driver.click(CLICK)
    driver.screenshot()
    assert agent.calls == [("screenshot", "png"), ("actions", ["click"]), ("actions", ["wait"]),
                           ("screenshot", "png")]


def test_a_before_capture_hook_runs_after_the_action_and_a_wait_it_made_takes_a_new_image():
    agent = CombinedAgent()
    driver = SandboxDriver(agent, ScreenshotPolicy(max_width=64, max_height=40))
    driver.capture()
    hooked: list[list[tuple[str, Any]]] = []
    driver.seam = FnSeam(capture_wait=lambda: hooked.append(list(agent.calls)) or True)
    driver.click(CLICK)
    driver.screenshot()
    assert hooked == [[("screenshot", "png"), ("actions", ["click"]), ("actions", ["wait"])]]
    assert agent.calls[3:] == [("actions", ["wait"]), ("screenshot", "png")]
    # With the call planned, the hook runs after the action and its capture; having waited, it
    # takes a new image; a hook that did not wait keeps the one taken with the action.
    driver.plan_calls([1])
    driver.click(CLICK)
    driver.screenshot()
    assert hooked[1][5:] == [("actions_screenshot", (["click", "wait"], "png"))]
    assert agent.calls[6:] == [("actions", ["wait"]), ("screenshot", "png")]
    driver.seam.capture_wait = lambda: False
    driver.plan_calls([1])
    driver.click(CLICK)
    driver.screenshot()
    assert agent.calls[8:] == [("actions_screenshot", (["click", "wait"], "png"))]


def test_a_pause_at_the_step_boundary_takes_a_new_image():
    agent = CombinedAgent()
    driver = SandboxDriver(agent, ScreenshotPolicy(max_width=64, max_height=40, settle=False))
    driver.capture()
    driver.seam = FnSeam(gate=lambda screenshot: screenshot)  # as LiveRun.checkpoint after a take-over
    driver.plan_calls([1])
    driver.click(CLICK)
    driver.screenshot()
    assert agent.calls[1:] == [("actions_screenshot", (["click"], "png")), ("screenshot", "png")]


def test_a_refused_last_action_is_an_error_of_that_action_and_release_drops_the_image():
    from controller.agent_client import AgentError

    class Refusing(CombinedAgent):
        def actions_screenshot(self, actions: list[dict[str, Any]], **kwargs: Any) -> AgentStep:
            self.calls.append(("actions_screenshot", ([a["type"] for a in actions], kwargs["format"])))
            if actions[0]["type"] == "click":
                raise AgentError(400, "out_of_bounds", "x outside the screen", index=0)
            return AgentStep(len(actions), None, SHOT)

    agent = Refusing()
    driver = SandboxDriver(agent, ScreenshotPolicy(max_width=64, max_height=40, settle=False))
    driver.capture()
    driver.plan_calls([1])
    try:
        driver.click(CLICK)
    except AgentError:
        pass
    else:
        raise AssertionError("the refusal was swallowed")
    assert driver.last_error is not None and "out_of_bounds" in driver.last_error
    driver.plan_calls([1])
    driver.move({"type": "move", "x": 5, "y": 5})
    driver.release()
    driver.screenshot()
    assert agent.calls[3:] == [("release", None), ("screenshot", "png")]


def test_no_settle_policy_sends_no_wait():
    agent = CombinedAgent()
    driver = SandboxDriver(agent, ScreenshotPolicy(max_width=64, max_height=40, settle=False))
    driver.capture()
    driver.click(CLICK)
    driver.screenshot()
    assert agent.calls == [("screenshot", "png"), ("actions", ["click"]), ("screenshot", "png")]
    driver.plan_calls([1])
    driver.click(CLICK)
    driver.screenshot()
    assert agent.calls[3:] == [("actions_screenshot", (["click"], "png"))]
