"""The VM guest's session environment is derived from Dockerfile.desktop (so the two guests agree)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _module():
    spec = importlib.util.spec_from_file_location("dockerfile_env", ROOT / "scripts" / "vm" / "dockerfile-env.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_env_continuations_quotes_and_legacy_form():
    text = 'FROM x\n# c\nENV A=1 \\\n    B="two words" \\\n    C=""\nRUN echo\nENV D 4 5\n'
    assert _module().env_settings(text) == [("A", "1"), ("B", "two words"), ("C", ""), ("D", "4 5")]


def test_the_real_dockerfile_declares_what_the_session_needs():
    settings = dict(_module().env_settings((ROOT / "Dockerfile.desktop").read_text()))
    for key in ("DISPLAY", "AGENT_TOKEN_FILE", "AGENT_APPS_FILE", "AGENT_BIND", "PATH"):
        assert key in settings, key
