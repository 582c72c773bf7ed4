"""``scripts/prereqs.sh`` and ``make desktop``'s first step: on a machine that lacks what
docs/getting-started.md names, the build stops within seconds, before any slow step, with one message
naming the one command to run (or, as root with apt-get, installs the missing packages itself).

The commands the script may use are offered through a PATH made of links to the real ones, leaving out
what a fresh machine lacks (debootstrap, apt-get). The base image is named on a registry at
``127.0.0.1:9`` (discard: nothing listens), so "no registry answers" is real and no traffic leaves
this machine.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.require import unavailable

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "prereqs.sh"
ABSENT_BASE = "127.0.0.1:9/desktop-sandbox-test/absent:none"
"""A base image that is not here and cannot be pulled: its registry is a closed port on loopback."""
TOOLS = ("bash", "env", "docker", "python3", "id", "timeout", "cut", "tail", "dpkg", "make", "cat", "sh")


def _docker_answers() -> bool:
    return shutil.which("docker") is not None and subprocess.run(
        ["docker", "info"], capture_output=True, check=False, timeout=30).returncode == 0


@pytest.fixture
def bare_path() -> Iterator[Path]:
    """A bin/ of links to the real :data:`TOOLS` only (no debootstrap, no apt-get, no sudo), in a
    directory any user may read (the script is also run as nobody)."""
    if not _docker_answers():
        unavailable("IMAGE", "no Docker engine answers here")
    top = Path(tempfile.mkdtemp(prefix="prereqs-"))
    top.chmod(0o755)
    bin_dir = top / "bin"
    bin_dir.mkdir(mode=0o755)
    for tool in TOOLS:
        real = sys.executable if tool == "python3" else shutil.which(tool)
        if real:  # resolved: a shim (pyenv's python3) would look for its own tool on the PATH
            (bin_dir / tool).symlink_to(os.path.realpath(real))
    yield bin_dir
    shutil.rmtree(top, ignore_errors=True)


def _run(argv: list[str], path: Path, **env: str) -> tuple[subprocess.CompletedProcess[str], float]:
    full = {"PATH": str(path), "HOME": os.environ.get("HOME", "/root"), "LANG": "C.UTF-8", **env}
    t0 = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True, env=full, timeout=120, check=False, cwd=REPO)
    return proc, time.monotonic() - t0


def test_no_debootstrap_no_registry_names_the_command_and_exits_2(bare_path: Path) -> None:
    proc, seconds = _run(["bash", str(SCRIPT), ABSENT_BASE], bare_path)
    assert proc.returncode == 2, proc.stderr
    assert "apt-get install -y debootstrap" in proc.stderr
    assert seconds < 30, f"took {seconds:.1f}s"


def test_base_image_present_needs_no_debootstrap(bare_path: Path) -> None:
    present = subprocess.run(["docker", "image", "ls", "-q", "--no-trunc"], capture_output=True, text=True,
                             check=False).stdout.split()
    if not present:
        unavailable("IMAGE", "no image on this engine to stand for a present base")
    proc, _ = _run(["bash", str(SCRIPT), present[0]], bare_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""


def test_every_missing_thing_in_one_message(bare_path: Path, tmp_path: Path) -> None:
    """Not root, no Docker access, no debootstrap, a Python without venv: one message lists all of it,
    with sudo in the command, and nothing is installed."""
    python = bare_path.parent / "python-without-venv"
    # A test double for a Debian python3 without python3-venv (its ensurepip is missing): the real
    # interpreter with ensurepip made unimportable.
    real = "/usr/bin/python3"  # the distribution's: any user may run it (a pyenv one may sit under /root)
    if not os.access(real, os.X_OK):
        pytest.skip("no /usr/bin/python3")
    python.write_text(f"#!/bin/sh\nexec {real} -c "
                      "'import sys; sys.modules[\"ensurepip\"] = None; exec(sys.argv[1])' \"$2\"\n")
    python.chmod(0o755)
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("setpriv (util-linux) is needed to run the script as another user")
        argv = [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", "bash", str(SCRIPT), ABSENT_BASE]
    else:
        argv = ["bash", str(SCRIPT), ABSENT_BASE]
    proc, seconds = _run(argv, bare_path, SYSTEM_PYTHON=str(python), DOCKER_HOST="unix:///nonexistent.sock")
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if "run:" in line]
    assert len(lines) == 1, proc.stderr
    assert "sudo apt-get install -y" in lines[0]
    assert "python3-venv" in lines[0] and "debootstrap" in lines[0]
    assert "Docker engine does not answer" in proc.stderr
    assert seconds < 30


def test_root_installs_what_is_missing_with_apt_get(bare_path: Path, tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("installs only as root")
    log = tmp_path / "apt-get.log"
    # A test double for apt-get (the real one would change this machine): it records its arguments and
    # puts a debootstrap on the PATH as the package would.
    fake = bare_path / "apt-get"
    fake.write_text(f"#!/bin/sh\necho \"$@\" >> {log}\n"
                    f"case \"$*\" in *install*) printf '#!/bin/sh\\n' > {bare_path}/debootstrap; "
                    f"chmod +x {bare_path}/debootstrap;; esac\n")
    fake.chmod(0o755)
    (bare_path / "chmod").symlink_to(shutil.which("chmod"))
    proc, _ = _run(["bash", str(SCRIPT), ABSENT_BASE], bare_path)
    assert proc.returncode == 0, proc.stderr
    assert "installing debootstrap" in proc.stdout
    assert "install -y -qq --no-install-recommends debootstrap" in log.read_text()
    # Asked to report only, it installs nothing.
    (bare_path / "debootstrap").unlink()
    log.unlink()
    proc, _ = _run(["bash", str(SCRIPT), ABSENT_BASE], bare_path, DESKTOP_SANDBOX_PREREQS_INSTALL="0")
    assert proc.returncode == 2 and "apt-get install -y debootstrap" in proc.stderr
    assert not log.exists()


def test_make_desktop_stops_before_the_slow_steps(bare_path: Path, tmp_path: Path) -> None:
    """``make desktop`` runs the check first: the Python environments are never started."""
    if shutil.which("make") is None:
        pytest.skip("make not installed")
    venv = tmp_path / "venv"
    proc, seconds = _run(["make", "--no-print-directory", "desktop", f"BASE={ABSENT_BASE}", f"VENV={venv}",
                          f"GATEWAY_VENV={tmp_path / 'gw'}"], bare_path)
    assert proc.returncode != 0
    assert "apt-get install -y debootstrap" in proc.stderr
    assert not venv.exists() and not (tmp_path / "gw").exists()
    assert seconds < 30
