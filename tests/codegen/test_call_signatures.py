"""Every call of the runtime in a generated ``train.py`` fits the runtime's signature.

For every pair of FEATURES (each a few ``--set`` values on examples/tiny.par), the
spec ``parc check`` accepts is lowered and rendered in process, and every call in its
``train.py`` that reaches the runtime is bound (``inspect.Signature.bind``) against the
runtime *copied into a build folder*, imported as the trainer imports it:

- ``module.func(...)``, ``module.Class(...)``, ``module.obj.method(...)``: the modules
  are found through train.py's own ``from parc_runtime... import ...`` lines (so the
  test follows the runtime into subpackages), and each one's file must be among the
  files the build copies for that program;
- ``x.method(...)`` where ``x`` was assigned from a runtime class's constructor, or
  from a runtime function whose return annotation is a class.

A call with ``*args``/``**kwargs`` is bound only when it has neither. A pair whose spec
``parc check`` refuses has nothing to build (tests/test_check_build_contract.py keeps the
build's verdict the same). Black is replaced by the identity while rendering (the
calls are the same; black costs ~0.15 s a file). A few of the pairs also train for two
steps on gloo (``test_pairs_that_broke_train``), all of them in one torchrun launch
(tests/conftest.py's ``trainers``, tests/parity/batch.py): each pair is its own case, with
its own build, process groups and pass or fail.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import inspect
import itertools
import sys
import typing
from functools import lru_cache
from pathlib import Path

import black
import pytest

from parc.codegen.build import runtime_files
from parc.codegen.lower import lower
from parc.codegen.features import runtime_modules
from parc.codegen.render import render
from parc.dsl import Diagnostics, load
from parity.batch import Case  # tests/ is on sys.path (tests/conftest.py)

ROOT = Path(__file__).resolve().parents[2]
BASE = str(ROOT / "examples" / "tiny.par")  # dp 2 × tp 2, 4 layers, 4 heads

FEATURES = {
    "zero1": {"parallel.zero": "1"},
    "zero2": {"parallel.zero": "2"},
    "zero3": {"parallel.zero": "3", "parallel.zero_prefetch": "2"},
    "hsdp": {"parallel.zero": "3", "parallel.zero_shard": "node", "mesh.nodes": "2"},
    "bf16": {"train.precision": "bf16"},
    "fp16": {"train.precision": "fp16"},
    "grad_reduce_bf16": {"train.grad_reduce": "bf16"},
    "pp_1f1b": {"parallel.pp": "2"},
    "pp_gpipe": {"parallel.pp": "2", "parallel.schedule": "gpipe"},
    "pp_interleaved": {"parallel.pp": "2", "parallel.schedule": "interleaved(chunks = 2)"},
    "pp_zero_bubble": {"parallel.pp": "2", "parallel.schedule": "zero_bubble"},
    "pp_zero_bubble_v": {"parallel.pp": "2", "parallel.schedule": "zero_bubble_v"},
    "pp_chimera": {"parallel.pp": "2", "parallel.schedule": "chimera"},
    "pp_terapipe": {"parallel.pp": "2", "parallel.schedule": "terapipe(slices = 2)"},
    "stage_layers": {"parallel.pp": "2", "parallel.stage_layers": "[1, 3]"},
    "recompute_selective": {"parallel.recompute": "selective"},
    "recompute_full": {"parallel.recompute": "full"},
    "recompute_per_layer": {"parallel.recompute": "[full, none, selective, none]"},
    "overlap": {"parallel.overlap": "sub_batch(2)"},
    "sp": {"parallel.sp": "true"},
    "cp_ring": {"parallel.cp": "2"},
    "cp_ulysses": {"parallel.cp": "2", "parallel.cp_kind": "ulysses"},
    "cp_allgather": {"parallel.cp": "2", "parallel.cp_kind": "allgather"},
    "tp_2d": {"parallel.tp": "4", "parallel.dp": "1", "parallel.tp_shape": "(2, 2)"},
    "per_layer_tp": {"parallel.tp": "[2, 2, 1, 1]", "parallel.dp": "[2, 2, 4, 4]"},
    "moe": {"model.experts": "4", "model.top_k": "2"},
    "moe_ep": {"model.experts": "4", "parallel.ep": "2"},
    "moe_etp": {"model.experts": "4", "parallel.etp": "2"},
    "moe_capacity": {"model.experts": "4", "model.capacity_factor": "1.25"},
    "powersgd": {"parallel.compress": "powersgd(rank = 2)"},
    "topk": {"parallel.compress": "topk(ratio = 0.1)"},
    "compress_pp": {"parallel.pp": "2", "parallel.compress_pp": "lowrank(rank = 2)"},
    "llama_gqa": {"model.arch": "llama", "model.kv_heads": "2"},
    "tokens_eval": {"train.data": 'tokens("x.bin", val = "v.bin")', "train.eval": "every(2, batches = 1)"},
    "lr_wsd": {"train.schedule": "wsd(warmup = 1, decay = 5, shape = sqrt)"},
    "checkpoint_skip": {"train.checkpoint": "every(5)", "train.on_nonfinite": "skip"},
    "eager_dropout": {"train.kernels": "eager", "model.dropout": "0.1", "model.tie_embeddings": "false"},
}
PAIRS = list(itertools.combinations(FEATURES, 2))


def overrides(names) -> tuple[str, ...]:
    """The features' values (a later feature's value of a key wins), and the mesh they fill."""
    values: dict[str, str] = {}
    for name in names:
        values.update(FEATURES[name])

    def degree(key: str, default: str = "1") -> int:
        value = values.get(key, {"parallel.dp": "2", "parallel.tp": "2"}.get(key, default))
        return int(value.strip("[]").split(",")[0])  # a per-layer list: layer 0's (dp·tp is the same for all)

    world = degree("parallel.dp") * degree("parallel.tp") * degree("parallel.pp") * degree("parallel.cp")
    nodes = int(values.get("mesh.nodes", "1"))
    values["mesh.devices_per_node"] = str(max(1, world // nodes))
    return tuple(f"{key}={value}" for key, value in values.items())


# ---- the runtime as a build copies it -------------------------------------------------------


@pytest.fixture(scope="module")
def runtime(tmp_path_factory):
    """The whole runtime written as a build writes it, importable as ``parc_runtime``."""
    folder = tmp_path_factory.mktemp("build")
    for path, data in runtime_files(None).items():
        (folder / path).parent.mkdir(parents=True, exist_ok=True)
        (folder / path).write_bytes(data)
    saved = {name: module for name, module in sys.modules.items() if name.split(".")[0] == "parc_runtime"}
    for name in saved:
        del sys.modules[name]
    sys.path.insert(0, str(folder))
    try:
        yield folder
    finally:
        sys.path.remove(str(folder))
        for name in [n for n in sys.modules if n.split(".")[0] == "parc_runtime"]:
            del sys.modules[name]
        sys.modules.update(saved)


def nodes(tree: ast.Module) -> list[ast.AST]:
    """``ast.walk(tree)``, walked once for the three readers of a train.py below."""
    walked = getattr(tree, "_walked", None)
    if walked is None:
        walked = tree._walked = list(ast.walk(tree))
    return walked


def imported_names(tree: ast.Module) -> dict[str, object]:
    """train.py's names bound by ``from parc_runtime... import ...`` / ``import parc_runtime...``."""
    names = {}
    for node in nodes(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "parc_runtime":
            for alias in node.names:
                try:
                    value = importlib.import_module(f"{node.module}.{alias.name}")
                except ModuleNotFoundError:
                    value = getattr(importlib.import_module(node.module), alias.name)
                names[alias.asname or alias.name] = value
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "parc_runtime":
                    module = importlib.import_module(alias.name)
                    names[alias.asname or alias.name.split(".")[0]] = module if alias.asname else sys.modules["parc_runtime"]
    return names


def dotted(node: ast.expr) -> list[str] | None:
    """``a.b.c`` as ["a", "b", "c"]; None for anything else."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return [node.id, *reversed(parts)]


@lru_cache(maxsize=None)
def returned_class(function) -> type | None:
    """The class a runtime function's return annotation names, if it names one."""
    try:
        hint = typing.get_type_hints(function).get("return")
    except Exception:  # an annotation that does not evaluate (TYPE_CHECKING names): unknown
        return None
    return hint if inspect.isclass(hint) and hint.__module__.split(".")[0] == "parc_runtime" else None


class Calls:
    """Resolves train.py's calls to runtime callables and binds them."""

    def __init__(self, tree: ast.Module, names: dict[str, object]):
        self.names = names
        self.instances: dict[str, set[type]] = {}  # variable → the runtime classes assigned to it
        for node in nodes(tree):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
                made = self.made_by(node.value)
                for target in node.targets:
                    if isinstance(target, ast.Name) and made is not None:
                        self.instances.setdefault(target.id, set()).add(made)

    def made_by(self, call: ast.Call) -> type | None:
        target = self.resolve(call.func)
        if target is None:
            return None
        _, value, _ = target
        if inspect.isclass(value):
            return value
        return returned_class(value) if callable(value) else None

    def resolve(self, func: ast.expr) -> tuple[str, object, bool] | None:
        """(the call as written, the runtime callable, whether it wants a ``self``) or None."""
        parts = dotted(func)
        if parts is None:
            return None
        head, rest = parts[0], parts[1:]
        written = ".".join(parts)
        if head in self.names:
            value = self.names[head]
            for part in rest:
                if not hasattr(value, part):
                    raise AssertionError(f"{written}: {type(value).__name__} {value!r} has no {part!r}")
                value = getattr(value, part)
            return written, value, False
        if head in self.instances and len(rest) == 1:
            classes = self.instances[head]
            if len(classes) != 1:
                return None
            cls = next(iter(classes))
            if not hasattr(cls, rest[0]):
                if "__getattr__" in vars(cls) or rest[0] in getattr(cls, "__slots__", ()):
                    return None
                raise AssertionError(f"{written}: {cls.__qualname__} has no method {rest[0]!r}")
            static = inspect.getattr_static(cls, rest[0])
            value = getattr(cls, rest[0])
            if not callable(value):
                return None
            return written, value, not isinstance(static, (staticmethod, classmethod))
        return None

    def mismatches(self, tree: ast.Module) -> list[str]:
        out = []
        for node in nodes(tree):
            if not isinstance(node, ast.Call):
                continue
            try:
                target = self.resolve(node.func)
            except AssertionError as exc:
                out.append(f"line {node.lineno}: {exc}")
                continue
            if target is None:
                continue
            written, value, wants_self = target
            if any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords):
                continue  # *args / **kwargs: what they hold is not known here
            if not callable(value):
                out.append(f"line {node.lineno}: {written} is not callable")
                continue
            try:
                signature = inspect.signature(value)
            except (TypeError, ValueError):  # a builtin without a signature
                continue
            args = [object()] * (len(node.args) + wants_self)
            try:
                signature.bind(*args, **{k.arg: object() for k in node.keywords})
            except TypeError as exc:
                out.append(f"line {node.lineno}: {written}{signature}: {exc}")
        return out


def copied(names: dict[str, object], files: frozenset[str], folder: Path) -> list[str]:
    """The runtime modules train.py imports whose file the build does not copy."""
    missing = []
    for value in names.values():
        module = value if inspect.ismodule(value) else sys.modules[value.__module__]
        path = Path(module.__file__).relative_to(folder).as_posix()
        if path not in files:
            missing.append(path)
    return missing


@lru_cache(maxsize=None)
def shipped(modules: frozenset[str]) -> frozenset[str]:
    """The runtime files a build of these modules copies (many pairs ship the same set)."""
    return frozenset(runtime_files(set(modules)))


def _identity(text: str, mode=None) -> str:
    return text


def mismatches_of(sets, folder: Path) -> list[str] | None:
    """The calls of the build's train.py that do not fit (None: ``parc check`` refuses the spec)."""
    try:
        spec = load(BASE, list(sets))
    except Diagnostics:
        return None
    plan = lower(spec)
    saved, black.format_str = black.format_str, _identity
    try:
        text = render(plan)["train.py"]
    finally:
        black.format_str = saved
    tree = ast.parse(text)
    names = imported_names(tree)
    files = shipped(frozenset(runtime_modules(plan)))
    out = [f"not copied into the build: {path}" for path in copied(names, files, folder)]
    return out + Calls(tree, names).mismatches(tree)


def test_every_pair_of_features_is_swept():
    assert len(FEATURES) >= 36
    assert len(PAIRS) == len(FEATURES) * (len(FEATURES) - 1) // 2
    assert len({overrides(pair) for pair in PAIRS}) > 0.9 * len(PAIRS)  # few pairs collapse into one spec


def test_the_checker_sees_a_call_that_does_not_fit(runtime):
    """The checker itself: a wrong keyword, a missing argument, a missing function or method."""
    text = (
        "from parc_runtime.distributed import mesh\n"
        "from parc_runtime.optimizers import optim\n"
        "from parc_runtime.parallel.data import dp\n"
        "grid = mesh.Mesh(AXES, dist)\n"
        "grid.group('tp', bogus=1)\n"
        "sync = dp.GradientBuckets(net, group, overlap=True, colour='red')\n"
        "sync.finish(1.0)\n"
        "optim.clip_grad_norm_(net)\n"
        "optim.no_such_function(net)\n"
        "mesh.init_distributed()\n"
    )
    tree = ast.parse(text)
    found = Calls(tree, imported_names(tree)).mismatches(tree)
    lines = sorted(int(m.split(":")[0].split()[1]) for m in found)
    assert lines == [5, 6, 7, 8, 9], found


def test_every_runtime_call_of_every_pair_fits(runtime):
    built, refused, bad = 0, 0, []
    seen: dict[tuple, list | None] = {}
    for pair in [(name,) for name in FEATURES] + PAIRS:
        sets = overrides(pair)
        if sets not in seen:
            seen[sets] = mismatches_of(sets, runtime)
        found = seen[sets]
        if found is None:
            refused += 1
            continue
        built += 1
        bad += [f"{' + '.join(pair)}: {m}" for m in found]
    assert not bad, "\n".join(bad[:40])
    assert built > 0.5 * (built + refused), (built, refused)  # most pairs build


RUNS = {
    "powersgd + grad_reduce_bf16": ("powersgd", "grad_reduce_bf16"),
    "topk + grad_reduce_bf16": ("topk", "grad_reduce_bf16"),
    "per_layer_tp + fp16": ("per_layer_tp", "fp16"),
    "per_layer_tp + grad_reduce_bf16": ("per_layer_tp", "grad_reduce_bf16"),
    "bf16 + moe_etp": ("bf16", "moe_etp"),
}


def train_case(pair) -> Case:
    """Two steps of the pair's build of the tiny example, on as many ranks as its mesh fills."""
    sets = overrides(pair)
    world = int(dict(s.split("=", 1) for s in sets)["mesh.devices_per_node"])
    return Case(f"signatures-{'-'.join(pair)}", BASE, sets, world, ("--steps", "2"))


def cases_of(item) -> list[Case]:
    """The runs a selected test of this module reads (tests/conftest.py's ``trainers``)."""
    if item.originalname == "test_pairs_that_broke_train":
        return [train_case(item.callspec.params["pair"])]
    return []


@pytest.mark.parametrize("pair", list(RUNS.values()), ids=list(RUNS))
def test_pairs_that_broke_train(pair, trainers):
    """Pairs whose trainer once died at step 1 on a call that did not fit: two steps on gloo."""
    records = trainers.records(train_case(pair))
    assert [r["step"] for r in records] == [1, 2]
    assert all(builtins.abs(r["loss"]) < 100 and r["grad_norm"] >= 0 for r in records), records
