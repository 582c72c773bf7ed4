"""The OpenAI Agents SDK's own loop on a desktop sandbox: examples/agents_sdk_pickup.py (an
``agents.Agent`` with ``ComputerTool(AsyncDesktopComputer(...))`` run by the SDK's ``Runner`` against the
scripted Responses server on 127.0.0.1) books the pickup and passes the task's checks, and every call the
SDK made is in the sandbox's run record (``runner: agents-sdk``). The sync ``Computer`` gives the SDK the
same image size and PNG."""

from __future__ import annotations

import base64
import io
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_sdk_runner_books_the_pickup_through_the_async_computer(docker_client, desktop_image, tmp_path):
    from controller.run.record import read_entries

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("OPENAI_API_KEY", None)
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "agents_sdk_pickup.py")], capture_output=True,
                         text=True, timeout=300, cwd=tmp_path, env=env)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "model said: done" in out.stdout
    record = Path(next(line.split(": ", 1)[1] for line in out.stdout.splitlines() if line.startswith("record: ")))
    entries = [e.model_dump() for e in read_entries(tmp_path / record)]
    assert entries[0]["runner"] == "agents-sdk" and entries[0]["mode"] == "attended"
    kinds = [a["type"] for e in entries if e["type"] == "computer_call" for a in e["actions"]]
    assert "click" in kinds and "type" in kinds and "screenshot" in kinds
    assert all(e["error"] is None for e in entries if e["type"] == "action")
    checks = [e for e in entries if e["type"] == "check"]
    assert len(checks) == 3 and all(e["passed"] for e in checks)
    assert entries[-1]["type"] == "run_finished" and entries[-1]["status"] == "passed"


def test_the_sync_computer_gives_the_sdk_png_of_its_dimensions(docker_client, desktop_image, tmp_path):
    from PIL import Image

    from desktop_sandbox import Sandbox
    from desktop_sandbox.agents import DesktopComputer

    with Sandbox.start(screen=(1600, 1000), runs_dir=tmp_path, runner="agents-sdk") as sandbox:
        computer = DesktopComputer(sandbox, max_width=800, max_height=800)
        assert computer.dimensions == (800, 500) and computer.environment == "ubuntu"
        image = Image.open(io.BytesIO(base64.b64decode(computer.screenshot())))
        assert image.format == "PNG" and image.size == (800, 500)
        computer.move(799, 499)  # the image's last pixel: inside
        computer.keypress(["shift"])
