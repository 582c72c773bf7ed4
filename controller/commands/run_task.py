"""``desktop-sandbox run-task``: one task in a fresh sandbox through the model loop
(:func:`controller.run.runner.run_task`), its inputs refused before anything starts, the web console
beside it with ``--ui``; and the sandbox opener the run uses."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import typer

from controller.commands.common import backend_class, console, refuse, say, with_arch, writable_runs_dir
from wire.actions import ACTION_TYPES
from wire.browser_tools import GUEST_MEMBERS

RUNNERS = ("sdk", "agent-framework")
"""``run-task --runner`` values: the SDK's own loop, or an Agent Framework agent (:mod:`controller.af`)."""


def run_task(task_file: Path, *, image_tag: Optional[str], live: Optional[bool], model: Optional[str],
             max_steps: Optional[int], script: Optional[Path], legacy: Optional[bool],
             approve_safety_check: list[str], approve_origin: list[str], confirm_actions: str, step: bool,
             runs_dir: Path, backend: str, ui: bool, approval_timeout: float, runner: str, arch: str,
             opener: Callable[..., Callable[[Any], Any]], sign_in: Optional[Path] = None,
             attach_network: Optional[list[str]] = None, record_typed_text: bool = False,
             pool: Optional[Path] = None, record_web: bool = False, video: bool = False) -> None:
    """Run ``task_file`` with the command's options; the sandbox comes from ``opener(backend, image_tag)``
    (``arch=``, ``attach_networks=``, ``pool=`` added when given; :func:`sandbox_opener` unless
    replaced); ``video``: record the run's video (``--video``, :mod:`controller.run.video`, default settings).
    Prints the record path on stdout and exits with the run's status (0 passed, 1 failed or error, 2 refused input, 130 cancelled)."""
    from controller.offline.script import ScriptError, load_task_script
    from controller.run.runner import RunOptions, watching
    from controller.run.runner import run_task as run
    from controller.run.tasks import TaskError, load_task
    from controller.run.video import VideoSettings
    from controller.sandbox import INTERRUPT_SIGNALS, SandboxInterrupted, raise_on_signals, signals_deferred

    # Until the run's record is finished no signal cuts a step in half: before the run begins they are
    # noted here (the run then ends `cancelled` at once, with its record), from then on run_task handles
    # them, and once it has returned there is nothing left to stop.
    with signals_deferred(redeliver=False) as noted:
        try:
            task = load_task(task_file)
        except TaskError as exc:  # one line naming the file and the field
            refuse(f"cannot load task: {exc}")
        backend_class(backend)
        confirm = [a.strip() for a in confirm_actions.split(",") if a.strip()]
        known = [*ACTION_TYPES, *(m for m in GUEST_MEMBERS if m not in ACTION_TYPES)]
        unknown = [a for a in confirm if a not in known]
        if unknown:
            refuse(f"--confirm-actions: unknown action type(s) {', '.join(unknown)} (a computer action type: "
                   f"{', '.join(ACTION_TYPES)}; or a browser member: {', '.join(GUEST_MEMBERS)})")
        if any(not code.strip() for code in approve_safety_check):
            refuse("--approve-safety-check needs a safety check code (e.g. sensitive_action)")
        origins = approve_origins(approve_origin)
        if sign_in is not None:
            from controller.run.signin import SignInFileError, check_signin_file

            try:
                check_signin_file(sign_in)
            except SignInFileError as exc:
                refuse(f"--sign-in: {exc}")
        if attach_network and backend != "docker":
            refuse("--attach-network needs the docker backend")
        loop = runner_loop(runner)
        writable_runs_dir(runs_dir)
        if not (live if live is not None else bool(os.environ.get("OPENAI_API_KEY"))):
            try:  # the offline exercise: refuse a missing or malformed script before a sandbox starts
                load_task_script(task, script)
            except (ScriptError, TaskError) as exc:  # a bad script, or a task without [offline]
                refuse(f"cannot use the offline script: {exc}")
        if task.offline_web_path() is not None:  # served instead of the network: verified before a sandbox starts
            from controller.run.web import WebRecordingError, load_recording

            try:
                load_recording(task.offline_web_path())
            except WebRecordingError as exc:
                refuse(f"cannot use the task's web recording ([offline] web): {exc}")
        open_sandbox = _not_opened
        if not noted:
            try:  # may build the image (minutes): a signal stops that at once, nothing else is started
                with raise_on_signals(INTERRUPT_SIGNALS):
                    open_sandbox = opener(backend, image_tag, **({"arch": arch} if arch else {}),
                                          **({"attach_networks": list(attach_network)} if attach_network else {}),
                                          **({"pool": pool} if pool else {}))
            except (KeyboardInterrupt, SandboxInterrupted) as exc:
                noted.append(signal.SIGINT if isinstance(exc, KeyboardInterrupt) else exc.signum)
                console.print(f"interrupted before the run ({signal.Signals(noted[-1]).name})", markup=False)

        options = RunOptions(
            runs_dir=runs_dir, live=live, model=model, max_steps=max_steps, script=script, legacy=legacy,
            approve_codes=list(approve_safety_check), approve_origins=origins, approval_timeout_s=approval_timeout,
            confirm_actions=confirm, step=step, signals_before=noted, runner=runner, sign_in_file=sign_in,
            record_typed_text=record_typed_text, record_web=record_web,
            video=VideoSettings() if video else None,
        )
        server = None
        views = []
        if ui and not noted:
            from controller.console.server import ConsoleServer

            server = ConsoleServer(runs_dir).start()
            views.append(watching(_follow_in(server)))
        try:
            outcome = run(task, open_sandbox, options, console=console, views=views, loop=loop)
            if server is not None and sys.stdin.isatty():
                _keep_serving(server, noted, outcome.record_dir.name)
        finally:
            if server is not None:
                server.stop()
        typer.echo(str(outcome.record_dir / "record.jsonl"))
        raise typer.Exit(outcome.exit_code)


def runner_loop(runner: str) -> Any:
    """The model loop for ``--runner`` (``run_task(..., loop=)``): None for ``sdk``, :func:`controller.af.run_loop` for
    ``agent-framework``; refuses (exit 2) another name, or ``agent-framework`` without the ``[af]`` extra."""
    if runner not in RUNNERS:
        refuse(f"--runner: unknown runner {runner!r} (one of {', '.join(RUNNERS)})")
    if runner == "sdk":
        return None
    try:
        from controller.af import run_loop
    except ImportError as exc:
        refuse(f"--runner agent-framework needs the [af] extra (pip install -e '.[af]'): {exc}")
    return run_loop


def approve_origins(given: list[str]) -> list[Any]:
    """``--approve-origin`` values parsed as the gateway parses origins (``controller.gateway.policy.Origin``:
    scheme, IDNA host, effective port; duplicates dropped); refuses (exit 2) one that does not parse."""
    from controller.gateway.policy import Origin, PolicyError

    origins: list[Any] = []
    for text in given:
        try:
            origin = Origin.parse(text)
        except PolicyError as exc:
            refuse(f"--approve-origin: {exc}")
        if origin not in origins:
            origins.append(origin)
    return origins


def _follow_in(server: Any) -> Callable[[Any], None]:
    """What ``--ui`` does with the run's console view (:func:`controller.run.runner.watching`): the run goes into the console, and the console's one-time
    login URL is printed (``console: URL``, stderr) as soon as the run has its id; it opens that run's
    page."""
    def follow(live: Any) -> None:
        server.add_run(live)
        typer.echo(f"console: {server.url_for_run(live.run_id)}", err=True)

    return follow


def _keep_serving(server: Any, noted: list[int], run_id: str) -> None:
    """After a run with ``--ui`` on a terminal: the console goes on showing the run (now its report, at
    its page) until Enter, or a signal (``noted`` grows: signals are deferred here)."""
    import select

    console.print(f"the console goes on showing this run at {server.base}/runs/{run_id}: press Enter (or Ctrl-C) "
                  "to stop it", markup=False, highlight=False)
    before = len(noted)
    while len(noted) == before:
        ready, _, _ = select.select([sys.stdin], [], [], 0.2)  # poll interval: a deferred signal only lands in `noted`
        if ready:
            sys.stdin.readline()
            return


def _not_opened(task: Any) -> Any:
    """The opener of a run cancelled before it began (run_task never calls it then)."""
    raise RuntimeError("the run was cancelled before its sandbox was opened")


def sandbox_opener(backend: str, image_tag: Optional[str], arch: str = "",
                   attach_networks: Sequence[str] = (), pool: Optional[Path] = None) -> Callable[[Any], Any]:
    """``open_sandbox(task) -> Sandbox`` for ``run-task``: a fresh sandbox of the registry's ``backend``
    from ``image_tag`` (None: the backend's default image) for guest architecture ``arch`` ('' = the
    host's), built first when missing, sized and policed by the task, its gateway joined to each Docker
    network of ``attach_networks`` (``--attach-network``); with ``pool`` (a warm pool's claim socket,
    ``--pool``) claimed from that pool when it has one of the task's template, else started cold.
    Refuses (exit 2) when the backend cannot be reached."""
    from controller.sandbox import BackendUnavailable

    cls = backend_class(backend)
    try:
        options = cls.ensure_image(with_arch(cls.make_options(image=image_tag), arch), say)
    except BackendUnavailable as exc:
        refuse(str(exc))

    def open_sandbox(t):  # noqa: ANN001, ANN202
        spec = t.sandbox_spec(cls.default_ready_timeout)
        with console.status(f"claiming a {backend} sandbox" if pool else f"starting {backend} sandbox"):
            if pool:
                from controller.sandbox.pool_keeper import claim_from

                launch, ready = t.pool_apps()
                sandbox = claim_from(pool, spec, cls, start_cold=lambda: cls.start(spec, options), launch=launch,
                                     ready=ready)
            else:
                sandbox = cls.start(spec, options)
            try:
                for network in attach_networks:
                    sandbox.attach_gateway(network)
            except Exception:
                sandbox.close()
                raise
            return sandbox

    return open_sandbox
