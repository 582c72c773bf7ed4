"""The guest's facts (:mod:`controller.sandbox.guest`) are written once under ``controller/``.

Read on the source with :mod:`ast` (comments and documentation strings are prose, not values): outside
``controller/sandbox/guest.py`` no module may

* hold the guest's home as a value: a string constant equal to ``/home/sandbox``, starting with
  ``/home/sandbox/``, or naming that path inside a longer string (a command line, a configuration
  line); the same for the guest's other absolute paths and its display (equal or a path below them);
* bind a name ending in ``PORT`` or ``UID`` (assignment, annotated assignment, tuple assignment, a
  parameter's default) to one of the guest's ports or uids (``AGENT_PORT = 8000``);
* bind an upper-case name to a literal string equal to one of the guest's strings
  (``GATEWAY_HOSTNAME = "gateway"``, ``PYTHON = "/opt/desktop-sandbox/bin/python"``).

A failure names each offending ``file:line`` with what it holds.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Iterator

from controller.sandbox import guest

ROOT = Path(__file__).resolve().parents[2]
CONSTANTS = ROOT / "controller" / "sandbox" / "guest.py"

_VALUES: dict[str, object] = {name: getattr(guest, name) for name in guest.__all__}
_STRINGS = {value: name for name, value in _VALUES.items() if isinstance(value, str)}
_NUMBERS = {(value, name.rsplit("_", 1)[-1]): name for name, value in _VALUES.items() if isinstance(value, int)}
"""(value, kind) -> the guest module's name, kind the last word of the name (``PORT``, ``UID``)."""
_PATHS = {value: name for value, name in _STRINGS.items() if value.startswith(("/", ":"))}
"""The guest's strings that cannot be anything else: absolute paths and the display."""
_OWN_DEFAULTS = {("controller/gateway/serve.py", "port")}
"""(file, name) bindings that keep a value of their own on purpose, each with why:

* ``controller/gateway/serve.py`` ``port``: the proxy's default port when run by hand (``python -m
  controller.gateway serve``). The gateway package runs in the gateway's own virtual environment and
  sits below the sandboxes (they import it; it cannot import ``controller.sandbox`` without a cycle);
  every backend passes the guest's ``GATEWAY_PROXY_PORT`` to it explicitly."""
_HOME_IN_TEXT = re.compile(r"(?<![\w./-])" + re.escape(guest.GUEST_HOME) + r"(?![\w.-])")


def _sources() -> list[Path]:
    return sorted(p for p in (ROOT / "controller").rglob("*.py") if "__pycache__" not in p.parts and p != CONSTANTS)


def _prose(tree: ast.AST) -> set[int]:
    """ids of the string constants that stand alone as statements: documentation, not values."""
    return {id(node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)}


def _bindings(tree: ast.AST) -> Iterator[tuple[str, ast.expr]]:
    """(name, literal expression) for every name bound to an expression: ``A = x``, ``A: T = x``,
    ``A, B = x, y`` (element-wise), ``self.A = x`` (the attribute's name), and parameter defaults."""
    def targets(target: ast.expr, value: ast.expr) -> Iterator[tuple[str, ast.expr]]:
        if isinstance(target, ast.Name):
            yield target.id, value
        elif isinstance(target, ast.Attribute):
            yield target.attr, value
        elif isinstance(target, (ast.Tuple, ast.List)) and isinstance(value, (ast.Tuple, ast.List)) \
                and len(target.elts) == len(value.elts):
            for t, v in zip(target.elts, value.elts):
                yield from targets(t, v)

    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                yield from targets(target, node.value)
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            yield from targets(node.target, node.value)
        elif isinstance(node, ast.arguments):
            positional = node.posonlyargs + node.args
            for arg, default in zip(positional[len(positional) - len(node.defaults):], node.defaults):
                yield arg.arg, default
            for arg, default in zip(node.kwonlyargs, node.kw_defaults):
                if default is not None:
                    yield arg.arg, default


def copies(path: Path) -> list[str]:
    """``file:line: what`` for each literal copy of a guest fact in ``path`` (module docstring above)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    prose, found = _prose(tree), []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Constant) and isinstance(node.value, str)) or id(node) in prose:
            continue
        text = node.value
        named = next((name for value, name in _PATHS.items() if text == value or text.startswith(value + "/")), None)
        if named is None and _HOME_IN_TEXT.search(text):
            named = "GUEST_HOME"
        if named:
            found.append(f"{where}:{node.lineno}: {text[:80]!r} is {named}'s value")
    for name, value in _bindings(tree):
        if (where.as_posix(), name) in _OWN_DEFAULTS:
            continue
        if not isinstance(value, ast.Constant) or isinstance(value.value, bool):
            continue
        if isinstance(value.value, int):
            same = _NUMBERS.get((value.value, name.upper().rsplit("_", 1)[-1]))
            if same is None and name.upper().endswith(("PORT", "UID")):
                same = _NUMBERS.get((value.value, "PORT" if name.upper().endswith("PORT") else "UID"))
        else:
            same = _STRINGS.get(value.value) if isinstance(value.value, str) and name.isupper() else None
        if same:
            found.append(f"{where}:{value.lineno}: {name} = {value.value!r} copies {same}")
    return sorted(set(found))


def test_the_guest_facts_are_written_once():
    found = [line for path in _sources() for line in copies(path)]
    assert not found, ("literal copies of controller/sandbox/guest.py's values (import them from there):\n"
                       + "\n".join(found))


def test_the_scan_finds_each_kind_of_copy(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text('"""Docs may say /home/sandbox."""\n'
                      'AGENT_PORT = 8000\n'
                      'home = "/home/sandbox"\n'
                      'auth = "/home/sandbox/.Xauthority"\n'
                      'cmd = f"xauth {x} /home/sandbox/.Xauthority < cookie"\n'
                      'DESKTOP_UID, OTHER = 1000, 5\n'
                      'PYTHON = "/opt/desktop-sandbox/bin/python"\n'
                      'HOSTNAME = "gateway"\n'
                      'env = {"DISPLAY": ":99"}\n'
                      'def serve(port: int = 8000, *, listen_port=3128): ...\n'
                      'class Box:\n'
                      '    """Its home: /home/sandbox."""\n'
                      '    BUFFER = 1000\n'
                      '    role = "gateway"\n'
                      '    other = "/home/sandboxes"\n', encoding="utf-8")
    lines = [line.split(": ", 1)[0].rsplit(":", 1)[1] for line in copies(sample)]
    assert sorted(map(int, lines)) == [2, 3, 4, 5, 6, 7, 7, 8, 9, 10, 10], copies(sample)
