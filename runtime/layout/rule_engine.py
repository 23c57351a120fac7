"""The rules' engine: the value names rules read (``KEYS``), ``Violation``, the ``@rule``
registry and ``violations``/``legal``/``holds``/``smallest``, and the small helpers rules and
the trainer share (``per_layer``, ``entries``, ``divisors``). Torch-free, standard library and
``axes.py``/``layer_settings.py`` only: the trainer imports it (``model_desc``'s own checks,
``model.py``'s per-layer values) without the rules of ``constraints/``, which a build does not
ship. Note [a rule is an entry] is in ``constraints/__init__.py``.
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass, replace
from typing import Callable, Iterable, Mapping



LAYOUT, BUILD = "layout", "build"
"""Rule kinds: what any program must satisfy; what ``parc build`` can generate today."""



KEYS = {
    "name": "model.name",
    "layers": "model.layers",
    "hidden": "model.hidden",
    "heads": "model.heads",
    "kv_heads": "model.kv_heads",
    "head_dim": "model.head_dim",
    "arch": "model.arch",
    "qk_norm": "model.qk_norm",
    "attention_bias": "model.attention_bias",
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
    "first_dense_layers": "model.first_dense_layers",
    "ep": "parallel.ep",
    "dropout": "model.dropout",
    "tie_embeddings": "model.tie_embeddings",
    "documents": "model.documents",
    "nodes": "mesh.nodes",
    "devices_per_node": "mesh.devices_per_node",
    "dp": "parallel.dp",
    "tp": "parallel.tp",
    "layer_dp": "parallel.dp",
    "layer_tp": "parallel.tp",
    "pp": "parallel.pp",
    "cp": "parallel.cp",
    "sp": "parallel.sp",
    "zero": "parallel.zero",
    "schedule": "parallel.schedule",
    "chunks": "parallel.schedule",
    "slices": "parallel.schedule",
    "slice_lengths": "parallel.schedule",
    "recompute": "parallel.recompute",
    "overlap": "parallel.overlap",
    "stage_layers": "parallel.stage_layers",
    "compress": "parallel.compress",
    "global_batch": "train.global_batch",
    "micro_batch": "train.micro_batch",
    "steps": "train.steps",
    "warmup": "train.schedule.warmup",
    "decay": "train.schedule.decay",
    "precision": "train.precision",
    "grad_reduce": "train.grad_reduce",
    "optimizer": "train.optimizer",
    "data": "train.data",
    "data_dtype": "train.data.dtype",
    "data_files": "train.data",
    "data_weights": "train.data",
    "data_val_files": "train.data",
}
"""Each plain value's name and the spec key it comes from (``schedule``: ``1f1b``,
``gpipe`` or ``interleaved``; ``chunks``: 1 unless interleaved; ``tp``/``dp`` of a
heterogeneous layout: the stage's coarse split (the largest tp, the fewest dp), the lists
themselves ``layer_tp``/``layer_dp`` (``layer_degrees``; None when one value is given); the per-layer settings
as ``layer_settings`` reads them (``overlap``: the sub-batches, 1 for ``none``); ``moe_written``: the
mixture-of-experts keys other than ``experts`` the spec writes (``top_k``, ...; PAR0234); ``data``: ``synthetic`` or ``tokens``; ``data_files``, ``data_weights``, ``data_val_files``: how many token files, weights and validation files ``tokens(...)`` names (None: not written); ``optimizer``: its name; ``compress``: the call's name). A feature's own values are
declared by its rules module (``declare``, Note [a feature declares its values])."""


def declare(**names: str) -> None:
    """Add value names a feature's rules read, each with the spec key it comes from.

    Note [a feature declares its values]: ``KEYS`` above names the model's, the mesh's and
    the training's values; a parallel feature's own values (its kind, its options) are
    declared at the top of its ``constraints/rules_<concern>.py`` (``declare(name="parallel.key")``),
    next to the rules that read them. ``constraints/`` imports every rules module, so its
    ``KEYS`` is whole; a rule's names are checked against it when the rules are first
    selected (``_selected``), after every module has declared its own."""
    clash = {name for name, key in names.items() if KEYS.get(name, key) != key}
    if clash:
        raise ValueError(f"constraints: {sorted(clash)} already name other spec keys")
    KEYS.update(names)



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
        if not needs:
            raise ValueError(f"constraints: rule {check.__name__} reads nothing")
        RULES.append(Rule(name=name or check.__name__, code=code, kind=kind, check=check,
                          needs=needs, optional=optional))
        _SELECTED.clear()  # a selection made before this module's rules registered would miss them
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
        for entry in found:  # Note [a feature declares its values]: every module has declared by now
            unknown = [n for n in entry.needs + entry.optional if n not in KEYS]
            if unknown:
                raise ValueError(f"constraints: rule {entry.name} reads {unknown}, not in KEYS")
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
