"""``desktop-sandbox console`` (the web console over recorded runs) and ``desktop-sandbox serve`` (the
local Agents API): the two commands that serve on 127.0.0.1 until stopped."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Optional

import typer

from controller.commands.common import backend_class, refuse, writable_runs_dir


def console(runs_dir: Path) -> None:
    """Serve the web console over the run records in ``runs_dir``; print ``console: <url>`` on stdout and
    serve until Ctrl-C, SIGTERM or SIGHUP (then the server stops, exit 0). Refuses (exit 2) a
    ``runs_dir`` that is not a directory."""
    from controller.console.server import ConsoleServer
    from controller.sandbox.signals import INTERRUPT_SIGNALS, SandboxInterrupted, raise_on_signals

    if runs_dir.exists() and not runs_dir.is_dir():
        refuse(f"--runs-dir {runs_dir} is not a directory")
    server = None
    try:
        with raise_on_signals(INTERRUPT_SIGNALS):  # the handler raises: the wait below ends at once
            server = ConsoleServer(runs_dir).start()
            print(f"console: {server.url}", flush=True)
            while True:
                signal.pause()
    except (KeyboardInterrupt, SandboxInterrupted):
        pass
    finally:
        if server is not None:
            server.stop()


def serve(*, port: int, key_file: Optional[Path], backend: str, image_tag: Optional[str], runs_dir: Path,
          db: Optional[Path], approval_timeout: float, ui: bool, attach_network: list[str],
          max_sessions: int, pool: int = 0) -> None:
    """Serve the Agents API (:func:`controller.agents_api.server.serve_forever`) with the command's
    options until Ctrl-C or SIGTERM. Refuses (exit 2) a bad option, key file, a database another server
    uses, or a port that cannot be had."""
    from controller.agents_api.server import KeyFileError, ServeOptions, serve_forever
    from controller.agents_api.sessions import HubOptions
    from controller.agents_api.store import StoreError
    from controller.sandbox import CapabilityMissing

    backend_class(backend)
    writable_runs_dir(runs_dir)
    if attach_network and backend != "docker":
        refuse("--attach-network needs the docker backend")
    options = ServeOptions(port=port, key_file=key_file, db=db,
                           hub=HubOptions(runs_dir=runs_dir, backend=backend, image=image_tag,
                                          approval_timeout_s=approval_timeout, attach_networks=list(attach_network),
                                          max_sessions=max_sessions, pool=pool))
    if pool:
        typer.echo(f"agents-api: keeping a warm pool of {pool} sandbox(es) (1280x800, no apps); sessions claim "
                   f"from it", err=True)
    try:
        serve_forever(options, ui=ui, say=lambda line: typer.echo(line, err=True))
    except (KeyFileError, StoreError, CapabilityMissing) as exc:  # StoreBusy is one
        refuse(str(exc))
    except (OSError, RuntimeError) as exc:  # the port is taken
        refuse(f"cannot serve: {exc}")
