"""Where each runtime module lives, and which files a build ships.

Takes: the runtime's package tree (``parc.runtime``: ``layout/``, ``schedules/``,
``distributed/``, ``parallel/{tensor,context,expert,pipeline,data}/``, ``models/``,
``optimizers/``, ``train/``, ``checkpoints/``, ``kernels/``; DESIGN §3). Gives:
``dotted(name)``, the module's place under the runtime for a module's own name (every
runtime module's name is unique, so ``train.py``, the renderer and the layer settings
name modules by it), ``import_lines`` (``train.py``'s ``from parc_runtime.<package>
import ...``) and ``files`` (the sources of those modules and of every runtime module
they import at module level, with their packages' ``__init__.py``; ``kernels`` travels
whole with its C++ sources). Used by ``codegen/build.py`` and ``codegen/render.py``.
"""

from __future__ import annotations

import ast
import functools
from importlib import resources

SOURCES = (".py", ".cpp", ".h", ".cu")
WHOLE = ("kernels",)
"""Packages that travel whole (their C++ sources are read by path at run time), but the
modules a build leaves out (``features.left_out``: those of other devices and features)."""


def _root():
    return resources.files("parc.runtime")


@functools.lru_cache(maxsize=None)
def _tree() -> dict[str, str]:
    """Every runtime module's own name -> its dotted place under the runtime."""
    places: dict[str, str] = {}

    def walk(node, prefix: str) -> None:
        for child in sorted(node.iterdir(), key=lambda c: c.name):
            if child.is_dir() and child.name != "__pycache__" and child.joinpath("__init__.py").is_file():
                if prefix + child.name in WHOLE:  # named whole, and each of its modules by its own name
                    places[child.name] = prefix + child.name
                walk(child, f"{prefix}{child.name}.")
            elif child.name.endswith(".py") and child.name != "__init__.py":
                name = child.name[: -len(".py")]
                if name in places:
                    raise RuntimeError(f"internal error in parc: two runtime modules are named {name!r}")
                places[name] = prefix + name

    walk(_root(), "")
    return places


def dotted(name: str) -> str:
    """``"dp"`` -> ``"parallel.data.dp"``: a runtime module's place, from its own name."""
    return _tree()[name]


def import_lines(names) -> list[str]:
    """``train.py``'s runtime imports: one ``from parc_runtime.<package> import`` per package."""
    by_package: dict[str, list[str]] = {}
    for name in sorted(set(names)):
        package, _, leaf = dotted(name).rpartition(".")
        by_package.setdefault(package, []).append(leaf)
    return [
        f"from parc_runtime{'.' + package if package else ''} import {', '.join(leaves)}"
        for package, leaves in sorted(by_package.items())
    ]


def _node(parts: list[str]):
    return _root().joinpath(*parts) if parts else _root()


def _is_module(parts: list[str]) -> bool:
    return bool(parts) and _node(parts[:-1]).joinpath(parts[-1] + ".py").is_file()


def _walk(node, prefix: str) -> list[tuple[str, object]]:
    """Every source file under ``node``, as (path under the runtime, resource), sorted."""
    found = []
    for child in sorted(node.iterdir(), key=lambda c: c.name):
        if child.is_dir() and child.name != "__pycache__":
            found += _walk(child, f"{prefix}{child.name}/")
        elif child.name.endswith(SOURCES):
            found.append((prefix + child.name, child))
    return found


def _sources(parts: list[str], without=frozenset()) -> list[tuple[str, object]]:
    """The files of a place, as (path under the runtime, resource): a module's file; a
    package's ``__init__.py``, or every file of a package that travels whole but the
    modules named in ``without``."""
    if _is_module(parts):
        return [("/".join(parts) + ".py", _node(parts[:-1]).joinpath(parts[-1] + ".py"))]
    prefix = "/".join(parts) + "/" if parts else ""
    if parts and parts[0] in WHOLE:
        return [(path, node) for path, node in _walk(_node(parts), prefix)
                if path.rpartition("/")[2].removesuffix(".py") not in without]
    return [(prefix + "__init__.py", _node(parts).joinpath("__init__.py"))]


@functools.lru_cache(maxsize=None)
def _imports(path: str, text: str) -> tuple[tuple[str, ...], ...]:
    """The runtime places a source imports at module level (relative imports), each as
    its parts. Keyed by the text itself: an edited file is a new key."""
    package = path.split("/")[:-1]
    found: list[tuple[str, ...]] = []
    for statement in ast.parse(text).body:
        if not isinstance(statement, ast.ImportFrom) or statement.level == 0:
            continue
        base = package[: len(package) - (statement.level - 1)]
        target = base + (statement.module.split(".") if statement.module else [])
        if _is_module(target):
            found.append(tuple(target))
            continue
        for alias in statement.names:  # a module of the package, else a name its __init__ gives
            found.append(tuple(target + [alias.name]) if _is_module(target + [alias.name]) else tuple(target))
    return tuple(found)


def files(names=None, without=frozenset()) -> dict[str, bytes]:
    """The runtime's source files a build needs, as ``parc_runtime/...`` -> bytes.

    ``names``: the runtime modules the program uses (``features.runtime_modules``), by their
    own names; each brings the runtime modules it imports at module level, transitively,
    and the ``__init__.py`` of every package above it. None: every file (the whole runtime).
    ``without``: modules of a package that travels whole which the build leaves out
    (``features.left_out``: a CPU build's Triton kernels).
    """
    if names is None:
        return {f"parc_runtime/{path}": node.read_bytes() for path, node in _walk(_root(), "")}
    out: dict[str, bytes] = {}
    seen: set[tuple[str, ...]] = set()
    todo = [tuple(dotted(name).split(".")) for name in names] + [()]
    while todo:
        parts = todo.pop()
        if parts in seen:
            continue
        seen.add(parts)
        todo += [parts[:depth] for depth in range(len(parts))]  # the packages above it
        for path, node in _sources(list(parts), without):
            text = node.read_bytes()
            out[f"parc_runtime/{path}"] = text
            if path.endswith(".py"):
                todo += [place for place in _imports(path, text.decode("utf-8")) if place not in seen]
    return dict(sorted(out.items()))

