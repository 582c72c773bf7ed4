"""The model loops a run can drive: the SDK's ``ComputerToolset`` (computer tool only) and its
``ResponsesToolRunner`` (the browser tools, with the computer tool when the task has both), and the
requests they start from (:func:`build_params`, :func:`browser_params`).

A session's run continues a conversation: the items it starts from come first in the request's
``input``, then the run's own user message (:mod:`controller.run.conversation`).
"""

from __future__ import annotations

from typing import Any, Callable

from openai import ComputerToolset
from openai.lib.browser import BrowserToolset
from openai.lib.responses_tool_runner import ResponsesToolRunner, ToolRunnerError

from controller.run.browser_driver import GuestBrowserDriver
from controller.run.driver import SandboxDriver, SentScreenshot
from controller.run.recording import RecordingHooks
from controller.run.tasks import Task


def build_params(task: Task, model: str, first: SentScreenshot, legacy: bool,
                 conversation: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The Responses request the loop starts from: the ``conversation`` it continues (items, none for a
    run of its own), then the instructions with the first screenshot (model px)."""
    if legacy:
        tool: dict[str, Any] = {"type": "computer_use_preview", "display_width": first.image_size[0],
                                "display_height": first.image_size[1], "environment": "linux"}
    else:
        tool = {"type": "computer"}
    text = (f"{task.instructions}\n\nThe screenshot is {first.image_size[0]}x{first.image_size[1]} pixels; "
            "give coordinates in its pixels.")
    return {
        "model": model,
        "tools": [tool],
        "input": [*(conversation or []), {
            "role": "user",
            "content": [
                {"type": "input_text", "text": text},
                {"type": "input_image", "image_url": first.data_url, "detail": "high"},
            ],
        }],
        "truncation": "auto",
    }


def browser_params(task: Task, model: str, first: SentScreenshot | None, legacy: bool,
                   conversation: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The first request of a task with the browser tools (``[model] tools`` has ``browser``): the
    instructions, and with the computer tool too its declaration and the first screenshot (model px) as
    :func:`build_params` gives them. The ``browser_*`` function tools are the ``ResponsesToolRunner``'s
    to add (from the ``BrowserToolset``)."""
    about = "\n\nThe browser tools (browser_*) drive the web browser open on the desktop."
    params: dict[str, Any] = {"model": model}
    if first is not None:
        computer = build_params(task, model, first, legacy)
        params["tools"] = computer["tools"]
        content = computer["input"][0]["content"]
        content[0]["text"] += about
    else:
        content = [{"type": "input_text", "text": task.instructions + about}]
    params["input"] = [*(conversation or []), {"role": "user", "content": content}]
    params["truncation"] = "auto"
    return params


def browser_loop(task: Task, model: str, legacy: bool, driver: SandboxDriver, browser: GuestBrowserDriver,
                  client: Any, *, steps: int, approver: Callable[[Any], bool],
                  before_action: Callable[[Any], bool] | None, cancel: Callable[[], bool],
                  hooks: RecordingHooks, conversation: list[dict[str, Any]] | None = None) -> str | None:
    """The model loop of a task with the browser tools: the SDK's ``ResponsesToolRunner`` with a
    ``BrowserToolset`` over ``browser`` (the task's members, ``confirm`` and ``url_policy`` the driver's)
    and, when the task also has the computer tool, a ``ComputerToolset`` over ``driver``; the same
    approvals, cancellation and diagnostics (the record) as the computer loop. The run's
    ``before_capture`` chain (``driver.before_capture``: the origin wait, the sign-in flow) also runs on
    the browser path, once per model step before the SDK reads the state that follows the step's browser
    calls (:class:`controller.run.browser_driver.StepObservation`): the loop goes through the runner's
    turns (``iterate``, as its ``run`` does) to tell the driver each step's calls before they run.
    A browser call a person denied (``--confirm-actions``, ``--step``) ends the loop before the model's
    next turn runs anything (``ToolRunnerError``; the run is then ``failed`` on that denial), as a denied
    computer action does. Returns the model's final message; raises what the runner raises
    (``ToolRunnerError`` when it stops short)."""
    computer = task.computer_tools
    first = driver.capture() if computer else None
    params = browser_params(task, model, first, legacy, conversation)
    toolset = BrowserToolset(browser, members=list(task.browser_members), confirm=browser.confirm,
                             url_policy=browser.url_policy)
    names = [tool["name"] for tool in toolset.tools]
    browser.before_observe = browser_observe(driver.seam.before_capture if driver.seam.waits_before_capture else None, hooks)
    runner = ResponsesToolRunner(browser=toolset, computer=ComputerToolset(driver) if computer else None)

    def on_diagnostic(event: dict[str, Any]) -> None:
        browser.on_diagnostic(event)
        hooks.on_diagnostic(event)

    turns = runner.iterate(client, params, max_steps=steps, approve_safety_checks=approver if computer else None,
                           before_action=before_action if computer else None, cancelled=cancel,
                           on_diagnostic=on_diagnostic)
    try:
        for turn in turns:
            if browser.denied is not None:  # a person said no: the run stops there, as for a computer action
                raise ToolRunnerError(f"{browser.denied} was denied", [], [])
            browser.plan_step(turn.response.output, names)  # before the turn's tools run
            if turn.final:
                return turn.response.output_text
    finally:
        turns.close()
    raise ToolRunnerError("the tool runner ended without a final turn", [], [])


def browser_observe(before: Callable[[], bool] | None, hooks: RecordingHooks) -> Callable[[], bool] | None:
    """The browser path's ``before_observe``: the run's ``before_capture`` chain (None: nothing to run).
    The milliseconds the origin wait noted for the next screenshot line are dropped after it: no
    screenshot follows a browser state read to carry them."""
    if before is None:
        return None

    def observe() -> bool:
        try:
            return before()
        finally:
            hooks.waited_for_origin_ms = None

    return observe
