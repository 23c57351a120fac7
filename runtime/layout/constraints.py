"""Every rule that decides whether a layout is legal and whether parc can build it.

Takes: plain values (numbers, strings, booleans, tuples) by their short names in
``KEYS`` — ``dp``, ``heads``, ``global_batch`` ... — a missing or ``None`` value being
unknown (``auto``, not given, or already reported bad). Gives: ``violations(values)``,
the ``Violation`` of each rule that fails, its message the formula with the values
filled in and a hint. A rule whose required values are unknown is skipped, so a
rule only reports what holds whatever the unknowns turn out to be (the search feeds
it partial layouts for that reason).

The front end (``dsl/checks.py``), the build (``codegen/passes/check_values.py``,
``check_buildable.py``), the layout search (``codegen/planner/search.py``, the cost model's
``buildable``) and the runtime (``model.ModelConfig``) all call this module, so
``parc check`` and ``parc build`` cannot disagree (``tests/test_check_build_contract.py``).
Torch-free (the standard library and ``axes.py`` only): ``parc.dsl`` may import it, and
a build vendors it as ``parc_runtime/layout/constraints.py``.

Note [a rule is an entry]: a new parallel axis is an ``Axis`` of ``axes.py`` (whether it
joins the world product, what sizes its degree divides); a feature parc cannot build yet is
an ``Unbuildable`` entry; a per-layer setting an entry of ``layer_settings.SETTINGS``; anything
else is one function decorated with ``@rule(code)`` whose parameters are names of
``KEYS`` (without a default: required, the rule is skipped while it is unknown; with
``= None``: optional). Context parallel is ``Axis("cp", ...)`` in ``axes.AXES``, ``"cp"``
and ``"cp_kind"`` in ``KEYS``, its degree in ``world``, and three rules (``cp_divides_seq_len``,
``ulysses_heads``, ``ring_dropout``: they read sp, tp, the kind and the model, more than an
axis's ``divides`` says); the planner searches cp (``cp = auto``) and costs it like any axis.
"""

from __future__ import annotations

import inspect
import keyword
import math
from dataclasses import dataclass, replace
from typing import Callable, Iterable, Mapping

from .axes import TP_SIDES, WORLD_ORDER, Axis, axis
from .layer_settings import SETTINGS, spec_text

LAYOUT, BUILD = "layout", "build"
"""Rule kinds: what any program must satisfy; what ``parc build`` can generate today."""

KEYS = {
    "name": "model.name",
    "layers": "model.layers",
    "hidden": "model.hidden",
    "heads": "model.heads",
    "kv_heads": "model.kv_heads",
    "ffn": "model.ffn",
    "vocab": "model.vocab",
    "pad_vocab_to": "model.pad_vocab_to",
    "padded_vocab": "model.pad_vocab_to",
    "seq_len": "model.seq_len",
    "experts": "model.experts",
    "top_k": "model.top_k",
    "expert_ffn": "model.expert_ffn",
    "capacity_factor": "model.capacity_factor",
    "moe_written": "model.experts",
    "ep": "parallel.ep",
    "etp": "parallel.etp",
    "dropout": "model.dropout",
    "tie_embeddings": "model.tie_embeddings",
    "nodes": "mesh.nodes",
    "devices_per_node": "mesh.devices_per_node",
    "dp": "parallel.dp",
    "tp": "parallel.tp",
    "layer_dp": "parallel.dp",
    "layer_tp": "parallel.tp",
    "pp": "parallel.pp",
    "cp": "parallel.cp",
    "cp_kind": "parallel.cp_kind",
    "sp": "parallel.sp",
    "zero": "parallel.zero",
    "zero_prefetch": "parallel.zero_prefetch",
    "zero_shard": "parallel.zero_shard",
    "schedule": "parallel.schedule",
    "chunks": "parallel.schedule",
    "slices": "parallel.schedule",
    "slice_lengths": "parallel.schedule",
    "recompute": "parallel.recompute",
    "overlap": "parallel.overlap",
    "stage_layers": "parallel.stage_layers",
    "tp_shape": "parallel.tp_shape",
    "tp_shape_auto": "parallel.tp_shape",
    "compress": "parallel.compress",
    "compress_pp": "parallel.compress_pp",
    "compress_stages": "parallel.compress_stages",
    "global_batch": "train.global_batch",
    "micro_batch": "train.micro_batch",
    "steps": "train.steps",
    "warmup": "train.schedule.warmup",
    "precision": "train.precision",
    "grad_reduce": "train.grad_reduce",
    "optimizer": "train.optimizer",
    "data": "train.data",
    "data_dtype": "train.data.dtype",
}
"""Each plain value's name and the spec key it comes from (``schedule``: ``1f1b``,
``gpipe`` or ``interleaved``; ``chunks``: 1 unless interleaved; ``tp``/``dp`` of a
heterogeneous layout: the stage's coarse split (the largest tp, the fewest dp), the lists
themselves ``layer_tp``/``layer_dp`` (``layer_degrees``; None when one value is given); the per-layer settings
as ``layer_settings`` reads them (``overlap``: the sub-batches, 1 for ``none``); ``moe_written``: the
mixture-of-experts keys other than ``experts`` the spec writes (``top_k``, ...; PAR0234); ``data``: ``synthetic`` or ``tokens``; ``optimizer``: its name; ``compress``, ``compress_pp``: the call's name)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Violation:
    code: str
    blame: tuple[str, ...]
    """Spec keys (dotted) the mistake is about: it is shown at the first one written."""
    message: str
    hint: str | None = None
    blame_latest_set: bool = False
    """Among ``blame``, point at the one a ``--set`` gave last, if any (the world size:
    the user just changed that degree)."""
    rule: str = ""
    """The name of the rule (``violations`` fills it in)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Rule:
    name: str
    code: str
    kind: str
    check: Callable
    needs: tuple[str, ...]
    """Values that must be known for the rule to run."""
    optional: tuple[str, ...]


RULES: list[Rule] = []
"""Every rule, in the order their violations are reported."""


def rule(code: str, kind: str = LAYOUT, name: str | None = None):
    """Register ``check(**values) -> Violation | tuple[Violation, ...] | None`` (Note [a rule is an entry])."""

    def register(check: Callable) -> Callable:
        params = inspect.signature(check).parameters.values()
        needs = tuple(p.name for p in params if p.default is inspect.Parameter.empty)
        optional = tuple(p.name for p in params if p.default is not inspect.Parameter.empty)
        unknown = [n for n in needs + optional if n not in KEYS]
        if unknown or not needs:
            raise ValueError(f"constraints: rule {check.__name__} reads {unknown or 'nothing'}")
        RULES.append(Rule(name=name or check.__name__, code=code, kind=kind, check=check,
                          needs=needs, optional=optional))
        return check

    return register


def violations(
    values: Mapping[str, object], kinds: Iterable[str] = (LAYOUT, BUILD), touching: Iterable[str] | None = None
) -> list[Violation]:
    """Every violated rule of ``kinds`` whose required values are known, in ``RULES`` order;
    with ``touching``, only the rules that read one of those names (a search that binds
    values one level at a time re-checks only what the new values can change)."""
    return [
        replace(item, rule=entry.name)
        for entry, result in _results(values, tuple(kinds), touching)
        for item in ((result,) if isinstance(result, Violation) else result)
    ]


def legal(
    values: Mapping[str, object], kinds: Iterable[str] = (LAYOUT,), touching: Iterable[str] | None = None
) -> bool:
    """No rule is violated (``violations`` is empty; stops at the first)."""
    return next(_results(values, tuple(kinds), touching), None) is None


def rules_of(kinds: Iterable[str]) -> tuple[Rule, ...]:
    """The rules of ``kinds``, in ``RULES`` order (the planner memoizes ``holds`` per rule,
    keyed on what each reads: codegen/planner/cost/estimate.py's ``buildable``)."""
    return _selected(tuple(kinds), None)


def holds(values: Mapping[str, object], entry: Rule) -> bool:
    """``entry`` is not violated (skipped, so holding, while a value it requires is unknown)."""
    result = _run(entry, values)
    return result is None or result == ()


def _results(values: Mapping[str, object], kinds: tuple, touching: Iterable[str] | None):
    """(rule, what it returned) for each rule that ran and failed."""
    for entry in _selected(kinds, None if touching is None else tuple(touching)):
        result = _run(entry, values)
        if result is not None and result != ():
            yield entry, result


def _run(entry: Rule, values: Mapping[str, object]):
    """What ``entry``'s check returns for ``values``; None when a value it requires is unknown."""
    get = values.get
    args = {}
    for name in entry.needs:
        value = get(name) if name != "padded_vocab" else _padded_vocab(values)
        if value is None:
            return None
        args[name] = value
    for name in entry.optional:
        args[name] = get(name) if name != "padded_vocab" else _padded_vocab(values)
    return entry.check(**args)


def _padded_vocab(values: Mapping[str, object]):
    """The vocab rounded up to a multiple of pad_vocab_to (the embedding's rows), or None."""
    given, vocab, pad = values.get("padded_vocab"), values.get("vocab"), values.get("pad_vocab_to")
    if given is not None or vocab is None or pad is None:
        return given
    return -(-vocab // pad) * pad


_SELECTED: dict[tuple, tuple[Rule, ...]] = {}


def _selected(kinds: tuple, touching: tuple | None) -> tuple[Rule, ...]:
    """The rules of ``kinds`` (that read a name of ``touching``), cached."""
    found = _SELECTED.get((kinds, touching))
    if found is None:
        wanted = None
        if touching is not None:
            wanted = set(touching) | ({"padded_vocab"} if {"vocab", "pad_vocab_to"} & set(touching) else set())
        found = tuple(
            r for r in RULES if r.kind in kinds and (wanted is None or wanted & {*r.needs, *r.optional})
        )
        _SELECTED[(kinds, touching)] = found
    return found


def _violation(code: str, blame, message: str, hint: str | None = None, **extra) -> Violation:
    blame = (blame,) if isinstance(blame, str) else tuple(blame)
    return Violation(code=code, blame=blame, message=message, hint=hint, **extra)


def smallest(values: Mapping[str, object], candidates: Iterable[Mapping[str, object]]):
    """The first of ``candidates`` (each a few values to put in place) that leaves every
    rule reading them satisfied, given the rest of ``values``; None when none does.
    ``parc verify`` shrinks a model with it: the rules decide what a smaller value may be."""
    for candidate in candidates:
        if legal({**values, **candidate}, touching=tuple(candidate)):
            return dict(candidate)
    return None


def divisors(n: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def some(values: list[int], near: int, limit: int = 10) -> str:
    """At most ``limit`` of ``values``, those closest to ``near``, in order."""
    chosen = sorted(sorted(values, key=lambda v: (abs(v - near), v))[:limit])
    text = ", ".join(str(v) for v in chosen)
    return text if len(values) <= limit else text + ", ..."


def entries(value) -> tuple:
    """A per-layer value's entries (Note [a rule is an entry]); a single value is one entry."""
    return tuple(value) if isinstance(value, (tuple, list)) else (value,)


def per_layer(value, layers: int, what: str = "a per-layer value") -> tuple:
    """``value`` for each of ``layers`` blocks: a sequence of that length, or one value for
    all (the one expansion the spec, the cost model and the runtime's model share)."""
    if isinstance(value, (tuple, list)):
        if len(value) != layers:
            raise ValueError(f"{what} lists {len(value)} values for {layers} layers")
        return tuple(value)
    return (value,) * layers


# ---- the model ------------------------------------------------------------------


@rule("PAR0114")
def model_name(name):
    if isinstance(name, str) and (keyword.iskeyword(name) or keyword.issoftkeyword(name)):
        return _violation("PAR0114", "model.name", f"`{name}` is a Python keyword and cannot name the model",
                          f"try `{name}_model`")
    return None


# ---- the mesh axes ----------------------------------------------------------------


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


@rule("PAR0202")
def heads_divide_hidden(hidden, heads):
    if hidden % heads == 0:
        return None
    return _violation(
        "PAR0202", "model.heads",
        f"hidden = {hidden} is not divisible by heads = {heads} (head_dim = hidden / heads = {hidden / heads:g})",
        f"heads must divide hidden: one of {some(divisors(hidden), heads)}",
    )


@rule("PAR0204")
def kv_heads_divide_heads(heads, kv_heads):
    if heads % kv_heads == 0:
        return None
    return _violation("PAR0204", "model.kv_heads", f"heads = {heads} is not divisible by kv_heads = {kv_heads}",
                      f"kv_heads must divide heads: one of {some(divisors(heads), kv_heads)}")


def kv_replicas(kv_heads: int, tp: int) -> int:
    """How many tp ranks hold each kv head (Note [KV replication] in ``layers.py``): 1 when
    tp divides kv_heads (each rank its kv_heads / tp heads), tp / kv_heads when tp is a
    multiple of kv_heads (each rank one head, shared with its replicas); 0: neither."""
    if kv_heads % tp == 0:
        return 1
    return tp // kv_heads if tp % kv_heads == 0 else 0


@rule("PAR0223")
def tp_kv_heads(tp, kv_heads, heads=None, hidden=None, tp_shape=None, tp_shape_auto=None):
    """tp ≤ kv_heads splits the kv heads; tp > kv_heads replicates each over tp / kv_heads ranks,
    and the k and v weights (kv_heads · head_dim rows) are stored split over all tp ranks.
    A 2D grid splits them over C instead, never replicating them (``build_tp_2d_kv_heads``);
    under ``tp_shape = auto`` only a tp that no grid with R > 1 fits is reported."""
    if tp_2d(tp_shape):
        return None
    found = _kv_heads_1d(tp, kv_heads, heads, hidden)
    if found is not None and tp_shape is None and tp_shape_auto:
        if any(rows > 1 for rows, _ in tp_grids(tp, {"heads": heads, "hidden": hidden})):
            return None
    return found


def _kv_heads_1d(tp, kv_heads, heads, hidden) -> Violation | None:
    replicas = kv_replicas(kv_heads, tp)
    if replicas == 0:
        fits = sorted({d for d in divisors(kv_heads)} | {kv_heads * m for m in divisors(heads or kv_heads)})
        if heads is not None:
            fits = [d for d in fits if heads % d == 0]
        return _violation("PAR0223", ("parallel.tp", "model.kv_heads"),
                          f"tp = {tp} neither divides kv_heads = {kv_heads} nor is a multiple of it "
                          f"(tp > kv_heads replicates each kv head over tp / kv_heads ranks)",
                          f"tp must be one of {some(fits, tp)}")
    if replicas == 1 or heads is None or hidden is None:
        return None
    rows = kv_heads * (hidden // heads)
    if rows % tp == 0:
        return None
    return _violation("PAR0223", ("parallel.tp", "model.kv_heads"),
                      f"tp = {tp} replicates kv_heads = {kv_heads} over {replicas} ranks each, but does not divide "
                      f"the k and v weights' kv_heads·head_dim = {kv_heads}·{hidden // heads} = {rows} rows, "
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


# ---- context parallel -----------------------------------------------------------------


def _cp_parts(cp, tp, ring, both) -> int:
    """What seq_len must divide by: cp chunks (2·cp for ring), each split over tp under sp."""
    return math.lcm(2 * cp if ring else cp, cp * tp if both else 1)


@rule("PAR0220")
def cp_divides_seq_len(cp, seq_len, sp=None, tp=None, cp_kind=None):
    """Each cp rank holds seq_len / cp tokens (ring: two chunks of seq_len / (2·cp), the
    causal load balance of ``data.context_spans``); under sp its tp ranks split them again."""
    if cp == 1:
        return None
    both, ring = sp is True and tp is not None and tp > 1, cp_kind == "ring"
    parts = _cp_parts(cp, tp, ring, both)
    if seq_len % parts == 0:
        return None
    formulas = ([f"2·cp = {2 * cp}"] if ring else []) + ([f"cp·tp = {cp}·{tp} = {cp * tp}"] if both else [])
    whys = (["cp_kind = ring splits each sequence into 2·cp chunks, two a rank"] if ring else []) + (
        ["sp = true splits each cp rank's tokens over tp"] if both else [])
    formula = " and ".join(formulas) or f"cp = {cp}"
    why = f" ({'; '.join(whys)})" if whys else ""
    fits = [d for d in divisors(seq_len) if seq_len % _cp_parts(d, tp, ring, both) == 0]
    return _violation("PAR0220", ("parallel.cp", "model.seq_len"),
                      f"seq_len = {seq_len} is not divisible by {formula}{why}",
                      f"make seq_len a multiple of {parts}, or cp one of {some(fits, cp)}")


@rule("PAR0221")
def ulysses_heads(cp, cp_kind, heads, tp, kv_heads=None):
    """Ulysses trades the sequence shard for a head shard: every rank takes heads / (cp·tp)."""
    if cp == 1 or cp_kind != "ulysses":
        return None
    parts = cp * tp
    failing = [(n, v) for n, v in (("heads", heads), ("kv_heads", kv_heads)) if v is not None and v % parts]
    if not failing:
        return None
    words = _and([f"{n} = {v}" for n, v in failing])
    common = math.gcd(heads, kv_heads) if kv_heads is not None else heads
    fits = [d for d in divisors(common) if d % tp == 0 and d // tp > 1]
    hint = "use cp_kind = allgather (it needs no head split)"
    if fits:
        hint = f"cp must be one of {some([d // tp for d in fits], cp)} with tp = {tp}, or {hint}"
    return _violation("PAR0221", ("parallel.cp_kind", "parallel.cp"),
                      f"cp_kind = ulysses needs heads and kv_heads divisible by cp·tp = {cp}·{tp} = {parts}, "
                      f"but {words} {'is' if len(failing) == 1 else 'are'} not", hint)


@rule("PAR0222")
def ring_dropout(cp, cp_kind, dropout):
    """Ring attention merges exact block softmaxes; it applies no dropout to attention weights."""
    if cp == 1 or cp_kind != "ring" or not dropout:
        return None
    return _violation("PAR0222", ("model.dropout", "parallel.cp_kind"),
                      f"cp_kind = ring computes attention without dropout, but dropout = {dropout}",
                      "set dropout = 0 (long-context training rarely uses it), or use cp_kind = ulysses "
                      "or cp_kind = allgather, which run attention with dropout")


# ---- the pipeline -------------------------------------------------------------------


@rule("PAR0263")
def terapipe_slices(schedule, slices, seq_len, slice_lengths=None):
    """terapipe(slices = S) cuts every sequence into S equal token slices."""
    if schedule != "terapipe" or slice_lengths is not None or seq_len % slices == 0:
        return None
    fits = [n for n in range(2, min(seq_len, 16) + 1) if seq_len % n == 0]
    return _violation("PAR0263", ("parallel.schedule", "model.seq_len"),
                      f"schedule = terapipe(slices = {slices}) cuts each sequence into equal token slices, "
                      f"but seq_len = {seq_len} is not divisible by {slices}",
                      f"use slices = {', '.join(map(str, fits[:4])) or 'a divisor of seq_len'}")


@rule("PAR0265")
def terapipe_slice_lengths(schedule, slice_lengths, seq_len):
    """terapipe(slices = [n0, n1, ...]) cuts every sequence into slices of those token
    lengths (uneven, as the paper's; ``slices`` is their count); each is at least 1 (the
    key table's element)."""
    if schedule != "terapipe" or sum(slice_lengths) == seq_len:
        return None
    slices = list(slice_lengths)
    written = "[" + ", ".join(map(str, slices)) + "]"
    last = seq_len - sum(slices[:-1])
    fix = [*slices[:-1], last] if last >= 1 else None
    hint = (f"make the last slice {last} tokens: slices = [{', '.join(map(str, fix))}]" if fix else
            f"use lengths that add up to {seq_len}, or slices = S for S equal slices")
    return _violation("PAR0265", ("parallel.schedule", "model.seq_len"),
                      f"schedule = terapipe(slices = {written}) cuts each sequence into slices of these token "
                      f"lengths, but they sum to {sum(slices)}, not seq_len = {seq_len}", hint)


PIPELINE_UNITS = 65_536
"""Most forward/backward units (micro-batch · chunk · slice) one pipeline rank's schedule may
hold a step: ``parc build`` builds and simulates the whole schedule (the trainer builds it too),
a list per unit, so 2³¹ micro-batches would never finish. Real pipelines run hundreds."""


@rule("PAR0266")
def pipeline_units(global_batch, micro_batch, dp, pp, chunks=None, slices=None, schedule=None):
    if pp < 2 or global_batch % (micro_batch * dp):
        return None  # no pipeline, or PAR0208
    grad_accum = global_batch // (micro_batch * dp)
    per_slice = slices if schedule == "terapipe" and slices else 1
    chunks = 2 if schedule == "zero_bubble_v" else chunks  # the V's two chunks a rank (schedule.FIXED_CHUNKS)
    units = grad_accum * (chunks or 1) * per_slice
    if units <= PIPELINE_UNITS:
        return None
    sliced = per_slice > 1 and grad_accum * (chunks or 1) <= PIPELINE_UNITS
    return _violation("PAR0266", ("parallel.schedule",) if sliced else ("train.global_batch", "train.micro_batch"),
                      f"the pipeline schedule runs micro-batches · chunks · slices = {grad_accum}·{chunks or 1}·"
                      f"{per_slice} = {units:,} forward and backward units per rank a step, but parc builds "
                      f"schedules of at most {PIPELINE_UNITS:,}",
                      "use fewer slices" if sliced else
                      "raise micro_batch or dp (micro-batches = global_batch / (micro_batch·dp)), or lower global_batch")


TERAPIPE_UNBUILT = (
    ("sp", "sequence parallelism", lambda v: bool(v)),
    ("cp", "context parallelism", lambda v: v not in (None, 1)),
    ("experts", "a mixture of experts", lambda v: bool(v)),
    ("recompute", "activation recomputation", lambda v: any(e not in (None, "none") for e in entries(v))),
    ("overlap", "sub-batch overlap", lambda v: any(e not in (None, 1) for e in entries(v))),
    ("compress_pp", "compressed pipeline gradients", lambda v: v not in (None, "none")),
    ("zero", "ZeRO-3", lambda v: v == 3),
    ("layer_tp", "per-layer tp lists", lambda v: v is not None),
    ("layer_dp", "per-layer dp lists", lambda v: v is not None),
    ("tp_shape", "2D tensor parallelism", lambda v: tp_2d(v)),
)
"""What a TeraPipe slice does not meet yet (runtime/parallel/pipeline/terapipe.py): a slice's keys and values
are kept per stage in the model's attention, outside the sequence shards (sp, cp), the
experts' token routing, recomputed blocks, sub-batches, the pp codec, ZeRO-3's units and
the 2D layers' attention (runtime/parallel/tensor/layers2d.py)."""


@rule("PAR0264", BUILD)
def build_terapipe(schedule, pp=None, sp=None, cp=None, experts=None, recompute=None, overlap=None,
                   compress_pp=None, zero=None, layer_tp=None, layer_dp=None, tp_shape=None):
    if schedule != "terapipe" or pp == 1:
        return None
    values = {"sp": sp, "cp": cp, "experts": experts, "recompute": recompute, "overlap": overlap,
              "compress_pp": compress_pp, "zero": zero, "layer_tp": layer_tp, "layer_dp": layer_dp,
              "tp_shape": tp_shape}
    for name, words, unbuilt in TERAPIPE_UNBUILT:
        if unbuilt(values[name]):
            return _violation("PAR0264", (KEYS[name], "parallel.schedule"),
                              f"{words} with schedule = terapipe is not supported yet by parc build: "
                              "a slice's keys and values are kept whole in each stage's attention",
                              f"use schedule = 1f1b with {words}, or terapipe without it")
    return None


@rule("PAR0260")
def zero_bubble_v_stages(schedule, layers, pp, stage_layers=None):
    """ZB-V holds two chunks per rank (runtime/layout/placement.py, Note [placements]): the
    layers split evenly into 2·pp stages (``schedule.FIXED_CHUNKS``; not imported:
    builds ship constraints alone)."""
    if schedule != "zero_bubble_v" or pp < 2:
        return None
    if stage_layers is not None:
        return _violation("PAR0260", "parallel.stage_layers",
                          "stage_layers cannot be combined with schedule = zero_bubble_v",
                          "remove stage_layers: ZB-V splits the layers evenly into 2·pp stages, two a rank")
    if layers % (2 * pp) == 0:
        return None
    fits = [d // 2 for d in divisors(layers) if d % 2 == 0 and d // 2 >= 2]
    return _violation("PAR0260", ("parallel.schedule", "parallel.pp"),
                      f"schedule = zero_bubble_v splits layers = {layers} into 2·pp = {2 * pp} stages "
                      f"(two a rank, in a V), but {layers} / {2 * pp} = {layers / (2 * pp):g}",
                      f"pp must be one of {some(fits, pp)}" if fits
                      else f"layers = {layers} is odd: use schedule = zero_bubble")


@rule("PAR0261")
def chimera_pipelines(schedule, pp):
    """Chimera pairs pipeline rank r with p-1-r (runtime/layout/placement.py): p even."""
    if schedule != "chimera" or pp % 2 == 0:
        return None
    return _violation("PAR0261", ("parallel.schedule", "parallel.pp"),
                      f"schedule = chimera runs two pipelines that pair rank r with rank pp-1-r, "
                      f"so pp must be even, but pp = {pp}",
                      f"use pp = {pp + 1 if pp > 1 else 2}, or schedule = 1f1b")


@rule("PAR0262", BUILD)
def build_chimera_zero(schedule, zero):
    """Chimera's replica sum runs on whole gradients after backward: ZeRO-1 and 2 keep
    them whole until then (every chimera parameter is a late gradient, dp.py Note [late
    gradients]); ZeRO-3's units reduce-scatter each block's gradient during backward."""
    if schedule != "chimera" or zero != 3:
        return None
    return _violation("PAR0262", ("parallel.schedule", "parallel.zero"),
                      f"zero = {zero} with schedule = chimera is not supported yet by parc build: "
                      "ZeRO-3 reduce-scatters each block's gradient before the two replicas' sum",
                      "use zero = 1 or 2 with chimera, or schedule = 1f1b with zero = 3")


@rule("PAR0212")
def interleaved_needs_pipeline(chunks, pp):
    if chunks > 1 and pp < 2:
        return _violation("PAR0212", "parallel.schedule",
                          f"schedule = interleaved(chunks = {chunks}) needs pp ≥ 2, but pp = {pp}",
                          "use interleaving with a pipeline, or schedule = 1f1b")
    return None


@rule("PAR0206")
def stage_layers_fit(stage_layers, layers=None, pp=None, chunks=None):
    if chunks is not None and chunks > 1 and pp is not None and pp < 2:
        return None  # interleaved_needs_pipeline
    found = []
    if chunks is not None and chunks > 1:
        found.append(_violation("PAR0206", "parallel.stage_layers",
                                f"stage_layers cannot be combined with interleaved(chunks = {chunks})",
                                "remove stage_layers: interleaved stages split the layers evenly"))
    if pp is not None and len(stage_layers) != pp:
        found.append(_violation("PAR0206", "parallel.stage_layers",
                                f"stage_layers has {len(stage_layers)} entries, but pp = {pp}",
                                "give one entry per stage"))
    if layers is not None and sum(stage_layers) != layers:
        total = " + ".join(str(n) for n in stage_layers)
        found.append(_violation("PAR0206", "parallel.stage_layers",
                                f"stage_layers sum to {total} = {sum(stage_layers)}, but layers = {layers}",
                                "the stages together hold every layer once"))
    return tuple(found)


@rule("PAR0205")
def layers_split_evenly(layers, pp, chunks, stage_layers=None):
    if stage_layers is not None or (chunks > 1 and pp < 2):
        return None
    stages = pp * chunks
    if layers % stages == 0:
        return None
    formula = f"pp·chunks = {pp}·{chunks} = {stages}" if chunks > 1 else f"pp = {pp}"
    if chunks == 1:
        hint = f"pp must divide layers = {layers}: one of {some(divisors(layers), pp)}; or give stage_layers"
    else:
        fits = [d // chunks for d in divisors(layers) if d % chunks == 0 and d // chunks >= 2]
        hint = (f"with chunks = {chunks}, pp must be one of {some(fits, pp)}" if fits
                else f"chunks = {chunks} does not divide layers = {layers}")
    return _violation("PAR0205", "parallel.pp",
                      f"layers = {layers} cannot be split evenly into {formula} stages "
                      f"({layers} / {stages} = {layers / stages:g})", hint)


# ---- the batch ----------------------------------------------------------------------


@rule("PAR0208")
def batch_divides(global_batch, micro_batch, dp=None, pp=None, schedule=None):
    if dp is None:
        if global_batch % micro_batch:
            return _violation("PAR0208", ("train.global_batch", "train.micro_batch"),
                              f"global_batch = {global_batch} is not divisible by micro_batch = {micro_batch}",
                              "global_batch = micro_batch · grad_accum · dp")
        return None
    per_step = micro_batch * dp
    if global_batch % per_step:
        below = global_batch // per_step * per_step
        near = " or ".join(str(n) for n in (below, below + per_step) if n > 0)
        fits = divisors(global_batch // dp) if global_batch % dp == 0 else []
        # shown at the key a --set changed last (--set train.micro_batch=3: there), else at global_batch
        return _violation("PAR0208", ("train.global_batch", "train.micro_batch", "parallel.dp"),
                          f"global_batch = {global_batch} is not divisible by micro_batch·dp = "
                          f"{micro_batch}·{dp} = {per_step}",
                          f"global_batch = micro_batch · grad_accum · dp: try global_batch = {near}"
                          + (f", or micro_batch = {some(fits, micro_batch)}" if fits else ""),
                          blame_latest_set=True)
    grad_accum = global_batch // per_step
    if pp is None or pp < 2:
        return None
    formula = f"global_batch / (micro_batch·dp) = {global_batch} / ({micro_batch}·{dp}) = {grad_accum}"
    if grad_accum < pp:
        return _violation("PAR0207", ("parallel.pp", "train.global_batch"),
                          f"micro-batches per step = {formula} is fewer than pp = {pp} stages",
                          f"a pipeline needs at least {pp} micro-batches: raise global_batch to "
                          f"{pp * per_step} or lower micro_batch")
    if schedule == "interleaved" and grad_accum % pp:
        return _violation("PAR0212", "parallel.schedule",
                          f"interleaved needs micro-batches per step divisible by pp: {formula} is not a "
                          f"multiple of pp = {pp}",
                          f"make global_batch a multiple of micro_batch·dp·pp = {per_step * pp}")
    return None


# ---- sequence parallel and overlap ---------------------------------------------------------


@rule("PAR0209")
def sequence_parallel(sp, tp, seq_len=None, tp_shape=None):
    """sp splits the sequence over tp; on a 2D grid over a row's C ranks (Note [2D sequence
    parallelism] in layers2d.py), so there C must divide seq_len."""
    if sp is not True:
        return None
    if tp < 2:
        return _violation("PAR0209", "parallel.sp", f"sp = true needs tp > 1, but tp = {tp}",
                          "sequence parallelism splits along the tp axis: set tp ≥ 2, or sp = false")
    if seq_len is not None and tp_2d(tp_shape) and seq_len % tp_shape[1]:
        rows, cols = tp_shape
        return _violation("PAR0210", ("model.seq_len", "parallel.tp_shape"),
                          f"seq_len = {seq_len} is not divisible by C = {cols} (sp = true with tp_shape = "
                          f"({rows}, {cols}) splits the sequence over a row's C ranks)",
                          f"make seq_len a multiple of {cols}, or set sp = false")
    if seq_len is not None and not tp_2d(tp_shape) and seq_len % tp:
        return _violation("PAR0210", "model.seq_len",
                          f"seq_len = {seq_len} is not divisible by tp = {tp} (sp = true splits the sequence over tp)",
                          f"make seq_len a multiple of {tp}, or set sp = false")
    return None


@rule("PAR0211")
def sub_batches_divide(overlap, micro_batch):
    found = []
    for parts in dict.fromkeys(entries(overlap)):
        if parts is None or micro_batch % parts == 0:
            continue
        choices = [d for d in divisors(micro_batch) if d >= 2]
        hint = (f"sub_batches must divide micro_batch: one of {some(choices, parts)}" if choices
                else f"micro_batch = {micro_batch} cannot be split; use overlap = none or a larger micro_batch")
        found.append(_violation("PAR0211", ("parallel.overlap.sub_batches", "parallel.overlap"),
                                f"sub_batch({parts}) does not divide micro_batch = {micro_batch}", hint))
    return tuple(found)


@rule("PAR0215")
def overlap_needs_tp(overlap, tp, ep=None):
    """``overlap = sub_batch(K)`` splits tensor-parallel communication (or, with ep > 1, the
    expert all-to-alls): with tp = 1 and ep = 1 there is none."""
    parts = [k for k in entries(overlap) if k is not None and k > 1]
    if tp != 1 or (ep or 1) > 1 or not parts:
        return None
    return _violation(
        "PAR0215", "parallel.overlap", f"overlap = sub_batch({parts[0]}) has nothing to overlap: tp = 1",
        "overlap splits tensor-parallel communication; with tp = 1 there is none — remove it or raise tp",
    )


PER_LAYER = tuple(entry.name for entry in SETTINGS)
"""Settings that may be a list with one entry per layer (``layer_settings.SETTINGS``)."""


def _one_entry_per_layer(name: str) -> Callable:
    key = KEYS[name]

    def check(**values):
        value, layers = values[name], values["layers"]
        if isinstance(value, (tuple, list)) and len(value) != layers:
            return Violation(
                code="PAR0116", blame=(key,),
                message=f"`{key}` lists {len(value)} value{'s' if len(value) != 1 else ''} but the model has layers = {layers}",
                hint=f"give one value per layer ({layers}), or a single value for all of them",
            )
        return None

    check.__signature__ = inspect.Signature(
        [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY) for n in ("layers", name)]
    )
    return check


for _name in PER_LAYER:
    rule("PAR0116", name=f"{_name}_per_layer")(_one_entry_per_layer(_name))


# ---- mixture of experts (runtime/parallel/expert/moe.py) ---------------------------------------------


@rule("PAR0230")
def top_k_within_experts(experts, top_k):
    if experts == 0 or top_k <= experts:
        return None
    return _violation("PAR0230", ("model.top_k", "model.experts"),
                      f"top_k = {top_k} is more than experts = {experts}",
                      f"each token goes to top_k distinct experts: top_k must be at most {experts}")


@rule("PAR0234")
def moe_keys_need_experts(experts, moe_written):
    """A mixture-of-experts key (``top_k``, ``capacity_factor``, ...) written for a dense
    model does nothing: as ``ep`` on a dense model (PAR0231), it is refused."""
    if experts > 0:
        return ()
    return tuple(
        _violation("PAR0234", (f"model.{key}", "model.experts"),
                   f"{key} is a mixture-of-experts setting, but the model is dense (experts = 0): it does nothing",
                   f"remove {key}, or give the model routed experts (experts = N)")
        for key in moe_written
    )


@rule("PAR0231")
def ep_divides_experts(ep, experts):
    """Each expert-parallel rank holds experts / ep whole experts."""
    if ep == 1 or (experts > 0 and experts % ep == 0):
        return None
    if experts == 0:
        return _violation("PAR0231", ("parallel.ep", "model.experts"),
                          f"ep = {ep} splits the experts, but the model is dense (experts = 0)",
                          "set model.experts to a multiple of ep, or ep = 1")
    return _violation("PAR0231", ("parallel.ep", "model.experts"),
                      f"ep = {ep} does not divide experts = {experts}",
                      f"ep must be one of {some(divisors(experts), ep)}")


@rule("PAR0232")
def experts_fold_ranks(ep, etp, dp, tp, cp=None):
    """Parallel folding: expert layers re-read a stage's dp·cp·tp ranks as edp·ep·etp."""
    ranks = dp * (cp or 1) * tp
    if ranks % (ep * etp) == 0:
        return None
    return _violation("PAR0232", ("parallel.ep", "parallel.etp"),
                      f"expert layers fold dp·cp·tp = {dp}·{cp or 1}·{tp} = {ranks} ranks as edp·ep·etp, "
                      f"but ep·etp = {ep}·{etp} = {ep * etp} does not divide {ranks}",
                      f"ep·etp must be one of {some(divisors(ranks), ep * etp)}")


@rule("PAR0233")
def etp_divides_expert_ffn(etp, ffn, expert_ffn=None):
    size = ffn if expert_ffn is None else expert_ffn
    if size % etp == 0:
        return None
    return _violation("PAR0233", ("parallel.etp", "model.expert_ffn"),
                      f"etp = {etp} does not divide expert_ffn = {size}",
                      f"etp must be one of {some(divisors(size), etp)}")


# ---- training -----------------------------------------------------------------------


@rule("PAR0213")
def warmup_within_steps(warmup, steps):
    if warmup <= steps:
        return None
    return _violation("PAR0213", ("train.schedule.warmup", "train.schedule"),
                      f"warmup = {warmup} is more than steps = {steps}", f"warmup is counted in steps: at most {steps}")


TOKEN_IDS = {"uint16": 2**16, "uint32": 2**32}


@rule("PAR0214")
def vocab_fits_tokens(data, vocab, data_dtype=None):
    dtype = data_dtype or "uint16"
    if data != "tokens" or dtype != "uint16" or vocab <= TOKEN_IDS[dtype]:
        return None
    return _violation("PAR0214", ("train.data.dtype", "train.data"),
                      f"vocab = {vocab} does not fit the token file's dtype uint16 (at most 65536 ids)",
                      'write tokens("...", dtype = uint32)')


# ---- what parc build cannot generate yet ----------------------------------------------------


@dataclass(frozen=True, slots=True)
class Unbuildable:
    name: str
    """The value (a name of ``KEYS``) that asks for the feature."""
    asked: Callable[[object], bool]
    feature: str
    instead: str


UNBUILDABLE = (
    Unbuildable("optimizer", lambda name: name != "adamw", "", "use optimizer = adamw(...)"),
)
"""One entry per feature ``parc build`` cannot generate: the issue that builds it deletes
its entry (and adds its pass). Rule kind ``BUILD``: ``parc plan`` still predicts them."""


def _unbuildable(entry: Unbuildable) -> Callable:
    def check(**values):
        value = values[entry.name]
        if not entry.asked(value):
            return None
        feature = entry.feature or f"{entry.name} {value!r}"
        return Violation(code="PAR0802", blame=(KEYS[entry.name],),
                         message=f"{feature} is not supported yet by parc build",
                         hint=f"{entry.instead}; a later version of parc generates it")

    check.__signature__ = inspect.Signature([inspect.Parameter(entry.name, inspect.Parameter.KEYWORD_ONLY)])
    return check


for _entry in UNBUILDABLE:
    rule("PAR0802", BUILD, name=f"build_{_entry.name}")(_unbuildable(_entry))


@rule("PAR0241")
def zero_options_need_zero3(zero, zero_prefetch, zero_shard):
    """``zero_prefetch`` and ``zero_shard`` say how ZeRO-3 gathers and shards parameters."""
    if zero == 3 or (zero_prefetch == 1 and zero_shard == "dp"):
        return None
    key, value = ("zero_shard", zero_shard) if zero_shard != "dp" else ("zero_prefetch", zero_prefetch)
    return _violation("PAR0241", (f"parallel.{key}", "parallel.zero"),
                      f"{key} = {value} needs zero = 3 (sharded parameters), but zero = {zero}",
                      f"set zero = 3, or remove {key}")


@rule("PAR0243")
def zero_needs_data_ranks(zero, dp, cp=None, tp=None, layer_dp=None, ep=None, etp=None):
    """ZeRO shards over the data-parallel ranks (dp·cp; a per-layer dp list: its largest
    degree); expert-parallel parameters over their edp = dp·cp·tp / (ep·etp) ranks (Note
    [experts under ZeRO] in zero.py). With one such rank it shards nothing: as ``sp = true``
    with tp = 1 (PAR0209), a setting that does nothing is refused."""
    ranks = max(layer_dp or (dp,)) * (cp or 1)
    expert_ranks = ranks * (tp or 1) // ((ep or 1) * (etp or 1)) if (ep or 1) > 1 else ranks
    if zero == 0 or ranks > 1 or expert_ranks > 1:
        return None
    return _violation("PAR0243", ("parallel.zero", "parallel.dp"),
                      f"zero = {zero} shards over the data-parallel ranks, but dp·cp = {dp}·{cp or 1} = 1: "
                      "it does nothing",
                      "remove zero (or zero = 0), or use more data-parallel ranks (dp > 1)")


@rule("PAR0242")
def zero_shard_node(zero_shard, devices_per_node, tp, dp, cp=None):
    """HSDP shards over the dp (× cp) ranks of one node: s = devices_per_node / tp of them
    (all dp·cp when fewer); the groups must tile the dp·cp ranks."""
    if zero_shard != "node":
        return None
    group = dp * (cp or 1)
    per_node = devices_per_node // tp if devices_per_node % tp == 0 else 0
    if per_node and (per_node % group == 0 or group % per_node == 0):
        return None
    return _violation("PAR0242", ("parallel.zero_shard", "mesh.devices_per_node"),
                      f"zero_shard = node shards over the dp·cp ranks of one node, devices_per_node / tp = "
                      f"{devices_per_node} / {tp}, which must divide or be a multiple of dp·cp = {group}",
                      "use zero_shard = dp, or a devices_per_node that holds whole groups of dp ranks")


@rule("PAR0240", BUILD)
def build_zero3_overlap(zero, overlap):
    """ZeRO-3 gathers a block in its forward hooks; the sub-batch wavefront runs a block's
    regions one by one (``overlap.py``), past those hooks."""
    parts = [k for k in entries(overlap) if k is not None and k > 1]
    if zero != 3 or not parts:
        return None
    return _violation("PAR0240", ("parallel.overlap", "parallel.zero"),
                      f"zero = 3 with overlap = sub_batch({parts[0]}) is not supported yet by parc build: "
                      "the sub-batch wavefront runs each block's regions apart, past ZeRO-3's per-block gathers",
                      "use overlap = none with zero = 3, or zero = 2 with overlap")


@rule("PAR0826", BUILD)
def build_zero3_split_backward(zero, schedule):
    """A zero_bubble W op runs after the block's backward (B) has freed ZeRO-3's gathered
    parameters (``fsdp.py``, Note [when a unit is gathered]); W would need a third gather."""
    if zero != 3 or schedule not in ("zero_bubble", "zero_bubble_v"):  # schedule.SPLIT_BACKWARD (not imported)
        return None
    return _violation("PAR0826", ("parallel.schedule", "parallel.zero"),
                      f"zero = 3 with schedule = {schedule} is not supported yet by parc build: "
                      "the weight-gradient (W) ops run after the block's gathered parameters are freed",
                      "use schedule = 1f1b with zero = 3, or zero = 2 with zero_bubble")


@rule("PAR0820", BUILD)
def build_grad_reduce(grad_reduce, zero):
    """A bf16 gradient reduction is built for ZeRO 0 (runtime/parallel/data/dp.py's buckets); ZeRO 1/2/3
    reduce (and reduce-scatter) in fp32 only yet."""
    if grad_reduce != "bf16" or zero == 0:
        return None
    return _violation("PAR0820", ("train.grad_reduce", "parallel.zero"),
                      f"grad_reduce = bf16 with zero = {zero} (gradients reduced in bf16 into the "
                      "optimizer's shards) is not supported yet by parc build",
                      "use grad_reduce = fp32 (the default) with zero >= 1, or zero = 0 with grad_reduce = bf16")


@rule("PAR0813", BUILD)
def build_expert_parallel_zero(ep, zero, etp=1, zero_shard=None):
    """ZeRO 1/2 keep the experts in a flat buffer of their own over edp (zero.py, Note
    [experts under ZeRO]), ZeRO-3 in units of their own over edp (fsdp.py, Note [experts
    as units]); HSDP (``zero_shard = node``) would replicate those units over nodes, which
    is not built."""
    if ep * (etp or 1) == 1 or zero != 3 or zero_shard != "node":
        return None
    return _violation("PAR0813", ("parallel.zero_shard", "parallel.ep"),
                      f"zero_shard = node with expert parallelism (ep = {ep}, etp = {etp or 1}) "
                      "is not supported yet by parc build",
                      "write zero_shard = dp with ep > 1 (the experts' units shard over their edp ranks), or ep = 1")


def _drops(capacity_factor) -> bool:
    """Whether a capacity drops tokens: ``none`` (dropless, the default) is the word as
    written at check time and None in a built ``Spec``."""
    return capacity_factor not in (None, "none")


@rule("PAR0811", BUILD)
def build_moe_context_capacity(capacity_factor, cp=None):
    """A capacity keeps each expert's best tokens of the micro-batch; under cp a rank routes
    a chunk of each sequence, and the drop ranking over the whole micro-batch is not built
    (Note [MoE under context parallelism]: dropless routing is)."""
    if not _drops(capacity_factor) or (cp or 1) == 1:
        return None
    return _violation("PAR0811", ("model.capacity_factor", "parallel.cp"),
                      f"capacity_factor = {capacity_factor} with cp = {cp} is not supported yet by parc build",
                      "write capacity_factor = none (dropless) with cp > 1, or cp = 1")


@rule("PAR0830", BUILD)
def build_moe_sp_capacity(capacity_factor, sp):
    """A capacity keeps each expert's best tokens of the micro-batch; under sp a rank routes
    a sequence shard, and the drop ranking over the whole micro-batch is not built."""
    if not _drops(capacity_factor) or sp is not True:
        return None
    return _violation("PAR0830", ("model.capacity_factor", "parallel.sp"),
                      f"capacity_factor = {capacity_factor} with sp = true is not supported yet by parc build",
                      "write capacity_factor = none (dropless) with sp = true, or sp = false")


@rule("PAR0812", BUILD)
def build_moe_overlap(experts, overlap, ep=None):
    """Sub-batch overlap of a MoE model is the expert all-to-all's (ep > 1); the tensor-parallel
    walk of overlap.py has no MoE region."""
    parts = [k for k in entries(overlap) if k is not None and k > 1]
    if experts == 0 or not parts or (ep or 1) > 1:
        return None
    return _violation("PAR0812", ("parallel.overlap", "model.experts"),
                      f"overlap = sub_batch({parts[0]}) of a mixture-of-experts model without expert parallelism "
                      "is not supported yet by parc build",
                      "write overlap = none, or ep > 1 (the sub-batches then overlap the expert all-to-alls)")


@rule("PAR0270", BUILD)
def build_compress_zero(compress, zero):
    """PowerSGD and top-k replace the dp all-reduce of whole gradients (compress.py); under
    ZeRO 1/2 each rank then keeps its slice of the decompressed mean (zero.py, Note
    [compression under ZeRO]). ZeRO-3's gradients leave backward reduce-scattered, unit by
    unit, and have no compressed form yet."""
    if compress == "none" or zero != 3:
        return None
    return _violation("PAR0270", ("parallel.compress", "parallel.zero"),
                      f"compress = {compress} with zero = 3 is not supported yet by parc build: "
                      "ZeRO-3 reduce-scatters whole gradients into the shards as backward produces them",
                      f"use zero = 1 or 2 with compress = {compress}, or compress = none with zero = 3")


@rule("PAR0271")
def compress_pp_needs_pipeline(compress_pp, pp, compress_stages=None):
    """``compress_pp`` compresses what pipeline stages send back; ``compress_stages``
    names stages 1 .. pp-1 (stage 0 sends nothing back) and needs ``compress_pp``."""
    if compress_pp != "none" and pp == 1:
        return _violation("PAR0271", ("parallel.compress_pp", "parallel.pp"),
                          f"compress_pp = {compress_pp} compresses gradients sent between pipeline stages, "
                          "but pp = 1", "use pp >= 2, or remove compress_pp")
    if compress_stages is None:
        return None
    if compress_pp == "none":
        return _violation("PAR0271", ("parallel.compress_stages",),
                          "compress_stages says which stages send compressed gradients, but compress_pp = none",
                          "add compress_pp = lowrank(rank = 4), or remove compress_stages")
    wrong = [s for s in compress_stages if not 1 <= s < pp]
    if wrong:
        return _violation("PAR0271", ("parallel.compress_stages",),
                          f"compress_stages = {list(compress_stages)}: stage {wrong[0]} is not one of 1 .. pp-1 = "
                          f"{pp - 1} (stage 0 sends no gradient back)",
                          "list only stages among " + ", ".join(str(stage) for stage in range(1, pp)))
    return None


@rule("PAR0273", BUILD)
def build_compress_pp_interleaved(compress_pp, chunks):
    """The codec keys its state by virtual stage; ``compress_stages`` of an interleaved
    schedule (several chunks per rank) has no meaning defined yet."""
    if compress_pp == "none" or chunks == 1:
        return None
    return _violation("PAR0273", ("parallel.compress_pp", "parallel.schedule"),
                      f"compress_pp = {compress_pp} with an interleaved schedule (chunks = {chunks}) is not "
                      "supported yet by parc build",
                      "use schedule = 1f1b (or gpipe, zero_bubble) with compress_pp")


@rule("PAR0276", BUILD)
def build_compress_schedule(schedule, compress="none", compress_pp="none", pp=1):
    """Chimera sums its two stage replicas' gradients and ZB-V hands the V's turn over in
    memory: neither meets the compressed reductions or the codec's per-boundary state
    yet, and zero_bubble's split backward does not run the pp codec."""
    if pp == 1:
        return None
    if compress not in (None, "none") and schedule in ("chimera", "zero_bubble_v"):
        key, value = "compress", compress
    elif compress is None and schedule in ("chimera", "zero_bubble_v"):
        key, value = "compress", "auto"
    elif compress_pp != "none" and schedule in ("chimera", "zero_bubble_v", "zero_bubble"):
        key, value = "compress_pp", compress_pp
    else:
        return None
    return _violation("PAR0276", (f"parallel.{key}", "parallel.schedule"),
                      f"{key} = {value} with schedule = {schedule} is not supported yet by parc build",
                      f"use schedule = 1f1b (or gpipe) with {key}, or {key} = none")


@rule("PAR0274")
def tp_shape_product(tp_shape, tp):
    """2D tensor parallelism arranges the tp ranks as an R × C mesh: R·C = tp."""
    rows, cols = tp_shape
    if rows * cols == tp:
        return None
    return _violation("PAR0274", ("parallel.tp_shape", "parallel.tp"),
                      f"tp_shape = ({rows}, {cols}) arranges {rows}·{cols} = {rows * cols} ranks, but tp = {tp}",
                      f"write tp_shape = (1, {tp}), or a pair whose product is {tp}")


def tp_2d(tp_shape) -> bool:
    """``tp_shape = (R, C)`` with R > 1: the tp ranks as a 2D grid (Note [2D tensor
    parallelism] in layers2d.py); ``(1, tp)`` and no tp_shape are today's 1D."""
    return tp_shape is not None and tuple(tp_shape)[0] > 1


def _setting_text(name: str) -> Callable:
    entry = next(e for e in SETTINGS if e.name == name)
    return lambda value: spec_text(entry, value)


def _list_text(value) -> str:
    return "[" + ", ".join(str(v) for v in value) + "]"


_NOT_WITH_2D = (
    # (value name, is it on?, the spec key, what to write instead, the value as the spec writes it)
    ("cp", lambda v: v > 1, "parallel.cp", "cp = 1", str),
    ("experts", lambda v: v > 0, "model.experts", "a dense model", str),
    ("layer_tp", lambda v: v is not None, "parallel.tp", "one tp for every layer", _list_text),
    ("overlap", lambda v: any(k is not None and k > 1 for k in entries(v)), "parallel.overlap", "overlap = none",
     _setting_text("overlap")),
    ("compress", lambda v: v not in ("none", None), "parallel.compress", "compress = none", str),
    ("compress_pp", lambda v: v not in ("none", None), "parallel.compress_pp", "compress_pp = none", str),
)


@rule("PAR0277", BUILD)
def build_tp_2d_with(tp_shape, cp=None, experts=None, layer_tp=None, overlap=None,
                     compress=None, compress_pp=None):
    """2D tensor parallelism is built for dense models with dp, pp, sp (over a row: Note [2D
    sequence parallelism]), ZeRO 1/2/3, recompute and any precision; the features below shard
    or move the hidden state in ways the 2D layers do not meet yet (cp; expert dispatch;
    per-layer tp; sub-batch overlap; the compressed dp and pp paths)."""
    if not tp_2d(tp_shape):
        return None
    values = dict(cp=cp, experts=experts, layer_tp=layer_tp, overlap=overlap,
                  compress=compress, compress_pp=compress_pp)
    for name, on, key, instead, text in _NOT_WITH_2D:
        value = values[name]
        if value is not None and on(value):
            rows, cols = tp_shape  # the value as written: `overlap = sub_batch(2)`, `tp = [4, 4]`
            return _violation("PAR0277", (key, "parallel.tp_shape"),
                              f"tp_shape = ({rows}, {cols}) (2D tensor parallelism) with "
                              f"{key.split('.')[1]} = {text(value)} "
                              "is not supported yet by parc build",
                              f"use {instead} with tp_shape = ({rows}, {cols}), or tp_shape = (1, {rows * cols}) (1D)")
    return None


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


# ---- heterogeneous per-layer tp × dp (runtime/parallel/data/hetero.py) -------------------------------


def layer_degrees(values: dict) -> dict:
    """Note [heterogeneous layouts]: ``tp``/``dp`` written as lists become the coarse split
    (the largest tp, the fewest dp: the mesh's and the batch formula's) and the lists
    ``layer_tp``/``layer_dp``; a list holding ``auto`` is unknown. Changes ``values`` in place."""
    for name, pick in (("tp", max), ("dp", min)):
        value = values.get(name)
        if isinstance(value, (list, tuple)):
            known = None not in value and "auto" not in value
            values[f"layer_{name}"] = tuple(value) if known else None
            values[name] = pick(value) if known else None
        else:
            values[f"layer_{name}"] = None
    return values


@rule("PAR0250")
def hetero_lengths(layers, layer_tp=None, layer_dp=None):
    """A per-layer ``tp`` or ``dp`` lists one degree per transformer block."""
    for key, value in (("tp", layer_tp), ("dp", layer_dp)):
        if value is not None and len(value) != layers:
            return _violation("PAR0250", f"parallel.{key}",
                              f"`parallel.{key}` lists {len(value)} degree{'s' if len(value) != 1 else ''} "
                              f"but the model has layers = {layers}",
                              f"give one {key} per layer ({layers}), or one degree for all of them")
    return None


@rule("PAR0251")
def hetero_products(layers, tp, dp, layer_tp=None, layer_dp=None):
    """dp[i] · tp[i] is the same for every layer: each layer splits the same ranks."""
    if layer_tp is None and layer_dp is None:
        return None
    tps = layer_tp or (tp,) * layers
    dps = layer_dp or (dp,) * layers
    if len(tps) != layers or len(dps) != layers:
        return None  # PAR0250
    products = [d * t for d, t in zip(dps, tps)]
    if len(set(products)) == 1:
        return None
    i = next(i for i, p in enumerate(products) if p != products[0])
    given = "tp" if layer_tp is not None and layer_dp is None else "dp"
    ranks = products[0]
    hint = ("give `dp` one value per layer too, dp[i] = " + f"{ranks} / tp[i]: "
            + "[" + ", ".join(str(ranks // t) if ranks % t == 0 else "?" for t in tps) + "]"
            if layer_dp is None else "each layer splits its stage's ranks: make dp[i]·tp[i] the same for all")
    return _violation("PAR0251", (f"parallel.{given}", "parallel.tp"),
                      f"every layer must split the same ranks: dp[0]·tp[0] = {dps[0]}·{tps[0]} = {products[0]} "
                      f"but dp[{i}]·tp[{i}] = {dps[i]}·{tps[i]} = {products[i]}", hint)


@rule("PAR0252")
def hetero_degrees_divide(layer_tp):
    """Neighbouring degrees divide one another: a change of degree splits or gathers the batch."""
    degrees = sorted(set(layer_tp))  # each pair once: a 96-layer list has few degrees
    for t in degrees:
        for u in degrees:
            if max(t, u) % min(t, u):
                return _violation("PAR0252", "parallel.tp",
                                  f"tp degrees {t} and {u} in one stage do not divide one another",
                                  "use degrees that divide each other (powers of two): the batch moves "
                                  "between layers by splits and gathers")
    return None


@rule("PAR0253")
def hetero_micro_batch(layer_tp, tp, micro_batch):
    """A layer at tp / k splits each coarse micro-batch into k pieces along the batch."""
    k = tp // min(layer_tp)
    if micro_batch % k == 0:
        return None
    return _violation("PAR0253", ("train.micro_batch", "parallel.tp"),
                      f"micro_batch = {micro_batch} does not split into tp / min(tp) = {tp} / {min(layer_tp)} = {k} "
                      "pieces (a layer with fewer tp ranks has more dp ranks, each with a piece of the micro-batch)",
                      f"make micro_batch a multiple of {k}")


def _hetero_unbuilt(layer_tp, layer_dp, pp, cp, zero, experts, auto, schedule, zero_shard=None):
    reason = None
    if auto:
        reason = (f"parallel.{auto[0]}" if auto[0] != "micro_batch" else "train.micro_batch", f"{auto[0]} = auto",
                  f"give {auto[0]} a value (with tp and dp lists written the planner fills only zero and "
                  "recompute; write tp = auto and dp = auto for it to search per-layer degrees)")
    elif pp is not None and pp > 1 and schedule not in (None, "1f1b", "gpipe"):
        reason = ("parallel.schedule", f"pp = {pp} and schedule = {schedule}", "use schedule = 1f1b or gpipe")
    elif cp is not None and cp > 1:
        reason = ("parallel.cp", f"cp = {cp}", "set cp = 1")
    elif zero == 3 and zero_shard == "node":  # ZeRO-1/2: hetero.ShardedAdamW; 3: fsdp over each layer's dp
        reason = ("parallel.zero_shard", "zero = 3 and zero_shard = node",
                  "use zero_shard = dp (each layer's units shard over its own dp group)")
    elif experts:
        reason = ("model.experts", "experts (MoE)", "use a dense model (experts = 0)")
    if reason is None:
        return None
    key, what, hint = reason
    return _violation("PAR0254", (key, "parallel.tp"),
                      f"per-layer tp/dp with {what} is not supported yet by parc build",
                      f"{hint}, or give tp and dp one value for all layers")


@rule("PAR0256")
def hetero_overlap_needs_tp(layer_tp, overlap):
    """Sub-batches hide a layer's tensor-parallel collectives (overlap.py): under per-layer tp one
    ``overlap`` value applies to the layers at tp > 1 (those at tp 1 run unsplit), and a list
    that gives ``sub_batch(k)`` to a layer at tp 1 asks for what cannot be (as PAR0215)."""
    if not isinstance(overlap, (tuple, list)) or len(overlap) != len(layer_tp):
        return None  # one value, or the list's length is PAR0250's kind of error
    for i, (k, t) in enumerate(zip(overlap, layer_tp)):
        if k is not None and k > 1 and t == 1:
            return _violation("PAR0256", ("parallel.overlap", "parallel.tp"),
                              f"overlap[{i}] = sub_batch({k}) but layer {i} runs at tp[{i}] = 1: it has no "
                              "tensor-parallel communication to overlap",
                              f"write none for overlap[{i}] (one overlap value for all layers applies only to "
                              "the layers at tp > 1)")
    return None


@rule("PAR0257")
def hetero_sub_batches_divide(layer_tp, tp, micro_batch, overlap):
    """A layer at tp t < tp holds micro_batch · t / tp sequences (Note [heterogeneous layouts]):
    its sub-batches split that piece, not the coarse micro-batch."""
    if isinstance(overlap, (tuple, list)) and len(overlap) != len(layer_tp):
        return None
    for i, (k, t) in enumerate(zip(per_layer(overlap, len(layer_tp)), layer_tp)):
        if k is None or k < 2 or t < 2 or t >= tp or micro_batch % (tp // t):
            continue  # unsplit; at the coarse degree PAR0211; an uneven piece PAR0253
        piece = micro_batch * t // tp
        if piece % k:
            choices = [d for d in divisors(piece) if d >= 2]
            return _violation("PAR0257", ("parallel.overlap", "train.micro_batch"),
                              f"sub_batch({k}) does not divide layer {i}'s piece of the micro-batch: at tp[{i}] = "
                              f"{t} of tp = {tp} it holds micro_batch · {t} / {tp} = {piece} sequences",
                              (f"use sub_batch({choices[-1]}) there, or " if choices else "")
                              + f"a micro_batch that is a multiple of {k * tp // t}")
    return None


@rule("PAR0254", BUILD)
def hetero_unbuilt(layer_tp, layer_dp=None, pp=None, cp=None, zero=None, experts=None, overlap=None, sp=None,
                   micro_batch=None, schedule=None, compress="none", compress_pp="none", zero_shard=None):
    """What a heterogeneous layout cannot be combined with yet (Note [heterogeneous layouts]),
    ``auto`` values included: the planner would fill them for the coarse split alone."""
    # None: auto (these have a default or are required; an unwritten zero or recompute is None too)
    values = dict(pp=pp, sp=sp, micro_batch=micro_batch, overlap=overlap)
    auto = [name for name, value in values.items() if value is None or None in entries(value)]
    reason = _hetero_unbuilt(layer_tp, layer_dp, pp, cp, zero, experts, auto, schedule, zero_shard)
    if reason is None and (compress != "none" or compress_pp != "none"):  # None: compress = auto
        key = "compress" if compress != "none" else "compress_pp"
        value = {"compress": compress, "compress_pp": compress_pp}[key] or "auto"
        reason = _violation("PAR0254", (f"parallel.{key}", "parallel.tp"),
                            f"per-layer tp/dp with {key} = {value} is not supported yet by parc build",
                            f"set {key} = none, or give tp and dp one value for all layers")
    return reason


@rule("PAR0255", BUILD)
def hetero_stage_boundaries(layer_tp, layers, pp, stage_layers=None, tie_embeddings=None):
    """Under a pipeline, activations cross every stage boundary at one degree (the executor's
    one activation shape), and a tied head shares the embedding's sharding."""
    if pp == 1:
        return None
    sizes = stage_layers or ((layers // pp,) * pp if layers % pp == 0 else None)
    if sizes is None or len(sizes) != pp or sum(sizes) != layers or len(layer_tp) != layers:
        return None  # PAR0205 / PAR0206 / PAR0250
    starts = [sum(sizes[:i]) for i in range(1, pp)]
    crossing = {(layer_tp[s - 1], layer_tp[s]) for s in starts}
    if len(crossing) == 1 and len(set(next(iter(crossing)))) == 1:
        if tie_embeddings is False or layer_tp[0] == layer_tp[-1]:
            return None
        return _violation("PAR0255", ("parallel.tp", "parallel.pp"),
                          f"with tied embeddings over a pipeline the first and last layers share the table's "
                          f"sharding, but tp[0] = {layer_tp[0]} and tp[{layers - 1}] = {layer_tp[-1]}",
                          "give the first and last layer the same tp")
    pairs = ", ".join(f"tp[{s - 1}] = {layer_tp[s - 1]} → tp[{s}] = {layer_tp[s]}" for s in starts)
    return _violation("PAR0255", ("parallel.tp", "parallel.pp"),
                      f"per-layer tp across pipeline stages is built only where every stage boundary has one "
                      f"degree on both sides: {pairs}",
                      "give the layers on both sides of each boundary the same tp (one for all boundaries)")


def master_weights(precision: str, *, per_layer_tp: bool, compressed: bool) -> bool:
    """Whether ``train.precision`` bf16/fp16 holds the parameters in that dtype with fp32
    master weights in the optimizer (runtime/optimizers/master.py, Note [master weights]). Per-layer
    tp/dp layouts and compressed gradients (dp or pipeline) keep fp32 parameters and
    autocast the forward over them: their gradient code has no low-precision weights
    yet. The renderer and the planner's memory model both ask here."""
    return precision in ("bf16", "fp16") and not per_layer_tp and not compressed
