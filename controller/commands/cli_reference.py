"""The command line's help, rendered for the docs: ``desktop-sandbox --help`` and each command's
``--help``, exactly as typer prints them at a fixed width without colour.

``docs/cli.md`` holds :func:`reference_markdown` between its ``cli-reference`` markers, and a test keeps
the two equal (``tests/controller/test_docs.py``): after changing an option or a help text, run
``python -m controller.commands.cli_reference`` and paste its output into the page.
"""

from __future__ import annotations

import typer
import typer.rich_utils
from typer.testing import CliRunner

PROG = "desktop-sandbox"
WIDTH = 80
"""Columns the help is rendered at (typer's help console; independent of the terminal's)."""


def _help(app: typer.Typer, args: list[str]) -> str:
    result = CliRunner().invoke(app, [*args, "--help"], prog_name=PROG, env={"COLUMNS": str(WIDTH)})
    if result.exit_code != 0:
        raise RuntimeError(f"{PROG} {' '.join(args)} --help exited {result.exit_code}: {result.output}")
    return "\n".join(line.rstrip() for line in result.output.splitlines()).strip("\n")


def reference_markdown() -> str:
    """Markdown: a section per command (the top-level help first), each its ``--help`` in a text block."""
    from controller.cli import app  # the top of the tree: nothing else imports the CLI

    saved = (typer.rich_utils.MAX_WIDTH, typer.rich_utils.COLOR_SYSTEM, typer.rich_utils.FORCE_TERMINAL)
    typer.rich_utils.MAX_WIDTH, typer.rich_utils.COLOR_SYSTEM, typer.rich_utils.FORCE_TERMINAL = WIDTH, None, False
    try:
        names = list(typer.main.get_command(app).commands)  # in the order --help lists them
        parts = [f"### `{PROG}`\n\n```text\n{_help(app, [])}\n```\n"]
        parts += [f"### `{PROG} {name}`\n\n```text\n{_help(app, [name])}\n```\n" for name in names]
    finally:
        typer.rich_utils.MAX_WIDTH, typer.rich_utils.COLOR_SYSTEM, typer.rich_utils.FORCE_TERMINAL = saved
    return "\n".join(parts)


if __name__ == "__main__":  # pragma: no cover - a helper for editing the docs
    print(reference_markdown(), end="")
