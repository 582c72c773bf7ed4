"""``desktop-sandbox build``: the guest image (:mod:`controller.sandbox.image`) with its progress."""

from __future__ import annotations

import typer
from rich.markup import escape

from controller.commands.common import console, docker_client, error, refuse, say


def build(tag: str, base: str, *, no_cache: bool, wheelhouse: bool, verbose: bool, arch: str) -> None:
    """Build ``tag`` from ``base`` for ``arch`` ('' = the host's; a foreign one suffixes both with
    ``-ARCH``): the base imported when absent, the wheels first when ``wheelhouse``, each build step on
    stderr, then the size and build time. Exit 1 when the base or the build fails."""
    from controller.sandbox import image

    try:
        arch = image.normalize_arch(arch)
    except ValueError as exc:
        refuse(str(exc))
    tag, base = image.arch_tag(tag, arch), image.arch_tag(base, arch)
    client = docker_client()
    try:
        how = image.ensure_base(client, base, log=lambda m: say(m, label="[cyan]base[/]"), arch=arch)
    except image.BuildError as exc:
        error("base image:", exc)
        raise typer.Exit(1) from None
    say(f"{base} ({arch}): {how}", label="[cyan]base[/]")
    if wheelhouse and image.is_foreign(arch):
        image.prepare_foreign_wheelhouse(arch, log=lambda m: say(m, label="[cyan]wheels[/]"))
    elif wheelhouse:
        image.prepare_wheelhouse(client, log=lambda m: say(m, label="[cyan]wheels[/]"))

    def show(ev: image.BuildEvent) -> None:
        if ev.is_step:
            say(ev.text.split(' : ', 1)[-1], 110, label=f"[bold]{escape(f'[{ev.step}/{ev.total}]')}[/]")
        elif ev.cached:
            console.print("        [dim]cached[/]")
        elif verbose:
            say(f"        {ev.text}", 2000, style="dim")

    with console.status("building", spinner="dots"):
        try:
            result = image.build(tag, base, no_cache=no_cache, client=client, on_event=show, arch=arch)
        except image.BuildError as exc:
            error("build failed:", exc)
            raise typer.Exit(1) from None
    console.print(
        f"[green]built[/] {result.tag} ({result.image_id[:19]}): {result.size_bytes / 1e6:.0f} MB, "
        f"{result.seconds:.1f}s, {result.cached_steps}/{result.steps} steps cached"
    )
