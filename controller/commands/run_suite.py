"""``desktop-sandbox run-suite``: many task files, each run (``run-task`` in a process of its own)
``repeat`` times, at most ``parallel`` at once (:mod:`controller.suite`); the tables and reports."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any, Optional

import typer

from controller.commands.common import backend_class, console, error, refuse, say, writable_runs_dir
from controller.commands.pool import pool_summary
from controller.sandbox.pool_keeper import ENV


def _warm_pool(cls: Any, image_tag: Optional[str], specs: list[Any], size: int) -> tuple[Any, Any]:
    """A started warm pool of ``size`` per template of ``specs`` (``(spec, launch, ready)`` each, as
    :meth:`controller.run.tasks.Task.pool_apps` gives the apps) and its claim socket's keeper."""
    from controller.sandbox import CapabilityMissing
    from controller.sandbox.pool import Template, WarmPool
    from controller.sandbox.pool_keeper import PoolKeeper

    try:
        pool = WarmPool(cls, cls.make_options(image=image_tag), [Template.of(*s) for s in specs], size)
    except CapabilityMissing as exc:
        refuse(f"run-suite --pool: {exc}")
    say(f"run-suite: keeping {size} warm sandbox(es) per template ({len(pool.templates)} template(s))")
    return pool.start(), PoolKeeper(pool).start()


def run_suite(paths: list[Path], *, parallel: int, repeat: int, backend: str, image_tag: Optional[str],
              live: Optional[bool], model: Optional[str], runs_dir: Path, json_out: Optional[Path],
              junit_out: Optional[Path], run_timeout: float, pool: int = 0, video: bool = False) -> None:
    """Run the tasks under ``paths`` with the command's options: every task (and, offline, its script;
    its ``[offline] web`` recording, verified) checked and the image ensured before any run; the runs
    shown as they go, a table per task and a summary on stderr, the JSON and JUnit reports written when
    asked, the suite's index path on stdout.
    With ``pool`` N a warm pool of N sandboxes per task template is kept while the suite runs and each
    run claims from it (``run-task --pool``); the report gets its counts (``pool``). With ``video`` each run
    records its video (``run-task --video``). Exits with :func:`controller.suite.exit_status` (2 for refused input, 130 when cancelled)."""
    from controller import suite
    from controller.offline.script import ScriptError, load_task_script
    from controller.run.tasks import TaskError, load_task
    from controller.run.web import WebRecordingError, load_recording
    from controller.sandbox import (INTERRUPT_SIGNALS, BackendUnavailable, SandboxError, SandboxInterrupted,
                                    raise_on_signals, signals_deferred)

    with signals_deferred(redeliver=False) as noted:
        try:
            files = suite.find_task_files(paths)
        except suite.SuiteError as exc:
            refuse(f"run-suite: {exc}")
        offline = not (live if live is not None else bool(os.environ.get("OPENAI_API_KEY")))
        tasks = []
        templates: list[Any] = []
        for path in files:
            try:
                task = load_task(path)
                if offline:
                    load_task_script(task)
                if task.offline_web_path() is not None:  # served in every mode: verified as each run will
                    load_recording(task.offline_web_path())
            except (TaskError, ScriptError) as exc:
                refuse(f"cannot use task {path}: {exc}")
            except WebRecordingError as exc:
                refuse(f"cannot use task {path}: its web recording ([offline] web) is refused: {exc}")
            tasks.append((task.name, path))
            templates.append((task.sandbox_spec(), *task.pool_apps()))
        cls = backend_class(backend)
        writable_runs_dir(runs_dir)
        if not noted:
            try:  # once, before the runs: N runs must not each build a missing image
                with raise_on_signals(INTERRUPT_SIGNALS):
                    cls.ensure_image(cls.make_options(image=image_tag), say)
            except (KeyboardInterrupt, SandboxInterrupted) as exc:
                noted.append(signal.SIGINT if isinstance(exc, KeyboardInterrupt) else exc.signum)
            except (BackendUnavailable, SandboxError) as exc:
                refuse(f"run-suite: {exc}")
        if noted:
            say(f"cancelled ({signal.Signals(noted[0]).name}) before any run started")
            raise typer.Exit(130)
        options = suite.SuiteOptions(parallel=parallel, runs_dir=runs_dir, backend=backend, image=image_tag,
                                     live=live, model=model, run_timeout_s=run_timeout, video=video)
        plan = suite.plan_runs(tasks, repeat)
        say(f"run-suite: {len(plan)} run(s) of {len(tasks)} task(s), at most {parallel} at once ({backend})")
        warm = _warm_pool(cls, image_tag, templates, pool) if pool else None
        try:
            if warm is not None:
                options.env[ENV] = str(warm[1].path)
            runner, report = suite.run_suite(plan, options, repeat=repeat, console=console)
        finally:
            if warm is not None:
                warm[1].close()
                warm[0].close()
        if warm is not None:
            report["pool"] = {"size": pool, **warm[0].stats.as_dict()}
            try:
                suite.write_atomic(runner.index_path, suite.report_json(report))
            except OSError as exc:
                error(f"cannot write {runner.index_path}:", exc)
            say(pool_summary(warm[0].stats))
        console.print(suite.task_table(report))
        style = "green" if report["status"] == "passed" else ("yellow" if report["cancelled"] else "red")
        say(suite.summary_line(report), 2000, style=style)
        for target, data in ((json_out, suite.report_json), (junit_out, suite.junit_xml)):
            if target is not None:
                try:
                    suite.write_atomic(target, data(report))
                except OSError as exc:
                    error(f"cannot write {target}:", exc)
                    raise typer.Exit(1) from None
                say(f"wrote {target}")
        typer.echo(str(runner.index_path))
        raise typer.Exit(suite.exit_status(report))
