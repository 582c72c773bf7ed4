"""``desktop-sandbox report``: a recorded run's summary (table or JSON), or its HTML review page."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from controller.commands.common import refuse
from controller.run.progress import make_console


def report(run: Path, *, as_json: bool, as_html: bool) -> None:
    """Print the summary of the run at ``run`` (its folder or record.jsonl) as a table, or as JSON
    (``as_json``), or write its report.html and print the path (``as_html``); exit 0 only if it passed,
    2 when ``run`` is no readable run record."""
    from controller.run.record import print_summary, read_entries, summarize

    if as_json and as_html:
        refuse("give --json or --html, not both")
    try:
        entries = read_entries(run)
    except (OSError, ValueError) as exc:
        refuse(f"cannot read the run record: {exc}")
    try:
        summary = summarize(entries)
        if as_html:
            from controller.report.html import write_report

            try:
                written = write_report(run)
            except OSError as exc:
                refuse(f"cannot write the report of {run}: {exc.strerror or exc}")
            typer.echo(str(written))
        elif as_json:
            typer.echo(json.dumps(summary, indent=2, allow_nan=False))
        else:
            print_summary(entries, run, console=make_console())
    # entries read_entries took whose free-form values cannot be shown or written as JSON (infinite numbers)
    except (AttributeError, TypeError, ValueError, KeyError, OverflowError, RecursionError) as exc:
        refuse(f"cannot read {run}: not a run record ({type(exc).__name__}: {exc})")
    raise typer.Exit(0 if summary["status"] == "passed" else 1)
