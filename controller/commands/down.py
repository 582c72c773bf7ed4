"""``desktop-sandbox down``: remove sandboxes (given ids, or every one of every backend, optionally
only those carrying labels) and their token files."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any, Optional

import typer

from controller.commands.common import backend_class, refuse, say, token_path
from controller.sandbox import registry
from controller.text import clean


def down(sandbox_ids: list[str], *, all_: bool, label: list[str], backend: Optional[str]) -> None:
    """Remove ``sandbox_ids``, or with ``all_`` every sandbox (only what also carries each ``label``,
    KEY=VALUE), of ``backend`` (None: every one), and their token files. Refuses (exit 2) a given id
    that names no sandbox, or when no backend could be asked; 130 when a signal came meanwhile."""
    from controller.sandbox import SANDBOX_ID, signals_deferred

    if not all_ and not sandbox_ids:
        refuse("give sandbox ids or --all")
    if label and not all_:
        refuse("--label goes with --all")
    bad = [sid for sid in sandbox_ids or [] if not SANDBOX_ID.fullmatch(sid)]
    if bad:
        refuse(f"not a sandbox id: {', '.join(clean(s, 40) for s in bad)} (ids look like ds-1a2b3c4d, "
               "dv-1a2b3c4d or dk-1a2b3c4d, as `up` prints them)")
    wanted = {}
    for item in label:
        key, sep, value = item.partition("=")
        if not sep or not key:
            refuse(f"--label {item!r}: give KEY=VALUE")
        wanted[key] = value
    names = [backend] if backend is not None else registry.backend_names()
    classes = [backend_class(name) for name in names]
    removed: list[str] = []
    found: set[str] = set()
    unavailable: list[str] = []
    # A signal waits until everything asked for is removed (a half-removed sandbox helps nobody); the
    # command then ends with 130.
    with signals_deferred(redeliver=False) as noted:
        _remove(classes, all_, wanted, sandbox_ids or [], removed, found, unavailable)
        unknown = [sid for sid in sandbox_ids or [] if sid not in found and not token_path(sid).exists()]
        kept: list[str] = []
        for sid in (sandbox_ids or []) + sorted(found):
            _drop_token(token_path(sid), kept)
        if all_ and not wanted and backend is None:
            for path in token_path("x").parent.glob("*.token"):
                _drop_token(path, kept)
        elif all_:
            _remove_stale_tokens(classes, kept)
    if len(unavailable) == len(classes):
        refuse("; ".join(unavailable))
    for line in unavailable:  # the other backends were asked; this one could not be
        say(f"skipped {line}")
    say(f"removed {len(removed)}: " + (", ".join(removed) if removed else "nothing"), 100_000)
    for line in kept:
        say(f"kept {line}")
    if noted:
        say(f"interrupted ({signal.Signals(noted[0]).name}) after the removal finished")
        raise typer.Exit(130)
    if unknown and not all_:
        # A mistyped id must not pass as done: nothing of it existed.
        refuse(f"no sandbox {', '.join(clean(s, 40) for s in unknown)} (see `docker ps -a --filter "
               f"label=desktop-sandbox.sandbox`, or `ls -d /tmp/desktop-sandbox-vm-*`)")


def _drop_token(path: Path, kept: list[str]) -> None:
    """Remove the token file ``path`` (gone already: nothing to do). What cannot be removed (a directory
    or anything else someone put under that name, a file of another user) is kept and said in ``kept``,
    never a traceback: the sandboxes are removed either way."""
    try:
        path.unlink(missing_ok=True)
    except OSError as exc:
        kept.append(f"{clean(str(path), 300)}: {clean(exc.strerror or exc, 100)} (not removed)")


def _remove_stale_tokens(classes: list[Any], kept: list[str]) -> None:
    """Token files of sandboxes that no longer exist, of the backends in ``classes``: a sandbox ``up``
    left when it was killed can be reaped by another process's start (its owner provably dead) before
    ``down --all --label ...`` comes, and its token file must not stay behind naming nothing. The files
    are listed before the backends are asked (``up`` writes one only once its sandbox exists); a backend
    that cannot be asked keeps its files."""
    from controller.sandbox import SANDBOX_ID, BackendUnavailable

    tokens = [path for path in token_path("x").parent.glob("*.token") if SANDBOX_ID.fullmatch(path.stem)]
    for cls in classes:
        mine = [path for path in tokens if path.stem.startswith(cls.id_prefix)]
        if not mine:
            continue
        try:
            alive = cls.list_all()
        except BackendUnavailable:
            continue
        for path in mine:
            if path.stem not in alive:
                _drop_token(path, kept)


def _remove(classes: list[Any], all_: bool, wanted: dict[str, str], sandbox_ids: list[str], removed: list[str],
            found: set[str], unavailable: list[str]) -> None:
    """``down``'s removal: every backend in ``classes`` asked in turn; what went into ``removed``, the ids
    that existed into ``found``, backends that could not be asked into ``unavailable``."""
    from controller.sandbox import BackendUnavailable

    for cls in classes:
        try:
            if all_:
                if wanted:
                    found.update(sid for sid, labels in cls.list_all().items()
                                 if all(labels.get(k) == v for k, v in wanted.items()))
                removed += cls.remove_all(wanted)
            else:
                for sid in sandbox_ids:
                    gone = cls.remove(sid)
                    if gone:
                        found.add(sid)
                    removed += gone
        except BackendUnavailable as exc:
            unavailable.append(f"{cls.backend_name}: {exc}")
