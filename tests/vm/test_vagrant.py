"""``vagrant/Vagrantfile`` is valid for Vagrant (with the libvirt provider Debian packages; the qemu
provider's plugin cannot be installed without rubygems.org, so its block is checked by Ruby only)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.require import require_commands

VAGRANT_DIR = Path(__file__).resolve().parents[2] / "vagrant"


def _vagrant(*args: str, **env: str) -> subprocess.CompletedProcess:
    require_commands("VAGRANT", "vagrant", install="apt-get install vagrant vagrant-libvirt")
    return subprocess.run(["vagrant", *args], cwd=VAGRANT_DIR, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "VAGRANT_CHECKPOINT_DISABLE": "1", **env})


@pytest.mark.parametrize("arch", ["amd64", "arm64"])
def test_vagrantfile_validates(arch):
    plugins = _vagrant("plugin", "list").stdout
    provider = "qemu" if "vagrant-qemu" in plugins else "libvirt"
    if provider == "libvirt" and "vagrant-libvirt" not in plugins:
        result = _vagrant("validate", "--ignore-provider", DESKTOP_SANDBOX_ARCH=arch)
    else:
        result = _vagrant("validate", DESKTOP_SANDBOX_ARCH=arch, VAGRANT_DEFAULT_PROVIDER=provider)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "validated successfully" in result.stdout


def test_vagrantfile_rejects_an_unknown_arch():
    result = _vagrant("validate", "--ignore-provider", DESKTOP_SANDBOX_ARCH="mips")
    assert result.returncode != 0
    assert "DESKTOP_SANDBOX_ARCH" in result.stdout + result.stderr
