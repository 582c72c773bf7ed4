"""``desktop-sandbox up --pool N`` (keep a warm pool and serve claims until a signal) and ``up
--capabilities`` (what each backend can do); the pool's one-line summary that ``run-suite`` prints."""

from __future__ import annotations

import signal
import statistics
from pathlib import Path
from typing import Any, Optional, Sequence

import typer
from rich.markup import escape
from rich.table import Table

from controller.commands.common import backend_class, console, refuse, say, with_arch


MAX_POOL = 64
"""Largest pool size a command takes."""


def pool_size(text: str) -> int:
    """``--pool N|auto`` as a size: ``auto`` is :func:`controller.sandbox.pool.default_size` (what a quarter of
    this host's available memory holds, at most 4); N a whole number 1..:data:`MAX_POOL`. Refuses (exit 2)
    anything else."""
    from controller.sandbox.pool import default_size

    value = text.strip().lower()
    if value == "auto":
        size = default_size()
        say(f"--pool auto: {size} (a quarter of this host's available memory over a waiting sandbox's, at most 4)")
        return size
    if not (value.isascii() and value.isdigit()) or not 1 <= int(value) <= MAX_POOL:
        refuse(f"--pool must be a number of sandboxes from 1 to {MAX_POOL}, or auto; got {text[:20]!r}")
    return int(value)


def capabilities() -> None:
    """Print one row per backend: policy swap, pool, snapshot kind, fork."""
    from controller.sandbox.capabilities import FEATURES
    from controller.sandbox.registry import capability_table

    table = Table(title="backend capabilities")
    table.add_column("backend", style="bold")
    for feature in FEATURES:
        table.add_column(feature.replace("_", " "))
    for row in capability_table():
        table.add_row(*(escape(_shown(row[key])) for key in ("backend", *FEATURES)))
    console.print(table)
    for feature, meaning in FEATURES.items():
        console.print(f"{feature.replace('_', ' ')}: {meaning}", markup=False)


def _shown(value: Any) -> str:
    return "yes" if value is True else "no" if value is False else str(value)


def pool_summary(stats: Any) -> str:
    """``warm pool: 18 hits, 2 cold starts (empty 2), claim p50 0.12s`` for a pool's :class:`PoolStats`."""
    reasons = ", ".join(f"{k} {v}" for k, v in sorted(stats.cold_reasons.items()))
    claim = f", claim p50 {statistics.median(stats.claim_s):.2f}s" if stats.claim_s else ""
    return f"warm pool: {stats.hits} hit(s), {stats.cold} cold start(s){f' ({reasons})' if reasons else ''}{claim}"


def keep_pool(image_tag: Optional[str], *, width: int, height: int, size: int, backend: str, arch: str,
              tasks: Sequence[Path] = ()) -> None:
    """Keep a warm pool of ``size`` ``backend`` sandboxes per template (each of ``tasks``: its screen and the
    apps a pool may launch for it; none: ``width`` x ``height``, no apps), deny-all until claimed, and serve
    claims on a private unix socket, printed as ``pool: SOCKET`` (stdout) with the ``run-task --pool`` line
    to use it; until Ctrl-C or SIGTERM/SIGHUP, then every sandbox not claimed is removed (exit 0). Exit 2
    for a bad task, a backend that keeps no pools for other processes, or one that cannot be reached."""
    from controller.run.tasks import TaskError, load_task
    from controller.sandbox import (INTERRUPT_SIGNALS, BackendUnavailable, CapabilityMissing, Sandbox, SandboxError,
                                    SandboxInterrupted, SandboxSpec, raise_on_signals)
    from controller.sandbox.pool import Template, WarmPool
    from controller.sandbox.pool_keeper import PoolKeeper

    cls = backend_class(backend)
    if cls.handover is Sandbox.handover:
        refuse(f"the {backend} backend keeps pools in one process only (serve --pool): its sandboxes cannot be "
               f"handed to another process")
    templates = []
    for path in tasks:
        try:
            task = load_task(path)
        except TaskError as exc:
            refuse(f"--task: cannot load task: {exc}")
        templates.append(Template.of(task.sandbox_spec(), *task.pool_apps()))
    templates = templates or [Template.of(SandboxSpec(screen_width=width, screen_height=height))]
    try:
        options = cls.ensure_image(with_arch(cls.make_options(image=image_tag), arch), say)
        pool = WarmPool(cls, options, templates, size)
    except (BackendUnavailable, CapabilityMissing, SandboxError) as exc:
        refuse(str(exc))
    keeper = PoolKeeper(pool)
    try:
        with raise_on_signals(INTERRUPT_SIGNALS):
            pool.start()
            keeper.start()
            for template in templates:
                say(f"warm pool: {size} {backend} sandbox(es) of {template} (template {template.key()}), filling "
                    f"in the background")
            say(f"claim with: desktop-sandbox run-task {tasks[0] if tasks else 'TASK'} --pool {keeper.path}")
            typer.echo(f"pool: {keeper.path}")
            full = False
            while True:
                if not full and pool.wait_ready(timeout=1.0):
                    full = True
                    say(f"warm pool: {pool.ready_count()} sandbox(es) ready")
                elif full:
                    signal.pause()
    except (KeyboardInterrupt, SandboxInterrupted):
        console.print("removing the pool's sandboxes", markup=False)
    finally:
        keeper.close()
        pool.close()
        say(pool_summary(pool.stats))
