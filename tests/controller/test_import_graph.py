"""The import graph of ``controller/`` has no cycle (docs/ARCHITECTURE.md, Layout: imports go one way).

Read on the source with :mod:`ast`, nothing imported: a node is a module under ``controller/`` (a
package is its ``__init__.py``), an edge ``a -> b`` an ``import``/``from`` statement in ``a`` that names
``b``, absolute (``controller.x.y``) or relative (``from .y import z``, resolved against ``a``'s package).

What counts as an edge:

* every import statement in the file, wherever it stands: at module level, inside a function or method,
  and under ``if TYPE_CHECKING:``. A deferred import only hides a cycle from the interpreter at start-up;
  the two modules still need each other, and the next person to move the import up gets the
  ``ImportError``. So a function-level import closes a cycle as surely as a module-level one.
* the most specific module a statement names: ``from controller.gateway import policy`` is an edge to
  ``controller.gateway.policy``; ``from controller.gateway.policy import Origin`` to the same module.
  The parent packages that Python initialises on the way (``controller.gateway``) are not edges of
  their own: a package that re-exports its submodules would otherwise be in a cycle with every one of
  them, and its submodules' own imports are what the graph is about.
* names outside ``controller`` (``guest``, ``wire``, third-party packages) are not nodes.

A failure names every cycle it finds, one a line, as the files in import order back to the first.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "controller"


def _module_name(path: Path, root: Path = ROOT) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    """Module name -> file, for every module under ``controller/``."""
    return {_module_name(p): p for p in sorted((ROOT / PACKAGE).rglob("*.py")) if "__pycache__" not in p.parts}


def _named(path: Path, modules: dict[str, Path], root: Path = ROOT) -> set[str]:
    """The modules under ``controller/`` that ``path`` imports anywhere in its text (module doc)."""
    own = _module_name(path, root)
    package = own if path.name == "__init__.py" else own.rpartition(".")[0]
    found: set[str] = set()

    def most_specific(name: str) -> str | None:
        while name:
            if name in modules:
                return name
            name = name.rpartition(".")[0]
        return None

    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        candidates: list[str] = []
        if isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1])
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            # ``from pkg import sub`` names the submodule when there is one, else a name in ``pkg``
            candidates = [f"{module}.{alias.name}" if f"{module}.{alias.name}" in modules else module
                          for alias in node.names]
        for name in candidates:
            target = most_specific(name) if name == PACKAGE or name.startswith(PACKAGE + ".") else None
            if target is not None and target != own:
                found.add(target)
    return found


def import_graph() -> dict[str, set[str]]:
    """Module -> the modules under ``controller/`` it imports."""
    modules = _modules()
    return {name: _named(path, modules) for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (a list of modules, the first repeated at the end) through each strongly connected
    component of more than one module, found with Tarjan's algorithm; sorted, so the message is stable."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)

    found = []
    for component in components:
        members = set(component)
        start = component[0]
        # breadth-first from start back to start inside the component: the shortest cycle through it
        paths = {start: [start]}
        queue = [start]
        cycle: list[str] | None = None
        while queue and cycle is None:
            node = queue.pop(0)
            for nxt in sorted(graph[node] & members):
                if nxt == start:
                    cycle = paths[node] + [start]
                    break
                if nxt not in paths:
                    paths[nxt] = paths[node] + [nxt]
                    queue.append(nxt)
        assert cycle is not None
        found.append(cycle)
    return sorted(found)


def _file(name: str) -> str:
    path = _modules()[name]
    return str(path.relative_to(ROOT))


def test_the_walk_sees_relative_function_level_and_type_checking_imports(tmp_path):
    # the walk itself, on a small made-up package: every kind of import statement is an edge
    pkg = tmp_path / "controller"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from .a import thing\n")
    (pkg / "sub" / "a.py").write_text("def f():\n    from controller.sub import b\n")
    (pkg / "sub" / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                      "    from ..top import X\n")
    (pkg / "top.py").write_text("import controller.sub.a\nimport os\n")
    modules = {_module_name(p, tmp_path): p for p in pkg.rglob("*.py")}
    graph = {name: _named(path, modules, tmp_path) for name, path in modules.items()}
    assert graph["controller.sub"] == {"controller.sub.a"}
    assert graph["controller.sub.a"] == {"controller.sub.b"}
    assert graph["controller.sub.b"] == {"controller.top"}
    assert graph["controller.top"] == {"controller.sub.a"}
    assert cycles(graph) == [["controller.sub.a", "controller.sub.b", "controller.top", "controller.sub.a"]]


def test_the_controller_import_graph_has_no_cycle():
    graph = import_graph()
    assert len(graph) > 50 and "controller.run.runner" in graph  # the walk found the tree
    found = cycles(graph)
    assert not found, "import cycles in controller/ (each: a file, the file it imports, ... back to the first):\n" + (
        "\n".join(" -> ".join(_file(name) for name in cycle) for cycle in found))
