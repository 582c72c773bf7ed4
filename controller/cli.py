"""``desktop-sandbox`` command line (typer): it parses and dispatches, nothing else.

Every command's options, help text and exit statuses are declared here, so what a user can type reads
in one place; each command's body hands the parsed values to its module in :mod:`controller.commands`
(``build``, ``up``, ``down``, ``run_task``, ``report``, ``audit``, ``run_suite``, ``render``, ``servers``),
which does the work over the feature's own modules: controller.sandbox.image, a backend of
controller.sandbox.registry, controller.run.runner, controller.run.record, controller.audit,
controller.suite, controller.sandbox.kubernetes, controller.console and controller.agents_api. ``bench``
passes its arguments on to controller.bench (``--suite``: controller.bench_suite; ``--agents-api``:
controller.agents_api.bench). ``--backend`` names a backend of the registry.
"""

from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path
from typing import Any, Optional

import typer

from controller.commands import servers
from controller.commands.audit import audit as audit_command
from controller.commands.build import build as build_command
from controller.commands.common import console, refuse
from controller.commands.down import down as down_command
from controller.commands.render import render as render_command
from controller.commands.replay import replay_run
from controller.commands.report import report as report_command
from controller.commands.run_suite import run_suite
from controller.commands.run_task import run_task, sandbox_opener
from controller.commands import snapshot as snapshot_commands
from controller.commands.pool import capabilities as capabilities_command, keep_pool as pool_command, pool_size
from controller.commands.up import up as up_command
from controller.sandbox.registry import DEFAULT_BACKEND, backend_names
from controller.text import clean_lines

if not sys.stdout.isatty() and not os.environ.get("COLUMNS") and not os.environ.get("TERMINAL_WIDTH"):
    # --help piped (into less, a file): typer's help console would default to 80 columns and split words.
    import typer.rich_utils

    typer.rich_utils.MAX_WIDTH = 120

UNCAUGHT_CHARS = 20000
"""Longest traceback of an uncaught exception :class:`_App` prints (characters; its end is kept)."""


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


BACKEND_HELP = f"Backend: {' or '.join(backend_names())}."
IMAGE_HELP = "Guest image: a Docker tag (default desktop-sandbox:latest) or a VM image directory (default: the built one)."


ARCH_HELP = ("Guest architecture: amd64 | arm64 (default the host's). A foreign one runs under emulation: "
             "the Docker image desktop-sandbox:latest-ARCH (`desktop-sandbox build --arch`), a VM under TCG.")


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
    build_command(tag, base, no_cache=no_cache, wheelhouse=wheelhouse, verbose=verbose, arch=arch)


@app.command()
def up(
    image_tag: Optional[str] = typer.Option(None, "--image", help=IMAGE_HELP),
    width: int = typer.Option(1280, help="Screen width (screen px)."),
    height: int = typer.Option(800, help="Screen height (screen px)."),
    allow: list[str] = typer.Option([], help="Allowlisted origin (repeatable); none: deny all."),
    detach: bool = typer.Option(False, help="Leave it running; print where its token is and exit."),
    backend: str = typer.Option(DEFAULT_BACKEND, "--backend", help=BACKEND_HELP),
    arch: str = typer.Option("", "--arch", help=ARCH_HELP),
    from_snapshot: Optional[str] = typer.Option(
        None, "--from", help="Restore from this snapshot (an id under $DESKTOP_SANDBOX_SNAPSHOTS or ./snapshots, "
                             "or its directory) instead: its screen, policy and backend; refused if its state "
                             "cannot be proven."),
    count: int = typer.Option(1, "--count", help="With --from: restore this many independent sandboxes (1-16)."),
    pool: Optional[str] = typer.Option(None, "--pool", metavar="N|auto",
                                       help="Keep a warm pool of N sandboxes instead (auto: what this host's memory "
                                            "holds, at most 4) and serve claims until Ctrl-C: prints the claim "
                                            "socket for run-task --pool. Of --width x --height with no apps, or of "
                                            "each --task's template (its screen and the apps it launches)."),
    pool_task: list[Path] = typer.Option([], "--task", help="With --pool: keep N sandboxes of this task's template "
                                                           "(repeatable), so that its runs claim one."),
    capabilities: bool = typer.Option(False, "--capabilities", help="Print what each backend can do and exit."),
) -> None:
    """Start a sandbox, print how to reach its agent (token file, example curl line), and keep it until
    Ctrl-C (or `down ID`, when detached).

    Ctrl-C or SIGTERM while it starts abandons the start (exit 130); afterwards it removes the sandbox
    and the token file (exit 0). Either way nothing is left, also under a second signal.
    """
    if from_snapshot is not None or count != 1:
        changed = [name for name, given in (("--width", width != 1280), ("--height", height != 800),
                                            ("--allow", bool(allow)), ("--arch", bool(arch)),
                                            ("--backend", backend != DEFAULT_BACKEND), ("--pool", pool is not None),
                                            ("--capabilities", capabilities), ("--task", bool(pool_task))) if given]
        snapshot_commands.up_from(from_snapshot, count=count, detach=detach, image_tag=image_tag, changed=changed)
        return
    if capabilities:
        capabilities_command()
        return
    if pool is not None:
        ignored = [name for name, given in (("--allow", bool(allow)), ("--detach", detach)) if given]
        if ignored:
            refuse(f"{', '.join(ignored)}: not with --pool (a claim gives each sandbox its task's policy; "
                   "the pool lives as long as this command)")
        pool_command(image_tag, width=width, height=height, size=pool_size(pool), backend=backend, arch=arch,
                     tasks=pool_task)
        return
    if pool_task:
        refuse("--task: only with --pool")
    up_command(image_tag, width=width, height=height, allow=allow, detach=detach, backend=backend, arch=arch)


@app.command()
def snapshot(
    sandbox_id: str = typer.Argument(..., help="A running sandbox's id, as `up` prints it."),
    task: Optional[Path] = typer.Option(None, "--task", help="Task file: the files and app records its "
                                        "checks read go into the state proof."),
    snapshots_dir: Optional[Path] = typer.Option(None, "--dir", help="Where snapshots go (default "
                                                 "$DESKTOP_SANDBOX_SNAPSHOTS, else ./snapshots)."),
) -> None:
    """Save a running sandbox (started by `up`, also from another shell) as a snapshot; print its id.

    Docker: the guest's homes as files (processes do not survive: a restore starts the apps again); VM:
    the whole machine. `up --from ID [--count N]` restores it, after proving the restored state equals
    the saved one. Exit 2 for a bad id or task, or a backend that cannot snapshot; 1 when it fails.
    """
    snapshot_commands.snapshot(sandbox_id, task_file=task, root=snapshots_dir)


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
    carries each --label, when given), and their token files (with --all also those whose sandbox is
    gone, e.g. reaped by another start after its owner died). Exit 2 when a given id names no sandbox
    (nothing of it was found), or when no backend could be asked."""
    down_command(sandbox_ids, all_=all_, label=label, backend=backend)


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
                                     "unattended, for a task whose \\[network] mode is \"ask\" (repeatable; logged)."),
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
                                                       "agent-framework (an Agent Framework agent; needs the \\[af] extra)."),
    arch: str = typer.Option("", "--arch", help=ARCH_HELP),
    sign_in: Optional[Path] = typer.Option(
        None, "--sign-in", help="Answer the agent's browser's sign-in requests from this TOML file of origin -> "
                                "values (mode 0600; read anew for each request; docs/approvals.md, sign-in)."),
    attach_network: list[str] = typer.Option(
        [], "--attach-network", help="Docker network the sandbox's gateway also joins (a local site the task "
                                     "reaches, e.g. the sign-in demo's; repeatable; docker backend only)."),
    record_typed_text: bool = typer.Option(
        False, "--record-typed-text", help="Keep the text the model (or a person taking over) typed in the run "
                                           "record, so that `replay` can type it again; off by default (typed "
                                           "text may hold secrets)."),
    record_web: bool = typer.Option(
        False, "--record-web", help="Keep the plain-HTTP responses the policy let through in runs/<id>/web (no "
                                    "request body, nothing sent with a cookie; HTTPS is never recorded), so that "
                                    "`replay --offline-web` serves them instead of fetching."),
    video: bool = typer.Option(
        False, "--video", help="Record a video of the run, runs/<id>/run.webm (WebM: the screen at 2 frames a "
                               "second with the model's actions drawn on it), played in the HTML report and the "
                               "console; the task's \\[record] video = true does the same."),
    pool: Optional[Path] = typer.Option(
        None, "--pool", envvar="DESKTOP_SANDBOX_POOL",
        help="Claim the sandbox from the warm pool whose claim socket this is (`up --pool N` prints it; "
             "run-suite --pool sets it for its runs); an empty or unreachable pool means a cold start."),
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
    run_task(task_file, image_tag=image_tag, live=live, model=model, max_steps=max_steps, script=script,
             legacy=legacy, approve_safety_check=approve_safety_check, approve_origin=approve_origin,
             confirm_actions=confirm_actions, step=step, runs_dir=runs_dir, backend=backend, ui=ui,
             approval_timeout=approval_timeout, runner=runner, arch=arch, opener=sandbox_opener, sign_in=sign_in,
             attach_network=attach_network, record_typed_text=record_typed_text, pool=pool,
             record_web=record_web, video=video)


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
    report_command(run, as_json=as_json, as_html=as_html)


@app.command()
def replay(
    run: Path = typer.Argument(..., help="A recorded run directory (runs/<id>) or its record.jsonl."),
    image_tag: Optional[str] = typer.Option(None, "--image", help=IMAGE_HELP + " Built if missing."),
    backend: str = typer.Option(DEFAULT_BACKEND, "--backend", help=BACKEND_HELP),
    runs_dir: Path = typer.Option(Path("runs"), help="Where the replay's run record goes."),
    write_task: Optional[Path] = typer.Option(None, "--write-task", help="Also save the replay as this task file, "
                                              "its offline script beside it and, when the recorded run kept its "
                                              "web origins, their recording as the folder STEM.web (its "
                                              "\\[offline] web), for run-suite; the folder is made if missing."),
    attach_network: list[str] = typer.Option(
        [], "--attach-network", help="Docker network the sandbox's gateway also joins (as for run-task)."),
    tolerance: int = typer.Option(16, "--tolerance", min=0, max=255,
                                  help="Largest RGB channel difference a pixel may have and still count as unchanged."),
    max_changed: float = typer.Option(0.05, "--max-changed", min=0.0, max=1.0,
                                      help="Largest share of a region's pixels that may differ for the step to match."),
    approve_safety_check: list[str] = typer.Option(
        [], "--approve-safety-check", help="Approve pending safety checks with this code unattended, as for run-task "
                                           "(repeatable; logged). Never one the recorded run was refused."),
    sign_in: Optional[Path] = typer.Option(
        None, "--sign-in", help="Answer the sign-in requests from this TOML file of origin -> values, as for run-task "
                                "(mode 0600; never recorded). Never one the recorded run did not complete."),
    approval_timeout: float = typer.Option(300.0, "--approval-timeout", min=1.0, max=86400.0,
                                           help="Seconds a question waits for an answer before it is denied."),
    step_timeout: Optional[float] = typer.Option(
        None, "--step-timeout", min=1.0, max=3600.0, show_default=False,
        help="Seconds a step waits for the screen to match before it diverges, times the sandbox's slowness "
             "factor \\[default: 30]."),
    offline_web: bool = typer.Option(
        False, "--offline-web", help="Serve the pages the recorded run fetched (its runs/<id>/web, `run-task "
                                     "--record-web`) instead of fetching them: what it lacks is denied, nothing "
                                     "goes to the network."),
    video: bool = typer.Option(False, "--video", help="Record a video of the replay, as for run-task."),
) -> None:
    """Replay a recorded run on a fresh sandbox as a regression test, without a model or an API key.

    Each recorded computer call runs again once the screen matches, where its actions land, the
    screenshot the model chose it on (the screen comparison rule, docs/ARCHITECTURE.md); a person's
    actions during a takeover are performed again as a person's. What the recorded run was asked is
    asked again as in any run (terminal, --approve-safety-check, --sign-in; nobody to ask: denied); what
    it was refused is refused again and not performed. Prints one row per step -- matched, diverged,
    denied, not reached -- then the task's checks.

    \b
    Exit status:
      0    every step matched and the run passed
      1    a step diverged or was denied (the replay stopped there), a check failed or the run failed
           (also when it ends refused as the recorded run did)
      2    the record cannot be replayed (e.g. typed text recorded as its length only), or bad input
      130  cancelled
    """
    replay_run(run, image_tag=image_tag, backend=backend, runs_dir=runs_dir, write_task_to=write_task,
               opener=sandbox_opener, attach_network=attach_network, tolerance=tolerance, max_changed=max_changed,
               approve_safety_check=approve_safety_check, sign_in=sign_in, approval_timeout=approval_timeout,
               step_timeout=step_timeout, offline_web=offline_web, video=video)


@app.command()
def audit(
    policy: Optional[Path] = typer.Option(None, "--policy", help="Policy file (TOML: a network table, or mode/allow at top level)."),
    task: Optional[Path] = typer.Option(None, "--task", help="Task file; its network table is audited."),
    json_out: Optional[Path] = typer.Option(None, "--json", help="Also write the JSON report to this file."),
    image_tag: Optional[str] = typer.Option(None, "--image", help=IMAGE_HELP),
    backend: str = typer.Option(DEFAULT_BACKEND, "--backend", help=BACKEND_HELP),
    arch: str = typer.Option("", "--arch", help=ARCH_HELP),
    swap_from: Optional[Path] = typer.Option(None, "--swap-from", help="Start the sandbox with this policy file "
                                             "and swap the audited policy in at runtime first (docker)."),
    via_pool: bool = typer.Option(False, "--via-pool", help="Audit a sandbox claimed from a warm pool (docker)."),
) -> None:
    """Probe the network policy from inside the guest; print a table, optionally write JSON.

    Without --policy/--task the policy is deny-all. Exit 0 only if every probe passed; 1 if any failed.
    """
    audit_command(policy, task, json_out=json_out, image_tag=image_tag, backend=backend, arch=arch,
                  swap_from=swap_from, via_pool=via_pool)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def bench(ctx: typer.Context) -> None:
    """Measure the agent (p50/p95, ms) against xdotool + ImageMagick import on a private Xvfb, and the
    driver's path through the relay into a Docker sandbox beside the in-guest floor, in one run.

    Options pass through to ``python -m controller.bench`` (--iterations N, --baseline-iterations N,
    --type-iterations N, --no-baseline, --image TAG, --backend docker|vm, --no-docker,
    --console-iterations N, --no-console, --json FILE). --browser adds the browser tools: a step of
    read_page + click + screenshot through the SDK's BrowserToolset beside the computer driver's step
    on one page (--browser-iterations N). Exit 0 only if every target was met.

    With --suite first: many sandboxes on this host instead (controller.bench_suite): memory and CPU of an
    idle and a busy sandbox, sandbox start and run-task wall time with 1, 2, 4 and 8 runs at once, the
    largest N at which every run passed (--levels 1,2,4,8, --task FILE, --image TAG, --idle-samples N,
    --runs-dir DIR, --json FILE). Exit 0 when the task passed alone.

    With --pool first: a warm pool beside cold starts (controller.bench_pool): a pool sandbox's idle
    memory, time to the first screenshot and a run-task run cold vs on a pool hit, N runs at once on a pool.

    With --mcp first: what the MCP server adds (controller.bench_mcp): a screenshot and a click through
    `desktop-sandbox mcp` over stdio, through the Python API and through the driver alone, interleaved
    (--iterations N, --image TAG, --json FILE). Exit 0 when MCP adds at most 5 ms p50 to each.

    With --agents-api first: the local Agents API (controller.agents_api.bench): session create to first
    screenshot event, and each step's screenshot from the guest to the SSE event, beside run-task's own
    step time (--steps 20, --sessions 3, --image TAG, --runs-dir DIR, --json FILE).

    With --video first: what a run's video costs (controller.bench_video): each grab a video may take (JPEG,
    the console's path, and PNG) on one sandbox, then the pickup run by run-task without and with --video,
    interleaved: wall time medians and their ratio, the frame rate measured (--runs 5, --grabs 40, --task
    FILE, --image TAG, --runs-dir DIR, --json FILE). Exit 0 when the video keeps the run within 15%.
    """
    args = list(ctx.args)
    if args[:1] == ["--suite"]:
        from controller.bench_suite import main as suite_main

        report = suite_main(args[1:])
    elif args[:1] == ["--pool"]:
        from controller.bench_pool import main as pool_main

        report = pool_main(args[1:])
    elif args[:1] == ["--mcp"]:
        from controller.bench_mcp import main as mcp_main

        report = mcp_main(args[1:])
    elif args[:1] == ["--agents-api"]:
        from controller.agents_api.bench import main as agents_main

        report = agents_main(args[1:])
    elif args[:1] == ["--video"]:
        from controller.bench_video import main as video_main

        report = video_main(args[1:])
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
    pool: Optional[str] = typer.Option(None, "--pool", metavar="N|auto",
                                       help="Keep N sandboxes per task template warm while the suite runs (auto: "
                                            "what this host's memory holds, at most 4); each run claims one (an "
                                            "empty pool: a cold start)."),
    video: bool = typer.Option(False, "--video", help="Record a video of every run (run-task --video): "
                                                      "runs/<id>/run.webm beside each record."),
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
    run_suite(paths, parallel=parallel, repeat=repeat, backend=backend, image_tag=image_tag, live=live,
              model=model, runs_dir=runs_dir, json_out=json_out, junit_out=junit_out, run_timeout=run_timeout,
              pool=pool_size(pool) if pool is not None else 0, video=video)


@app.command()
def render(
    task_file: Path = typer.Argument(..., help="Task TOML whose sandbox to render."),
    backend: str = typer.Option("kubernetes", "--backend", help="Only kubernetes renders manifests."),
    namespace: Optional[str] = typer.Option(None, "--namespace",
                                            help="Namespace in the manifests (default $DESKTOP_SANDBOX_K8S_NAMESPACE, "
                                                 "else desktop-sandbox)."),
    image_tag: Optional[str] = typer.Option(None, "--image", help="Image the cluster pulls (default "
                                            "$DESKTOP_SANDBOX_K8S_IMAGE, else desktop-sandbox:latest)."),
    pool: Optional[int] = typer.Option(None, "--pool", min=0, help="Print instead a warm pool of this many "
                                       "sandboxes as agent-sandbox objects (SandboxTemplate, SandboxWarmPool, "
                                       "SandboxClaim); deny-all tasks only."),
) -> None:
    """Print the Kubernetes manifests (YAML) of one sandbox for TASK, as `--backend kubernetes` creates
    them, or with --pool N a warm pool of N; nothing is contacted. Exit 2 for a bad task or another
    backend."""
    render_command(task_file, backend=backend, namespace=namespace, image_tag=image_tag, pool=pool)


@app.command("console")
def console_cmd(
    runs_dir: Path = typer.Option(Path("runs"), "--runs-dir", help="Where the run records are (runs/<id>/)."),
) -> None:
    """Serve the local web console for browsing recorded runs (their reports and screenshots).

    Listens on 127.0.0.1 only, on a free port, and prints one line, ``console: <url>``: open that URL
    once (its token is spent on first use) in a browser on this machine. Ctrl-C stops it.
    """
    servers.console(runs_dir)


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
    pool: Optional[str] = typer.Option(None, "--pool", metavar="N|auto",
                                       help="Keep N sandboxes (1280x800, no apps) warm (auto: what this host's memory "
                                            "holds, at most 4); a new session claims one (an empty pool: a cold "
                                            "start)."),
) -> None:
    """Serve the Agents API's sessions (client.beta.agents.sessions of the openai SDK) on 127.0.0.1.

    A program using OpenAI(base_url="http://127.0.0.1:PORT/v1", api_key=KEY) creates sessions (each a
    sandbox), sends messages (each a turn of run-task's model loop: live with OPENAI_API_KEY, or
    agent.model "offline:TASK_FILE"), follows the events, answers approvals, lists items, deletes.
    Prints one line on stderr once it accepts requests: agents-api: URL key-file: PATH. Ctrl-C or
    SIGTERM stops it and removes every session's sandbox. Exit 2 for a bad option, key file or a
    database another server uses.
    """
    servers.serve(port=port, key_file=key_file, backend=backend, image_tag=image_tag, runs_dir=runs_dir, db=db,
                  approval_timeout=approval_timeout, ui=ui, attach_network=attach_network,
                  max_sessions=max_sessions, pool=pool_size(pool) if pool is not None else 0)


@app.command("mcp")
def mcp_cmd(
    http: bool = typer.Option(False, "--http", help="Serve streamable HTTP on 127.0.0.1 (path /mcp) instead of stdio; "
                                                   "every request must carry the key (Authorization: Bearer)."),
    port: Optional[int] = typer.Option(None, "--port", min=0, max=65535, help="With --http: the port on 127.0.0.1 "
                                                                            "(default 0: a free one)."),
    key_file: Optional[Path] = typer.Option(None, "--key-file", help="With --http: the key, read from this file (a "
                                            "file of yours, mode 0600), or a new one written there (0600) when it "
                                            "does not exist. Default: RUNS_DIR/mcp.key. The key is never printed."),
    backend: str = typer.Option(DEFAULT_BACKEND, "--backend", help=BACKEND_HELP),
    image_tag: Optional[str] = typer.Option(None, "--image", help=IMAGE_HELP + " Built first if missing."),
    task: Optional[Path] = typer.Option(None, "--task", help="A task TOML whose \\[screen], \\[network], "
                                        "\\[\\[launch]] and \\[\\[ready]] each session's sandbox takes (name, "
                                        "instructions and checks optional). Default: an empty 1280x800 desktop "
                                        "under deny-all."),
    pool: Optional[Path] = typer.Option(None, "--pool", envvar="DESKTOP_SANDBOX_POOL",
                                        help="Claim each session's sandbox from the warm pool whose claim socket this "
                                             "is (`up --pool N` prints it); an empty or unreachable pool means a cold "
                                             "start."),
    confirm_actions: str = typer.Option("", "--confirm-actions", help="Ask before these action types, e.g. "
                                        "click,type: by MCP elicitation when the client supports it, otherwise "
                                        "they are refused."),
    step: bool = typer.Option(False, "--step", help="Ask before every action."),
    runs_dir: Path = typer.Option(Path("runs"), "--runs-dir", help="Where run records (and the default key file) go."),
    max_edge: int = typer.Option(1568, "--max-edge", min=64, max=8192,
                                 help="Longest edge of a screenshot the tools return (px)."),
    max_bytes: int = typer.Option(750_000, "--max-bytes", min=1024, max=16 * 1024 * 1024,
                                  help="Most bytes of image data a screenshot carries (750000: its base64 stays "
                                       "within 1,000,000 characters)."),
    apps_file: Optional[str] = typer.Option(None, "--apps-file", help="The guest agent's app allowlist inside the "
                                            "image (default: the image's own)."),
    approval_timeout: float = typer.Option(300.0, "--approval-timeout", min=1.0, max=86400.0,
                                           help="Seconds a question waits for an answer before it is denied."),
    idle_timeout: Optional[float] = typer.Option(None, "--idle-timeout", min=5.0, max=86400.0,
                                                 help="With --http: a session without a request or an open stream "
                                                      "for this many seconds ends, its sandbox removed (default 600)."),
    max_sessions: Optional[int] = typer.Option(None, "--max-sessions", min=1, max=256,
                                               help="With --http: sessions with a sandbox at once (default 8); a "
                                                    "session beyond them gets a tool error until one ends."),
) -> None:
    """Serve the sandbox's computer tools over MCP: one sandbox per MCP session (docs/mcp.md).

    Tools: screenshot, click, double_click, move, scroll, drag, keypress, type,
    wait, launch, read_file, run_task. A session's sandbox starts with its first
    tool call and is removed when the session ends (stdio: the client closes
    stdin; HTTP: the session's DELETE, its idle timeout, or the server's stop)
    or on SIGINT, SIGTERM or SIGHUP (then exit 0); its run record
    (runs/<id>/record.jsonl) is finished first. Over HTTP it prints one line on
    stderr once it accepts requests: mcp: URL key-file: PATH. Exit 2 for a bad
    option, task, key file or a backend that cannot start sandboxes here.
    """
    from controller.commands.mcp import mcp as mcp_command

    mcp_command(http=http, port=port, key_file=key_file, backend=backend, image_tag=image_tag, task=task, pool=pool,
                confirm_actions=confirm_actions, step=step, runs_dir=runs_dir, max_edge=max_edge, max_bytes=max_bytes,
                apps_file=apps_file, approval_timeout=approval_timeout, idle_timeout=idle_timeout,
                max_sessions=max_sessions)

if __name__ == "__main__":
    app()
