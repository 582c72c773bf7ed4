"""Every exception class defined under ``controller/`` is one of the project's errors: it derives from
:class:`controller.model.errors.DesktopSandboxError` (besides the Python base it had, so ``except
ValueError`` and the like still catch it), except the few in :data:`NOT_ERRORS`, each with why.

Every module under ``controller/`` is imported and every class it defines (at module level or in a
class) that is an ``Exception`` is checked. A class Python cannot reach that way (defined inside a
function, or in a module whose third-party packages are not installed here: the gateway's mitmproxy
addon) is checked on the source: one of its bases is a built-in exception or a class checked not to
be a project error. A failure names each class as ``file:line module.Class (bases)``.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import inspect
from pathlib import Path


from controller.model.errors import DesktopSandboxError

ROOT = Path(__file__).resolve().parents[2]

NOT_ERRORS = {
    # Control flow, not an error: raised between a run's phases and steps once it is cancelled and
    # caught by the run itself; ``except DesktopSandboxError`` must never take it for a failure.
    "controller.run.cancel.RunStopped",
    # Control flow, not an error: a model request abandoned because the run is stopping. It is the
    # OpenAI SDK's APIConnectionError so that the SDK passes it on at once instead of retrying.
    "controller.run.model_client.ModelRequestStopped",
    # controller.json_semantics sits below controller.model (controller.model.checks imports it): an
    # import of controller.model.errors from there would make the two layers import each other
    # (tests/controller/test_import_graph.py). Still a ValueError, as the JSON decoder's own errors.
    "controller.json_semantics.DuplicateKey",
}
"""``module.Class`` of the exception classes that stay outside :class:`DesktopSandboxError`."""


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _sources() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted((ROOT / "controller").rglob("*.py")) if "__pycache__" not in p.parts}


def _import(name: str) -> object | None:
    """The module, or None when a third-party package it needs is not installed here (any other
    failure to import is an error of its own and raises)."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] in {"controller", "guest", "wire"}:
            raise
        return None


def _classes(tree: ast.Module) -> list[tuple[str, ast.ClassDef, bool]]:
    """(qualified name, node, reachable) of every class in the file; reachable: Python binds it to an
    attribute of the module or of a reachable class once the module is imported."""
    found: list[tuple[str, ast.ClassDef, bool]] = []

    def visit(node: ast.AST, prefix: str, reachable: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                found.append((prefix + child.name, child, reachable))
                visit(child, prefix + child.name + ".", reachable)
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                visit(child, prefix + getattr(child, "name", "<lambda>") + ".<locals>.", False)
            else:
                visit(child, prefix, reachable)

    visit(tree, "", True)
    return found


def _attribute(obj: object, qualname: str) -> object | None:
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
    return obj


def _plain_on_source(node: ast.ClassDef, plain_names: set[str]) -> bool:
    """Whether a class Python did not reach derives, by one of its bases' names, from a built-in
    exception or a class known not to be a project error (``plain_names``)."""
    for base in node.bases:
        name = base.attr if isinstance(base, ast.Attribute) else base.id if isinstance(base, ast.Name) else ""
        builtin = getattr(builtins, name, None)
        if name in plain_names or (inspect.isclass(builtin) and issubclass(builtin, BaseException)):
            return True
    return False


def plain_exceptions(sources: dict[str, Path]) -> list[str]:
    """``file:line module.Class (bases)`` for every ``Exception`` class defined in ``sources`` (module
    name -> file) that does not derive from :class:`DesktopSandboxError` and is not in :data:`NOT_ERRORS`."""
    found: list[tuple[str, Path, ast.ClassDef]] = []
    unreached: list[tuple[str, Path, ast.ClassDef]] = []
    plain_names: set[str] = set()
    for module_name, path in sources.items():
        module = _import(module_name)
        for qualname, node, reachable in _classes(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            cls = _attribute(module, qualname) if module is not None and reachable else None
            if not inspect.isclass(cls):
                unreached.append((f"{module_name}.{qualname}", path, node))
            elif issubclass(cls, Exception) and not issubclass(cls, DesktopSandboxError):
                plain_names.add(node.name)
                found.append((f"{module_name}.{qualname}", path, node))
    found += [(name, path, node) for name, path, node in unreached if _plain_on_source(node, plain_names)]
    found.sort(key=lambda item: (str(item[1]), item[2].lineno))
    return [f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}:{node.lineno} {name} "
            f"({', '.join(ast.unparse(b) for b in node.bases)})"
            for name, path, node in found if name not in NOT_ERRORS]


def test_every_exception_class_is_a_desktop_sandbox_error():
    found = plain_exceptions(_sources())
    assert not found, ("exception classes outside DesktopSandboxError (add it to their bases, or to NOT_ERRORS "
                       "with why):\n" + "\n".join(found))


def test_the_exceptions_left_out_exist_and_are_left_out():
    for dotted in sorted(NOT_ERRORS):
        module_name, name = dotted.rsplit(".", 1)
        cls = getattr(importlib.import_module(module_name), name)
        assert issubclass(cls, Exception) and not issubclass(cls, DesktopSandboxError), dotted


def test_the_walk_sees_module_nested_local_and_unimportable_classes(tmp_path, monkeypatch):
    package = tmp_path / "errsample"
    package.mkdir()
    (package / "__init__.py").write_text("", encoding="utf-8")
    (package / "plain.py").write_text(
        "from controller.model.errors import DesktopSandboxError\n"
        "class Plain(ValueError): pass\n"
        "class Fine(DesktopSandboxError, ValueError): pass\n"
        "class Holder:\n"
        "    class Inner(RuntimeError): pass\n"
        "def make():\n"
        "    class Local(Plain): pass\n"
        "    class LocalFine(Fine): pass\n"
        "    return Local\n", encoding="utf-8")
    (package / "missing.py").write_text("import no_such_package_here\nclass Gone(Exception): pass\n",
                                        encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    found = plain_exceptions({"errsample.plain": package / "plain.py", "errsample.missing": package / "missing.py"})
    assert sorted(line.split(" ")[1] for line in found) == [
        "errsample.missing.Gone", "errsample.plain.Holder.Inner", "errsample.plain.Plain",
        "errsample.plain.make.<locals>.Local"], found
