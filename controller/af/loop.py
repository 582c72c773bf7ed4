"""``run-task --runner agent-framework``: the task's model loop as an Agent Framework agent.

:func:`run_loop` is what :class:`controller.run.runner.RunOptions` calls as its ``loop`` instead of the
SDK's ``ComputerToolset.run``. Everything around the loop stays the runner's: the sandbox, readiness,
the first screenshot, the approvals (the same registry, prompt, console card and record lines),
verification from the guest's state, the record and the teardown. Inside it:

* an ``OpenAIChatClient`` (``agent-framework-openai``) on an ``openai.AsyncOpenAI`` -- against the
  offline scripted server over a transport that reaches loopback addresses only, or the live API with
  ``OPENAI_API_KEY`` -- whose HTTP responses go through the run's usage meter, so each model response
  and each computer call gets its ``model_response`` / ``computer_call`` line as in the SDK loop;
* an ``Agent`` with the task's computer tool (``{"type": "computer"}``, or the legacy
  ``computer_use_preview`` one), on one ``AgentSession``: the first message is the task's instructions
  and first screenshot, each batch of computer calls runs through
  :class:`controller.af.executor.ComputerCallExecutor`, and its results go back as one ``tool``
  message on the same session (the framework continues with ``previous_response_id``, which the
  scripted server follows);
* a batch that stops (a denial, a cancellation) sends nothing and ends the loop with
  ``ComputerUseError``: the runner then ends the run ``failed`` (a denial) or ``cancelled``.
"""

from __future__ import annotations

import asyncio
import ipaddress
from typing import Any, Awaitable, Callable, TypeVar

import httpx
from openai import AsyncOpenAI
from openai.lib.computer import ComputerUseError

from controller.af.executor import ComputerCallExecutor
from controller.af.sessions import AgentComputerUse, StepLimit

T = TypeVar("T")

POLL_S = 0.1
"""How often a model request in flight looks at the run's cancellation flag (seconds)."""


class LoopbackOnlyAsyncTransport(httpx.AsyncHTTPTransport):
    """An async httpx transport that raises ``httpx.ConnectError`` for any host that is not a loopback
    IP literal (names are refused too: no DNS lookups offline). The async twin of
    :class:`controller.run.model_client.LoopbackOnlyTransport`."""

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        host = request.url.host
        try:
            loopback = ipaddress.ip_address(host).is_loopback
        except ValueError:
            loopback = False
        if not loopback:
            raise httpx.ConnectError(f"offline mode only reaches loopback addresses; refused {host!r}",
                                     request=request)
        return await super().handle_async_request(request)


def async_client(base_url: str | None, meter: Any = None, *, api_key: str | None = None,
                 timeout_s: float | None = None) -> AsyncOpenAI:
    """``openai.AsyncOpenAI`` for the scripted server at ``base_url`` (a loopback IP URL; ValueError
    otherwise) with its key ``api_key`` (``ScriptedServer.key``; ValueError when missing), or for the live
    API when ``base_url`` is None (key from ``OPENAI_API_KEY``; ``api_key`` unused). ``meter``:
    a :class:`controller.run.model_client.UsageMeter` (the runner's ``BodyMeter``) that sees every
    response, read in full first. ``timeout_s``: per request, default 60 offline, 120 live."""

    async def hook(response: httpx.Response) -> None:
        await response.aread()
        meter.hook(response)

    hooks = {"response": [hook]} if meter is not None else {}
    if base_url is None:
        http = httpx.AsyncClient(event_hooks=hooks, timeout=timeout_s or 120.0)
        return AsyncOpenAI(http_client=http)
    if not ipaddress.ip_address(httpx.URL(base_url).host).is_loopback:
        raise ValueError(f"offline base_url must be a loopback address, got {base_url}")
    if not api_key:
        raise ValueError("the scripted server's key is needed (api_key)")
    http = httpx.AsyncClient(transport=LoopbackOnlyAsyncTransport(), trust_env=False, event_hooks=hooks,
                             timeout=timeout_s or 60.0)
    return AsyncOpenAI(api_key=api_key, base_url=base_url, http_client=http, max_retries=0)


def first_message(params: dict[str, Any]) -> Any:
    """The agent's first message from the runner's Responses request ``params``
    (:func:`controller.run.runner.build_params`): its user message's text and screenshot (a data URL,
    sent with ``detail`` high), as one Agent Framework ``Message``."""
    from agent_framework import Content, Message

    contents = []
    for part in params["input"][0]["content"]:
        if part.get("type") == "input_text":
            contents.append(Content.from_text(part["text"]))
        elif part.get("type") == "input_image":
            url = part["image_url"]
            mime = url[len("data:"):url.index(";")] if url.startswith("data:") and ";" in url else "image/png"
            contents.append(Content.from_uri(url, media_type=mime,
                                             additional_properties={"detail": part.get("detail", "high")}))
    return Message(role="user", contents=contents)


async def until_cancelled(work: Awaitable[T], cancelled: Callable[[], bool]) -> T:
    """Await ``work``, stopping it when ``cancelled()`` turns true (polled every :data:`POLL_S`
    seconds): then raises ``ComputerUseError("... cancelled")``."""
    task = asyncio.ensure_future(work)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=POLL_S)
            if done:
                return task.result()
            if cancelled():
                raise ComputerUseError("Computer run was cancelled")
    finally:
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("agent-framework-core")
    except PackageNotFoundError:  # pragma: no cover - imported, so installed
        return "?"


def run_loop(*, driver: Any, params: dict[str, Any], max_steps: int, approver: Any, before_action: Any,
             cancelled: Callable[[], bool], hooks: Any, meter: Any, base_url: str | None,
             api_key: str | None = None, console: Any = None, **_: Any) -> str | None:
    """The runner's ``loop`` (:class:`controller.run.runner.RunOptions`): run the task's model loop as
    an Agent Framework agent (see the module docstring) and return the model's final message.

    ``driver``, ``approver`` (SafetyCheckApprover), ``before_action`` (ActionGate or None),
    ``cancelled`` (the run's flag), ``hooks`` (RecordingHooks), ``meter`` (the runner's usage meter):
    the run's own; ``params``: the first Responses request (model, tool, instructions and first
    screenshot); ``max_steps``: most model responses; ``base_url`` and ``api_key``: the scripted
    server's URL and key (None: live). Raises ``ComputerUseError`` when a batch stopped (denied,
    cancelled, already attempted) or the model still asked for actions after ``max_steps`` responses;
    what the client, the driver or the guest raised otherwise."""
    return asyncio.run(_loop(driver=driver, params=params, max_steps=max_steps, approver=approver,
                             before_action=before_action, cancelled=cancelled, hooks=hooks, meter=meter,
                             base_url=base_url, api_key=api_key, console=console))


async def _loop(*, driver: Any, params: dict[str, Any], max_steps: int, approver: Any, before_action: Any,
                cancelled: Callable[[], bool], hooks: Any, meter: Any, base_url: str | None, api_key: str | None,
                console: Any) -> str | None:
    from agent_framework import Agent
    from agent_framework.openai import OpenAIChatClient

    client = async_client(base_url, meter, api_key=api_key)
    if console is not None:
        console.print(f"model loop: an Agent Framework agent (agent-framework-core {_version()})", markup=False,
                      emoji=False, highlight=False)
    try:
        chat = OpenAIChatClient(model=params["model"], async_client=client)
        agent = Agent(client=chat, tools=[dict(params["tools"][0])], name="desktop-sandbox")
        executor = ComputerCallExecutor(driver, approver, before_action=before_action, hooks=hooks,
                                        cancelled=cancelled, console=console)
        use = AgentComputerUse(agent, executor, options={"truncation": params.get("truncation", "auto")})
        try:
            turn = await until_cancelled(use.run(first_message(params), max_responses=max_steps), cancelled)
        except StepLimit as exc:
            raise ComputerUseError(str(exc)) from None
        if turn.stopped is not None:
            raise ComputerUseError(f"Computer call batch stopped: {turn.stopped.stopped} ({turn.stopped.message})")
        return turn.response.text or None
    finally:
        await client.close()


__all__ = ["LoopbackOnlyAsyncTransport", "async_client", "first_message", "run_loop", "until_cancelled"]
