"""A candidate layout and what each pipeline rank of it holds.

Takes: a ``Spec`` (model shape, batch) and a ``Layout`` (every degree and setting
filled in). Gives: ``Layout``, ``Accounting`` and ``stage_contents`` — per pipeline
rank, its layers and whether it holds the embedding, the head (or a tied copy) — and
``rank_params`` (elements and tensors of one rank's parameters, exactly as the
runtime's model builds them): counted by the model description
(``runtime/layout/model_desc.py``), memoized per (model, tp, pp, chunks, rank); and
``uses_master_weights`` (fp32 masters beside bf16/fp16 parameters) with what it makes of
an activation element's bytes (``streamed_element``), which memory and time both read.

Note [per-layer costs]: a layout may give each block its own value of each per-layer
setting (``recompute = [full, none, ...]``; ``layer_settings.SETTINGS``). Memory sums each pipeline rank's own blocks; time
costs each distinct block setting once and weighs it by how many blocks have it, so a
uniform layout costs exactly what it did. The pipeline's makespan takes the mean
block (its chunks are costed as equal).

Before: ``codegen/planner/search.py`` or ``choose_layout``. After: ``cost/memory.py``, ``cost/time.py``.
"""

from __future__ import annotations

import enum
import functools
import math
import operator
from dataclasses import dataclass, fields

from parc.dsl.keys.layout_options import LayoutOptions
from parc.dsl.spec import ModelSpec, Spec
from parc.runtime.layout import layer_settings, model_counts
from parc.runtime.layout.constraints import master_weights, per_layer
from parc.runtime.layout.layer_settings import SETTINGS
from parc.runtime.layout.model_desc import NONE, ParamCount
from parc.runtime.layout.placement import Placement, chunk_stages, placement_for
from ...layout_words import schedule_words
from .compress import compresses
from .options import options, qualified



SETTING_NAMES = tuple(entry.name for entry in SETTINGS)
"""The order of ``Layout.block_settings``' values."""


class Accounting(enum.Enum):
    """Which training program the model describes."""

    PARC = "parc"
    """parc's generated trainer: fp32 weights, gradients and AdamW state (bf16 is
    autocast), the tensors it saves for backward (flash attention: no s² term)."""
    MEGATRON = "megatron"
    """Megatron-LM's mixed precision (ZeRO paper: 2 + 2 + 12 bytes per parameter),
    Korthikanti et al.'s activation formulas (attention scores materialized)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Layout(LayoutOptions):
    """A complete layout: its degrees and per-layer settings, and the options it shares with
    the spec's (``LayoutOptions``: cp and ep, their options, the tp grid, token slices;
    Note [one record of the options])."""

    dp: int
    tp: int
    pp: int
    sp: bool
    zero: int
    schedule: str
    """``gpipe``, ``1f1b`` or ``interleaved``."""
    chunks: int
    """Model chunks per pipeline rank (> 1 when interleaved, or a kind of ``schedule.FIXED_CHUNKS``)."""
    micro_batch: int
    recompute: str | tuple[str, ...] = "none"
    """``none``, ``selective`` or ``full``; or one per block (Note [per-layer costs])."""
    overlap: int | tuple[int, ...] = 1
    """Oases sub-batches per micro-batch (1: none); or one per block."""
    compress: str = "none"
    """``parallel.compress``: ``none``, ``powersgd`` or ``topk`` (``cost/compress.py``)."""
    layer_tp: tuple[int, ...] | None = None
    """One tensor-parallel degree per block (a heterogeneous layout: ``tp`` is then the
    largest, ``dp`` the fewest; layer i runs dp·tp / layer_tp[i] × layer_tp[i]); None: all ``tp``."""

    @property
    def layer_dp(self) -> tuple[int, ...] | None:
        """Each block's data-parallel ranks, dp·tp / layer_tp[i] (None: uniform)."""
        return None if self.layer_tp is None else tuple(self.dp * self.tp // t for t in self.layer_tp)


    @property
    def schedule_words(self) -> str:
        """The schedule in the DSL's words (``layout_words.schedule_words``): ``interleaved(2)``, ``1f1b``."""
        return schedule_words(self.schedule, self.chunks, self.slices)

    @property
    def shard_ranks(self) -> int:
        """dp·cp: the ranks that hold the same parameters, average their gradients and, under
        ZeRO, shard their states (runtime/parallel/data/zero.py, fsdp.py: the generated trainer's
        ``grad_group`` when cp > 1)."""
        return self.dp * self.cp

    def tokens(self, seq_len: int) -> int:
        """Tokens of one micro-batch on one rank: micro_batch · seq_len / cp."""
        return self.micro_batch * seq_len // self.cp

    def setting(self, name: str):
        """A per-layer setting (``layer_settings.SETTINGS``): one value or one per block."""
        return getattr(self, name)

    def block_settings(self, layers: int) -> tuple[tuple, ...]:
        """Each of the model's ``layers`` blocks' values of every per-layer setting, in
        ``SETTINGS`` order (recompute, overlap)."""
        return tuple(zip(*(per_layer(self.setting(entry.name), layers) for entry in SETTINGS)))

    @property
    def per_layer(self) -> bool:
        return any(isinstance(self.setting(entry.name), tuple) for entry in SETTINGS)

    def settings_words(self, labels: str = "short") -> list[str]:
        """The settings in use as ``parc plan`` shows them: ``rc:full`` (``labels =
        "short"``) or ``recompute full`` (``"name"``); one value's own words when they
        name the setting (an overlap's)."""
        shown = [
            layer_settings.shown(entry, self.setting(entry.name),
                                 f"{entry.short}:" if labels == "short" else f"{entry.name} ")
            for entry in SETTINGS
        ]
        return [text for text in shown if text is not None]

    def grad_accum(self, global_batch: int) -> int:
        return global_batch // (self.micro_batch * self.dp)

    def describe(self) -> str:
        """The layout in the DSL's words, one line."""
        if self.layer_tp is not None:
            parts = [f"dp {layer_settings.folded(self.layer_dp)}", f"tp {layer_settings.folded(self.layer_tp)}", f"pp {self.pp}"]
        else:
            parts = [f"dp {self.dp}", f"tp {self.tp}", f"pp {self.pp}"]
        parts[1] += qualified(self, "tp")
        if self.cp > 1:
            parts.insert(1, f"cp {self.cp}{qualified(self, 'cp')}")
        if self.ep > 1:
            parts.append(f"ep {self.ep}")
        parts += [text for entry in options() if not entry.axis
                  and (text := entry.words(getattr(self, entry.name))) is not None]
        if self.pp > 1:
            parts.append(self.schedule_words)
        return " ".join(parts)


LAYOUT_FIELDS = tuple(item.name for item in fields(Layout))
"""Every field of a ``Layout``, in its order."""


def fields_but(*names: str) -> operator.attrgetter:
    """The values of every ``Layout`` field but ``names``: the key of a part of the cost model
    that does not read those (Note [planner caches]); a field added to ``Layout`` joins every key."""
    return operator.attrgetter(*(name for name in LAYOUT_FIELDS if name not in names))


def by_node(spec) -> bool:
    """ZeRO-3 shards within a node and replicates across nodes (HSDP: ``SpecOptions.by_node``)."""
    return spec.parallel.by_node


def zero3_spread(hsdp: bool) -> tuple[str, str]:
    """(the ranks ZeRO-3 shards a unit over, those it gathers an MoE layer's experts over), in
    words (``why``): every rank and edp, or under HSDP one node's."""
    return ("the ranks of a node (zero_shard = node)", "its node's edp ranks") if hsdp else ("every rank", "edp")


@dataclass(frozen=True, slots=True, kw_only=True)
class StageContents:
    """What one pipeline rank holds (all of its chunks together)."""

    layers: int
    embed: bool
    """Holds the token embedding (virtual stage 0)."""
    head: bool
    """Holds the final norm and loss (the last virtual stage)."""
    head_weight: bool
    """Holds a head matrix of its own (untied, or the tied copy on a later stage)."""


def placement_kind(layout: Layout) -> str:
    """Which stage each chunk of a rank runs (``runtime/layout/placement.py``)."""
    return placement_for(layout.schedule, layout.pp, layout.chunks).kind if layout.pp > 1 else "interleaved"


def rank_blocks(model: ModelSpec, layout: Layout, rank: int, stage_layers=None) -> list[int]:
    """The block indices pipeline rank ``rank`` holds (all of its chunks)."""
    return blocks_of(model.layers, layout.pp, layout.chunks, rank, stage_layers, placement_kind(layout))


def blocks_of(layers: int, pp: int, chunks: int, rank: int, stage_layers=None, kind: str = "interleaved") -> list[int]:
    """``rank_blocks`` from the degrees alone."""
    mine = _chunks(layers, pp, chunks, rank, _stages(stage_layers), kind)
    return [i for (start, stop), _, _ in mine for i in range(start, stop)]


def stage_contents(model: ModelSpec, layout: Layout, rank: int, stage_layers=None) -> StageContents:
    return _stage_contents(model, layout.pp, layout.chunks, rank, _stages(stage_layers), placement_kind(layout))


@functools.lru_cache(maxsize=4096)
def _stage_contents(model: ModelSpec, pp: int, chunks: int, rank: int, stage_layers, kind: str) -> StageContents:
    mine = _chunks(model.layers, pp, chunks, rank, stage_layers, kind)
    desc = model.desc
    return StageContents(
        layers=sum(stop - start for (start, stop), _, _ in mine),
        embed=any(first for _, first, _ in mine),
        head=any(last for _, _, last in mine),
        head_weight=any(last and desc.has_head_weight(first=first) for _, first, last in mine),
    )


def rank_params(model: ModelSpec, layout: Layout, rank: int, stage_layers=None) -> tuple[int, int]:
    """(elements, tensors) of pipeline rank ``rank``'s parameters on one tp rank: the sum
    of its chunks' ``ModelDesc.stage_params`` (runtime/layout/model_desc.py)."""
    count = _rank_params(model, layout.tp, layout.pp, layout.chunks, rank, _stages(stage_layers),
                         placement_kind(layout), layout.expert_folds, layout.grid)
    return count.elements, count.tensors


def rank_expert_params(model: ModelSpec, layout: Layout, rank: int, stage_layers=None) -> int:
    """Elements of pipeline rank ``rank``'s experts split over ep (0 when ep = 1: then they
    are replicated like any parameter): their gradients reduce over edp, ZeRO shards them
    over edp (runtime/parallel/data/zero.py, Note [experts under ZeRO])."""
    folds = layout.expert_folds
    if folds == 1:
        return 0
    kind = placement_kind(layout)
    whole = _rank_params(model, layout.tp, layout.pp, layout.chunks, rank, _stages(stage_layers), kind, ep=folds)
    dense = _rank_params(model, layout.tp, layout.pp, layout.chunks, rank, _stages(stage_layers), kind, ep=1)
    grouped = dense.elements - whole.elements  # the (folds − 1)/folds of the experts a rank lacks
    return grouped // (folds - 1)


def expert_data_ranks(layout: Layout) -> int:
    """edp: the ranks holding the same experts, dp·cp·tp / ``expert_folds`` (expert_folding.py's
    Note [parallel folding])."""
    return layout.dp * layout.cp * layout.tp // layout.expert_folds


def sequence_parallel_params(model: ModelSpec, layout: Layout, rank: int, stage_layers=None) -> int:
    """Elements of pipeline rank ``rank`` whose gradients are partial under sp (each tp
    rank saw a sequence shard): the norms, the row-parallel biases, gpt's positions
    (runtime/parallel/tensor/sp_columns.py, Note [sequence-parallel gradients]); 0 without sp."""
    if not layout.sp or layout.tp < 2:
        return 0
    desc = model.desc
    mine = _chunks(model.layers, layout.pp, layout.chunks, rank, _stages(stage_layers), placement_kind(layout))
    return sum(model_counts.sequence_parallel_params(desc, layers=layers, first=first, last=last, grid=layout.grid)
               for layers, first, last in mine)


def zero3_shard_ranks(layout: Layout, *, by_node: bool, devices_per_node: int) -> int:
    """Ranks a ZeRO-3 unit is sharded over: dp·cp, or under HSDP (``by_node``) those of them
    on one node (runtime/parallel/data/fsdp_units.py's ``node_groups``; tp innermost, so
    devices_per_node / tp of them)."""
    if not by_node:
        return layout.shard_ranks
    return max(1, min(layout.shard_ranks, devices_per_node // layout.tp))


def expert_shard_ranks(layout: Layout, *, by_node: bool, devices_per_node: int) -> int:
    """Ranks a ZeRO-3 unit of experts is sharded over: edp, or under HSDP (``by_node``) the
    edp ranks on one node (runtime/parallel/data/fsdp_units.py's ``expert_node_groups``): an
    edp group is every F-th rank of a stage (F = ``expert_folds``, mesh.py's Note [parallel
    folding]), so a node of n ranks holds n / F of it, at least one."""
    edp = expert_data_ranks(layout)
    if not by_node:
        return edp
    return max(1, min(edp, devices_per_node // layout.expert_folds))


def zero3_shard_elements(model: ModelSpec, layout: Layout, rank: int, stage_layers=None, shard: int | None = None,
                         expert_shard: int | None = None) -> int:
    """Elements pipeline rank ``rank`` keeps under ZeRO-3 (runtime/parallel/data/fsdp.py, Note [units]):
    Σ over its units (each block; each chunk's embeddings, final norm and head) of
    ⌈n_unit / s⌉, the padding included; s = ``shard`` ranks (``zero3_shard_ranks``), dp·cp
    by default; the experts' units over ``expert_shard`` (``expert_shard_ranks``), edp by default."""
    desc = model.desc
    total, shard = 0, layout.shard_ranks if shard is None else shard
    for (start, stop), first, last in _chunks(model.layers, layout.pp, layout.chunks, rank, _stages(stage_layers),
                                              placement_kind(layout)):
        root = desc.stage_params(layout.tp, layers=(start, start), first=first, last=last, grid=layout.grid).elements
        total += math.ceil(root / shard)
        if layout.expert_folds == 1:
            block = desc.stage_params(layout.tp, layers=(start, start + 1), first=False, last=False,
                                      grid=layout.grid).elements
            total += (stop - start) * math.ceil(block / shard)
        else:  # Note [experts as units] (fsdp.py): a MoE block's dense unit over dp, its experts' over edp
            edp = expert_data_ranks(layout) if expert_shard is None else expert_shard
            total += sum(math.ceil(dense / shard) + math.ceil(mine / edp)
                         for dense, mine in _block_units(model, layout.tp, layout.expert_folds)[start:stop])
    return total


@functools.lru_cache(maxsize=1024)
def _block_units(model: ModelSpec, tp: int, folds: int) -> tuple[tuple[int, int], ...]:
    """Each block's (dense elements, this rank's experts' elements) on a tp rank with the
    experts folded over ``folds`` = ``expert_folds`` ranks (0 experts for a dense block). Cached: the
    search asks for them with every layout, and they depend on none of dp, pp or the settings."""
    desc = model.desc
    units = []
    for index, block in enumerate(desc.blocks):
        whole = desc.stage_params(tp, layers=(index, index + 1), first=False, last=False).elements
        if not block.experts:
            units.append((whole, 0))
            continue
        folded = desc.stage_params(tp, layers=(index, index + 1), first=False, last=False, ep=folds).elements
        mine = (whole - folded) // (folds - 1)  # this rank's 1/folds of the block's experts
        units.append((folded - mine, mine))
    return tuple(units)


def total_params(model: ModelSpec) -> int:
    """Parameters of the whole model (one copy of a tied embedding)."""
    return model_counts.parameters(model.desc)


def _stages(stage_layers) -> tuple[int, ...] | None:
    return tuple(stage_layers) if stage_layers else None


@functools.lru_cache(maxsize=4096)
def _chunks(layers: int, pp: int, chunks: int, rank: int, stage_layers, kind: str = "interleaved") -> tuple:
    """((start, stop), first, last) of each virtual stage pipeline rank ``rank`` runs, by
    chunk, as ``runtime/layout/placement.py`` places them (a two-way placement: its two replicas)."""
    place = chunk_stages(kind, pp, pp * chunks) if pp > 1 else Placement("interleaved", 1, chunks)
    stages = place.virtual_stages
    counts = stage_layers or (layers // stages,) * stages
    bounds = [0]
    for n in counts:
        bounds.append(bounds[-1] + n)
    return tuple(((bounds[v], bounds[v + 1]), v == 0, v == stages - 1) for v in place.stages_of(rank))


@functools.lru_cache(maxsize=4096)
def _rank_params(model: ModelSpec, tp: int, pp: int, chunks: int, rank: int, stage_layers,
                 kind: str = "interleaved", ep: int = 1, grid=None) -> ParamCount:
    desc = model.desc
    total = NONE
    for layers, first, last in _chunks(model.layers, pp, chunks, rank, stage_layers, kind):
        total += desc.stage_params(tp, layers=layers, first=first, last=last, ep=ep, grid=grid)
    return total


def uses_master_weights(spec: Spec) -> bool:
    """bf16/fp16 parameters with fp32 masters (else fp32, or autocast over fp32 weights)."""
    return master_weights(spec.train.precision.value, per_layer_tp=False, compressed=compresses(spec))


def streamed_element(spec: Spec) -> float:
    """Bytes of an activation element that parc's elementwise work (norms, activations,
    residual adds, the experts' permutations) reads and writes: 2 with bf16/fp16
    parameters (fp32 masters: the forward runs in the compute dtype but for the
    statistics the kernels keep in fp32, runtime/optimizers/master.py), as the saved
    activations (``memory.activation_bytes``); else 4 (fp32, and autocast over fp32 weights,
    whose residual stream and norms stay fp32)."""
    return 2.0 if uses_master_weights(spec) else 4.0
