"""The layout's options, declared once: each field with its key, shared by the spec and the planner.

Takes: nothing. Gives: ``LayoutOptions`` (the options and degrees ``ParallelSpec`` and the
planner's ``Layout`` both hold), ``SpecOptions`` (those only the spec holds), ``with_keys``
(the parallel block's key table with each option's key in its place) and ``in_plan`` (the
options the build's ``Plan`` cites, by the part of the Plan that holds them). Before:
nothing. After: ``dsl/keys/parallel.py`` (the table), ``dsl/spec.py`` (``ParallelSpec``
inherits ``SpecOptions``), ``codegen/planner/cost/layout.py`` (``Layout`` inherits
``LayoutOptions``) and ``codegen/plan.py`` (``with_options`` adds each cited field to its
Plan part).

Note [one record of the options]: an option of the layout beyond the per-layer settings
(how attention sees the sequence under cp, the experts' tensor split, the tp grid, ...) used
to be written as a key, a field of ``ParallelSpec``, of the planner's ``Layout`` and of the
``Plan``, each with its own default and docs. Its field, default, one-line doc and key (its
``Param``: name, doc, choices, the default as the docs show it) live here, one ``option``
each; ``ParallelSpec`` and ``Layout`` inherit the fields (``spec.parallel.<name>`` and
``layout.<name>`` read as before), the key table places the key after the key ``after``
names (the table's order is what docs/language.md, the schema and the key lists of
messages show), and a field whose value train.py writes as a cited constant says where in
the Plan it goes (``cited_in``): ``codegen/plan.py``'s ``with_options`` adds it there,
filled by ``from_spec``. A call argument (``slices``, ``compress_pp_rank``) is the field its
call's ``Param.field`` names (Note [a key is its field]). A new option is an ``option``
here (in ``SpecOptions`` when the planner does not search it) and its owners
(docs/DESIGN.md, "Adding a layout option").
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from .types import CallDef, Param, _int


def cited_in(part: str, name: str, *, when=None, note: str = "") -> dict:
    """A field's metadata: its value is the Plan's cited field ``name`` of part ``part``
    (``mesh``, ``model``, ``train``); ``when(spec)``: the layouts that have it (None: every
    layout, and the Plan field is required)."""
    return {"plan": (part, name, when, note)}


def option(default, *, key: Param, after: str, plan: dict | None = None):
    """A field that is the ``parallel`` key ``key`` (the key's name is the field's), placed
    after the key ``after`` in the table; ``plan``: ``cited_in``'s metadata, if the Plan cites it."""
    return field(default=default, metadata={"key": (key, after)} | (plan or {}))


def with_keys(keys: tuple[Param, ...]) -> tuple[Param, ...]:
    """``keys`` with each option's key after the one its ``after`` names, in field order."""
    table = list(keys)
    for f in fields(SpecOptions):
        if "key" in f.metadata:
            key, after = f.metadata["key"]
            table.insert(next(i for i, k in enumerate(table) if k.name == after) + 1, key)
    return tuple(table)


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

    cp: int | None = option(1, after="pp", key=_int(
        "cp",
        "context-parallel degree: ranks that split each sequence (seq_len / cp tokens each); "
        "auto lets the planner choose it (parallel = auto leaves it 1)",
        default="1",
        auto=True,
        whole_auto=False,
    ))
    """Context-parallel ranks: each holds seq_len / cp tokens of every sequence (None: auto)."""
    ep: int | None = option(1, after="cp", key=_int(
        "ep", "expert-parallel degree: ranks that split each MoE layer's experts; auto lets the "
        "planner choose it (parallel = auto leaves it 1)", default="1", auto=True, whole_auto=False))
    """Expert-parallel ranks (MoE layers fold dp·cp·tp as edp·ep·etp; None: auto)."""
    etp: int | None = option(1, after="ep", key=_int(
        "etp", "expert tensor-parallel degree: ranks that split each expert's ffn; auto lets the "
        "planner choose it among the divisors of tp (parallel = auto leaves it 1)", default="1", auto=True,
        whole_auto=False), plan=cited_in(
        "model", "expert_tensor_parallel", when=lambda spec: spec.model.experts and spec.parallel.etp > 1,
        note="expert-tensor-parallel ranks"))
    """Expert tensor-parallel ranks: each holds 1 / etp of each of its experts' ffn (Note
    [expert tensor parallelism]). ETP: the Plan has it when the model has experts and
    etp > 1 (plan.json leaves it out otherwise)."""
    cp_kind: str = option("ring", after="etp", key=Param(
        name="cp_kind",
        type="enum",
        choices=("ring", "ulysses", "allgather"),
        default="ring",
        doc="how attention sees the whole sequence under cp > 1: ring (K/V blocks passed "
        "around the cp group, load-balanced chunks), ulysses (all-to-all to head shards) or "
        "allgather (gather K/V)",
    ), plan=cited_in("mesh", "cp_kind"))
    """How attention sees the whole sequence: ``ring``, ``ulysses`` or ``allgather``
    (runtime/parallel/context/context.py; ``cost/context.py``). CP_KIND: train.py names it
    only when cp > 1."""
    tp_shape: tuple[int, int] | None = option(None, after="stage_layers", key=Param(
        name="tp_shape",
        type="int_pair",
        default="(1, tp)",
        auto=True,
        whole_auto=False,
        auto_field="tp_shape_auto",
        one_rank="(1, 1)",
        doc="2D tensor parallelism: the tp ranks as an R × C grid (R·C = tp), weights split over "
        "both sides; (1, tp) is 1D; auto lets the planner choose (parallel = auto leaves it 1D)",
    ), plan=cited_in(
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
    zero_shard: str = option("dp", after="zero_prefetch", key=Param(
        name="zero_shard",
        type="enum",
        choices=("dp", "node"),
        default="dp",
        doc="zero = 3: shard parameters over every dp rank (dp), or over the dp ranks of "
        "one node and replicate across nodes (node: hybrid sharding, HSDP)",
    ), plan=cited_in("train", "zero_shard", when=lambda spec: spec.parallel.zero == 3))
    """ZeRO-3: ``dp`` (shard over every dp rank) or ``node`` (within a node; HSDP).
    ZERO_SHARD: the Plan has it under zero = 3 only."""
    slice_lengths: tuple[int, ...] | None = None
    """Tokens of each slice when written as a list (uneven slices; ``slices`` is then their
    count); None: ``slices`` equal parts."""
    compress_pp: str = option("none", after="error_feedback", key=Param(
        name="compress_pp",
        type="call",
        default="none",
        lossy=True,
        doc="compress the gradients pipeline stages send back (changes numerics)",
        calls=(
            CallDef(name="none", doc="send them whole"),
            CallDef(
                name="lowrank",
                doc="Optimus-CC's compressed backpropagation: each as a rank-`rank` P·Qᵀ",
                params=(
                    _int("rank", "rank of the approximation", default="4", field="compress_pp_rank"),
                    Param(
                        name="lazy_error",
                        field="compress_pp_lazy_error",
                        type="bool",
                        default="false",
                        doc="lazy error propagation: what P·Qᵀ leaves out is added to the next "
                        "micro-batch's gradient",
                    ),
                ),
            ),
        ),
    ))
    """Pipeline backward-gradient compression: ``none`` or ``lowrank`` (runtime/parallel/pipeline/compress_pp.py)."""
    compress_pp_rank: int = 4
    """``lowrank(rank = r)``."""
    compress_pp_lazy_error: bool = False
    """``lowrank(lazy_error = true)``: Optimus-CC's lazy error propagation."""
    compress_stages: tuple[int, ...] | None = option(None, after="compress_pp", key=Param(
        name="compress_stages",
        type="int_list",
        default="every stage but the first",
        qualifies="compress_pp",
        doc="with compress_pp: the stages whose input gradient is sent back compressed, e.g. [2, 3]",
    ))
    """Stages whose input gradient goes back compressed; None: every stage but the first."""

    @property
    def by_node(self) -> bool:
        """ZeRO-3 shards within a node and replicates across nodes (HSDP)."""
        return self.zero_shard == "node"

    @property
    def options_set(self) -> bool:
        """True when no option here is left to the planner."""
        return self.etp is not None and not self.tp_shape_auto
