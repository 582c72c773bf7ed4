"""Build the guest image (``Dockerfile.desktop``) with the docker SDK, showing progress.

When the base image (``debian:bookworm-slim`` by default) is absent and cannot be pulled (no registry),
``scripts/import-base.sh`` builds it from Debian's packages with debootstrap and tags it under the same
name, so the Dockerfile builds unchanged: the air-gapped path.

Other architectures (``arch="arm64"`` on an x86-64 host) build from the same Dockerfile and provisioning
under emulation (Debian's qemu-user-static through the kernel's binfmt_misc): the base is imported with
``debootstrap --arch`` under its own tag (``debian:bookworm-slim-arm64``), the image is tagged with the
architecture as a suffix (``desktop-sandbox:latest-arm64``), and the Python wheels are fetched on the host
for the target platform (``build/wheelhouse-arm64/``) so pip does not resolve and download under emulation.
"""

from __future__ import annotations

import io
import platform
import re
import subprocess
import sys
import tarfile
import tempfile
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import docker
import docker.errors

from controller.model.errors import DesktopSandboxError

REPO_ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = "Dockerfile.desktop"
DEFAULT_TAG = "desktop-sandbox:latest"
DEFAULT_BASE = "debian:bookworm-slim"
IMPORT_BASE_SCRIPT = REPO_ROOT / "scripts" / "import-base.sh"
BINFMT_SCRIPT = REPO_ROOT / "scripts" / "binfmt-register.sh"
BINFMT_MISC = Path("/proc/sys/fs/binfmt_misc")
WHEELHOUSE = REPO_ROOT / "wheelhouse"
IMAGE_PYTHON = (3, 11)
"""Python of the image's base (Debian bookworm's python3); host wheels fit only when it matches."""
_DOCKER_ARCH = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}
ARCHES = ("amd64", "arm64")
"""Architectures the image builds for (Debian and Docker names)."""
_WHEEL_PLATFORMS = {
    "amd64": ["manylinux2014_x86_64", "manylinux_2_17_x86_64", "manylinux_2_28_x86_64", "manylinux_2_34_x86_64"],
    "arm64": ["manylinux2014_aarch64", "manylinux_2_17_aarch64", "manylinux_2_28_aarch64", "manylinux_2_34_aarch64"],
}
"""pip ``--platform`` tags a bookworm guest (glibc 2.36) installs, per architecture."""
EMULATION_TIME_SCALE = 5.0
"""``Sandbox.time_scale`` of a container whose image is of a foreign architecture (an arm64 image on an
x86-64 host: every guest process runs under qemu-user-static). Readiness deadlines and the offline
script's screen expectations are multiplied by it, the way ``controller.sandbox.vm.TCG_TIME_SCALE`` does
for a VM under TCG; measured figures are in docs/arm64.md ("Measured here")."""
EMULATION_MEM_LIMIT = "4g"
"""The desktop container's memory limit under emulation (``--arch`` of a foreign architecture): every
guest process carries qemu-user's translated code besides its own memory, and Firefox's parent process
alone reached 800 MB here, so the native 2g limit killed it (memory cgroup OOM) mid-task."""
_CONTEXT = ("Dockerfile.desktop", "pyproject.toml", "images", "guest", "wire", "controller")
"""What .dockerignore lets into the build context, besides wheelhouse/ (kept in step with it)."""

_STEP = re.compile(r"^Step (\d+)/(\d+) : (.*)$")


class BuildError(DesktopSandboxError, RuntimeError):
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


def normalize_arch(arch: str | None) -> str:
    """``arch`` as a Debian/Docker architecture name (``amd64``, ``arm64``; ``x86_64``/``aarch64`` are
    accepted); ``None`` or empty: the host's. Raises ValueError for an architecture the image does not
    build for."""
    if not arch:
        return host_arch()
    name = _DOCKER_ARCH.get(arch.lower().removeprefix("linux/"))
    if name not in ARCHES:
        raise ValueError(f"unknown architecture {arch!r} (one of {', '.join(ARCHES)})")
    return name


def host_arch() -> str:
    """The host's CPU architecture as a Debian/Docker name (``amd64`` on x86-64, ``arm64`` on aarch64)."""
    machine = platform.machine().lower()
    return _DOCKER_ARCH.get(machine, machine)


def is_foreign(arch: str | None) -> bool:
    """Whether ``arch`` differs from the host's, i.e. its binaries run under emulation here."""
    return normalize_arch(arch) != host_arch()


def arch_tag(tag: str, arch: str | None) -> str:
    """``tag`` for ``arch``: unchanged for the host's architecture, else suffixed with it
    (``desktop-sandbox:latest`` -> ``desktop-sandbox:latest-arm64``; a tag already ending in
    ``-arm64`` is kept)."""
    arch = normalize_arch(arch)
    if arch == host_arch() or tag.endswith(f"-{arch}"):
        return tag
    return f"{tag}-{arch}" if ":" in tag.rsplit("/", 1)[-1] else f"{tag}:latest-{arch}"


def time_scale_of(image_arch: str | None) -> float:
    """``Sandbox.time_scale`` of a container of an image built for ``image_arch`` (its ``Architecture``):
    1.0 for the host's (or unknown), :data:`EMULATION_TIME_SCALE` for a foreign one."""
    try:
        return EMULATION_TIME_SCALE if image_arch and is_foreign(image_arch) else 1.0
    except ValueError:
        return 1.0


def arch_of_tag(tag: str) -> str:
    """The architecture a tag names by its ``-ARCH`` suffix (``desktop-sandbox:latest-arm64`` -> ``arm64``),
    else the host's."""
    for arch in ARCHES:
        if tag.endswith(f"-{arch}"):
            return arch
    return host_arch()


def platform_of(arch: str | None) -> str:
    """The Docker platform string of ``arch`` (``linux/arm64``)."""
    return f"linux/{normalize_arch(arch)}"


_QEMU_CPU = {"amd64": "x86_64", "arm64": "aarch64"}


def ensure_emulation(arch: str | None) -> None:
    """Make sure this host's kernel runs binaries of ``arch`` (a no-op for the host's own): its QEMU
    user-mode handler (``qemu-aarch64`` for arm64) is registered with binfmt_misc, else
    ``scripts/binfmt-register.sh`` registers it (root; from the QEMU packages' description).

    Raises BuildError saying what is missing when it cannot be done (no qemu-user-static, not root).
    """
    arch = normalize_arch(arch)
    if not is_foreign(arch) or (BINFMT_MISC / f"qemu-{_QEMU_CPU[arch]}").exists():
        return
    proc = subprocess.run([str(BINFMT_SCRIPT), arch], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise BuildError(f"{arch} binaries cannot run on this host: {proc.stderr.strip()[-400:]}")


def ensure_base(client: docker.DockerClient, base: str = DEFAULT_BASE,
                log: Callable[[str], None] = print, *, arch: str | None = None) -> str:
    """Make sure ``base`` exists locally for ``arch`` (default the host's): present, else pulled, else
    imported with debootstrap (``--arch``; a foreign architecture under qemu-user-static).

    Returns how it was obtained: ``present`` | ``pulled`` | ``imported``. Raises BuildError when the
    import script fails (it needs root and debootstrap) or a present image is of another architecture.
    """
    arch = normalize_arch(arch)
    try:
        found = client.images.get(base)
        if (found.attrs.get("Architecture") or arch) != arch:
            raise BuildError(f"{base} is {found.attrs.get('Architecture')}, not {arch}; "
                             f"use --base {arch_tag(base, arch)}")
        return "present"
    except docker.errors.ImageNotFound:
        pass
    name, _, tag = base.partition(":")
    try:
        log(f"pulling {base} ({arch}) ...")
        client.images.pull(name, tag=tag or "latest", platform=platform_of(arch))
        return "pulled"
    except docker.errors.APIError as exc:
        log(f"cannot pull {base} ({exc.explanation or exc}); importing it with debootstrap")
    proc = subprocess.run([str(IMPORT_BASE_SCRIPT), base, "bookworm", "http://deb.debian.org/debian", arch],
                          check=False)
    if proc.returncode != 0:
        raise BuildError(f"{IMPORT_BASE_SCRIPT.name} failed with status {proc.returncode}")
    return "imported"


def image_requirements() -> list[str]:
    """The requirement strings the image installs: the project's dependencies plus the ``gateway`` extra
    (the same list Dockerfile.desktop reads from pyproject.toml)."""
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    return list(project["dependencies"]) + list(project.get("optional-dependencies", {}).get("gateway", []))


def _wheels_up_to_date(folder: Path, key: str, log: Callable[[str], None], what: str) -> int:
    """The number of wheels in ``folder`` when its ``.requirements`` stamp says they were made for ``key``
    (Python, architecture, requirements; logged as ``what``: N wheels, up to date); otherwise 0, the stamp
    and the wheels removed so they are made again."""
    stamp = folder / ".requirements"
    wheels = list(folder.glob("*.whl"))
    if wheels and stamp.is_file() and stamp.read_text() == key:
        log(f"{what}: {len(wheels)} wheels, up to date")
        return len(wheels)
    stamp.unlink(missing_ok=True)
    for old in wheels:
        old.unlink()
    return 0


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
    fresh = _wheels_up_to_date(WHEELHOUSE, key, log, "wheelhouse")
    if fresh:
        return fresh
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


def foreign_wheelhouse(arch: str) -> Path:
    """Where the wheels for a foreign ``arch`` are kept (``build/wheelhouse-arm64/``): the build context
    carries them as its wheelhouse/, so the shared wheelhouse/ of the host's builds is never touched."""
    return REPO_ROOT / "build" / f"wheelhouse-{arch}"


def prepare_foreign_wheelhouse(arch: str, log: Callable[[str], None] = print) -> int:
    """Fill ``foreign_wheelhouse(arch)`` with wheels of ``image_requirements()`` for ``arch`` and the
    image's Python, downloaded by the host's pip (``--platform manylinux..._aarch64``), so the emulated
    build installs them offline instead of running pip's resolver under emulation.

    Dependencies published only as source (pure Python, e.g. pyperclip) are built once on the host into
    the same folder first: their wheels are ``py3-none-any`` and fit every architecture. Returns the
    number of wheels; 0 (folder emptied, the build uses PyPI) when pip cannot satisfy every requirement
    with binary wheels.
    """
    arch = normalize_arch(arch)
    folder = foreign_wheelhouse(arch)
    folder.mkdir(parents=True, exist_ok=True)
    requirements = image_requirements()
    stamp = folder / ".requirements"
    key = "\n".join([f"{IMAGE_PYTHON[0]}.{IMAGE_PYTHON[1]} {arch}", *requirements]) + "\n"
    fresh = _wheels_up_to_date(folder, key, log, f"wheelhouse ({arch})")
    if fresh:
        return fresh
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    log(f"wheelhouse ({arch}): pure-Python wheels with the host's pip, then {arch} wheels from the index")
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([*pip, "wheel", "--quiet", "--wheel-dir", tmp, *requirements], check=False)
        for wheel in Path(tmp).glob("*-none-any.whl"):
            wheel.rename(folder / wheel.name)
    platforms = [arg for tag in _WHEEL_PLATFORMS[arch] for arg in ("--platform", tag)]
    proc = subprocess.run(
        [*pip, "download", "--quiet", "--only-binary=:all:", "--implementation", "cp",
         "--python-version", f"{IMAGE_PYTHON[0]}.{IMAGE_PYTHON[1]}", *platforms,
         "--find-links", str(folder), "--dest", str(folder), *requirements],
        check=False,
    )
    if proc.returncode != 0:
        for old in folder.glob("*.whl"):
            old.unlink()
        log(f"wheelhouse ({arch}): pip download failed; the build installs from PyPI under emulation")
        return 0
    count = len(list(folder.glob("*.whl")))
    stamp.write_text(key)
    log(f"wheelhouse ({arch}): {count} wheels")
    return count


def _context_tar(wheelhouse: Path) -> io.BytesIO:
    """The build context as .dockerignore admits it, with ``wheelhouse`` as its wheelhouse/."""
    def keep(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        parts = Path(info.name).parts
        if "__pycache__" in parts or ".pytest_cache" in parts or info.name.endswith(".pyc"):
            return None
        return info

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name in _CONTEXT:
            tar.add(str(REPO_ROOT / name), arcname=name, filter=keep)
        tar.add(str(wheelhouse), arcname="wheelhouse", filter=keep)
    buf.seek(0)
    return buf


def build(
    tag: str = DEFAULT_TAG,
    base: str = DEFAULT_BASE,
    *,
    no_cache: bool = False,
    client: docker.DockerClient | None = None,
    on_event: Callable[[BuildEvent], None] | None = None,
    arch: str | None = None,
) -> BuildResult:
    """Build ``Dockerfile.desktop`` from the repository root and tag it ``tag``.

    ``arch`` (default the host's) selects the platform (``linux/arm64``); a foreign one builds under
    emulation with ``foreign_wheelhouse(arch)`` as the context's wheelhouse/. ``on_event`` receives every
    output line as it streams. Raises BuildError on a failed step.
    """
    client = client or docker.from_env()
    on_event = on_event or (lambda ev: None)
    arch = normalize_arch(arch)
    step = total = cached = 0
    image_id = ""
    tail: list[str] = []
    t0 = time.monotonic()
    common = dict(dockerfile=DOCKERFILE, tag=tag, buildargs={"BASE_IMAGE": base}, nocache=no_cache,
                  rm=True, forcerm=True, decode=True)
    if is_foreign(arch):
        ensure_emulation(arch)
        folder = foreign_wheelhouse(arch)
        folder.mkdir(parents=True, exist_ok=True)
        # Emulated steps take minutes of CPU: a low CPU weight (the build's `nice`) keeps the host's other
        # work responsive; it costs nothing when the CPUs are otherwise idle.
        stream = client.api.build(fileobj=_context_tar(folder), custom_context=True,
                                  platform=platform_of(arch), container_limits={"cpushares": 256}, **common)
    else:
        stream = client.api.build(path=str(REPO_ROOT), **common)
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
