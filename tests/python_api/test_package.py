"""The package as users get it: a wheel built from this checkout and installed plainly (``pip install``
of the wheel, base dependencies only) imports ``desktop_sandbox`` and says which extra its API needs;
every snippet of docs/python-api.md runs as written, on real sandboxes."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "python-api.md"


def _snippets() -> list[str]:
    return re.findall(r"```python\n(.*?)```", PAGE.read_text(), flags=re.S)


def test_a_plain_install_of_the_wheel_imports_the_package(tmp_path):
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--disable-pip-version-check", "-w",
                    str(wheels), str(ROOT)], check=True, timeout=300, cwd=tmp_path)
    (wheel,) = wheels.glob("desktop_sandbox-*.whl")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", str(wheel)],
                   check=True, timeout=600)
    probe = ("import desktop_sandbox, sys\n"
             "print(desktop_sandbox.__version__, desktop_sandbox.API_VERSION)\n"
             "try:\n    desktop_sandbox.Sandbox\nexcept ImportError as exc:\n    print('needs:', exc)\n")
    out = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    version, api, *rest = out.stdout.split()
    assert version == "0.1.0" and api == "1"
    assert "desktop-sandbox[controller]" in out.stdout  # the plain install has no controller: said so


def test_the_examples_page_has_its_snippets():
    snippets = _snippets()
    assert len(snippets) >= 5 and all("desktop_sandbox" in s for s in snippets)


@pytest.mark.parametrize("index", range(len(_snippets())))
def test_each_snippet_of_the_examples_page_runs(index, docker_client, desktop_image, tmp_path):
    (tmp_path / "tasks").symlink_to(ROOT / "tasks")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DESKTOP_SANDBOX_IMAGE": desktop_image}
    env.pop("OPENAI_API_KEY", None)
    out = subprocess.run([sys.executable, "-c", _snippets()[index]], capture_output=True, text=True, timeout=300,
                         cwd=tmp_path, env=env)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    said = SAYS[index] if index < len(SAYS) else ""
    assert said in out.stdout, out.stdout[-2000:]


SAYS = ["b'hello\\n'", "refused, nothing sent", "denied: nothing reached the desktop", "passed", "320 200"]
"""What each snippet prints when it did what the page says (in the page's order)."""


def test_the_agents_sdk_page_offline_snippet_runs(docker_client, desktop_image, tmp_path):
    """docs/agents-sdk.md's offline snippet (the SandboxAgent client's session API, no model) runs as written."""
    text = (ROOT / "docs" / "agents-sdk.md").read_text()
    (snippet,) = [s for s in re.findall(r"```python\n(.*?)```", text, flags=re.S) if "client.create" in s]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", snippet], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                         env=env)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    assert out.stdout.split()[:2] == ["sandbox", "/home/sandbox"] and "b'hello\\n'" in out.stdout
