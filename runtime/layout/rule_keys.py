"""The planner's side of the rules' engine (``rule_engine.py``): the value names rules read
(``KEYS``, ``declare``), and ``legal``/``rules_of``/``holds``/``smallest``, which search
layouts. ``constraints/`` imports it (and checks every rule's names against ``KEYS`` once
every rules module has declared its own: ``check_declared``); a build does not ship it.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping

from .rule_engine import _SELECTED, DERIVED, LAYOUT, Rule, _results, _run, _selected


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
    ``KEYS`` is whole; its rules' names are checked against it once every module has
    declared its own (``check_declared``, at the end of ``constraints/__init__.py``)."""
    clash = {name for name, key in names.items() if KEYS.get(name, key) != key}
    if clash:
        raise ValueError(f"constraints: {sorted(clash)} already name other spec keys")
    KEYS.update(names)


@dataclass(frozen=True, slots=True, kw_only=True)
class Derived:
    name: str
    check: Callable
    """The formula: ``(**values) -> value`` (named as a rule's check: ``rule_engine._run`` runs both)."""
    needs: tuple[str, ...]
    optional: tuple[str, ...]
    written: str
    """How a message names it (its formula as the spec writes it); ``name`` when not given."""


def derive(written: str = "") -> Callable:
    """Register ``compute(**values)`` as the value of its name (Note [a derived value]).

    Note [a derived value]: a rule that needs another feature's fact (the vocab's padded
    size, whether tp is a 2D grid, how many ways the experts fold the ranks, why a per-layer
    layout is not built with ZeRO's node sharding) reads it by a name that feature's rules
    module derives once, next to its other rules, rather than reading the feature's options
    and repeating the formula or the refusal. ``compute``'s parameters are the values it
    reads, as a rule's are: without a default required (unknown: the derived value is unknown
    too), with ``= None`` optional. Its name is in ``rule_engine.DERIVED``, not in ``KEYS``
    (no spec key holds it: a rule blames the keys it comes from); ``written`` is how a
    message names it. The engine computes it for each rule that reads it (``_run``) and counts
    its inputs among what that rule reads (``reads``: the search's ``touching``, the
    planner's verdict cache)."""

    def register(compute: Callable) -> Callable:
        params = inspect.signature(compute).parameters.values()
        DERIVED[compute.__name__] = Derived(
            name=compute.__name__, check=compute, written=written or compute.__name__,
            needs=tuple(p.name for p in params if p.default is inspect.Parameter.empty),
            optional=tuple(p.name for p in params if p.default is not inspect.Parameter.empty))
        _SELECTED.clear()  # a selection made before would miss the rules reading its inputs
        return compute

    return register


@derive()
def padded_vocab(vocab, pad_vocab_to):
    """The vocab rounded up to a multiple of pad_vocab_to (the embedding's rows; also a name of
    ``KEYS``, the key its message blames)."""
    return -(-vocab // pad_vocab_to) * pad_vocab_to


def check_declared(rules: Iterable[Rule]) -> None:
    """Every name ``rules`` read is in ``KEYS`` or derived (Note [a feature declares its values]:
    run by ``constraints/`` once every rules module has declared its own; Note [a derived value])."""
    for entry in rules:
        unknown = [n for n in entry.needs + entry.optional if n not in KEYS and n not in DERIVED]
        if unknown:
            raise ValueError(f"constraints: rule {entry.name} reads {unknown}, not in KEYS")


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


def smallest(values: Mapping[str, object], candidates: Iterable[Mapping[str, object]]):
    """The first of ``candidates`` (each a few values to put in place) that leaves every
    rule reading them satisfied, given the rest of ``values``; None when none does.
    ``parc verify`` shrinks a model with it: the rules decide what a smaller value may be."""
    for candidate in candidates:
        if legal({**values, **candidate}, touching=tuple(candidate)):
            return dict(candidate)
    return None
