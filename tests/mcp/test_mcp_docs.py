"""docs/mcp.md as written: its Python snippets run (the ``mcp`` client's on a real sandbox; the Agents SDK's
lists the tools, its model part needing a key), its commands and configurations name real options of
``desktop-sandbox mcp``, and its tools, limits and defaults are the server's."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from controller.mcp.server import READ_CAP, TOOLS
from controller.mcp.session import DEFAULT_MAX_BYTES, DEFAULT_MAX_EDGE
from wire.actions import MAX_TEXT_CHARS

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "mcp.md"


def _blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", PAGE.read_text(), flags=re.S)


SAYS = [["'screenshot', 'click'", "screenshot 1280x800 px (image/png", "clicked left at (640, 400)",
         "True point (5000,0) is outside"],
        ["screenshot 1280x800 px (image/png", "12 tools"],
        ["'run_task'"]]
"""What each Python snippet prints when it did what the page says (in the page's order)."""


def test_the_page_has_its_snippets():
    assert len(_blocks("python")) == len(SAYS)


@pytest.mark.parametrize("index", range(len(SAYS)))
def test_each_python_snippet_runs(index, docker_client, desktop_image, tmp_path):
    (tmp_path / ".venv").symlink_to(ROOT / ".venv")  # the snippets name .venv/bin/desktop-sandbox
    env = {k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"}
    env["PYTHONPATH"] = str(ROOT)
    out = subprocess.run([sys.executable, "-c", _blocks("python")[index]], capture_output=True, text=True,
                         timeout=300, cwd=tmp_path, env=env)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    for said in SAYS[index]:
        assert said in out.stdout, out.stdout[-2000:]
    if index == 0:  # the session ended with the snippet: its record is finished
        (record,) = (tmp_path / "runs").glob("*/record.jsonl")
        assert json.loads(record.read_text().splitlines()[-1])["type"] == "run_finished"


def _mcp_options() -> set[str]:
    import typer

    from controller.cli import app

    command = typer.main.get_command(app).commands["mcp"]
    return {opt for param in command.params for opt in param.opts}


def test_the_commands_and_configurations_name_real_options():
    options = _mcp_options()
    named: list[str] = []
    for block in _blocks("sh"):
        for line in block.splitlines():
            if "desktop-sandbox mcp" in line:
                named += re.findall(r"\s(--[a-z][a-z-]*)", line.split("desktop-sandbox mcp", 1)[1])
    (config,) = _blocks("json")
    server = json.loads(config)["mcpServers"]["desktop-sandbox"]
    assert server["command"].endswith("/.venv/bin/desktop-sandbox") and server["args"][0] == "mcp"
    named += [a for a in server["args"] if a.startswith("--")]
    assert named and set(named) <= options, set(named) - options


def test_the_tools_and_limits_are_the_servers():
    text = PAGE.read_text()
    listed = re.findall(r"^\| `([a-z_]+)` \|", text, flags=re.M)
    assert tuple(listed) == TOOLS
    assert f"(default **{DEFAULT_MAX_EDGE}**)" in text and f"(default **{DEFAULT_MAX_BYTES}**" in text
    assert f"(at most {READ_CAP})" in text and f"(at most {MAX_TEXT_CHARS:,} characters)" in text
    options = _mcp_options()
    for option in re.findall(r"`(--[a-z][a-z-]*)`", text):
        assert option in options, option
