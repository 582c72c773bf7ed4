"""The OpenAI Agents SDK's computer-use loop on a desktop sandbox, offline.

An ``agents.Agent`` with ``ComputerTool(AsyncDesktopComputer(...))``, run by the SDK's ``Runner``,
books the pickup task (tasks/pickup.toml) in the sandbox. Without ``OPENAI_API_KEY`` the model is the
task's offline script, served by the scripted Responses server on 127.0.0.1; with it, the live model
(``OPENAI_MODEL``, default run-task's). Then the task's checks run on the guest.

    .venv/bin/python examples/agents_sdk_pickup.py
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

from agents import Agent, ComputerTool, ModelSettings, RunConfig, Runner
from agents.models.openai_responses import OpenAIResponsesModel
from openai import AsyncOpenAI

from controller.offline.script import load_task_script
from controller.offline.scripted_server import ScriptedModel, ScriptedServer
from controller.run.runner import DEFAULT_MODEL
from controller.run.tasks import load_task
from desktop_sandbox import AsyncSandbox
from desktop_sandbox.agents import AsyncDesktopComputer

TASK = Path(__file__).resolve().parent.parent / "tasks" / "pickup.toml"


async def main() -> int:
    task = load_task(TASK)
    server = None
    if os.environ.get("OPENAI_API_KEY"):
        client, model, turns = AsyncOpenAI(), os.environ.get("OPENAI_MODEL", DEFAULT_MODEL), task.max_steps
    else:  # the task's offline script as the model
        scripted = ScriptedModel(load_task_script(task))
        server = ScriptedServer(scripted).start()
        client = AsyncOpenAI(base_url=server.base_url, api_key=server.key, max_retries=0)
        model, turns = scripted.model, task.max_steps + scripted.wait_allowance
    try:
        async with await AsyncSandbox.start(task=TASK, runner="agents-sdk") as sandbox:
            agent = Agent(name="pickup", instructions=task.instructions,
                          model=OpenAIResponsesModel(model=model, openai_client=client),
                          tools=[ComputerTool(AsyncDesktopComputer(sandbox))],
                          model_settings=ModelSettings(truncation="auto"))
            result = await Runner.run(agent, input="Book the pickup.", max_turns=turns,
                                      run_config=RunConfig(tracing_disabled=True))
            print("model said:", result.final_output)
            checks = await sandbox.check()
            for check in checks:
                said = check.get("detail") or f"observed {check.get('observed')!r}"
                print("check", check["kind"], check.get("target"), "passed" if check["passed"] else "FAILED", said)
            print("record:", sandbox.record_dir / "record.jsonl")
            return 0 if checks and all(c["passed"] for c in checks) else 1
    finally:
        if server is not None:
            server.stop()


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
