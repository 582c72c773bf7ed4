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


def _copy_inputs(dest: Path) -> Path:
    """The build script's inputs (what its cache key hashes) copied to ``dest``, outside any git checkout."""
    import shutil

    for name in ("images", "guest", "wire", "scripts"):
        shutil.copytree(ROOT / name, dest / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for name in ("Dockerfile.desktop", "pyproject.toml"):
        shutil.copy2(ROOT / name, dest / name)
    return dest


def test_the_vm_image_cache_key_does_not_depend_on_where_the_checkout_is(tmp_path):
    import subprocess

    keys = []
    for where in (tmp_path / "a", tmp_path / ("a-much-longer-folder-name-" + "x" * 40) / "checkout"):
        where.mkdir(parents=True)
        script = _copy_inputs(where) / "scripts" / "build-vm-image.sh"
        out = subprocess.run(["bash", str(script), "--print-dir", "--arch", "amd64"], capture_output=True, text=True,
                             timeout=60, env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
        assert out.returncode == 0, out.stderr
        keys.append(Path(out.stdout.strip()).name)
    assert keys[0] == keys[1], keys
    assert keys[0].startswith("amd64-")
