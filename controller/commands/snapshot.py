"""``desktop-sandbox snapshot``: save a running sandbox as a snapshot; ``desktop-sandbox up --from``:
start sandboxes restored from one (:mod:`controller.sandbox.snapshot`).

``snapshot`` reaches a sandbox that another process started (``up``, ``up --detach``) by its id: the
Docker backend finds its containers by label and reads the tokens from their files
(``DockerSandbox.attach``). A backend that cannot reach another process's sandbox (the VM backend: its
QEMU and gateway are the starting process's children) is refused in one line, as is a backend without
snapshots (``CapabilityMissing``), before anything is read.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any, Optional

import typer

from controller.commands.common import backend_class, console, error, refuse, say, token_path, write_token

PREFIXES = {"ds": "docker", "dv": "vm", "dk": "kubernetes"}
"""Sandbox id prefix -> the backend that makes such ids."""


def snapshot(sandbox_id: str, *, task_file: Optional[Path], root: Optional[Path]) -> None:
    """Snapshot the running sandbox ``sandbox_id`` into ``root`` (default ``$DESKTOP_SANDBOX_SNAPSHOTS`` or
    ./snapshots), with the checks of ``task_file`` in its state proof; print the snapshot's id on stdout and
    what it holds on stderr. Exit 2 for a bad id or task, a backend without snapshots or one that cannot
    reach the sandbox; 1 when the snapshot fails (nothing of it is left)."""
    from controller.model.errors import DesktopSandboxError
    from controller.sandbox import SANDBOX_ID, CapabilityMissing
    from controller.sandbox import snapshot as snapshots

    if not SANDBOX_ID.fullmatch(sandbox_id):
        refuse(f"not a sandbox id: {sandbox_id} (ids look like ds-1a2b3c4d, as `up` prints them)")
    backend = PREFIXES[sandbox_id[:2]]
    cls = backend_class(backend)
    try:
        cls.capabilities.require(backend, "snapshot")
    except CapabilityMissing as exc:
        refuse(str(exc))
    attach = getattr(cls, "attach", None)
    if attach is None:
        refuse(f"the {backend} backend cannot reach a sandbox another process started; snapshot it from the "
               "process that holds it (controller.sandbox.snapshot.take_snapshot)")
    task = None
    if task_file is not None:
        from controller.run.tasks import TaskError, load_task

        try:
            task = load_task(task_file)
        except TaskError as exc:
            refuse(str(exc))
    token_file = token_path(sandbox_id)
    try:
        token = token_file.read_text().strip() if token_file.is_file() else None
    except OSError:
        token = None
    try:
        sandbox = attach(sandbox_id, agent_token=token)
        with console.status(f"snapshotting {sandbox_id}"):
            snap = snapshots.take_snapshot(sandbox, task=task, root=root)
    except DesktopSandboxError as exc:  # the backend's, the agent's
        error("cannot snapshot the sandbox:", exc)
        raise typer.Exit(1) from None
    payload = snap.manifest["payload"]
    size = sum(int(entry["size"]) for entry in payload.values())
    listed = sum(len((tree or {}).get("files", {})) for tree in snap.manifest["proof"]["roots"].values())
    say(f"snapshot {snap.id} of {sandbox_id} ({snap.kind}, {size} bytes, {listed} guest files proven"
        f"{', ' + str(len(snap.manifest['proof']['files'])) + ' checked paths' if task else ''}) in {snap.path}")
    typer.echo(snap.id)


def up_from(ref: Optional[str], *, count: int, detach: bool, image_tag: Optional[str], changed: list[str]) -> None:
    """``up --from REF [--count N]``: restore ``count`` sandboxes from the snapshot ``ref`` (an id under
    ``$DESKTOP_SANDBOX_SNAPSHOTS`` or ./snapshots, or a directory), each proven to hold its state, print
    ``up``'s table for each and keep them until Ctrl-C or SIGTERM/SIGHUP (then they and their token files
    are removed, exit 0); with ``detach`` print their ids and leave them. The backend is the snapshot's;
    ``image_tag`` must name the image it was taken on. ``changed``: options given that a snapshot fixes
    (screen, policy, architecture, backend): refused. Exit 2 for bad input, 1 when the restore
    fails or is refused (nothing of it is left), 130 for a signal during it."""
    from controller.commands.up import guest_description, sandbox_table
    from controller.model.errors import DesktopSandboxError
    from controller.sandbox import INTERRUPT_SIGNALS, SandboxInterrupted, raise_on_signals, signals_deferred
    from controller.sandbox import snapshot as snapshots

    if ref is None:
        refuse("--count goes with --from SNAPSHOT")
    if changed:
        refuse(f"{', '.join(changed)}: a snapshot fixes these (its template); leave them out with --from")
    if not 1 <= count <= 16:
        refuse(f"--count {count}: 1 to 16")
    try:
        snap = snapshots.load(ref)
    except snapshots.SnapshotError as exc:
        refuse(str(exc))
    backend_cls = backend_class(snap.backend)
    overrides: dict[str, Any] = {"detached": True} if detach else {}
    if image_tag:
        overrides["image"] = image_tag
    sandboxes: list[Any] = []
    token_files: list[Path] = []
    with signals_deferred(redeliver=False) as noted:
        try:
            say(f"restoring {count} {snap.backend} sandbox(es) from {snap.id} ({snap.kind}; each ready within "
                f"{backend_cls.default_ready_timeout:g}s and proven, or removed)")
            try:
                with console.status("restoring"):
                    sandboxes = snapshots.restore(snap.path, count=count, **overrides)
            except (KeyboardInterrupt, SandboxInterrupted) as exc:
                noted.append(signal.SIGINT if isinstance(exc, KeyboardInterrupt) else exc.signum)
            except DesktopSandboxError as exc:  # the backend's, the agent's: restore removed what it started
                error("cannot restore the snapshot:", exc)
                raise typer.Exit(1) from None
            if noted:
                console.print(f"cancelled ({signal.Signals(noted[0]).name}): the restore was abandoned", markup=False)
                raise typer.Exit(130)
            policy = snap.manifest["template"].get("policy") or {"mode": "deny-all", "allow": []}
            for sandbox in sandboxes:
                token_files.append(write_token(sandbox.id, sandbox.agent_token))
                console.print(sandbox_table(sandbox.id, sandbox.agent_url, sandbox.ready_seconds, policy,
                                            token_files[-1], detach, guest_description(sandbox)))
            if detach:
                for sandbox in sandboxes:
                    typer.echo(sandbox.id)
                sandboxes, token_files = [], []  # they stay until `down`
                return
            try:
                with raise_on_signals(INTERRUPT_SIGNALS):
                    if noted:
                        raise SandboxInterrupted(noted[0])
                    while True:
                        signal.pause()
            except (KeyboardInterrupt, SandboxInterrupted):
                console.print("removing sandboxes")
        finally:
            for path in token_files:
                path.unlink(missing_ok=True)
            for sandbox in sandboxes:
                sandbox.close()
