"""The workflow the Agent Framework tests checkpoint, and a process that restores it.

``build_workflow(base_url, key, checkpoints)``: one agent (the native computer tool, on an
``OpenAIChatClient`` against the scripted server at ``base_url`` with its ``key``) as a workflow that
checkpoints into the directory ``checkpoints``. ``python -m tests.af.flow BASE_URL CHECKPOINTS AGENT_URL
RUNS ANSWER [EARLIER_RECORD ...]`` (the server's key in ``$DS_TEST_SCRIPTED_KEY``) restores the latest
checkpoint in a fresh process, answers the restored computer requests on the agent at ``AGENT_URL``
(token in ``$DS_TEST_AGENT_TOKEN``) through :class:`controller.af.WorkflowComputerUse`, with a person who
answers every question ``ANSWER``, and prints one JSON object: the requests as restored, the batch's
outcome, the workflow's outputs, the requests still pending and the run directory.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import sys
from pathlib import Path
from typing import Any

from rich.console import Console

WORKFLOW = "desktop-sandbox-af-test"


def build_workflow(base_url: str, key: str, checkpoints: str | Path) -> tuple[Any, Any]:
    """(workflow, its FileCheckpointStorage)."""
    from agent_framework import Agent, FileCheckpointStorage, WorkflowBuilder
    from agent_framework.openai import OpenAIChatClient

    from controller.af.loop import async_client

    chat = OpenAIChatClient(model="scripted", async_client=async_client(base_url, api_key=key))
    agent = Agent(client=chat, tools=[chat.get_computer_tool()], name="computer")
    storage = FileCheckpointStorage(str(checkpoints))
    return WorkflowBuilder(start_executor=agent, checkpoint_storage=storage, name=WORKFLOW).build(), storage


def describe_requests(result: Any) -> list[dict[str, Any]]:
    """The pending computer requests of a workflow result: request id, call id, actions, checks."""
    from controller.af import computer_requests

    return [{"request_id": e.request_id, "call_id": e.data.call_id, "actions": e.data.actions,
             "checks": e.data.pending_safety_checks or [], "raw": e.data.raw_representation is not None}
            for e in computer_requests(result)]


def describe_outputs(result: Any) -> list[list[dict[str, Any]]]:
    """The workflow's outputs (agent responses) as their messages' contents: type, call id, text."""
    out = []
    for response in result.get_outputs() if result is not None else []:
        out.append([{"role": m.role, "type": c.type, "call_id": getattr(c, "call_id", None),
                     "text": c.message if c.type == "error" else getattr(c, "text", None),
                     "acknowledged": getattr(c, "acknowledged_safety_checks", None)}
                    for m in response.messages for c in m.contents])
    return out


async def resume(base_url: str, checkpoints: str, agent_url: str, runs: str, answer: str,
                 earlier: list[str]) -> dict[str, Any]:
    """Restore the latest checkpoint and answer its computer requests (see the module docstring)."""
    from controller.af import SandboxComputer, WorkflowComputerUse
    from controller.agent_client import AgentClient
    from controller.run.driver import ScreenshotPolicy

    workflow, storage = build_workflow(base_url, os.environ["DS_TEST_SCRIPTED_KEY"], checkpoints)
    latest = await storage.get_latest(workflow_name=WORKFLOW)
    console_text = io.StringIO()
    with AgentClient(agent_url, os.environ["DS_TEST_AGENT_TOKEN"]) as agent, \
            SandboxComputer(agent, runs_dir=runs, name="af-resume", asker=lambda question: answer,
                            policy=ScreenshotPolicy(max_width=1280, max_height=800), earlier_records=earlier,
                            console=Console(file=console_text, width=200, emoji=False)) as computer:
        use = WorkflowComputerUse(workflow, computer.executor)
        restored = await workflow.run(checkpoint_id=latest.checkpoint_id)
        result = await use.answer(restored)
        outcome = use.outcomes[-1]
        return {"restored": describe_requests(restored),
                "outcome": {"stopped": outcome.stopped, "ran": outcome.ran, "not_run": outcome.not_run},
                "outputs": describe_outputs(result), "pending": describe_requests(result),
                "record": str(computer.record_dir), "console": console_text.getvalue()}


def main(argv: list[str]) -> int:
    base_url, checkpoints, agent_url, runs, answer, *earlier = argv
    print(json.dumps(asyncio.run(resume(base_url, checkpoints, agent_url, runs, answer, earlier))))
    return 0


if __name__ == "__main__":
    import controller.af  # noqa: F401 - the framework's experimental-feature warning is silenced there

    sys.exit(main(sys.argv[1:]))
