"""No import cycles inside a package of the compiler.

Reads every module's ``import`` / ``from`` statements with ``ast`` (imports inside
functions count: a lazy import still ties the modules together; those under
``if TYPE_CHECKING:`` do not), resolves relative imports and ``parc.<pkg>.*``
names to modules of the same package, and fails on a cycle, printing it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _modules(package: str) -> dict[str, Path]:
    """Dotted module name (``dsl.parse``, ``codegen.passes``) → file."""
    out = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imported(tree: ast.AST, module: str, is_package: bool) -> set[str]:
    """Every dotted name ``module`` imports, absolute, ``parc.`` dropped."""
    found: set[str] = set()
    base = module.split(".") if is_package else module.split(".")[:-1]

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = base[: len(base) - (node.level - 1)]
                target = ".".join(anchor + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.add(target)
            found.update(f"{target}.{alias.name}" for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return {name.removeprefix("parc.") for name in found}


def _graph(package: str) -> dict[str, set[str]]:
    modules = _modules(package)
    graph = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        names = _imported(tree, name, path.name == "__init__.py")
        graph[name] = {n for n in names if n in modules and n != name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle (``[a, b, a]``), or None. Depth-first, iterative."""
    state: dict[str, int] = {}  # 1: on the path, 2: done
    for root in sorted(graph):
        if state.get(root):
            continue
        path, stack = [root], [iter(sorted(graph[root]))]
        state[root] = 1
        while stack:
            child = next(stack[-1], None)
            if child is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(child) == 1:
                return path[path.index(child) :] + [child]
            elif not state.get(child):
                state[child] = 1
                path.append(child)
                stack.append(iter(sorted(graph[child])))
    return None


def _package_imports_itself(graph: dict[str, set[str]], package: str) -> dict[str, set[str]]:
    """A package's ``__init__`` re-exports its modules; a module importing a package
    it sits in (``from . import ast``, ``from .. import comm``) means the submodule it
    names, not the ``__init__``: edges to an enclosing package stand for the names
    imported from it."""
    return {
        name: {n for n in targets if not name.startswith(n + ".")}
        for name, targets in graph.items()
    }


@pytest.mark.parametrize("package", ["dsl", "codegen", "runtime"])
def test_no_import_cycles(package: str) -> None:
    graph = _package_imports_itself(_graph(package), package)
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " → ".join(cycle)


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_relative_imports_resolve_inside_functions_and_skip_type_checking() -> None:
    tree = ast.parse(
        "from typing import TYPE_CHECKING\nfrom . import ast\nfrom .x import y\n"
        "if TYPE_CHECKING:\n    from .spec import Spec\n"
        "def f():\n    from .parse import parser\n"
    )
    names = _imported(tree, "dsl.tree", is_package=False)
    assert {"dsl.ast", "dsl.x", "dsl.x.y", "dsl.parse", "dsl.parse.parser"} <= names
    assert "dsl.spec" not in names and "dsl.spec.Spec" not in names


def test_the_layout_and_the_schedules_import_no_torch() -> None:
    """runtime/layout/, runtime/schedules/ and runtime/paths.py are what the compiler's passes
    read (DESIGN §3): nothing they import, at any depth and inside functions too, is torch."""
    graph = _graph("runtime")
    modules = _modules("runtime")
    torch_free = [name for name in modules if name.startswith(("runtime.layout", "runtime.schedules"))]
    for start in [*torch_free, "runtime.paths"]:
        seen, todo = set(), [start]
        while todo:
            name = todo.pop()
            if name in seen:
                continue
            seen.add(name)
            tree = ast.parse(modules[name].read_text(encoding="utf-8"))
            imported = _imported(tree, name, modules[name].name == "__init__.py")
            torch = sorted(n for n in imported if n.split(".")[0] == "torch")
            assert not torch, f"{name} (reached from {start}) imports {torch[0]}"
            todo += graph[name]
