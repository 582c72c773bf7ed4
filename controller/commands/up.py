"""``desktop-sandbox up``: start a sandbox, print how to reach its agent, keep it until a signal (or
``down``, when detached); and the table it prints."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any, Optional

import typer
from rich.markup import escape
from rich.table import Table

from controller.commands.common import backend_class, console, error, refuse, say, with_arch, write_token


def policy_toml(policy: Any) -> str:
    """The policy as the ``[network]`` table of a task file (canonical origins), e.g.
    ``mode = "allowlist"`` / ``allow = ["https://example.com:443"]`` on separate lines."""
    data = policy.model_dump(mode="json") if hasattr(policy, "model_dump") else dict(policy)
    lines = [f"mode = {json.dumps(data.get('mode', 'deny-all'))}"]
    for key in ("allow", "allow_addresses"):
        if data.get(key):
            lines.append(f"{key} = [{', '.join(json.dumps(v) for v in data[key])}]")
    return "\n".join(lines)


def guest_description(sandbox: Any) -> str:
    """What runs a started sandbox's guest, for a person: its architecture where the backend knows it,
    and whether it runs under emulation (``time_scale`` above 1: deadlines stretched by it)."""
    arch = getattr(sandbox, "arch", "") or ""
    accel = getattr(sandbox, "accel", "") or ""
    scale = float(getattr(sandbox, "time_scale", 1.0) or 1.0)
    parts = [p for p in (arch, f"accel {accel}" if accel else "") if p]
    if scale > 1.0:
        parts.append(f"under emulation: deadlines x{scale:g}")
    return ", ".join(parts)


def sandbox_table(sandbox_id: str, agent_url: str, ready_s: float | None, policy: Any, token_file: Path,
                  detached: bool, guest: str = "") -> Table:
    """What ``up`` prints: id, agent URL, readiness time, ``guest`` (what runs it, e.g. ``arm64 VM
    under emulation (TCG)``; left out when empty), the policy in TOML form, the token file (0600) with
    example ``curl`` lines (the display, launching a terminal on the empty desktop, a screenshot to
    ``screen.png``), and how to remove the sandbox."""
    table = Table(show_header=False)
    table.add_column("what", style="bold", no_wrap=True)
    table.add_column("value", overflow="fold")
    table.add_row("sandbox", escape(sandbox_id))
    table.add_row("agent", escape(agent_url))
    if ready_s is not None:
        table.add_row("ready in", f"{ready_s:.1f}s")
    if guest:
        table.add_row("guest", escape(guest))
    table.add_row(escape("policy [network]"), escape(policy_toml(policy)))
    kept = "kept until `down`" if detached else "removed on exit"
    table.add_row("token file", escape(f"{token_file} (0600, {kept})"))
    auth = f'-H "Authorization: Bearer $(cat {token_file})"'
    table.add_row("try", escape(f"curl -s {auth} {agent_url}/v1/display"))
    table.add_row("launch", escape(f"curl -s {auth} -H 'Content-Type: application/json' -d '{{\"app\": "
                                   f"\"terminal\"}}' {agent_url}/v1/launch   (the desktop is empty until "
                                   f"an app is launched: terminal or browser)"))
    table.add_row("screenshot", escape(f"curl -s {auth} -o screen.png {agent_url}/v1/screenshot"))
    remove = f"desktop-sandbox down {sandbox_id}"
    table.add_row("remove", escape(remove if detached else f"Ctrl-C here, or {remove} from another shell"))
    return table


def up(image_tag: Optional[str], *, width: int, height: int, allow: list[str], detach: bool, backend: str,
       arch: str) -> None:
    """Start a ``backend`` sandbox of ``width`` x ``height`` allowing ``allow`` (none: deny all), print
    :func:`sandbox_table`, and keep it until Ctrl-C or SIGTERM/SIGHUP (then it and its token file are
    removed, exit 0); with ``detach`` print its id and leave both. A signal during the start abandons
    it (exit 130); a failed start exits 1."""
    from pydantic import ValidationError

    from controller.gateway.policy import NetworkPolicy
    from controller.sandbox import (INTERRUPT_SIGNALS, BackendUnavailable, SandboxError, SandboxInterrupted,
                                    SandboxSpec, raise_on_signals, signals_deferred)
    from controller.validation import describe_validation_error

    backend_cls = backend_class(backend)
    try:
        network = NetworkPolicy(mode="allowlist" if allow else "deny-all", allow=list(allow))
    except ValidationError as exc:
        refuse(f"--allow: {describe_validation_error(exc, known_keys=NetworkPolicy.model_fields)}")
    spec = SandboxSpec(screen_width=width, screen_height=height, policy=network.model_dump(mode="json"),
                       ready_timeout=backend_cls.default_ready_timeout)
    options = with_arch(backend_cls.make_options(image=image_tag, detached=detach), arch)
    sandbox = None
    token_file: Path | None = None
    # From the start to the removal a signal never cuts a step in half: it is noted (the start itself
    # abandons at its next step) and acted on where nothing is half done; only the wait for Ctrl-C
    # below raises on it. Whatever exists is removed in `finally`.
    with signals_deferred(redeliver=False) as noted:
        try:
            say(f"starting a {backend} sandbox (ready within {spec.ready_timeout:g}s, or it is removed)")
            try:
                with console.status("starting sandbox"):
                    sandbox = backend_cls.start(spec, options)
            except (KeyboardInterrupt, SandboxInterrupted) as exc:
                noted.append(signal.SIGINT if isinstance(exc, KeyboardInterrupt) else exc.signum)
            except (SandboxError, BackendUnavailable) as exc:  # nothing of it is left: the backend removed it
                error("cannot start the sandbox:", exc)
                raise typer.Exit(1) from None
            if noted:  # before the token file exists: the start is abandoned
                console.print(f"cancelled ({signal.Signals(noted[0]).name}): the sandbox start was abandoned",
                              markup=False)
                raise typer.Exit(130)
            # from here a signal ends a started sandbox the usual way (removed, exit 0), also one that
            # comes while the token file is written or the table printed
            token_file = write_token(sandbox.id, sandbox.agent_token)
            table = sandbox_table(sandbox.id, sandbox.agent_url, sandbox.ready_seconds, network, token_file,
                                  detach, guest_description(sandbox))
            console.print(table)
            if detach:
                typer.echo(sandbox.id)
                sandbox = token_file = None  # both stay until `down`
                return
            try:
                with raise_on_signals(INTERRUPT_SIGNALS):
                    if noted:  # came while the table was printed
                        raise SandboxInterrupted(noted[0])
                    while True:
                        signal.pause()  # until Ctrl-C or SIGTERM/SIGHUP
            except (KeyboardInterrupt, SandboxInterrupted):
                console.print("removing sandbox")
        finally:
            if token_file is not None:
                token_file.unlink(missing_ok=True)
            if sandbox is not None:
                sandbox.close()
