"""``desktop-sandbox`` command line (typer). Each command is a thin wrapper over a module.

Commands: ``build`` (controller.sandbox.image), ``up`` / ``down`` (a backend of
controller.sandbox.registry), ``run-task`` (controller.run.runner), ``report`` (controller.run.record),
``audit`` (controller.audit), ``bench`` (controller.bench; ``--suite``: controller.bench_suite), ``run-suite``
(controller.suite), ``render`` (controller.sandbox.kubernetes), ``serve`` (controller.agents_api). ``--backend``
names a backend of the registry.

Over 400 lines: every command's options, help text and refusals (one line, exit 2) are here and nowhere
else, so what a user can type reads in one place; the work itself lives in the modules above.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import tomllib
import traceback
from pathlib import Path
from typing import Any, Callable, Optional

import typer
from rich.markup import escape
from rich.table import Table

from controller.run.progress import make_console
from controller.sandbox.registry import DEFAULT_BACKEND, backend_names, get_backend
from controller.text import clean, clean_lines
from wire.actions import ACTION_TYPES

if not sys.stdout.isatty() and not os.environ.get("COLUMNS") and not os.environ.get("TERMINAL_WIDTH"):
    # --help piped (into less, a file): typer's help console would default to 80 columns and split words.
    import typer.rich_utils

    typer.rich_utils.MAX_WIDTH = 120


UNCAUGHT_CHARS = 20000
"""Longest traceback of an uncaught exception :class:`_App` prints (characters; its end is kept)."""

ERROR_CHARS = 8000
"""Longest error message (a backend's, which may quote a console or a log) ``_error`` prints."""


class _App(typer.Typer):
    """``typer.Typer`` that prints an uncaught exception's traceback with every line escaped
    (:func:`controller.text.clean_lines`: its message may quote the guest's console, a container's
    output or an answer from the guest) on stderr, literally, and exits 1, instead of typer's
    traceback, which prints the message raw. Only ``app(...)`` (the installed command) goes
    through here; ``typer.testing.CliRunner`` calls the command itself."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().__call__(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - shown escaped, then the usual exit status 1
            text = "".join(traceback.format_exception(exc))
            console.print(clean_lines(text.rstrip("\n"), UNCAUGHT_CHARS), style="red", markup=False, emoji=False,
                          highlight=False)
            raise SystemExit(1) from None


app = _App(help="A real Linux desktop for computer-use models, behind a default-deny gateway.",
           no_args_is_help=True, add_completion=False)
console = make_console(stderr=True)


REFUSAL_CHARS = 1000
"""Longest refusal line ``_refuse`` prints (characters)."""


def _say(message: Any, limit: int = REFUSAL_CHARS, *, label: str = "", style: str | None = None) -> None:
    """Print one line on stderr literally: control characters escaped, cut to ``limit`` characters
    (:func:`controller.text.clean`), no markup, no emoji codes; after ``label`` (trusted console
    markup, e.g. ``[cyan]base[/]``) when given; in ``style`` when given."""
    text = clean(message, limit)
    if label:
        console.print(f"{label} {escape(text)}", emoji=False, highlight=False, style=style)
    else:
        console.print(text, markup=False, emoji=False, highlight=False, style=style)


def _error(prefix: str, exc: BaseException) -> None:
    """Print ``prefix`` (red) and ``exc``'s message on stderr: its lines kept, each escaped
    (:func:`controller.text.clean_lines`, the last :data:`ERROR_CHARS` characters), never markup."""
    console.print(f"[red]{escape(prefix)}[/] {escape(clean_lines(exc, ERROR_CHARS))}", emoji=False, highlight=False)


def _refuse(message: str) -> None:
    """Print one line (literally, no markup) to stderr and exit 2: bad input, nothing was started.

    The message may quote the input (a task's or script's keys and values): it is shown with control
    characters escaped and cut to :data:`REFUSAL_CHARS` characters (:func:`controller.text.clean`)."""
    _say(message)
    raise typer.Exit(2)


BACKEND_HELP = f"Backend: {' or '.join(backend_names())}."
IMAGE_HELP = "Guest image: a Docker tag (default desktop-sandbox:latest) or a VM image directory (default: the built one)."


ARCH_HELP = ("Guest architecture: amd64 | arm64 (default the host's). A foreign one runs under emulation: "
             "the Docker image desktop-sandbox:latest-ARCH (`desktop-sandbox build --arch`), a VM under TCG.")


def _with_arch(options: Any, arch: str) -> Any:
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
        _refuse(f"--arch: {exc}")
    if dataclasses.is_dataclass(options) and any(f.name == "arch" for f in dataclasses.fields(options)):
        return dataclasses.replace(options, arch=arch)
    if isinstance(getattr(options, "image", None), str):
        options = dataclasses.replace(options, image=image.arch_tag(options.image, arch))
        if image.is_foreign(arch) and hasattr(options, "mem_limit"):  # qemu-user needs more (see the constant)
            options = dataclasses.replace(options, mem_limit=image.EMULATION_MEM_LIMIT)
        return options
    _refuse("--arch: this backend has no per-architecture image")


def _backend(name: str):  # noqa: ANN202 - a Sandbox subclass
    """The backend class registered as ``name``, or a one-line refusal (exit 2) naming the known ones."""
    try:
        return get_backend(name)
    except KeyError:
        _refuse(f"unknown backend {name!r} (one of {', '.join(backend_names())})")


def _docker_client():  # noqa: ANN202
    """``docker.from_env()``, or a one-line refusal (exit 2) when the engine cannot be reached."""
    import docker
    import docker.errors

    try:
        return docker.from_env()
    except docker.errors.DockerException as exc:
        _refuse(f"cannot reach the Docker engine: {exc}")


@app.command()
def build(
    tag: str = typer.Option("desktop-sandbox:latest", help="Tag of the built image (suffixed -ARCH for a "
                            "foreign --arch: desktop-sandbox:latest-arm64)."),
    base: str = typer.Option("debian:bookworm-slim", help="Base image (imported with debootstrap if absent; "
                             "suffixed -ARCH for a foreign --arch)."),
    no_cache: bool = typer.Option(False, "--no-cache", help="Rebuild every layer."),
    wheelhouse: bool = typer.Option(True, help="Build the Python wheels on the host first (see wheelhouse/)."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Print every line of build output."),
    arch: str = typer.Option("", "--arch", help="amd64 | arm64 (default the host's); a foreign one builds "
                             "under emulation (qemu-user-static, binfmt_misc)."),
) -> None:
    """Build the guest image (Dockerfile.desktop) with progress; print its size and build time."""
    from controller.sandbox import image

    try:
        arch = image.normalize_arch(arch)
    except ValueError as exc:
        _refuse(str(exc))
    tag, base = image.arch_tag(tag, arch), image.arch_tag(base, arch)
    client = _docker_client()
    try:
        how = image.ensure_base(client, base, log=lambda m: _say(m, label="[cyan]base[/]"), arch=arch)
    except image.BuildError as exc:
        _error("base image:", exc)
        raise typer.Exit(1) from None
    _say(f"{base} ({arch}): {how}", label="[cyan]base[/]")
    if wheelhouse and image.is_foreign(arch):
        image.prepare_foreign_wheelhouse(arch, log=lambda m: _say(m, label="[cyan]wheels[/]"))
    elif wheelhouse:
        image.prepare_wheelhouse(client, log=lambda m: _say(m, label="[cyan]wheels[/]"))

    def show(ev: image.BuildEvent) -> None:
        if ev.is_step:
            _say(ev.text.split(' : ', 1)[-1], 110, label=f"[bold]{escape(f'[{ev.step}/{ev.total}]')}[/]")
        elif ev.cached:
            console.print("        [dim]cached[/]")
        elif verbose:
            _say(f"        {ev.text}", 2000, style="dim")

    with console.status("building", spinner="dots"):
        try:
            result = image.build(tag, base, no_cache=no_cache, client=client, on_event=show, arch=arch)
        except image.BuildError as exc:
            _error("build failed:", exc)
            raise typer.Exit(1) from None
    console.print(
        f"[green]built[/] {result.tag} ({result.image_id[:19]}): {result.size_bytes / 1e6:.0f} MB, "
        f"{result.seconds:.1f}s, {result.cached_steps}/{result.steps} steps cached"
    )


def policy_toml(policy: Any) -> str:
    """The policy as the ``[network]`` table of a task file (canonical origins), e.g.
    ``mode = "allowlist"`` / ``allow = ["https://example.com:443"]`` on separate lines."""
    data = policy.model_dump(mode="json") if hasattr(policy, "model_dump") else dict(policy)
    lines = [f"mode = {json.dumps(data.get('mode', 'deny-all'))}"]
    for key in ("allow", "allow_addresses"):
        if data.get(key):
            lines.append(f"{key} = [{', '.join(json.dumps(v) for v in data[key])}]")
    return "\n".join(lines)


def _write_token(sandbox_id: str, token: str) -> Path:
    """Write the agent token to ``_token_path(sandbox_id)`` (directory 0700, file 0600)."""
    token_file = _token_path(sandbox_id)
    token_file.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(token)
    return token_file


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


@app.command()
def up(
    image_tag: Optional[str] = typer.Option(None, "--image", help=IMAGE_HELP),
    width: int = typer.Option(1280, help="Screen width (screen px)."),
    height: int = typer.Option(800, help="Screen height (screen px)."),
    allow: list[str] = typer.Option([], help="Allowlisted origin (repeatable); none: deny all."),
    detach: bool = typer.Option(False, help="Leave it running; print where its token is and exit."),
    backend: str = typer.Option(DEFAULT_BACKEND, "--backend", help=BACKEND_HELP),
    arch: str = typer.Option("", "--arch", help=ARCH_HELP),
) -> None:
    """Start a sandbox, print how to reach its agent (token file, example curl line), and keep it until
    Ctrl-C (or `down ID`, when detached).

    Ctrl-C or SIGTERM while it starts abandons the start (exit 130); afterwards it removes the sandbox
    and the token file (exit 0). Either way nothing is left, also under a second signal.
    """
    from pydantic import ValidationError

    from controller.gateway.policy import NetworkPolicy
    from controller.sandbox import (INTERRUPT_SIGNALS, BackendUnavailable, SandboxError, SandboxInterrupted,
                                    SandboxSpec, raise_on_signals, signals_deferred)
    from controller.validation import describe_validation_error

    backend_cls = _backend(backend)
    try:
        network = NetworkPolicy(mode="allowlist" if allow else "deny-all", allow=list(allow))
    except ValidationError as exc:
        _refuse(f"--allow: {describe_validation_error(exc, known_keys=NetworkPolicy.model_fields)}")
    spec = SandboxSpec(screen_width=width, screen_height=height, policy=network.model_dump(mode="json"),
                       ready_timeout=backend_cls.default_ready_timeout)
    options = _with_arch(backend_cls.make_options(image=image_tag, detached=detach), arch)
    sandbox = None
    token_file: Path | None = None
    # From the start to the removal a signal never cuts a step in half: it is noted (the start itself
    # abandons at its next step) and acted on where nothing is half done; only the wait for Ctrl-C
    # below raises on it. Whatever exists is removed in `finally`.
    with signals_deferred(redeliver=False) as noted:
        try:
            _say(f"starting a {backend} sandbox (ready within {spec.ready_timeout:g}s, or it is removed)")
            try:
                with console.status("starting sandbox"):
                    sandbox = backend_cls.start(spec, options)
            except (KeyboardInterrupt, SandboxInterrupted) as exc:
                noted.append(signal.SIGINT if isinstance(exc, KeyboardInterrupt) else exc.signum)
            except (SandboxError, BackendUnavailable) as exc:  # nothing of it is left: the backend removed it
                _error("cannot start the sandbox:", exc)
                raise typer.Exit(1) from None
            if noted:  # before the token file exists: the start is abandoned
                console.print(f"cancelled ({signal.Signals(noted[0]).name}): the sandbox start was abandoned",
                              markup=False)
                raise typer.Exit(130)
            # from here a signal ends a started sandbox the usual way (removed, exit 0), also one that
            # comes while the token file is written or the table printed
            token_file = _write_token(sandbox.id, sandbox.agent_token)
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


@app.command()
def down(
    sandbox_ids: list[str] = typer.Argument(None, help="Sandbox ids to remove."),
    all_: bool = typer.Option(False, "--all", help="Remove every sandbox of every backend (containers, "
                                                   "networks, VM processes and directories)."),
    label: list[str] = typer.Option(
        [], "--label", help="With --all: only sandboxes that also carry this label, KEY=VALUE (repeatable), "
                            "e.g. desktop-sandbox.owner=HOST:PID for what one (killed) process started."),
    backend: Optional[str] = typer.Option(None, "--backend", help=f"Only this backend (default: every one). "
                                                                  f"{BACKEND_HELP}"),
) -> None:
    """Remove sandboxes: the given ids, or with --all every sandbox of every backend (only what also
    carries each --label, when given), and their token files. Exit 2 when a given id names no sandbox
    (nothing of it was found), or when no backend could be asked."""
    from controller.sandbox import signals_deferred

    if not all_ and not sandbox_ids:
        _refuse("give sandbox ids or --all")
    if label and not all_:
        _refuse("--label goes with --all")
    from controller.sandbox import SANDBOX_ID

    bad = [sid for sid in sandbox_ids or [] if not SANDBOX_ID.fullmatch(sid)]
    if bad:
        _refuse(f"not a sandbox id: {', '.join(clean(s, 40) for s in bad)} (ids look like ds-1a2b3c4d, "
                "dv-1a2b3c4d or dk-1a2b3c4d, as `up` prints them)")
    wanted = {}
    for item in label:
        key, sep, value = item.partition("=")
        if not sep or not key:
            _refuse(f"--label {item!r}: give KEY=VALUE")
        wanted[key] = value
    names = [backend] if backend is not None else backend_names()
    classes = [_backend(name) for name in names]
    removed: list[str] = []
    found: set[str] = set()
    unavailable: list[str] = []
    # A signal waits until everything asked for is removed (a half-removed sandbox helps nobody); the
    # command then ends with 130.
    with signals_deferred(redeliver=False) as noted:
        _remove(classes, all_, wanted, sandbox_ids or [], removed, found, unavailable)
        unknown = [sid for sid in sandbox_ids or [] if sid not in found and not _token_path(sid).exists()]
        for sid in (sandbox_ids or []) + sorted(found):
            _token_path(sid).unlink(missing_ok=True)
        if all_ and not wanted and backend is None:
            for path in _token_path("x").parent.glob("*.token"):
                path.unlink(missing_ok=True)
    if len(unavailable) == len(classes):
        _refuse("; ".join(unavailable))
    for line in unavailable:  # the other backends were asked; this one could not be
        _say(f"skipped {line}")
    _say(f"removed {len(removed)}: " + (", ".join(removed) if removed else "nothing"), 100_000)
    if noted:
        _say(f"interrupted ({signal.Signals(noted[0]).name}) after the removal finished")
        raise typer.Exit(130)
    if unknown and not all_:
        # A mistyped id must not pass as done: nothing of it existed.
        _refuse(f"no sandbox {', '.join(clean(s, 40) for s in unknown)} (see `docker ps -a --filter "
                f"label=desktop-sandbox.sandbox`, or `ls -d /tmp/desktop-sandbox-vm-*`)")


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


def _writable_runs_dir(runs_dir: Path) -> None:
    """Make ``runs_dir`` if needed; refuse (exit 2) when run records cannot be written there."""
    try:
        runs_dir.mkdir(parents=True, exist_ok=True)
        if not os.access(runs_dir, os.W_OK | os.X_OK):
            raise PermissionError("not writable")
    except OSError as exc:
        _refuse(f"--runs-dir {runs_dir}: cannot write run records there: {exc.strerror or exc}")


@app.command("run-task")
def run_task_cmd(
    task_file: Path = typer.Argument(Path("tasks/pickup.toml"), help="Task TOML (contract: tasks/*.toml)."),
    image_tag: Optional[str] = typer.Option(None, "--image", help=IMAGE_HELP + " Built if missing."),
    live: Optional[bool] = typer.Option(None, "--live/--offline",
                                        help="Live model or the offline exercise; default: live iff OPENAI_API_KEY."),
    model: Optional[str] = typer.Option(None, help="Live model (default $OPENAI_MODEL or gpt-6-astra)."),
    max_steps: Optional[int] = typer.Option(None, min=1, max=500,
                                            help="Limit on model responses (default: the task's, 20)."),
    script: Optional[Path] = typer.Option(None, help="Offline script to use instead of the task's."),
    legacy: Optional[bool] = typer.Option(None, "--legacy/--ga", help="Offline: legacy computer_use_preview tool."),
    approve_safety_check: list[str] = typer.Option(
        [], "--approve-safety-check", help="Approve pending safety checks with this code unattended (repeatable; logged)."),
    approve_origin: list[str] = typer.Option(
        [], "--approve-origin", help="Approve the gateway's origin requests for this origin (scheme://host[:port]) "
                                     "unattended, for a task whose [network] mode is \"ask\" (repeatable; logged)."),
    confirm_actions: str = typer.Option("", help="Ask before these action types, e.g. type,keypress."),
    step: bool = typer.Option(False, "--step", help="Ask before every action."),
    runs_dir: Path = typer.Option(Path("runs"), help="Where run records go."),
    backend: str = typer.Option(DEFAULT_BACKEND, "--backend", help=BACKEND_HELP),
    ui: bool = typer.Option(False, "--ui", help="Serve the web console beside the run (prints 'console: URL'): "
                                                  "watch the screen, approve or deny, take over, cancel."),
    approval_timeout: float = typer.Option(300.0, "--approval-timeout", min=1.0, max=86400.0,
                                           help="Seconds a question (safety check, confirmation) waits for an "
                                                "answer before it is denied."),
    runner: str = typer.Option("sdk", "--runner", help="The model loop: sdk (the openai SDK's ComputerToolset) or "
                                                       "agent-framework (an Agent Framework agent; needs the [af] extra)."),
    arch: str = typer.Option("", "--arch", help=ARCH_HELP),
) -> None:
    """Run a task in a fresh sandbox through the SDK loop, verify it from the guest, write runs/<id>/.

    Prints the run as it goes (sandbox start, each model step and its actions, approvals, network
    decisions, checks), then the summary table; the record path goes to stdout.

    \b
    Exit status:
      0    passed: the loop completed and every check passed
      1    failed (a check failed, an approval was denied) or error (the loop or the sandbox failed)
      2    bad input: the task, its offline script or an option was refused (one line on stderr,
           before anything is started)
      130  cancelled (Ctrl-C, SIGTERM or SIGHUP): inputs released, sandbox removed, no verification

    \b
    A signal (SIGINT, SIGTERM, SIGHUP) at any moment once the command runs, also twice or during
    teardown, ends the run cancelled (130) with its record complete and nothing left behind; one
    before the interpreter has loaded the command ends the process by that signal, before anything
    was started or recorded.
    """
    from controller.run.runner import RunOptions, run_task
    from controller.sandbox import INTERRUPT_SIGNALS, SandboxInterrupted, raise_on_signals, signals_deferred
    from controller.offline.scripted_server import ScriptError, load_script
    from controller.run.tasks import TaskError, load_task

    # Until the run's record is finished no signal cuts a step in half: before the run begins they are
    # noted here (the run then ends `cancelled` at once, with its record), from then on run_task handles
    # them, and once it has returned there is nothing left to stop.
    with signals_deferred(redeliver=False) as noted:
        try:
            task = load_task(task_file)
        except TaskError as exc:  # one line naming the file and the field
            _refuse(f"cannot load task: {exc}")
        _backend(backend)
        confirm = [a.strip() for a in confirm_actions.split(",") if a.strip()]
        unknown = [a for a in confirm if a not in ACTION_TYPES]
        if unknown:
            _refuse(f"--confirm-actions: unknown action type(s) {', '.join(unknown)} "
                    f"(one of {', '.join(ACTION_TYPES)})")
        if any(not code.strip() for code in approve_safety_check):
            _refuse("--approve-safety-check needs a safety check code (e.g. sensitive_action)")
        origins = _approve_origins(approve_origin)
        loop = _runner_loop(runner)
        _writable_runs_dir(runs_dir)
        if not (live if live is not None else bool(os.environ.get("OPENAI_API_KEY"))):
            try:  # the offline exercise: refuse a missing or malformed script before a sandbox starts
                load_script(script or task.offline_script_path())
            except (ScriptError, TaskError) as exc:  # a bad script, or a task without [offline]
                _refuse(f"cannot use the offline script: {exc}")
        open_sandbox = _not_opened
        if not noted:
            try:  # may build the image (minutes): a signal stops that at once, nothing else is started
                with raise_on_signals(INTERRUPT_SIGNALS):
                    open_sandbox = sandbox_opener(backend, image_tag, **({"arch": arch} if arch else {}))
            except (KeyboardInterrupt, SandboxInterrupted) as exc:
                noted.append(signal.SIGINT if isinstance(exc, KeyboardInterrupt) else exc.signum)
                console.print(f"interrupted before the run ({signal.Signals(noted[-1]).name})", markup=False)

        options = RunOptions(
            runs_dir=runs_dir, live=live, model=model, max_steps=max_steps, script=script, legacy=legacy,
            approve_codes=list(approve_safety_check), approve_origins=origins, approval_timeout_s=approval_timeout,
            confirm_actions=confirm, step=step, signals_before=noted, runner=runner, loop=loop,
        )
        server = None
        if ui and not noted:
            from controller.console.server import ConsoleServer

            server = ConsoleServer(runs_dir).start()
            options.on_live = server.add_run
            typer.echo(f"console: {server.url}", err=True)
        try:
            outcome = run_task(task, open_sandbox, options, console=console)
            if server is not None and sys.stdin.isatty():
                _keep_serving(server, noted)
        finally:
            if server is not None:
                server.stop()
        typer.echo(str(outcome.record_dir / "record.jsonl"))
        raise typer.Exit(outcome.exit_code)


RUNNERS = ("sdk", "agent-framework")
"""``run-task --runner`` values: the SDK's own loop, or an Agent Framework agent (:mod:`controller.af`)."""


def _runner_loop(runner: str) -> Any:
    """The ``RunOptions.loop`` for ``--runner``: None for ``sdk``, :func:`controller.af.run_loop` for
    ``agent-framework``; refuses (exit 2) another name, or ``agent-framework`` without the ``[af]`` extra."""
    if runner not in RUNNERS:
        _refuse(f"--runner: unknown runner {runner!r} (one of {', '.join(RUNNERS)})")
    if runner == "sdk":
        return None
    try:
        from controller.af import run_loop
    except ImportError as exc:
        _refuse(f"--runner agent-framework needs the [af] extra (pip install -e '.[af]'): {exc}")
    return run_loop


def _approve_origins(given: list[str]) -> list[Any]:
    """``--approve-origin`` values parsed as the gateway parses origins (``controller.gateway.policy.Origin``:
    scheme, IDNA host, effective port; duplicates dropped); refuses (exit 2) one that does not parse."""
    from controller.gateway.policy import Origin, PolicyError

    origins: list[Any] = []
    for text in given:
        try:
            origin = Origin.parse(text)
        except PolicyError as exc:
            _refuse(f"--approve-origin: {exc}")
        if origin not in origins:
            origins.append(origin)
    return origins


def _keep_serving(server: Any, noted: list[int]) -> None:
    """After a run with ``--ui`` on a terminal: the console goes on showing the run (now its report)
    until Enter, or a signal (``noted`` grows: signals are deferred here)."""
    import select

    console.print(f"the console goes on showing this run at {server.base}/: press Enter (or Ctrl-C) to stop it",
                  markup=False, highlight=False)
    before = len(noted)
    while len(noted) == before:
        ready, _, _ = select.select([sys.stdin], [], [], 0.2)  # poll interval: a deferred signal only lands in `noted`
        if ready:
            sys.stdin.readline()
            return


def _not_opened(task: Any) -> Any:
    """The opener of a run cancelled before it began (run_task never calls it then)."""
    raise RuntimeError("the run was cancelled before its sandbox was opened")


def sandbox_opener(backend: str, image_tag: Optional[str], arch: str = "") -> Callable[[Any], Any]:
    """``open_sandbox(task) -> Sandbox`` for ``run-task``: a fresh sandbox of the registry's ``backend``
    from ``image_tag`` (None: the backend's default image) for guest architecture ``arch`` ('' = the
    host's), built first when missing, sized and policed by the task. Refuses (exit 2) when the backend
    cannot be reached."""
    from controller.sandbox import BackendUnavailable, SandboxSpec

    cls = _backend(backend)
    try:
        options = cls.ensure_image(_with_arch(cls.make_options(image=image_tag), arch), _say)
    except BackendUnavailable as exc:
        _refuse(str(exc))

    def open_sandbox(t):  # noqa: ANN001, ANN202
        spec = SandboxSpec(screen_width=t.screen.width, screen_height=t.screen.height,
                           policy=t.network.model_dump(mode="json"), ready_timeout=cls.default_ready_timeout)
        with console.status(f"starting {backend} sandbox"):
            return cls.start(spec, options)

    return open_sandbox


@app.command()
def report(
    run: Path = typer.Argument(..., help="A run directory (runs/<id>) or its record.jsonl."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
    as_html: bool = typer.Option(False, "--html", help="Write the run's review page, runs/<id>/report.html "
                                 "(screenshots with the actions drawn on them, checks, verdict), and print its path."),
) -> None:
    """Print the summary table of a recorded run (exit 0 only if it passed).

    ``--json``: the summary as JSON, with ``checks`` (kind, target, rule, expected, observed, passed and
    detail when there is one) so a script can tell why a run failed. ``--html``: write the self-contained
    review page beside the record (controller.report) and print its path.
    """
    import json as _json

    from controller.run.record import print_summary, read_entries, summarize

    if as_json and as_html:
        _refuse("give --json or --html, not both")
    try:
        entries = read_entries(run)
    except (OSError, ValueError) as exc:
        _refuse(f"cannot read the run record: {exc}")
    try:
        summary = summarize(entries)
        if as_html:
            from controller.report.html import write_report

            try:
                written = write_report(run)
            except OSError as exc:
                _refuse(f"cannot write the report of {run}: {exc.strerror or exc}")
            typer.echo(str(written))
        elif as_json:
            typer.echo(_json.dumps(summary, indent=2, allow_nan=False))
        else:
            print_summary(entries, run, console=make_console())
    # entries read_entries took whose free-form values cannot be shown or written as JSON (infinite numbers)
    except (AttributeError, TypeError, ValueError, KeyError, OverflowError, RecursionError) as exc:
        _refuse(f"cannot read {run}: not a run record ({type(exc).__name__}: {exc})")
    raise typer.Exit(0 if summary["status"] == "passed" else 1)


@app.command()
def audit(
    policy: Optional[Path] = typer.Option(None, "--policy", help="Policy file (TOML: a network table, or mode/allow at top level)."),
    task: Optional[Path] = typer.Option(None, "--task", help="Task file; its network table is audited."),
    json_out: Optional[Path] = typer.Option(None, "--json", help="Also write the JSON report to this file."),
    image_tag: Optional[str] = typer.Option(None, "--image", help=IMAGE_HELP),
    backend: str = typer.Option(DEFAULT_BACKEND, "--backend", help=BACKEND_HELP),
    arch: str = typer.Option("", "--arch", help=ARCH_HELP),
) -> None:
    """Probe the network policy from inside the guest; print a table, optionally write JSON.

    Without --policy/--task the policy is deny-all. Exit 0 only if every probe passed; 1 if any failed.
    """
    import docker.errors
    from pydantic import ValidationError

    from controller.audit import AuditError, render_table
    from controller.gateway.policy import NetworkPolicy
    from controller.sandbox import SandboxError
    from controller.sandbox.registry import audit_function
    from controller.run.tasks import TaskError, load_task
    from controller.validation import describe_validation_error

    backend_cls = _backend(backend)
    try:
        audit_backend = audit_function(backend)
    except KeyError:
        _refuse(f"the {backend} backend has no network audit (audit runs on the docker and vm backends)")
    if policy is not None and task is not None:
        _refuse("give --policy or --task, not both")
    if task is not None:
        try:
            network = load_task(task).network
        except TaskError as exc:  # one line naming the file and the field
            _refuse(f"cannot load task: {exc}")
    else:
        try:
            network = NetworkPolicy.from_toml(policy) if policy else NetworkPolicy()
        except ValidationError as exc:
            _refuse(f"bad policy {policy}: {describe_validation_error(exc, known_keys=NetworkPolicy.model_fields)}")
        except OSError as exc:
            _refuse(f"bad policy {policy}: cannot read: {exc.strerror or exc}")
        except tomllib.TOMLDecodeError as exc:
            _refuse(f"bad policy {policy}: TOML syntax error: {exc}")
        except UnicodeDecodeError as exc:
            _refuse(f"bad policy {policy}: not UTF-8 text (byte {exc.start})")
    try:
        options = backend_cls.ensure_image(_with_arch(backend_cls.make_options(image=image_tag), arch), _say)
        with console.status(f"auditing ({backend} sandbox, probes)"):
            result = audit_backend(network, image=options.image)
    except (AuditError, SandboxError, docker.errors.DockerException) as exc:
        _error("audit could not run:", exc)
        raise typer.Exit(2) from None
    render_table(result, make_console())
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(result.to_json() + "\n", encoding="utf-8")
        console.print(f"report written to {json_out}")
    raise typer.Exit(0 if result.passed else 1)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def bench(ctx: typer.Context) -> None:
    """Measure the agent (p50/p95, ms) against xdotool + ImageMagick import on a private Xvfb, and the
    driver's path through the relay into a Docker sandbox beside the in-guest floor, in one run.

    Options pass through to ``python -m controller.bench`` (--iterations N, --baseline-iterations N,
    --type-iterations N, --no-baseline, --image TAG, --no-docker, --json FILE). Exit 0 only if every
    target was met.

    With --suite first: many sandboxes on this host instead (controller.bench_suite): memory and CPU of an
    idle and a busy sandbox, sandbox start and run-task wall time with 1, 2, 4 and 8 runs at once, the
    largest N at which every run passed (--levels 1,2,4,8, --task FILE, --image TAG, --idle-samples N,
    --runs-dir DIR, --json FILE). Exit 0 when the task passed alone.

    With --agents-api first: the local Agents API (controller.agents_api.bench): session create to first
    screenshot event, and each step's screenshot from the guest to the SSE event, beside run-task's own
    step time (--steps 20, --sessions 3, --image TAG, --runs-dir DIR, --json FILE).
    """
    args = list(ctx.args)
    if args[:1] == ["--suite"]:
        from controller.bench_suite import main as suite_main

        report = suite_main(args[1:])
    elif args[:1] == ["--agents-api"]:
        from controller.agents_api.bench import main as agents_main

        report = agents_main(args[1:])
    else:
        from controller.bench import main as bench_main

        report = bench_main(args)
    raise typer.Exit(0 if all(report["checks"].values()) else 1)


@app.command("run-suite")
def run_suite_cmd(
    paths: list[Path] = typer.Argument(..., help="Task files, or folders: every *.toml under one is a task."),
    parallel: int = typer.Option(1, "--parallel", min=1, max=64, help="Most runs at once."),
    repeat: int = typer.Option(1, "--repeat", min=1, max=1000, help="Runs of each task, each in a fresh sandbox."),
    backend: str = typer.Option(DEFAULT_BACKEND, "--backend", help=BACKEND_HELP),
    image_tag: Optional[str] = typer.Option(None, "--image", help=IMAGE_HELP + " Built once, first, if missing."),
    live: Optional[bool] = typer.Option(None, "--live/--offline",
                                        help="Live model or the offline exercise; default: live iff OPENAI_API_KEY."),
    model: Optional[str] = typer.Option(None, help="Live model (default $OPENAI_MODEL or gpt-6-astra)."),
    runs_dir: Path = typer.Option(Path("runs"), help="Where run records and the suite's folder go."),
    json_out: Optional[Path] = typer.Option(None, "--json", help="Also write the suite's report as JSON here."),
    junit_out: Optional[Path] = typer.Option(None, "--junit", help="Also write the report as JUnit XML here."),
    run_timeout: float = typer.Option(900.0, "--run-timeout", min=10.0, max=86400.0,
                                      help="Seconds one run may take; then it is cancelled (SIGTERM)."),
) -> None:
    """Run task files, each --repeat times in a fresh sandbox, at most --parallel at once; report.

    Each run is `run-task` in a process of its own (its own runs/<id>/ record). Shows the runs going,
    then a table per task (passes/runs, median time, steps) and a summary; writes
    runs/suite-<id>/index.json (every run's record folder, status, times) and prints its path on stdout.

    \b
    Exit status:
      0    every run passed
      1    a run failed or ended in error
      2    bad input (a task, its offline script, an option), before anything started
      130  cancelled (Ctrl-C, SIGTERM or SIGHUP): every run going is cancelled as run-task cancels (sandbox removed,
           record finished `cancelled`), runs not started are reported as not_started
    """
    from controller import suite
    from controller.offline.scripted_server import ScriptError, load_script
    from controller.run.tasks import TaskError, load_task
    from controller.sandbox import (INTERRUPT_SIGNALS, BackendUnavailable, SandboxError, SandboxInterrupted,
                                    raise_on_signals, signals_deferred)

    with signals_deferred(redeliver=False) as noted:
        try:
            files = suite.find_task_files(paths)
        except suite.SuiteError as exc:
            _refuse(f"run-suite: {exc}")
        offline = not (live if live is not None else bool(os.environ.get("OPENAI_API_KEY")))
        tasks = []
        for path in files:
            try:
                task = load_task(path)
                if offline:
                    load_script(task.offline_script_path())
            except (TaskError, ScriptError) as exc:
                _refuse(f"cannot use task {path}: {exc}")
            tasks.append((task.name, path))
        cls = _backend(backend)
        _writable_runs_dir(runs_dir)
        if not noted:
            try:  # once, before the runs: N runs must not each build a missing image
                with raise_on_signals(INTERRUPT_SIGNALS):
                    cls.ensure_image(cls.make_options(image=image_tag), _say)
            except (KeyboardInterrupt, SandboxInterrupted) as exc:
                noted.append(signal.SIGINT if isinstance(exc, KeyboardInterrupt) else exc.signum)
            except (BackendUnavailable, SandboxError) as exc:
                _refuse(f"run-suite: {exc}")
        if noted:
            _say(f"cancelled ({signal.Signals(noted[0]).name}) before any run started")
            raise typer.Exit(130)
        options = suite.SuiteOptions(parallel=parallel, runs_dir=runs_dir, backend=backend, image=image_tag,
                                     live=live, model=model, run_timeout_s=run_timeout)
        plan = suite.plan_runs(tasks, repeat)
        _say(f"run-suite: {len(plan)} run(s) of {len(tasks)} task(s), at most {parallel} at once ({backend})")
        runner, report = suite.run_suite(plan, options, repeat=repeat, console=console)
        console.print(suite.task_table(report))
        style = "green" if report["status"] == "passed" else ("yellow" if report["cancelled"] else "red")
        _say(suite.summary_line(report), 2000, style=style)
        for target, data in ((json_out, suite.report_json), (junit_out, suite.junit_xml)):
            if target is not None:
                try:
                    suite.write_atomic(target, data(report))
                except OSError as exc:
                    _error(f"cannot write {target}:", exc)
                    raise typer.Exit(1) from None
                _say(f"wrote {target}")
        typer.echo(str(runner.index_path))
        raise typer.Exit(suite.exit_status(report))


@app.command()
def render(
    task_file: Path = typer.Argument(..., help="Task TOML whose sandbox to render."),
    backend: str = typer.Option("kubernetes", "--backend", help="Only kubernetes renders manifests."),
    namespace: Optional[str] = typer.Option(None, "--namespace",
                                            help="Namespace in the manifests (default $DESKTOP_SANDBOX_K8S_NAMESPACE, "
                                                 "else desktop-sandbox)."),
    image_tag: Optional[str] = typer.Option(None, "--image", help="Image the cluster pulls (default "
                                            "$DESKTOP_SANDBOX_K8S_IMAGE, else desktop-sandbox:latest)."),
) -> None:
    """Print the Kubernetes manifests (YAML) of one sandbox for TASK, as `--backend kubernetes` creates
    them; nothing is contacted. Exit 2 for a bad task or another backend."""
    from controller.run.tasks import TaskError, load_task
    from controller.sandbox import SandboxSpec

    if backend != "kubernetes":
        _refuse(f"render: only --backend kubernetes has manifests (not {clean(backend, 40)})")
    try:
        task = load_task(task_file)
    except TaskError as exc:
        _refuse(f"cannot load task: {exc}")
    from controller.sandbox import kubernetes as k8s

    options = k8s.KubernetesSandbox.make_options(image=image_tag)
    options.namespace = namespace or os.environ.get(k8s.NAMESPACE_ENV) or "desktop-sandbox"
    spec = SandboxSpec(screen_width=task.screen.width, screen_height=task.screen.height,
                       policy=task.network.model_dump(mode="json"))
    try:
        typer.echo(k8s.render_for_task(spec, options), nl=False)
    except ValueError as exc:
        _refuse(f"cannot render {clean(task_file, 200)}: {clean(exc, 400)}")
    except ImportError:
        _refuse("render needs PyYAML: pip install 'desktop-sandbox[kubernetes]'")


def _token_path(sandbox_id: str) -> Path:
    base = Path(os.environ.get("XDG_RUNTIME_DIR") or Path.home() / ".cache")
    return base / "desktop-sandbox" / f"{sandbox_id}.token"


@app.command("console")
def console_cmd(
    runs_dir: Path = typer.Option(Path("runs"), "--runs-dir", help="Where the run records are (runs/<id>/)."),
) -> None:
    """Serve the local web console for browsing recorded runs (their reports and screenshots).

    Listens on 127.0.0.1 only, on a free port, and prints one line, ``console: <url>``: open that URL
    once (its token is spent on first use) in a browser on this machine. Ctrl-C stops it.
    """
    import threading

    from controller.console.server import ConsoleServer

    if runs_dir.exists() and not runs_dir.is_dir():
        _refuse(f"--runs-dir {runs_dir} is not a directory")
    server = ConsoleServer(runs_dir).start()
    stop = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        print(f"console: {server.url}", flush=True)
        stop.wait()
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        server.stop()


@app.command("serve")
def serve_cmd(
    port: int = typer.Option(0, "--port", min=0, max=65535, help="Port on 127.0.0.1 (0: a free one)."),
    key_file: Optional[Path] = typer.Option(None, "--key-file", help="The API key: read from this file, or a "
                                            "new one written there (0600) when it does not exist. Default: "
                                            "RUNS_DIR/agents-api.key."),
    backend: str = typer.Option(DEFAULT_BACKEND, "--backend", help=BACKEND_HELP),
    image_tag: Optional[str] = typer.Option(None, "--image", help=IMAGE_HELP),
    runs_dir: Path = typer.Option(Path("runs"), "--runs-dir", help="Where run records (and agents.db) go."),
    db: Optional[Path] = typer.Option(None, "--db", help="The sessions' database (default RUNS_DIR/agents.db)."),
    approval_timeout: float = typer.Option(300.0, "--approval-timeout", min=1.0, max=86400.0,
                                           help="Seconds a safety check waits for an answer before it is denied."),
    ui: bool = typer.Option(False, "--ui", help="Also serve the web console (prints 'console: URL'): every turn "
                                                  "is a live run there, its approvals answerable beside the API."),
    attach_network: list[str] = typer.Option([], "--attach-network", help="A Docker network each session's "
                                             "gateway joins (repeatable; docker backend): origins of yours on it, "
                                             "as a task's network policy allows them."),
    max_sessions: int = typer.Option(8, "--max-sessions", min=1, max=256,
                                     help="Sessions holding a sandbox at once (one more is refused: 429)."),
) -> None:
    """Serve the Agents API's sessions (client.beta.agents.sessions of the openai SDK) on 127.0.0.1.

    A program using OpenAI(base_url="http://127.0.0.1:PORT/v1", api_key=KEY) creates sessions (each a
    sandbox), sends messages (each a turn of run-task's model loop: live with OPENAI_API_KEY, or
    agent.model "offline:TASK_FILE"), follows the events, answers approvals, lists items, deletes.
    Prints one line on stderr once it accepts requests: agents-api: URL key-file: PATH. Ctrl-C or
    SIGTERM stops it and removes every session's sandbox. Exit 2 for a bad option, key file or a
    database another server uses.
    """
    from controller.agents_api.server import KeyFileError, ServeOptions, serve_forever
    from controller.agents_api.sessions import HubOptions
    from controller.agents_api.store import StoreBusy

    _backend(backend)
    _writable_runs_dir(runs_dir)
    if attach_network and backend != "docker":
        _refuse("--attach-network needs the docker backend")
    options = ServeOptions(port=port, key_file=key_file, db=db,
                           hub=HubOptions(runs_dir=runs_dir, backend=backend, image=image_tag,
                                          approval_timeout_s=approval_timeout, attach_networks=list(attach_network),
                                          max_sessions=max_sessions))
    try:
        serve_forever(options, ui=ui, say=lambda line: typer.echo(line, err=True))
    except (KeyFileError, StoreBusy) as exc:
        _refuse(str(exc))
    except (OSError, RuntimeError) as exc:  # the port is taken
        _refuse(f"cannot serve: {exc}")


if __name__ == "__main__":
    app()
