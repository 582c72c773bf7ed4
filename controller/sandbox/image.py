"""Build the guest image (``Dockerfile.desktop``) with the docker SDK, showing progress.

When the base image (``debian:bookworm-slim`` by default) is absent and cannot be pulled (no registry),
``scripts/import-base.sh`` builds it from Debian's packages with debootstrap and tags it under the same
name, so the Dockerfile builds unchanged: the air-gapped path.
"""

from __future__ import annotations

import platform
import re
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import docker
import docker.errors

REPO_ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = "Dockerfile.desktop"
DEFAULT_TAG = "desktop-sandbox:latest"
DEFAULT_BASE = "debian:bookworm-slim"
IMPORT_BASE_SCRIPT = REPO_ROOT / "scripts" / "import-base.sh"
WHEELHOUSE = REPO_ROOT / "wheelhouse"
IMAGE_PYTHON = (3, 11)
"""Python of the image's base (Debian bookworm's python3); host wheels fit only when it matches."""
_DOCKER_ARCH = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}

_STEP = re.compile(r"^Step (\d+)/(\d+) : (.*)$")


class BuildError(RuntimeError):
    """The image build failed; the message carries the builder's error and the last output lines."""


@dataclass(frozen=True)
class BuildResult:
    """A built image: ``tag``, ``image_id`` (``sha256:...``), ``size_bytes`` (uncompressed, as
    ``docker images`` shows), ``seconds`` (wall time of the build, base import excluded), ``cached_steps``
    (steps answered from the layer cache) out of ``steps``."""

    tag: str
    image_id: str
    size_bytes: int
    seconds: float
    steps: int
    cached_steps: int


@dataclass(frozen=True)
class BuildEvent:
    """One progress event: ``step``/``total`` (0 when unknown), ``text`` (one output line), ``is_step``
    (the line starts a Dockerfile step), ``cached`` (that step came from the layer cache)."""

    step: int
    total: int
    text: str
    is_step: bool = False
    cached: bool = False


def ensure_base(client: docker.DockerClient, base: str = DEFAULT_BASE,
                log: Callable[[str], None] = print) -> str:
    """Make sure ``base`` exists locally: present, else pulled, else imported with debootstrap.

    Returns how it was obtained: ``present`` | ``pulled`` | ``imported``. Raises BuildError when the
    import script fails (it needs root and debootstrap).
    """
    try:
        client.images.get(base)
        return "present"
    except docker.errors.ImageNotFound:
        pass
    name, _, tag = base.partition(":")
    try:
        log(f"pulling {base} ...")
        client.images.pull(name, tag=tag or "latest")
        return "pulled"
    except docker.errors.APIError as exc:
        log(f"cannot pull {base} ({exc.explanation or exc}); importing it with debootstrap")
    proc = subprocess.run([str(IMPORT_BASE_SCRIPT), base], check=False)
    if proc.returncode != 0:
        raise BuildError(f"{IMPORT_BASE_SCRIPT.name} failed with status {proc.returncode}")
    return "imported"


def image_requirements() -> list[str]:
    """The requirement strings the image installs: the project's dependencies plus the ``gateway`` extra
    (the same list Dockerfile.desktop reads from pyproject.toml)."""
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    return list(project["dependencies"]) + list(project.get("optional-dependencies", {}).get("gateway", []))


def prepare_wheelhouse(client: docker.DockerClient, log: Callable[[str], None] = print) -> int:
    """Fill ``wheelhouse/`` with wheels of ``image_requirements()`` built by the host's pip.

    Only when the host's Python is the image's (3.11) and its CPU architecture is the engine's, so the
    wheels install unchanged in the image; otherwise the wheelhouse is emptied and the build uses PyPI.
    Returns the number of wheels. Raises BuildError when pip fails.
    """
    WHEELHOUSE.mkdir(exist_ok=True)
    requirements = image_requirements()
    host_arch = _DOCKER_ARCH.get(platform.machine().lower(), platform.machine())
    stamp = WHEELHOUSE / ".requirements"
    key = "\n".join([f"{sys.version_info[0]}.{sys.version_info[1]} {host_arch}", *requirements]) + "\n"
    wheels = list(WHEELHOUSE.glob("*.whl"))
    if wheels and stamp.is_file() and stamp.read_text() == key:
        log(f"wheelhouse: {len(wheels)} wheels, up to date")
        return len(wheels)
    stamp.unlink(missing_ok=True)
    for old in wheels:
        old.unlink()
    engine_arch = _DOCKER_ARCH.get(str(client.version().get("Arch", "")).lower(), "?")
    if sys.version_info[:2] != IMAGE_PYTHON or host_arch != engine_arch:
        log(f"wheelhouse: host Python {sys.version_info[0]}.{sys.version_info[1]}/{host_arch} does not match "
            f"the image's {IMAGE_PYTHON[0]}.{IMAGE_PYTHON[1]}/{engine_arch}; the build installs from PyPI")
        return 0
    log("wheelhouse: building wheels of the image's Python dependencies with the host's pip")
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--disable-pip-version-check",
         "--wheel-dir", str(WHEELHOUSE), *requirements],
        check=False,
    )
    if proc.returncode != 0:
        raise BuildError(f"pip wheel failed with status {proc.returncode}")
    count = len(list(WHEELHOUSE.glob("*.whl")))
    stamp.write_text(key)
    log(f"wheelhouse: {count} wheels")
    return count


def build(
    tag: str = DEFAULT_TAG,
    base: str = DEFAULT_BASE,
    *,
    no_cache: bool = False,
    client: docker.DockerClient | None = None,
    on_event: Callable[[BuildEvent], None] | None = None,
) -> BuildResult:
    """Build ``Dockerfile.desktop`` from the repository root and tag it ``tag``.

    ``on_event`` receives every output line as it streams. Raises BuildError on a failed step.
    """
    client = client or docker.from_env()
    on_event = on_event or (lambda ev: None)
    step = total = cached = 0
    image_id = ""
    tail: list[str] = []
    t0 = time.monotonic()
    stream = client.api.build(
        path=str(REPO_ROOT),
        dockerfile=DOCKERFILE,
        tag=tag,
        buildargs={"BASE_IMAGE": base},
        nocache=no_cache,
        rm=True,
        forcerm=True,
        decode=True,
    )
    for chunk in stream:
        if "error" in chunk:
            raise BuildError(chunk["error"].strip() + "\n" + "\n".join(tail[-30:]))
        if "aux" in chunk and isinstance(chunk["aux"], dict) and "ID" in chunk["aux"]:
            image_id = chunk["aux"]["ID"]
        text = chunk.get("stream", "")
        for line in text.splitlines():
            line = line.rstrip()
            if not line:
                continue
            tail = (tail + [line])[-60:]
            m = _STEP.match(line)
            if m:
                step, total = int(m.group(1)), int(m.group(2))
                on_event(BuildEvent(step, total, line, is_step=True))
            elif line.strip() == "---> Using cache":
                cached += 1
                on_event(BuildEvent(step, total, line, cached=True))
            else:
                on_event(BuildEvent(step, total, line))
    seconds = time.monotonic() - t0
    image = client.images.get(tag)
    return BuildResult(tag, image_id or image.id, int(image.attrs.get("Size", 0)), seconds, total, cached)
