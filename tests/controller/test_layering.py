"""The tree reads as the design (docs/ARCHITECTURE.md, Layout): imports go one way.

``wire`` imports neither side; the guest never imports the controller; nothing below the top (the CLI,
the benchmark, the Agents API server) imports the CLI or the runner, and only the CLI the server; the sandboxes, the gateway, the offline model and the audit do not import the
run loop. Checked on the source (every ``import``/``from`` statement, also inside functions, and every
import by a literal string), so a new module that breaks the layering fails here."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.controller.test_import_graph import _modules as _controller_modules
from tests.controller.test_import_graph import imported_names

ROOT = Path(__file__).resolve().parents[2]
_CONTROLLER_MODULES = frozenset(_controller_modules())


def _imports(path: Path) -> set[str]:
    """Every module name ``path`` imports, by statement or by string (absolute, resolved for relative
    imports; the walk of tests/controller/test_import_graph.py, whose docstring says what it follows)."""
    return imported_names(path, _CONTROLLER_MODULES, ROOT)


def _modules(*folders: str) -> list[Path]:
    return sorted(p for folder in folders for p in (ROOT / folder).rglob("*.py") if "__pycache__" not in p.parts)


RULES = [
    (("wire",), ("controller", "guest", "openai", "fastapi", "Xlib", "mitmproxy", "docker")),
    (("guest",), ("controller",)),
    (("controller/sandbox", "controller/gateway", "controller/offline", "controller/audit"),
     ("controller.cli", "controller.run", "controller.bench")),
    (("controller/run",), ("controller.cli", "controller.bench", "controller.audit", "controller.console",
                           "controller.report")),
    # views read the run (its record, its LiveRun) and never start, drive or tear down a sandbox
    (("controller/console", "controller/report"), ("controller.cli", "controller.bench", "controller.sandbox",
                                                   "controller.run.runner", "docker")),
]


@pytest.mark.parametrize("folders, forbidden", RULES, ids=[",".join(r[0]) for r in RULES])
def test_imports_go_one_way(folders, forbidden):
    wrong = []
    for path in _modules(*folders):
        for name in _imports(path):
            if any(name == f or name.startswith(f + ".") for f in forbidden):
                wrong.append(f"{path.relative_to(ROOT)} imports {name}")
    assert not wrong, "\n".join(sorted(set(wrong)))


def test_nothing_below_the_top_imports_the_cli_or_the_runner():
    # the top: the CLI (its parser and the commands' work), the benchmark and the Agents API server (it
    # runs each turn with the runner)
    cli = {ROOT / "controller" / "cli.py", *_modules("controller/commands")}
    top = {*cli, ROOT / "controller" / "bench.py", *_modules("controller/agents_api")}
    wrong = [f"{p.relative_to(ROOT)} imports {n}" for p in _modules("controller", "guest", "wire") if p not in top
             for n in _imports(p) if n == "controller.cli" or n.startswith("controller.cli.")
             or (n.startswith("controller.run.runner") and p.parent.name != "run")
             or ((n == "controller.agents_api" or n.startswith("controller.agents_api."))
                 and p not in cli)]
    assert not wrong, "\n".join(wrong)
