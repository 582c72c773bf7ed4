"""What every command shares: the console on stderr, its one-line refusals (exit 2) and error lines,
the backend lookup, the guest architecture applied to a backend's options, the Docker engine, the runs
folder and the token files ``up`` writes and ``down`` removes.

Every line a command prints about its input or an error goes through :func:`say`, :func:`error` or
:func:`refuse`: control characters escaped, cut to a length, never console markup.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, NoReturn

import typer
from rich.markup import escape

from controller.run.progress import make_console
from controller.sandbox import registry
from controller.text import clean, clean_lines

console = make_console(stderr=True)
"""The commands' console: stderr (stdout carries only what a script reads: a path, an id, YAML)."""

REFUSAL_CHARS = 1000
"""Longest refusal line :func:`refuse` prints (characters)."""

ERROR_CHARS = 8000
"""Longest error message (a backend's, which may quote a console or a log) :func:`error` prints."""


def say(message: Any, limit: int = REFUSAL_CHARS, *, label: str = "", style: str | None = None) -> None:
    """Print one line on stderr literally: control characters escaped, cut to ``limit`` characters
    (:func:`controller.text.clean`), no markup, no emoji codes; after ``label`` (trusted console
    markup, e.g. ``[cyan]base[/]``) when given; in ``style`` when given."""
    text = clean(message, limit)
    if label:
        console.print(f"{label} {escape(text)}", emoji=False, highlight=False, style=style)
    else:
        console.print(text, markup=False, emoji=False, highlight=False, style=style)


def error(prefix: str, exc: BaseException) -> None:
    """Print ``prefix`` (red) and ``exc``'s message on stderr: its lines kept, each escaped
    (:func:`controller.text.clean_lines`, the last :data:`ERROR_CHARS` characters), never markup."""
    console.print(f"[red]{escape(prefix)}[/] {escape(clean_lines(exc, ERROR_CHARS))}", emoji=False, highlight=False)


def refuse(message: str) -> NoReturn:
    """Print one line (literally, no markup) to stderr and exit 2: bad input, nothing was started.

    The message may quote the input (a task's or script's keys and values): it is shown with control
    characters escaped and cut to :data:`REFUSAL_CHARS` characters (:func:`controller.text.clean`)."""
    say(message)
    raise typer.Exit(2)


def backend_class(name: str):  # noqa: ANN201 - a Sandbox subclass
    """The backend class registered as ``name``, or a one-line refusal (exit 2) naming the known ones."""
    try:
        return registry.get_backend(name)
    except KeyError:
        refuse(f"unknown backend {name!r} (one of {', '.join(registry.backend_names())})")


def with_arch(options: Any, arch: str) -> Any:
    """``options`` for guest architecture ``arch`` ('' = unchanged, the host's): a VM's options get
    ``arch``, an image tag the ``-ARCH`` suffix (``desktop-sandbox:latest-arm64``). Refuses (exit 2) an
    unknown architecture."""
    import dataclasses

    from controller.sandbox import image

    if not arch:
        return options
    try:
        arch = image.normalize_arch(arch)
    except ValueError as exc:
        refuse(f"--arch: {exc}")
    if dataclasses.is_dataclass(options) and any(f.name == "arch" for f in dataclasses.fields(options)):
        return dataclasses.replace(options, arch=arch)
    if isinstance(getattr(options, "image", None), str):
        options = dataclasses.replace(options, image=image.arch_tag(options.image, arch))
        if image.is_foreign(arch) and hasattr(options, "mem_limit"):  # qemu-user needs more (see the constant)
            options = dataclasses.replace(options, mem_limit=image.EMULATION_MEM_LIMIT)
        return options
    refuse("--arch: this backend has no per-architecture image")


def docker_client():  # noqa: ANN201
    """``docker.from_env()``, or a one-line refusal (exit 2) when the engine cannot be reached."""
    import docker
    import docker.errors

    try:
        return docker.from_env()
    except docker.errors.DockerException as exc:
        refuse(f"cannot reach the Docker engine: {exc}")


def writable_runs_dir(runs_dir: Path) -> None:
    """Make ``runs_dir`` if needed; refuse (exit 2) when run records cannot be written there."""
    try:
        runs_dir.mkdir(parents=True, exist_ok=True)
        if not os.access(runs_dir, os.W_OK | os.X_OK):
            raise PermissionError("not writable")
    except OSError as exc:
        refuse(f"--runs-dir {runs_dir}: cannot write run records there: {exc.strerror or exc}")


def token_path(sandbox_id: str) -> Path:
    """Where ``up`` keeps a sandbox's agent token: ``$XDG_RUNTIME_DIR`` (else ``~/.cache``)
    ``/desktop-sandbox/<id>.token``."""
    base = Path(os.environ.get("XDG_RUNTIME_DIR") or Path.home() / ".cache")
    return base / "desktop-sandbox" / f"{sandbox_id}.token"


def write_token(sandbox_id: str, token: str) -> Path:
    """Write the agent token to :func:`token_path` of ``sandbox_id`` (directory 0700, file 0600)."""
    token_file = token_path(sandbox_id)
    token_file.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(token)
    return token_file
