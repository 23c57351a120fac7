"""The mesh axes: the world, tensor parallelism (1D, within a node; the 2D grid: its shape,
sizes, kv heads, sequence split and what it is built with, and ``tp_2d``, the derived value other
features' rules read)."""

from __future__ import annotations

import inspect
import math
from typing import Callable, Mapping
from ..axes import TP_SIDES, WORLD_ORDER, Axis, axis

from ..rule_engine import BUILD, Violation, _violation, divisors, rule, some
from ..rule_keys import declare, derive, legal
from ..model_rules import kv_replicas

declare(tp_shape="parallel.tp_shape", tp_shape_auto="parallel.tp_shape")  # Note [a feature declares its values]


@derive()  # Note [a derived value]: sequence parallelism's and the schedules' rules read it
def tp_2d(tp_shape=None) -> bool:
    """``tp_shape = (R, C)`` with R > 1: the tp ranks as a 2D grid (Note [2D tensor
    parallelism] in layers2d.py); ``(1, tp)`` and no tp_shape are today's 1D."""
    return tp_shape is not None and tuple(tp_shape)[0] > 1



AXES = tuple(axis(name) for name in WORLD_ORDER)
"""The mesh axes of ``axes.py`` (one registry), in the order the world size is written."""



_WORDS = {"padded_vocab": "the padded vocab"}



@rule("PAR0201")
def world(nodes, devices_per_node, dp, cp, tp, pp):
    axes = [a for a in AXES if a.in_world]
    degrees = {"dp": dp, "cp": cp, "tp": tp, "pp": pp}
    product = math.prod(degrees[a.name] for a in axes)
    ranks = nodes * devices_per_node
    if product == ranks:
        return None
    shown = [a for a in axes if a.name != "cp" or cp != 1]  # cp is named only when in use
    first, rest = shown[0].name, shown[1:]
    others = math.prod(degrees[a.name] for a in rest)
    if ranks % others == 0:
        fixed = [f"{a.name} = {degrees[a.name]}" for a in rest]
        hint = f"{first} = {ranks // others} fits this mesh with {_and(fixed)}"
    else:
        hint = f"{'·'.join(a.name for a in rest)} = {others} must divide the {ranks} devices"
    return _violation(
        "PAR0201", tuple(a.key for a in axes),
        f"world size: {'·'.join(a.name for a in shown)} = {'·'.join(str(degrees[a.name]) for a in shown)} = "
        f"{product}, but nodes·devices_per_node = {nodes}·{devices_per_node} = {ranks}",
        hint, blame_latest_set=True,
    )



def _and(words: list[str]) -> str:
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]



@rule("PAR0223")
def tp_kv_heads(tp, kv_heads, heads=None, hidden=None, tp_shape=None, tp_shape_auto=None, head_dim=None):
    """tp ≤ kv_heads splits the kv heads; tp > kv_heads replicates each over tp / kv_heads ranks,
    and the k and v weights (kv_heads · head_dim rows) are stored split over all tp ranks.
    A 2D grid splits them over C instead, never replicating them (``build_tp_2d_kv_heads``);
    under ``tp_shape = auto`` only a tp that no grid with R > 1 fits is reported."""
    if tp_2d(tp_shape):
        return None
    width = head_dim if head_dim is not None else None if heads is None or hidden is None else hidden // heads
    found = _kv_heads_1d(tp, kv_heads, heads, width)
    if found is not None and tp_shape is None and tp_shape_auto:
        if any(rows > 1 for rows, _ in tp_grids(tp, {"heads": heads, "hidden": hidden})):
            return None
    return found



def _kv_heads_1d(tp, kv_heads, heads, head_dim) -> Violation | None:
    replicas = kv_replicas(kv_heads, tp)
    if replicas == 0:
        fits = sorted({d for d in divisors(kv_heads)} | {kv_heads * m for m in divisors(heads or kv_heads)})
        if heads is not None:
            fits = [d for d in fits if heads % d == 0]
        return _violation("PAR0223", ("parallel.tp", "model.kv_heads"),
                          f"tp = {tp} neither divides kv_heads = {kv_heads} nor is a multiple of it "
                          f"(tp > kv_heads replicates each kv head over tp / kv_heads ranks)",
                          f"tp must be one of {some(fits, tp)}")
    if replicas == 1 or heads is None or head_dim is None:
        return None
    rows = kv_heads * head_dim
    if rows % tp == 0:
        return None
    return _violation("PAR0223", ("parallel.tp", "model.kv_heads"),
                      f"tp = {tp} replicates kv_heads = {kv_heads} over {replicas} ranks each, but does not divide "
                      f"the k and v weights' kv_heads·head_dim = {kv_heads}·{head_dim} = {rows} rows, "
                      f"which every tp rank stores a share of",
                      f"tp must divide {rows} and heads = {heads}: one of "
                      f"{some([d for d in divisors(rows) if kv_replicas(kv_heads, d) and heads % d == 0], tp)}")



def _failing(degree: int, names, sizes: Mapping) -> tuple[list, list]:
    """The ``(name, size)`` of ``names`` whose size is known, and those ``degree`` does not divide."""
    known = [(n, sizes[n]) for n in names if sizes.get(n) is not None]
    return known, [(n, s) for n, s in known if s % degree]



def _sizes(failing: list, vocab, pad_vocab_to) -> str:
    """``heads = 4 and the padded vocab = 500 (vocab = ... rounded up ...)``."""
    words = _and([f"{_WORDS.get(n, n)} = {s}" for n, s in failing])
    if any(n == "padded_vocab" for n, _ in failing):
        words += f" (vocab = {vocab} rounded up to a multiple of pad_vocab_to = {pad_vocab_to})"
    return words



def _axis_divides(axis: Axis) -> Callable:
    def check(degree, heads=None, kv_heads=None, ffn=None, padded_vocab=None, vocab=None, pad_vocab_to=None):
        sizes = {"heads": heads, "kv_heads": kv_heads, "ffn": ffn, "padded_vocab": padded_vocab}
        known, failing = _failing(degree, axis.divides, sizes)
        if not failing:
            return None
        message = f"{axis.name} = {degree} does not divide {_sizes(failing, vocab, pad_vocab_to)}"
        common = math.gcd(*(s for _, s in known))
        hint = f"{axis.name} must be one of {some(divisors(common), degree)}"
        if [n for n, _ in failing] == ["padded_vocab"]:
            hint += f", or pad the vocab further: pad_vocab_to = {math.lcm(pad_vocab_to, degree)}"
        return Violation(code=axis.code, blame=(axis.key,), message=message, hint=hint)

    grid = axis.name == "tp"  # Note [2D tensor parallelism]: on a grid tp_shape's sides divide instead

    # The degree is read under the axis's own name (the rule's parameters are KEYS names).
    def entry(**values):
        degree = values.pop(axis.name)
        if not grid:
            return check(degree, **values)
        shape, auto, hidden = values.pop("tp_shape"), values.pop("tp_shape_auto"), values.pop("hidden")
        if tp_2d(shape):  # (a shape that does not arrange tp ranks is PAR0274's)
            return _grid_divides(shape, hidden=hidden, **values) if math.prod(shape) == degree else None
        found = check(degree, **values)
        if found is not None and shape is None and auto and tp_grids(degree, {**values, "hidden": hidden}):
            return None  # tp_shape = auto: some R × C grid of these ranks fits (R > 1: 1D does not)
        return found

    params = [inspect.Parameter(axis.name, inspect.Parameter.KEYWORD_ONLY)] + [
        inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=None)
        for n in (*axis.divides, "vocab", "pad_vocab_to", *(("hidden", "tp_shape", "tp_shape_auto") if grid else ()))
    ]
    entry.__signature__ = inspect.Signature(params)
    entry.__name__ = f"{axis.name}_divides"
    return entry



def tp_grid_fits(rows: int, cols: int, sizes: Mapping) -> bool:
    """Note [2D tensor parallelism] (layers2d.py): an R × C grid of the tp ranks splits the
    sizes its sides divide (``axes.TP_SIDES``): C the heads, the ffn and the padded vocab
    (the colwise outputs), R the hidden features. (1, tp) is 1D's rule. Unknown sizes pass."""
    return not any(_failing(degree, side.divides, sizes)[1] for side, degree in zip(TP_SIDES, (rows, cols)))



def tp_grid_choices(values: Mapping) -> list[dict]:
    """The tp grids the layout search tries for a leaf (Note [the search space] in layouts.py),
    as the values to put in place: the one written, or under ``tp_shape = auto`` every
    (R, tp / R) the rules allow with the leaves chosen (R = 1: 1D, written None); without it 1D."""
    tp, given = values["tp"], values.get("tp_shape")
    if given is not None or not values.get("tp_shape_auto") or tp == 1:
        return [{"tp_shape": None if given is None or given[0] == 1 else given}]
    shapes = [(rows, tp // rows) for rows in divisors(tp)]  # (1, tp) first: 1D, written None
    return [{"tp_shape": None if shape[0] == 1 else shape} for shape in shapes
            if legal({**values, "tp_shape": shape}, touching=("tp_shape",))]


def tp_grids(tp: int, sizes: Mapping) -> list[tuple[int, int]]:
    """Every (R, C) with R·C = tp that ``tp_grid_fits``, (1, tp) first."""
    return [(rows, tp // rows) for rows in divisors(tp) if tp_grid_fits(rows, tp // rows, sizes)]



_SPLIT_WORDS = {"heads": "the heads", "ffn": "the ffn", "padded_vocab": "the padded vocab",
                "hidden": "the hidden features"}



def _grid_divides(tp_shape, *, vocab=None, pad_vocab_to=None, **sizes) -> tuple[Violation, ...]:
    """PAR0203 on an R × C grid: the sizes C does not divide, then those R does not."""
    rows, cols = tp_shape
    fits = [f"({r}, {c})" for r, c in tp_grids(rows * cols, sizes)]
    hint = (f"tp_shape must be one of {', '.join(fits)}" if fits else
            f"no R × C grid of tp = {rows * cols} ranks fits this model: change tp")
    found = []
    for side, letter, degree in ((TP_SIDES[1], "C", cols), (TP_SIDES[0], "R", rows)):
        failing = _failing(degree, side.divides, sizes)[1]
        if failing:
            split = _and([_SPLIT_WORDS.get(n, n) for n in side.divides])
            found.append(_violation(
                "PAR0203", "parallel.tp_shape",
                f"tp_shape = ({rows}, {cols}) splits {split} over {letter} = {degree} ranks, but {letter} "
                f"does not divide {_sizes(failing, vocab, pad_vocab_to)}", hint))
    return tuple(found)



for _axis in AXES:
    if _axis.divides:
        rule(_axis.code, name=f"{_axis.name}_divides")(_axis_divides(_axis))



@rule("PAR0217")
def tp_within_node(nodes, devices_per_node, tp, tp_shape=None, tp_shape_auto=None):
    """A tp group stays on one node, except a 2D grid's columns (Note [2D tensor parallelism]):
    its rows of C consecutive ranks fill nodes (C divides devices_per_node, devices_per_node
    divides tp), its columns cross them. While ``tp_shape = auto`` is open (None), such a tp
    waits for the shape."""
    if nodes == 1 or devices_per_node % tp == 0:
        return None
    spans = tp % devices_per_node == 0
    if spans and tp_2d(tp_shape) and devices_per_node % tp_shape[1] == 0:
        return None
    if spans and tp_shape is None and tp_shape_auto:
        return None
    return _violation(
        "PAR0217", "parallel.tp",
        f"tp = {tp} does not divide devices_per_node = {devices_per_node}, so a tp group would span nodes "
        f"(nodes = {nodes})",
        f"keep each tp group on one node: tp must be one of {some(divisors(devices_per_node), tp)}",
    )


@rule("PAR0274")
def tp_shape_product(tp_shape, tp):
    """2D tensor parallelism arranges the tp ranks as an R × C mesh: R·C = tp."""
    rows, cols = tp_shape
    if rows * cols == tp:
        return None
    return _violation("PAR0274", ("parallel.tp_shape", "parallel.tp"),
                      f"tp_shape = ({rows}, {cols}) arranges {rows}·{cols} = {rows * cols} ranks, but tp = {tp}",
                      f"write tp_shape = (1, {tp}), or a pair whose product is {tp}")


@rule("PAR0210")
def sequence_parallel_2d(sp, tp, seq_len, tp_shape):
    """sp on a 2D grid splits the sequence over a row's C ranks (Note [2D sequence
    parallelism] in layers2d.py): C must divide seq_len (1D's split: ``sequence_parallel``)."""
    if sp is not True or tp < 2 or not tp_2d(tp_shape) or seq_len % tp_shape[1] == 0:
        return None  # sp = true with tp < 2: PAR0209
    rows, cols = tp_shape
    return _violation("PAR0210", ("model.seq_len", "parallel.tp_shape"),
                      f"seq_len = {seq_len} is not divisible by C = {cols} (sp = true with tp_shape = "
                      f"({rows}, {cols}) splits the sequence over a row's C ranks)",
                      f"make seq_len a multiple of {cols}, or set sp = false")


@rule("PAR0278", BUILD)
def build_tp_2d_kv_heads(tp_shape, kv_heads):
    """2D tensor parallelism splits the kv heads over a row's C ranks; it does not replicate
    them (Note [KV replication] is 1D's), so C must divide kv_heads."""
    if not tp_2d(tp_shape):
        return None
    rows, cols = tp_shape
    if kv_heads % cols == 0:
        return None
    fits = [c for c in divisors(kv_heads) if (rows * cols) % c == 0]
    return _violation("PAR0278", ("parallel.tp_shape", "model.kv_heads"),
                      f"tp_shape = ({rows}, {cols}) splits the kv heads over C = {cols} ranks, "
                      f"but C does not divide kv_heads = {kv_heads} (2D does not replicate kv heads)",
                      "C must be one of " + ", ".join(map(str, fits)) + f" (and R = {rows * cols} / C)")


@rule("PAR0228", BUILD)
def build_tp_2d_qk_norm(tp_shape, qk_norm):
    """A 2D grid repeats a row's heads on its R ranks; the head norms' gradient sum over tp
    (``llama_attention.HeadNorm``) is 1D's, so ``qk_norm`` is built with 1D tensor parallelism only."""
    if not tp_2d(tp_shape) or not qk_norm:
        return None
    rows, cols = tp_shape
    return _violation("PAR0228", ("model.qk_norm", "parallel.tp_shape"),
                      f"model.qk_norm = true is not built with 2D tensor parallelism (tp_shape = ({rows}, {cols}))",
                      f"write tp_shape = (1, {rows * cols}), or remove model.qk_norm")
