"""The layout's options, declared once: the fields the spec's layout and the planner's share.

Takes: nothing. Gives: ``LayoutOptions`` (the options and degrees ``ParallelSpec`` and the
planner's ``Layout`` both hold), ``SpecOptions`` (those only the spec holds) and ``in_plan``
(the options the build's ``Plan`` cites, by the part of the Plan that holds them). Before:
nothing. After: ``dsl/spec.py`` (``ParallelSpec`` inherits ``SpecOptions``),
``codegen/planner/cost/layout.py`` (``Layout`` inherits ``LayoutOptions``) and
``codegen/plan.py`` (``with_options`` adds each cited field to its Plan part).

Note [one record of the options]: an option of the layout beyond its degrees (how attention
sees the sequence under cp, the experts' tensor split, the tp grid, ...) used to be written
as a field of ``ParallelSpec``, of the planner's ``Layout`` and of the ``Plan``, each with its
own default and docs. Its field, default and one-line doc live here; ``ParallelSpec`` and
``Layout`` inherit them (``spec.parallel.<name>`` and ``layout.<name>`` read as before), and
a field whose value train.py writes as a cited constant says where in the Plan it goes
(``cited_in``): ``codegen/plan.py``'s ``with_options`` adds it there, filled by ``from_spec``.
The key itself (name, doc, choices, the default as the docs show it) stays in the key table
``dsl/keys/parallel.py`` (Note [a key is its field]: the field has the key's name). A new
option is a field here (and in ``SpecOptions`` when the planner does not search it), its key,
and its owners (docs/DESIGN.md, "Adding a layout option").
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields


def cited_in(part: str, name: str, *, when=None, note: str = "") -> dict:
    """A field's metadata: its value is the Plan's cited field ``name`` of part ``part``
    (``mesh``, ``model``, ``train``); ``when(spec)``: the layouts that have it (None: every
    layout, and the Plan field is required)."""
    return {"plan": (part, name, when, note)}


def in_plan(part: str) -> tuple[tuple[str, str, object, str], ...]:
    """(Plan field, spec field, when, note) of each option the Plan's ``part`` cites, in
    field order."""
    return tuple((name, f.name, when, note) for f in fields(SpecOptions)
                 for where, name, when, note in [f.metadata.get("plan", ("", "", None, ""))] if where == part)


@dataclass(frozen=True, slots=True, kw_only=True)
class LayoutOptions:
    """The degrees the options qualify and the options, as a spec's layout and the planner's
    ``Layout`` both hold them (None, a spec's only: ``auto``). ``tp`` is each subclass's own
    (required in both); the properties read a complete layout."""

    cp: int | None = 1
    """Context-parallel ranks: each holds seq_len / cp tokens of every sequence (None: auto)."""
    cp_kind: str = field(default="ring", metadata=cited_in("mesh", "cp_kind"))
    """How attention sees the whole sequence: ``ring``, ``ulysses`` or ``allgather``
    (runtime/parallel/context/context.py; ``cost/context.py``). CP_KIND: train.py names it
    only when cp > 1."""
    ep: int | None = 1
    """Expert-parallel ranks (MoE layers fold dp·cp·tp as edp·ep·etp; None: auto)."""
    etp: int | None = field(default=1, metadata=cited_in(
        "model", "expert_tensor_parallel", when=lambda spec: spec.model.experts and spec.parallel.etp > 1,
        note="expert-tensor-parallel ranks"))
    """Expert tensor-parallel ranks: each holds 1 / etp of each of its experts' ffn (Note
    [expert tensor parallelism]). ETP: the Plan has it when the model has experts and
    etp > 1 (plan.json leaves it out otherwise)."""
    tp_shape: tuple[int, int] | None = field(default=None, metadata=cited_in(
        "mesh", "tp_shape", when=lambda spec: spec.parallel.tp_shape is not None and spec.parallel.tp_shape[0] > 1))
    """The tp ranks as an R × C grid (Note [2D tensor parallelism], runtime/parallel/tensor/layers2d.py,
    ``cost/tp2d.py``); None: 1D, ``(1, tp)``, or in a spec the planner's when
    ``tp_shape_auto``. TP_SHAPE: the Plan has it for a 2D grid only."""
    slices: int = 1
    """Token slices per sequence under a sliced schedule (``schedule.SLICED``); 1 otherwise."""

    @property
    def tp_grid(self) -> tuple[int, int]:
        """(R, C): the grid's rows and columns; ``(1, tp)`` for 1D."""
        return tuple(self.tp_shape) if self.tp_shape is not None else (1, self.tp)

    @property
    def grid(self) -> tuple[int, int] | None:
        """(R, C) when the tp ranks form a 2D grid (R > 1), else None: what the model
        description's shard and activation counts take (``model_desc``, saved_elements.py)."""
        return tuple(self.tp_shape) if self.tp_shape is not None and self.tp_shape[0] > 1 else None

    @property
    def expert_folds(self) -> int:
        """ep·etp: the ranks among which a MoE block's expert weights are split."""
        return self.ep * self.etp

    @property
    def expert_split(self) -> dict:
        """The experts' split as the model description's counts take it (``ep``, ``etp``)."""
        return {"ep": self.ep, "etp": self.etp}


@dataclass(frozen=True, slots=True, kw_only=True)
class SpecOptions(LayoutOptions):
    """The options only a spec's layout holds (the planner does not search them)."""

    tp_shape_auto: bool = False
    """``tp_shape = auto``: the planner picks the grid (Note [2D tensor parallelism])."""
    zero_shard: str = field(default="dp", metadata=cited_in(
        "train", "zero_shard", when=lambda spec: spec.parallel.zero == 3))
    """ZeRO-3: ``dp`` (shard over every dp rank) or ``node`` (within a node; HSDP).
    ZERO_SHARD: the Plan has it under zero = 3 only."""
    slice_lengths: tuple[int, ...] | None = None
    """Tokens of each slice when written as a list (uneven slices; ``slices`` is then their
    count); None: ``slices`` equal parts."""
    compress_pp: str = "none"
    """Pipeline backward-gradient compression: ``none`` or ``lowrank`` (runtime/parallel/pipeline/compress_pp.py)."""
    compress_pp_rank: int = 4
    """``lowrank(rank = r)``."""
    compress_pp_lazy_error: bool = False
    """``lowrank(lazy_error = true)``: Optimus-CC's lazy error propagation."""

    @property
    def by_node(self) -> bool:
        """ZeRO-3 shards within a node and replicates across nodes (HSDP)."""
        return self.zero_shard == "node"

    @property
    def options_set(self) -> bool:
        """True when no option here is left to the planner."""
        return self.etp is not None and not self.tp_shape_auto
