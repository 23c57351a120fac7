"""Memory per rank: parameters, gradients, optimizer state, activations, buffers.

Takes: a ``Spec``, a ``Layout`` and an ``Accounting``. Gives: ``memory(...)``, a
``MemoryEstimate`` with one ``MemoryBreakdown`` per pipeline rank and the peak one;
and the formulas on their own (``model_state_bytes``, ``korthikanti_layer_bytes``,
``parc_layer_elements``) for the tests. Before: ``cost/layout.py``. After:
``cost/estimate.py``.

Note [what parc's trainer holds]: the PARC accounting predicts exactly what the
trainer logs (``runtime/train/memory.py``). Under bf16/fp16 with fp32 master weights
(``uses_master_weights``; runtime/optimizers/master.py) the parameters and ``param.grad`` take 2
bytes an element, the optimizer 12 (master + moments; of the slice under ZeRO 1/2),
ZeRO-2's gradient slice and ZeRO-3's shards stay fp32, gathered ZeRO-3 blocks are 2
bytes, with more than one backward a step the gradients' fp32 sums add 4 bytes an
element of the rank's parameters to ``buffers`` (``fp32_accumulation``; which elements:
``fp32_sum_elements`` — zero 0/1 hand the sums over as the gradients, 4 bytes an element
in ``grads``, ZeRO-3 reduce-scatters every pass into its fp32 shards), and
activations (the loss's logits too) are 2 bytes with no autocast weight copies (re-measured: the parity gpt within 1.2%). In fp32: ``param_bytes`` = 4 bytes × this rank's
elements (``rank_params``: the model description's count); ``grad_bytes`` = the same
for zero 0/1, 4·ceil(Ψ/dp) for zero 2; ``optim_bytes`` = two fp32 moments per element
plus torch's 4-byte ``step`` per tensor (zero 0), or the moments of the rank's slice,
8·ceil(Ψ/dp) (zero 1/2); under sp, zero 2 also holds the partial sequence-parallel
gradients (norms, row biases, positions) whole when backward ends, until their sum
over tp. Under ep > 1 a rank holds experts / ep of each MoE block (``rank_params``) and
ZeRO shards them over edp = dp·cp·tp / the expert folds (``Layout.expert_folds``) in a
buffer of their own (runtime/parallel/data/zero.py, Note [experts under ZeRO]):
ceil(dense/dp) + ceil(experts/edp) elements. Its activations are the tensors autograd
saves in ``runtime/models/model.py``, counted per token from the model's shapes in ``runtime/layout/saved_elements.py`` (Note
[what parc's trainer saves]; a MoE block's router, experts and combine: ``cost/experts.py``'s
``moe_saved_elements``; checked against the trainer's measurement in tests/planner). The
working set of a recomputed layer and the gradient flat buffers are real memory but not
saved activations: they are ``buffers``.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from parc.dsl.spec import ModelSpec, Precision, Spec
from parc.runtime.layout.constraints import per_layer
from parc.runtime.layout import model_counts
from parc.runtime.layout.model_desc import LINEAR
from parc.runtime.layout.saved_elements import block_saved_elements, head_saved_elements
from parc.runtime.schedules.schedule import in_flight_bound
from parc.runtime.layout.kernel_sizes import kinds_that_pay

from .context import cp_saved_elements
from .experts import moe_saved_elements
from .memo import shared
from .slices import kept_kv_elements
from .layout import (
    SETTING_NAMES, Accounting, Layout, blocks_of, by_node as hsdp, expert_data_ranks, fields_but, placement_kind,
    rank_blocks, rank_expert_params, rank_params,
    sequence_parallel_params, stage_contents, uses_master_weights, zero3_shard_elements, zero3_shard_ranks,
    expert_shard_ranks,
)

STATES_READS = fields_but(*SETTING_NAMES)
"""What a rank's states read (Note [planner caches]): all but the per-layer settings (the
micro-batch and slices too: the backwards a step decide the fp32 gradient sums)."""
ACTIVATIONS_READS = fields_but("zero", "compress", *(name for name in SETTING_NAMES if name != "recompute"))
"""What a rank's activations read: all but ZeRO, compression and the settings other than recompute."""


BUCKET_BYTES = 25 * 2**20
"""The runtime's gradient bucket (runtime/parallel/data/dp.py, runtime/parallel/data/zero.py)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryBreakdown:
    """Bytes one rank holds at its peak."""

    params: float
    grads: float
    optimizer: float
    activations: float
    buffers: float
    """Transient: gradient flat buffers, a recomputed layer's working set."""

    @property
    def total(self) -> float:
        return self.params + self.grads + self.optimizer + self.activations + self.buffers


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryEstimate:
    per_rank: tuple[MemoryBreakdown, ...]
    """One entry per pipeline rank (every tp and dp rank of it holds the same)."""
    peak_rank: int
    """The pipeline rank holding the most."""

    @property
    def peak(self) -> MemoryBreakdown:
        return self.per_rank[self.peak_rank]


def model_state_bytes(
    params: int, tensors: int, *, dp: int, zero: int, accounting: Accounting, low: bool = False
) -> tuple[float, float, float]:
    """(parameter, gradient, optimizer) bytes of a rank holding ``params`` elements.

    MEGATRON: the ZeRO paper's 2 + 2 + 12 bytes per parameter, with stage 1 sharding
    the 12, stage 2 also the gradients' 2, stage 3 everything. PARC: Note [what parc's
    trainer holds] (stage 3 shards the fp32 parameters too). ``low``: bf16/fp16
    parameters with fp32 master weights (runtime/optimizers/master.py): 2-byte parameters and
    gradients (stage 2's slice: fp32), the fp32 master with the moments in the optimizer.
    """
    shard = math.ceil(params / dp)
    if accounting is Accounting.MEGATRON:
        return (
            2.0 * (params / dp if zero >= 3 else params),
            2.0 * (params / dp if zero >= 2 else params),
            12.0 * (params / dp if zero >= 1 else params),
        )
    if low and zero < 3:  # Note [what parc's trainer holds]
        return 2.0 * params, 4.0 * shard if zero == 2 else 2.0 * params, (
            12.0 * shard if zero >= 1 else 12.0 * params + 4.0 * tensors)
    param_bytes = 4.0 * (shard if zero >= 3 else params)
    grad_bytes = 4.0 * (shard if zero >= 2 else params)
    optim_bytes = 8.0 * shard if zero >= 1 else 8.0 * params + 4.0 * tensors
    return param_bytes, grad_bytes, optim_bytes


def korthikanti_layer_bytes(
    *, seq: int, micro_batch: int, hidden: int, heads: int, tp: int, sp: bool, recompute: str,
    keys: int | None = None,
) -> float:
    """Activation bytes of one transformer layer, fp16 (Korthikanti et al. 2022, Table 2).
    ``seq``: the rank's tokens of a sequence; ``keys``: the keys each query is scored
    against (default ``seq``; under context parallelism the whole sequence, the rank
    holding T/cp queries' scores against all T keys)."""
    s, b, h, a, t = seq, micro_batch, hidden, heads, tp
    k = s if keys is None else keys
    if recompute == "full":
        return 2.0 * s * b * h / (t if sp else 1)
    if recompute == "selective":
        return s * b * h / t * 34 if sp else s * b * h * (10 + 24 / t)
    if sp:
        return s * b * h / t * (34 + 5 * a * k / h)
    if t > 1:
        return s * b * h * (10 + 24 / t + 5 * a * k / (h * t))
    return s * b * h * (34 + 5 * a * k / h)


def parc_layer_elements(
    model: ModelSpec, *, tp: int, sp: bool, recompute: str, micro_batch: int, compiled: bool = True, ep: int = 1,
    grid=None,
) -> float:
    """Elements saved per token by one block (the first: a MoE one in a MoE model) of parc's
    trainer: the model description's (runtime/layout/saved_elements.py, Note [what parc's trainer saves])
    and a MoE block's experts' (cost/experts.py, Note [what a MoE block saves]); ``grid``: (R, C)
    under 2D tensor parallelism (``Layout.grid``), whose attention is repeated on the R ranks of a column."""
    block = block_saved_elements(
        model.config, model.desc.blocks[0], tp=tp, sp=sp, recompute=recompute, micro_batch=micro_batch,
        compiled=compiled, grid=grid,
    )
    return block + moe_saved_elements(model, 0, tp=tp, sp=sp, recompute=recompute, compiled=compiled, ep=ep)


def parc_head_elements(model: ModelSpec, *, tp: int, sp: bool, compiled: bool = True, grid=None) -> float:
    """Elements saved per token by the final norm, the head and the loss (last stage)."""
    return head_saved_elements(model.config, tp=tp, sp=sp, compiled=compiled, grid=grid)


@functools.lru_cache(maxsize=4096)
def _in_flight(kind: str, stages: int, rank: int, micro_batches: int, chunks: int, slices: int = 1) -> float:
    """Micro-batch(-chunk)s in flight; under token slices, slices in flight as a share of
    micro-batches (each slice saves 1/S of a micro-batch's activations)."""
    if stages == 1:
        return 1
    if slices > 1:
        return in_flight_bound(kind, stages=stages, rank=rank, micro_batches=micro_batches, slices=slices) / slices
    return in_flight_bound(kind, stages=stages, rank=rank, micro_batches=micro_batches, chunks=chunks)


def compiled_kernels(spec: Spec) -> frozenset[str]:
    """The kinds of fused op the trainer runs (runtime/layout/kernel_sizes.py, Note [eager at small
    shapes]): none under ``train.kernels = eager``; under ``compiled`` (the default) those
    that pay at the model's global size on the spec's device."""
    kernels = getattr(spec.train, "kernels", None)
    if not (kernels is None or getattr(kernels, "value", kernels) == "compiled"):
        return frozenset()
    return kinds_that_pay(spec.model.desc.config, cpu=spec.mesh.device == "cpu")


def activation_bytes(spec: Spec, layout: Layout, rank: int, accounting: Accounting, stage_layers=None) -> float:
    """Peak bytes of activations saved on pipeline rank ``rank``."""
    model = spec.model
    contents = stage_contents(model, layout, rank, stage_layers)
    micro_batches = layout.grad_accum(spec.train.global_batch)
    in_flight = _in_flight(layout.schedule, layout.pp, rank, micro_batches, layout.chunks, layout.slices)
    tokens = layout.tokens(model.seq_len)  # this rank's: seq_len / cp of each sequence
    modes = _rank_recompute(model, layout, rank, stage_layers)  # Note [per-layer costs]
    if accounting is Accounting.MEGATRON:
        layers = sum(
            count * korthikanti_layer_bytes(  # the rank's T/cp tokens, scored against all T keys
                seq=model.seq_len // layout.cp, micro_batch=layout.micro_batch, hidden=model.hidden,
                heads=model.heads, tp=layout.tp, sp=layout.sp, recompute=mode, keys=model.seq_len,
            )
            for mode, count in modes.items()
        )
        return in_flight * layers / layout.chunks
    element = 4.0 if spec.train.precision is Precision.FP32 else 2.0
    compiled = compiled_kernels(spec)
    extra = cp_saved_elements(spec, layout)  # Note [cp costs]: allgather's K/V of other ranks
    if model.experts:  # blocks differ (moe_every): each kind of the rank's blocks once
        layers = sum(
            count * (block_saved_elements(
                model.config, model.desc.blocks[index], tp=layout.tp, sp=layout.sp, recompute=mode,
                micro_batch=layout.micro_batch, compiled=compiled,
            ) + moe_saved_elements(  # Note [what a MoE block saves]: the router's, experts' and combine's
                model, index, tp=layout.tp, sp=layout.sp, recompute=mode, compiled=compiled, **layout.expert_split,
            ) + (extra if mode != "full" else 0.0))
            for (index, mode), count in _rank_block_kinds(model, layout, rank, stage_layers)
        )
    else:
        layers = sum(
            count * (parc_layer_elements(
                model, tp=layout.tp, sp=layout.sp, recompute=mode, micro_batch=layout.micro_batch, compiled=compiled,
                grid=layout.grid,
            ) + (extra if mode != "full" else 0.0))
            for mode, count in modes.items()
        )
    layers += kept_kv_elements(model, layout.tp, layout.slices, modes)  # slices.py, Note [kept keys under recompute]
    total = in_flight * layers / layout.chunks * tokens * element
    if contents.embed:
        total += min(in_flight, micro_batches) * tokens * 8.0  # the int64 token ids
    if contents.head:
        head_in_flight = micro_batches if layout.schedule == "gpipe" and layout.pp > 1 else 1
        head = parc_head_elements(model, tp=layout.tp, sp=layout.sp, compiled=compiled, grid=layout.grid)
        # fp32 logits saved by the loss, under fp32 and autocast; bf16/fp16 parameters: the head's dtype
        total += head_in_flight * head * tokens * (element if uses_master_weights(spec) else 4.0)
    if element == 2.0 and not uses_master_weights(spec):  # Note [autocast's weight copies]
        kept = sum(count for mode, count in modes.items() if mode != "full")
        total += 2.0 * in_flight * kept / layout.chunks * autocast_block_weights(model, layout.tp)
        if contents.head:
            total += 2.0 * head_in_flight * model.desc.head[-1].weight.numel(layout.tp)
    return total


def fp32_accumulation(spec: Spec, layout: Layout) -> bool:
    """Low-precision parameters summing more than one backward a step (micro-batches, or
    token slices): their gradients accumulate in fp32 sums, 4 bytes an element from a
    step's first backward to its last (runtime/optimizers/master.py, Note [fp32 accumulation])."""
    return uses_master_weights(spec) and layout.grad_accum(spec.train.global_batch) * layout.slices > 1


def fp32_sum_elements(spec: Spec, layout: Layout, params: int, *, experts: int, late: int) -> int:
    """Elements whose fp32 gradient sums (runtime/optimizers/master.py, Note [fp32 accumulation]) are
    ``buffers`` beyond the gradients: none without ``fp32_accumulation``; under ZeRO-3
    only the ``late`` (sequence-parallel) ones, each pass reduce-scattering the rest into
    the fp32 shards (runtime/parallel/data/fsdp.py, Note [gradients of a unit]); under ZeRO-2 all, its
    buckets taking the sums at the last backward; under zero 0/1 the ``experts`` and the
    ``late`` ones, the others' sums being handed over as the gradients themselves
    (``grads``: 4 bytes an element)."""
    if not fp32_accumulation(spec, layout):
        return 0
    if layout.zero >= 3:
        return late
    return params if layout.zero == 2 else experts + late


def autocast_block_weights(model: ModelSpec, tp: int) -> int:
    """Note [autocast's weight copies]: under bf16 autocast every matmul casts its fp32
    weight to a bf16 copy, which autograd saves for backward: one copy per weight and per
    micro-batch in flight (each forward is its own autocast region), none inside a
    fully recomputed block. Elements of one block's matmul weights on a tp rank."""
    return sum(m.weight.numel(tp) for m in model_counts.typical_block(model.desc).modules if m.layer == LINEAR)


def _rank_block_kinds(model: ModelSpec, layout: Layout, rank: int, stage_layers=None):
    """((a block index of the kind, recompute mode), count) for each kind of block pipeline
    rank ``rank`` holds: MoE or dense, by recompute mode."""
    return _block_kinds(model, layout.pp, layout.chunks, layout.recompute, rank,
                        tuple(stage_layers) if stage_layers else None, placement_kind(layout))


@functools.lru_cache(maxsize=4096)
def _block_kinds(model: ModelSpec, pp: int, chunks: int, recompute, rank: int, stage_layers,
                 kind: str = "interleaved") -> tuple:
    modes = per_layer(recompute, model.layers)
    blocks = model.desc.blocks
    kinds: dict = {}
    for i in blocks_of(model.layers, pp, chunks, rank, stage_layers, kind):
        key = (bool(blocks[i].experts), modes[i])
        first, n = kinds.get(key, (i, 0))
        kinds[key] = (first, n + 1)
    return tuple(((first, mode), n) for (_, mode), (first, n) in kinds.items())


def _rank_recompute(model: ModelSpec, layout: Layout, rank: int, stage_layers=None) -> dict[str, int]:
    """How many of pipeline rank ``rank``'s blocks use each recompute mode."""
    if not layout.per_layer:
        return {layout.recompute: stage_contents(model, layout, rank, stage_layers).layers}
    settings = layout.block_settings(model.layers)
    counts: dict[str, int] = {}
    at = SETTING_NAMES.index("recompute")
    for i in rank_blocks(model, layout, rank, stage_layers):
        counts[settings[i][at]] = counts.get(settings[i][at], 0) + 1
    return counts


def memory(spec: Spec, layout: Layout, accounting: Accounting = Accounting.PARC) -> MemoryEstimate:
    """Peak bytes per pipeline rank, with the breakdown (ranks 0 and pp−1 bound the others
    under an even split, so only they are evaluated then; explicit stage_layers: all).
    Each rank's states and activations are shared by the layouts that agree on what they
    read (Note [planner caches])."""
    model = spec.model
    stage_layers = list(spec.parallel.stage_layers) if spec.parallel.stage_layers else None
    ranks = range(layout.pp) if stage_layers else sorted({0, layout.pp - 1})
    owner = (spec, accounting)
    rows = {}
    for rank in ranks:
        # reads: the placement, the degrees the states split over, ZeRO, sp, compression, and
        # the backwards a step (fp32 gradient sums: fp32_sum_elements)
        params, param_b, grad_b, optim_b, sums = shared(
            owner, "memory.states", (rank, STATES_READS(layout)),
            lambda: _states(spec, layout, rank, stage_layers, accounting))
        # reads: the placement, the tokens and micro-batches in flight, recompute, sp, cp
        acts = shared(
            owner, "memory.activations", (rank, ACTIVATIONS_READS(layout)),
            lambda: activation_bytes(spec, layout, rank, accounting, stage_layers))
        rows[rank] = MemoryBreakdown(
            params=param_b,
            grads=grad_b,
            optimizer=optim_b,
            activations=acts,
            buffers=_buffers(spec, layout, params, accounting, "full" in _rank_recompute(model, layout, rank, stage_layers),
                             fp32_sums=sums),
        )
    per_rank = tuple(rows.get(rank, rows[0]) for rank in range(layout.pp))
    peak_rank = max(range(layout.pp), key=lambda r: (per_rank[r].total, -r))
    return MemoryEstimate(per_rank=per_rank, peak_rank=peak_rank)


def _states(spec: Spec, layout: Layout, rank: int, stage_layers, accounting: Accounting) -> tuple:
    """(elements, parameter, gradient, optimizer bytes, fp32-sum elements) of pipeline rank ``rank`` (``memory``)."""
    model = spec.model
    params, tensors = rank_params(model, layout, rank, stage_layers)
    low = uses_master_weights(spec)
    param_b, grad_b, optim_b = model_state_bytes(
        params, tensors, dp=layout.shard_ranks, zero=layout.zero, accounting=accounting, low=low
    )
    grad_element = 2.0 if low else 4.0  # param.grad: the parameters' dtype
    experts = rank_expert_params(model, layout, rank, stage_layers)
    if accounting is Accounting.PARC and experts and layout.zero in (1, 2):  # Note [experts under ZeRO]
        shard = math.ceil((params - experts) / layout.shard_ranks) + math.ceil(experts / expert_data_ranks(layout))
        optim_b = (12.0 if low else 8.0) * shard
        grad_b = 4.0 * shard if layout.zero == 2 else grad_b
    if accounting is Accounting.PARC and layout.zero == 2 and layout.shard_ranks > 1 and layout.compress != "none":
        # the compressor needs whole gradients (runtime/parallel/data/zero.py, Note [compression under ZeRO])
        grad_b += grad_element * params
    elif accounting is Accounting.PARC and layout.zero == 2 and layout.shard_ranks > 1:
        # Partial sp gradients wait, whole, for their sum over tp when backward ends.
        grad_b += grad_element * sequence_parallel_params(model, layout, rank, stage_layers)
    if accounting is Accounting.PARC and layout.zero == 3 and layout.shard_ranks > 1:
        by_node = dict(by_node=hsdp(spec), devices_per_node=spec.mesh.devices_per_node)
        shard = zero3_shard_elements(model, layout, rank, stage_layers, zero3_shard_ranks(layout, **by_node),
                                     expert_shard_ranks(layout, **by_node))  # padded per unit
        param_b, grad_b, optim_b = 4.0 * shard, 4.0 * shard, 8.0 * shard
    if accounting is Accounting.PARC and layout.zero == 3 and layout.shard_ranks > 1 and layout.sp and layout.tp > 1:
        # every unit holds a sequence-parallel norm: its last pass's gradients wait, whole,
        # with the partial ones for their sum over tp (runtime/parallel/data/fsdp.py, Note [gradients of a unit])
        grad_b += grad_element * params
    late = sequence_parallel_params(model, layout, rank, stage_layers)
    sums = fp32_sum_elements(spec, layout, params, experts=experts, late=late)
    if accounting is Accounting.PARC and layout.zero <= 1 and fp32_accumulation(spec, layout):
        grad_b += 2.0 * (params - sums)  # handed over: 4 bytes, not 2 (runtime/optimizers/master.py)
    return params, param_b, grad_b, optim_b, sums


def zero3_working_set(spec: Spec, layout: Layout, params: int, accounting: Accounting) -> float:
    """Bytes of ZeRO-3's unsharded working set on a rank holding ``params`` elements
    (runtime/parallel/data/fsdp.py, Note [prefetch]): the root unit (embeddings, final norm, head) and
    1 + zero_prefetch blocks gathered at once, plus one block's gradient and its packed
    copy being reduce-scattered (PARC: fp32; MEGATRON: bf16 parameters and gradients).
    Blocks are taken as equal, the root as what the rank holds beyond its blocks."""
    model = spec.model
    element = 2.0 if accounting is Accounting.MEGATRON or uses_master_weights(spec) else 4.0  # gathered
    packed = 2.0 if accounting is Accounting.MEGATRON else 4.0  # the reduce-scattered copy: fp32 in parc
    block = model.desc.stage_params(
        layout.tp, layers=(0, 1), first=False, last=False, sharded=None, grid=layout.grid
    ).elements if model.layers else 0
    root = max(0, params - block * layout_blocks(model, layout))
    prefetch = int(getattr(spec.parallel, "zero_prefetch", 1))
    return element * (root + (1 + prefetch) * block + block) + packed * block


def layout_blocks(model, layout: Layout) -> int:
    """Blocks on the pipeline rank holding the most (an even split: layers / pp)."""
    return math.ceil(model.layers / layout.pp)


def _buffers(spec: Spec, layout: Layout, params: int, accounting: Accounting, full_recompute: bool,
             fp32_sums: int = 0) -> float:
    """``fp32_sums``: ``fp32_sum_elements``."""
    model, tokens = spec.model, layout.tokens(spec.model.seq_len)
    total = 0.0
    if layout.zero >= 3 and layout.shard_ranks > 1:
        total += zero3_working_set(spec, layout, params, accounting)
    elif accounting is Accounting.PARC and layout.shard_ranks > 1:
        if layout.zero == 2:  # Note [ZeRO-2 during backward]: two buckets alive at most
            total += 2 * min(BUCKET_BYTES, 4.0 * params)
        else:  # zero 0's packed buckets, zero 1's flat gradient: one fp32 copy in flight
            total += 4.0 * params
        if layout.compress != "none":  # runtime/parallel/data/compress.py: the error feedback's fp32 copy of the gradients
            total += 4.0 * params
    if accounting is Accounting.PARC:
        total += 4.0 * fp32_sums  # runtime/optimizers/master.py, Note [fp32 accumulation]
    if full_recompute:  # one block's tensors rebuilt during its backward
        element = 2.0 if accounting is Accounting.MEGATRON else 4.0
        working = parc_layer_elements(model, tp=layout.tp, sp=layout.sp, recompute="none",
                                      micro_batch=layout.micro_batch, ep=layout.ep, grid=layout.grid)
        total += working * tokens * element
    return total
