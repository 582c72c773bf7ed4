"""``desktop-sandbox mcp``: the sandbox's computer tools as an MCP server, over stdio or streamable HTTP
(:mod:`controller.mcp`; docs/mcp.md).

Checks every option before anything is served (a bad one is a one-line refusal, exit 2): the backend,
the guest image (built first when missing, one line per step on stderr), the ``--task`` file, the action
types of ``--confirm-actions``, the runs folder and, over HTTP, the key file. Lines about the server go
to stderr; on stdio, stdout carries the protocol only.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Optional

from controller.commands.common import backend_class, refuse, say, writable_runs_dir

KEY_FILE_NAME = "mcp.key"
"""The key file's name in the runs folder when ``--key-file`` is not given."""
DEFAULT_MAX_SESSIONS = 8
"""Sessions with a sandbox at once over HTTP (``--max-sessions``): each one holds a whole desktop."""
DEFAULT_IDLE_TIMEOUT_S = 600.0
"""How long an HTTP session may go without a request or an open stream before it ends (seconds)."""


def mcp(*, http: bool, port: Optional[int], key_file: Optional[Path], backend: str, image_tag: Optional[str],
        task: Optional[Path], pool: Optional[Path], confirm_actions: str, step: bool, runs_dir: Path,
        max_edge: int, max_bytes: int, apps_file: Optional[str], approval_timeout: float,
        idle_timeout: Optional[float], max_sessions: Optional[int] = None) -> None:
    """Serve until the client goes (stdio) or a signal; every session's sandbox is removed at its end."""
    from controller.mcp.session import McpOptions, load_session_task
    from controller.run.tasks import TaskError
    from wire.actions import ACTION_TYPES

    if not http:
        given = [name for name, value in (("--port", port), ("--key-file", key_file), ("--idle-timeout", idle_timeout),
                                          ("--max-sessions", max_sessions))
                 if value is not None]
        if given:
            refuse(f"{', '.join(given)}: only with --http (stdio serves one session over stdin/stdout)")
    backend_cls = backend_class(backend)
    confirm = tuple(dict.fromkeys(a.strip() for a in confirm_actions.split(",") if a.strip()))
    unknown = [a for a in confirm if a not in ACTION_TYPES]
    if unknown:
        refuse(f"--confirm-actions: unknown action type {unknown[0]!r} (one of {', '.join(ACTION_TYPES)})")
    session_task = None
    if task is not None:
        try:
            session_task = load_session_task(task)
        except TaskError as exc:
            refuse(f"--task {exc}")
    if pool is not None and not pool.exists():
        say(f"--pool {pool}: no claim socket there (yet): each session starts its sandbox cold until there is")
    writable_runs_dir(runs_dir)
    key = _key(key_file or runs_dir / KEY_FILE_NAME) if http else None
    _logging()
    try:
        backend_cls.ensure_image(backend_cls.make_options(image=image_tag), lambda line: say(line, label="image:"))
    except Exception as exc:  # noqa: BLE001 - BackendUnavailable, SandboxError: nothing can be served
        refuse(f"the {backend} backend cannot start sandboxes here: {exc}")
    options = McpOptions(backend=backend, image=image_tag, task=session_task, pool=pool, confirm_actions=confirm,
                         step=step, approval_timeout_s=approval_timeout, runs_dir=runs_dir, max_edge=max_edge,
                         max_bytes=max_bytes, apps_file=apps_file or None, workdir=Path.cwd(),
                         max_sessions=max_sessions if max_sessions is not None else DEFAULT_MAX_SESSIONS)
    if http:
        assert key is not None
        _serve_http(options, port=port or 0, key=key, key_file=key_file or runs_dir / KEY_FILE_NAME,
                    idle_timeout=idle_timeout if idle_timeout is not None else DEFAULT_IDLE_TIMEOUT_S)
    else:
        from controller.mcp.serve import serve_stdio

        serve_stdio(options, say=lambda line: say(f"mcp: {line}"))


def _key(key_file: Path) -> str:
    """The HTTP server's key: read from ``key_file``, or a new one written there (0600) when it does not
    exist (:func:`controller.agents_api.server.load_or_make_key`); a refusal (exit 2) for a file that
    cannot be used."""
    from controller.agents_api.server import KeyFileError, load_or_make_key

    try:
        return load_or_make_key(key_file)
    except KeyFileError as exc:
        refuse(f"--key-file: {exc}")


def _serve_http(options, *, port: int, key: str, key_file: Path, idle_timeout: float) -> None:  # noqa: ANN001
    from controller.mcp.serve import serve_http

    try:
        serve_http(options, port=port, key=key, idle_timeout_s=idle_timeout, say=lambda line: say(f"mcp: {line}"),
                   on_listen=lambda url: say(f"mcp: {url} key-file: {key_file}"))
    except (OSError, RuntimeError) as exc:
        refuse(f"cannot serve: {exc}")


def _logging() -> None:
    """Log lines (a session's sandbox started or removed, failures) on stderr, one line each, before the
    ``mcp`` package would configure its own."""
    logging.basicConfig(level=logging.WARNING, format="mcp: %(message)s")
