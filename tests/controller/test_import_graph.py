"""The import graph of ``controller/`` has no cycle (docs/ARCHITECTURE.md, Layout: imports go one way).

Read on the source with :mod:`ast`, nothing imported: a node is a module under ``controller/`` (a
package is its ``__init__.py``), an edge ``a -> b`` an import in ``a`` that names ``b``, absolute
(``controller.x.y``) or relative (``from .y import z``, resolved against ``a``'s package).

What counts as an edge:

* every import statement in the file, wherever it stands: at module level, inside a function or method,
  and under ``if TYPE_CHECKING:``. A deferred import only hides a cycle from the interpreter at start-up;
  the two modules still need each other, and the next person to move the import up gets the
  ``ImportError``. So a function-level import closes a cycle as surely as a module-level one.
* every import by a string: ``importlib.import_module("controller.x")`` (also ``importlib`` imported
  under another name), ``import_module("controller.x")`` with ``import_module`` imported from
  ``importlib`` (under any name), ``import_module(".x", package="controller")`` and
  ``package=__package__`` (resolved as :func:`importlib.util.resolve_name` does), and
  ``__import__("controller.x")`` (``builtins.__import__`` too) with its ``fromlist`` and ``level``.
  A lookup table is followed too: in a file that passes such a call a name it does not spell at the
  call (``import_module(module)``), every string constant that is the full dotted name of a module
  under ``controller/`` is an edge, since the call may load any of them. A name that is computed (an
  f-string, a concatenation, read from a file or the environment, or a relative name in a table) cannot
  be followed on the source: a module that loads one hides its edge from this test.
* the most specific module an import names: ``from controller.gateway import policy`` is an edge to
  ``controller.gateway.policy``; ``from controller.gateway.policy import Origin`` to the same module.
  The parent packages that Python initialises on the way (``controller.gateway``) are not edges of
  their own: a package that re-exports its submodules would otherwise be in a cycle with every one of
  them, and its submodules' own imports are what the graph is about.
* names outside ``controller`` (``guest``, ``wire``, third-party packages) are not nodes.

The same graph, folded by layer (a subpackage of ``controller/`` with all its modules; a top-level module
alone; ``cli.py`` with ``commands/``, one layer in the Layout), has no cycle either: two layers that
import each other, through whichever modules, do not go one way.

A failure names every cycle it finds, one a line, as the files (or layers) in import order back to the
first.
"""

from __future__ import annotations

import ast
import importlib.util
from collections.abc import Collection
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "controller"

_IMPORT_FUNCTIONS = frozenset({"import_module", "__import__"})
"""The functions of :mod:`importlib` (and the builtin) that import a module named by a string."""


def _module_name(path: Path, root: Path = ROOT) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    """Module name -> file, for every module under ``controller/``."""
    return {_module_name(p): p for p in sorted((ROOT / PACKAGE).rglob("*.py")) if "__pycache__" not in p.parts}


def _import_call(node: ast.Call, importlib_names: set[str], function_names: dict[str, str]) -> str | None:
    """``"import_module"`` or ``"__import__"`` when ``node`` calls that function, else None.

    ``importlib_names``: the names ``importlib`` (or ``builtins``) is bound to in the file;
    ``function_names``: name bound in the file -> the :mod:`importlib` function it is."""
    func = node.func
    if isinstance(func, ast.Name):
        return "__import__" if func.id == "__import__" else function_names.get(func.id)
    if (isinstance(func, ast.Attribute) and func.attr in _IMPORT_FUNCTIONS and isinstance(func.value, ast.Name)
            and func.value.id in importlib_names):
        return func.attr
    return None


def _argument(node: ast.Call, position: int, keyword: str) -> ast.expr | None:
    """The expression passed as positional ``position`` or as ``keyword=``; None when not passed."""
    if position < len(node.args) and not any(isinstance(a, ast.Starred) for a in node.args[: position + 1]):
        return node.args[position]
    return next((k.value for k in node.keywords if k.arg == keyword), None)


def _literal(node: ast.expr | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _string_import(node: ast.Call, kind: str, package: str) -> list[str] | None:
    """The dotted names one ``import_module``/``__import__`` call imports (``package``: the calling file's
    package, for ``__package__`` and ``level``); an empty list when it names no module that can be
    resolved (a relative name above the top package), None when its name is not a literal string."""
    name = _literal(_argument(node, 0, "name"))
    if name is None:
        return None
    if kind == "import_module":
        anchor_node = _argument(node, 1, "package")
        anchor = package if isinstance(anchor_node, ast.Name) and anchor_node.id == "__package__" \
            else _literal(anchor_node)
        if not name.startswith("."):
            return [name]
        if not anchor:
            return []  # a relative name against a package computed at run time
        try:
            return [importlib.util.resolve_name(name, anchor)]
        except ImportError:
            return []
    level_node = _argument(node, 4, "level")
    level = level_node.value if isinstance(level_node, ast.Constant) and isinstance(level_node.value, int) else 0
    if level:
        parts = package.split(".")
        if level > len(parts):
            return []
        base = ".".join(parts[: len(parts) - level + 1])
        name = f"{base}.{name}" if name else base
    fromlist = _argument(node, 3, "fromlist")
    members = [_literal(e) for e in fromlist.elts] if isinstance(fromlist, (ast.List, ast.Tuple, ast.Set)) else []
    # like ``from name import member``: the submodule when there is one, else a name in ``name``
    return [f"{name}.{m}" for m in members if m and m != "*"] or [name]


def imported_names(path: Path, modules: Collection[str], root: Path = ROOT) -> set[str]:
    """Every dotted name ``path`` imports anywhere in its text, by statement or by string (module doc):
    ``import a.b`` gives ``a.b``, ``from a import b`` gives ``a.b`` (a module or a name in ``a``), a
    relative import is resolved against the file's package. ``modules``: the module names under
    ``controller/``, which a lookup table's string constants are matched against. ``root``: the folder
    holding ``controller/``. Raises SyntaxError when the file does not parse."""
    own = _module_name(path, root)
    package = own if path.name == "__init__.py" else own.rpartition(".")[0]
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    names: set[str] = set()
    importlib_names: set[str] = set()
    function_names: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                names.add(alias.name)
                if alias.name in ("importlib", "builtins"):
                    importlib_names.add(alias.asname or alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1])
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            names.update(f"{module}.{alias.name}" for alias in node.names)
            if module in ("importlib", "builtins"):
                function_names.update((alias.asname or alias.name, alias.name) for alias in node.names
                                      if alias.name in _IMPORT_FUNCTIONS)
    computed = False
    for node in ast.walk(tree):
        kind = _import_call(node, importlib_names, function_names) if isinstance(node, ast.Call) else None
        if kind is None:
            continue
        found = _string_import(node, kind, package)
        if found is None:
            computed = True
        else:
            names.update(found)
    if computed:  # a lookup table: the full module names the file spells
        names.update(n.value for n in ast.walk(tree)
                     if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value in modules)
    return names


def _named(path: Path, modules: dict[str, Path], root: Path = ROOT) -> set[str]:
    """The modules under ``controller/`` that ``path`` imports anywhere in its text (module doc)."""
    own = _module_name(path, root)
    found: set[str] = set()

    def most_specific(name: str) -> str | None:
        while name:
            if name in modules:
                return name
            name = name.rpartition(".")[0]
        return None

    for name in imported_names(path, modules, root):
        target = most_specific(name) if name == PACKAGE or name.startswith(PACKAGE + ".") else None
        if target is not None and target != own:
            found.add(target)
    return found


def import_graph() -> dict[str, set[str]]:
    """Module -> the modules under ``controller/`` it imports."""
    modules = _modules()
    return {name: _named(path, modules) for name, path in modules.items()}


_SAME_LAYER = {"controller.cli": "controller.commands"}
"""Modules folded into another layer than their own: ``cli.py`` parses, ``commands/`` does the work, and
``commands.cli_reference`` renders ``cli.app``'s help (docs/ARCHITECTURE.md, Layout)."""


def layer(module: str) -> str:
    """The layer of a module under ``controller/``: ``controller.sandbox`` for ``controller.sandbox.docker``,
    a top-level module itself (``controller.bench``), ``controller.commands`` for ``controller.cli``."""
    name = ".".join(module.split(".")[:2])
    return _SAME_LAYER.get(name, name)


def layer_graph(graph: dict[str, set[str]]) -> dict[str, dict[str, tuple[str, str]]]:
    """Layer -> the other layers it imports, each with one module edge that does it (the first in name
    order, as ``(importer, imported)``), from the module graph ``graph``."""
    layers: dict[str, dict[str, tuple[str, str]]] = {}
    for module in sorted(graph):
        edges = layers.setdefault(layer(module), {})
        for target in sorted(graph[module]):
            if layer(target) != layer(module):
                edges.setdefault(layer(target), (module, target))
    return layers


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


def test_the_walk_sees_imports_by_string(tmp_path):
    # the walk itself, on a small made-up package: each way of importing by a literal string is an edge,
    # a lookup table of full module names is one, a computed name is none
    pkg = tmp_path / "controller"
    (pkg / "sub").mkdir(parents=True)
    sources = {
        "__init__.py": "",
        "sub/__init__.py": "",
        "sub/target.py": "",
        "top.py": "",
        "table.py": "",
        "plain.py": "import importlib\nimportlib.import_module('controller.sub.target')\n",
        "aliased.py": "import importlib as il\ndef f():\n    return il.import_module('controller.top')\n",
        "from_importlib.py": "from importlib import import_module\nimport_module('controller.sub.target')\n",
        "from_importlib_as.py": "from importlib import import_module as load\nload(name='controller.top')\n",
        "sub/relative.py": "import importlib\nimportlib.import_module('.target', package='controller.sub')\n"
                           "importlib.import_module('..top', __package__)\n",
        "dunder.py": "__import__('controller.sub.target')\n",
        "dunder_fromlist.py": "import builtins\nbuiltins.__import__('controller', fromlist=['top', 'missing'])\n",
        "sub/dunder_level.py": "__import__('target', globals(), locals(), [], 1)\n",
        "lookup.py": "import importlib\nTABLE = {'a': ('controller.table', 'f'), 'b': ('controller.nothing', 'g')}\n"
                     "def get(key):\n    module, attr = TABLE[key]\n"
                     "    return getattr(importlib.import_module(module), attr)\n",
        "computed.py": "import importlib\nimportlib.import_module(f'controller.{\"top\"}')\n"
                       "importlib.import_module('controller.' + 'top')\nNAME = 'controller.table'\n",
        "not_a_call.py": "NAME = 'controller.top'\nimport_module = print\nimport_module('controller.table')\n",
    }
    for name, text in sources.items():
        (pkg / name).write_text(text)
    modules = {_module_name(p, tmp_path): p for p in pkg.rglob("*.py")}
    graph = {name: _named(path, modules, tmp_path) for name, path in modules.items()}
    assert graph["controller.plain"] == {"controller.sub.target"}
    assert graph["controller.aliased"] == {"controller.top"}
    assert graph["controller.from_importlib"] == {"controller.sub.target"}
    assert graph["controller.from_importlib_as"] == {"controller.top"}
    assert graph["controller.sub.relative"] == {"controller.sub.target", "controller.top"}
    assert graph["controller.dunder"] == {"controller.sub.target"}
    assert graph["controller.dunder_fromlist"] == {"controller.top", "controller"}
    assert graph["controller.sub.dunder_level"] == {"controller.sub.target"}
    assert graph["controller.lookup"] == {"controller.table"}
    assert graph["controller.computed"] == {"controller.table"}  # the table rule, not the f-string
    assert graph["controller.not_a_call"] == set()


def test_the_layers_fold_the_module_graph():
    graph = {"controller.a.x": {"controller.b.y"}, "controller.b.y": {"controller.b.z"},
             "controller.b.z": {"controller.a.w"}, "controller.a.w": set(),
             "controller.cli": {"controller.commands.up"}, "controller.commands.up": set(),
             "controller.commands.cli_reference": {"controller.cli"}}
    layers = layer_graph(graph)
    assert layers == {"controller.a": {"controller.b": ("controller.a.x", "controller.b.y")},
                      "controller.b": {"controller.a": ("controller.b.z", "controller.a.w")},
                      "controller.commands": {}}
    assert cycles({k: set(v) for k, v in layers.items()}) == [["controller.a", "controller.b", "controller.a"]]


def test_the_controller_layers_import_one_way():
    layers = layer_graph(import_graph())
    assert {"controller.sandbox", "controller.audit", "controller.commands"} <= set(layers)
    found = cycles({name: set(edges) for name, edges in layers.items()})

    def shown(cycle: list[str]) -> str:
        steps = [layers[a][b] for a, b in zip(cycle, cycle[1:])]
        return " -> ".join(name.replace(".", "/") for name in cycle) + " (" + "; ".join(
            f"{_file(importer)} imports {imported}" for importer, imported in steps) + ")"

    assert not found, "layers of controller/ that import each other (each: a layer, the layer it imports, ... " \
                      "back to the first; the module that does each step):\n" + "\n".join(map(shown, found))
