"""Time per step: compute, exposed communication, the pipeline bubble.

Takes: a ``Spec``, a ``Layout``, ``Hardware`` and an ``Accounting``. Gives:
``step_time(...)`` → ``TimeBreakdown``. Before: ``cost/hardware.py``, ``cost/comm.py``.
After: ``cost/estimate.py``.

Note [the time model]: per micro-batch and transformer block on one rank,
- compute: each GEMM (q, k, v, o, the MLP's) takes 2·m·n·k / FLOP/s(smallest dim)
  (Note [size-dependent efficiency]); parc's causal attention core on a GPU preset is
  flash attention at its measured rates, backward 2.5× its forward FLOPs (Note [flash
  attention's rate], cost/hardware.py), elsewhere two batched GEMMs; backward twice the
  forward; recompute adds the forward again (full) or the
  attention core (selective); elementwise work moves bytes at the memory bandwidth
  (``layout.streamed_element``: 2 an element under bf16/fp16 parameters, else 4);
  every op costs the dispatch overhead. The head's GEMM runs on the last stage.
- tensor/sequence parallel: two all-reduces (or all-gather + reduce-scatter pairs
  under sp: the same ring volume, but a profile's measured figures for each) of the
  block's (b, s, h) activations forward, two backward, two more under full recompute;
  under sp two more all-gathers in backward, each region's saved input shard gathered
  again, hidden behind the input gradients' GEMMs where they last long enough.
- overlap (Oases): each micro-batch runs as k sub-batches; the exposed
  tp time is ``cost/overlap.py``'s replay of the runtime's sub-batch schedule
  (forward wavefront; backward, each gradient all-reduce behind the weight
  gradients) on the block's compute and its all-reduces, each sub-batch's collective
  paying the whole latency — paid for with k× the op dispatches and smaller GEMMs.
  Without overlap every tp collective is exposed. Full recompute repeats the
  forward's exposure in backward.
- on a profiled CPU (``Hardware.comm_on_cores``) gloo runs each collective on the
  cores the ranks compute on, so nothing hides it: tp collectives and the data-parallel
  reduction are exposed whole, and sub-batches only add their latencies.
- every parc step ends with two scalar all-reduces (the loss over dp, the finite check
  over all ranks): their latency.
- data parallel: the gradients are reduced once a step. parc's zero 0, 1 and 2
  all-reduce buckets as backward frees them, hidden behind the last micro-batch's
  backward (exposed max(0, reduce − backward)); zero 1 and 2 then all-gather the
  updated slice (exposed). Megatron-LM
  of 2021 reduces after the pipeline flush (nothing hidden), zero 2 as a
  reduce-scatter; zero 3 also gathers the parameters for every micro-batch's forward
  and backward, unit by unit, the next unit's gather hidden behind this one's compute
  (Note [ZeRO-3 gathers] at ``zero3.zero3_gathers``), and reduce-scatters each unit's
  gradient on the same link during backward (every micro-batch, in both programs; parc
  gathers nothing after the step), at what ZeRO-3 reaches across nodes; under
  HSDP (``layout.by_node``) within a node, the replicas' shards all-reduced across
  nodes once a step. Every gradient reduction carries fp32 elements, or bf16 under
  ``grad_reduce = bf16`` (``_grad_reduce_element``: half the bytes, whatever the zero
  stage). ``compress =
  powersgd`` replaces the reduction by its factors' all-reduces plus the
  compression's compute, both exposed (Note [powersgd cost]); ``topk`` by its two
  all-gathers and its selection (Note [topk cost]).
- pipeline: a (b, s, h) message per chunk boundary (fp32 in parc's trainer whatever the
  compute dtype, ``pipeline_element``); the makespan of the runtime's schedule
  (``cost/bubble.py``); bubble = makespan − the busy time. Compressing the pipeline's
  messages shrinks the backward ones and adds their compression to the backward
  (``compress.pipeline_messages``).
- mixture of experts: the experts' compute and the ep all-to-alls (``cost/experts.py``,
  Note [MoE costs]) join the block's forward, backward and exposed time; expert
  gradients reduce over edp, the rest over dp.
- the optimizer: the fused AdamW update and the gradient-norm pass (``cost/optimizer.py``,
  Note [the fused AdamW's cost]).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from parc.dsl.spec import Arch, ModelSpec, Precision, Spec
from parc.runtime.layout import model_counts
from parc.runtime.layout.model_desc import LINEAR
from parc.runtime.layout.placement import placement_for


from .bubble import makespan, slice_scales, stage_costs
from .context import cp_comm, eager_core
from .slices import per_slices, zero3_passes
from .tp2d import grid_block_comm, grid_head_comm
from .comm import collective_latency, collective_time
from .compress import RANK, pipeline_messages, powersgd_cost, topk_cost
from .experts import expert_reduce, moe_block, moe_share
from .hardware import Hardware, gemm_time
from .memo import shared
from .optimizer import optimizer_time
from .layout import (
    SETTING_NAMES, Accounting, Layout, by_node as hsdp, expert_data_ranks, expert_shard_ranks, fields_but,
    rank_expert_params, rank_params, streamed_element, uses_master_weights,
)
from .overlap import Exposure, exposed_tp
from .zero3 import zero3_gathers, zero3_gathers_per_unit, zero3_shard_group

REDUCTION_READS = fields_but("sp", "micro_batch", "compress", *SETTING_NAMES)
"""What ``_reduction`` reads (Note [planner caches]): the placement, the degrees, ZeRO."""
PIPELINE_READS = fields_but("zero", "compress")
"""What ``_pipeline`` reads: all but the data-parallel side."""
BLOCK_READS = fields_but("dp", "pp", "chunks", "schedule", "zero", "compress", *SETTING_NAMES)
"""What ``block_costs`` reads besides the block's settings (its ``key``)."""

OVERLAP_BLOCKS = 4
"""Blocks in a row the overlap replay runs (the per-block exposure is settled by then)."""

OPS_PER_LAYER = {
    (Accounting.PARC, Arch.GPT): 24,
    (Accounting.PARC, Arch.LLAMA): 46,
    (Accounting.MEGATRON, Arch.GPT): 14,
    (Accounting.MEGATRON, Arch.LLAMA): 16,
}
"""Ops dispatched by one block's forward (backward: twice as many)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TimeBreakdown:
    step: float
    """Seconds per optimizer step."""
    compute: float
    """Busy time of the busiest rank: forward, backward, recompute, optimizer."""
    exposed_comm: float
    """Communication nothing hides: tp/sp, data-parallel, pipeline messages."""
    bubble: float
    """Pipeline idle time: makespan − busy time (0 without a pipeline)."""
    tp_comm: float
    dp_comm: float
    pp_comm: float
    """Each collective kind's total per step, hidden or not."""
    ep_comm: float = 0.0
    """The expert all-to-alls (and their tp gathers) per step, hidden or not."""
    model_flops: float
    """Model FLOPs of one step over all ranks (6N + 12·L·H·Q·T per token, no recompute)."""


def model_flops_per_token(spec: Spec) -> float:
    """PaLM's 6·N + 12·L·H·Q·T, N the matmul weights: the model description's count
    (``runtime/layout/model_desc.py``), which the trainer's MFU uses too (``runtime/train/metrics.py``)."""
    return spec.model.desc.flops_per_token()


@functools.lru_cache(maxsize=1024)
def _block_gemms(model: ModelSpec, tp: int) -> tuple[tuple[int, int], ...]:
    """(out, in) of each linear weight of a block on one tp rank (model_desc.py): q, k, v,
    o, then the MLP's."""
    block = model_counts.typical_block(model.desc)
    return tuple(m.weight.local_shape(tp) for m in block.modules if m.layer == LINEAR)


_gemm = gemm_time  # cost/hardware.py: one (m × k)·(k × n) product's seconds


def _block_forward(spec: Spec, layout: Layout, hw: Hardware, accounting: Accounting, tokens: float):
    """(all of one block's forward, its attention core's forward, its core's backward) in
    seconds, on ``tokens`` tokens. parc's core on a GPU preset is flash attention at its
    own rates (Note [flash attention's rate], cost/hardware.py); else two GEMMs at the
    ramp of the head dim, backward twice the forward."""
    m, t = spec.model, layout.tp
    # Note [2D tp costs]: heads and ffn split over a row's C ranks, the hidden state over R
    # (every rank of a column repeats its heads' attention); 1D: R = 1, C = tp
    R, t = layout.tp_grid
    # a MoE block's MLP is its experts, streamed on their routed rows (cost/experts.py): the
    # dense MLP's elementwise work is only the dense blocks' (moe_every > 1), never both
    dense = 1.0 - moe_share(spec)
    C, D, F = m.hidden, m.head_dim, m.ffn / t * dense
    gemms = sum(_gemm(hw, tokens, rows, columns) for rows, columns in _block_gemms(m, layout.tp))
    sequences, s = tokens / m.seq_len, m.seq_len
    batched = sequences * m.heads / t  # attention core: (s × D)·(D × s), then (s × s)·(s × D)
    causal = 0.5 if accounting is Accounting.PARC else 1.0  # flash skips the masked blocks
    core = causal * 2 * batched * _gemm(hw, s, D, s)
    core_backward = None  # twice the whole core (its softmax streaming too), unless flash
    if eager_core(spec, layout):  # fp32 scores, weights, mask and kept weights, each written and read
        core += causal * batched * s * s * 4 * 2 * 4.0 / hw.memory_bandwidth
    elif accounting is Accounting.PARC and hw.attention is not None:
        core, core_backward = hw.attention_time(causal * 2 * batched * 2.0 * s * D * s)
    if accounting is Accounting.MEGATRON:
        whole, sharded = 14 * C, 2 * F + 4 * C / t
        elements, size = (whole / t if layout.sp else whole) + sharded, 2.0
        core += tokens * 5 * m.heads / t * s * size / hw.memory_bandwidth  # softmax, dropout on scores
    else:
        llama = m.arch is Arch.LLAMA
        whole, sharded = (30 * C, 12 * C / t + 5 * F + 4 * C / t) if llama else (14 * C, 2 * F + 4 * C / t)
        elements, size = (whole / t if layout.sp else whole / R) + sharded, streamed_element(spec)
        measured = _measured_elementwise(spec, layout, hw, tokens)
        if measured is not None:  # Note [elementwise is not a copy] (planner/profile.py)
            copies = (10 * C / t if layout.sp else 10 * C) + 4 * C / t  # residuals, views made whole
            elementwise = sum(measured) + tokens * copies * size / hw.memory_bandwidth
            ops = OPS_PER_LAYER[(accounting, m.arch)] * hw.op_overhead
            return gemms + core + elementwise + ops, core, 2.0 * core if core_backward is None else core_backward
    elementwise = tokens * elements * size / hw.memory_bandwidth
    ops = OPS_PER_LAYER[(accounting, m.arch)] * hw.op_overhead
    return gemms + core + elementwise + ops, core, 2.0 * core if core_backward is None else core_backward


def _measured_elementwise(spec: Spec, layout: Layout, hw: Hardware, tokens: float):
    """(norms, MLP activation) forward seconds of one block from a profile's per-element
    costs (measured forward + backward: a third is the forward), or None without them."""
    m = spec.model
    mode = "compiled" if getattr(getattr(spec.train, "kernels", None), "value", "compiled") == "compiled" else "eager"
    llama = m.arch is Arch.LLAMA
    norm = hw.elementwise_cost(mode, "rms_norm" if llama else "layer_norm")
    activation = hw.elementwise_cost(mode, "swiglu" if llama else "gelu")
    if norm is None or activation is None:
        return None
    norm_elements = 2 * m.hidden / (layout.tp if layout.sp else 1)
    dense = 1.0 - moe_share(spec)  # the experts' activation is cost/experts.py's
    return tokens * norm_elements * norm / 3, dense * tokens * m.ffn / layout.tp * activation / 3


def _activation_size(spec: Spec, accounting: Accounting) -> float:
    if accounting is Accounting.MEGATRON or spec.train.precision is not Precision.FP32:
        return 2.0
    return 4.0


def pipeline_element(accounting: Accounting) -> float:
    """Bytes of an activation (or its gradient) element a pipeline stage sends: parc's
    pipeline sends fp32 whatever the compute dtype (runtime/parallel/pipeline/pipeline.py);
    Megatron's, the fp16 activations."""
    return 2.0 if accounting is Accounting.MEGATRON else 4.0


def _zero3_gather_element(spec: Spec, accounting: Accounting) -> float:
    """Bytes of a gathered ZeRO-3 element: Megatron's fp16; parc's compute dtype (bf16/fp16
    parameters with fp32 masters: 2; else 4; runtime/parallel/data/fsdp.py)."""
    if accounting is Accounting.MEGATRON:
        return 2.0
    return 2.0 if uses_master_weights(spec) else 4.0


def _grad_reduce_element(spec: Spec, accounting: Accounting) -> float:
    """Bytes of a gradient element on the data-parallel wire, every zero stage: Megatron's
    fp16; parc's fp32 sums (of fp32 gradients, and of bf16/fp16 ones: master.py), or bf16
    under ``grad_reduce = bf16`` (dp.py's buckets, zero.py's Note [bf16 reduction under
    ZeRO]: ZeRO 1/2's buckets, ZeRO-3's reduce-scatters and HSDP's sum over the replicas)."""
    return 2.0 if accounting is Accounting.MEGATRON or spec.train.grad_reduce == "bf16" else 4.0


def step_time(
    spec: Spec, layout: Layout, hw: Hardware, accounting: Accounting = Accounting.PARC, *, exact: bool = True
) -> TimeBreakdown:
    """Note [the time model]. ``exact``: the bubble from the simulated schedule (else closed form)."""
    m = spec.model
    t, d, p, v = layout.tp, layout.dp, layout.pp, layout.chunks
    (micro_batches, layers_per_chunk, passes, forward, backward, tp_forward, tp_backward, exposed_forward,
     exposed_backward, ep_moved, head_forward, head_comm, span, busy_layers, p2p, _, pipeline) = _shared_pipeline(
        spec, layout, hw, accounting, exact)
    slow = hw.contention  # ranks sharing a CPU core

    # ---- data parallel and the optimizer ----------------------------------------
    # reads: the placement, the degrees the gradients reduce over, ZeRO (Note [planner caches])
    params, tensors, expert_params, reduce, gather = shared(
        (spec, hw, accounting), "time.reduction", REDUCTION_READS(layout),
        lambda: _reduction(spec, layout, hw, accounting))
    reducing = d * layout.cp  # replicated parameters' gradients average over dp × cp
    by_node = hsdp(spec)
    expert_shard = expert_shard_ranks(layout, by_node=by_node, devices_per_node=hw.devices_per_node)
    zpasses, zforward, zbackward = zero3_passes(micro_batches, layout.slices, forward, backward)
    zero3 = zero3_gathers(
        hw, layout, params, layers_per_chunk * v, zforward, zbackward, accounting, micro_batches=zpasses,
        gather_element=_zero3_gather_element(spec, accounting), grad_element=_grad_reduce_element(spec, accounting),
        by_node=by_node, experts=(expert_params, expert_shard) if by_node else None,
        pieces=zero3_gathers_per_unit(spec, accounting),
    )
    if zero3 is not None:  # Note [ZeRO-3 gathers]: the reduce-scatters are among its collectives
        reduce = 0.0
    dp_comm = reduce + gather + (0.0 if zero3 is None else zero3.total)
    last_backward = layers_per_chunk * passes * backward
    # Megatron 2021 reduces after the flush; gloo on CPU cores takes the cores backward runs on
    overlapped = accounting is Accounting.PARC and layout.zero <= 3 and not hw.comm_on_cores
    dp_exposed = (max(0.0, reduce - last_backward) if overlapped else reduce) + gather
    compression = 0.0
    if layout.compress != "none" and reducing > 1:  # cost/compress.py, Note [powersgd cost], [topk cost]
        cost = compression_cost(spec, layout, params, hw)
        reduce = dp_comm = cost.comm_s
        compression = cost.compute_s
        dp_exposed = reduce + compression + gather  # after backward, not behind it
    dp_exposed += 0.0 if zero3 is None else zero3.exposed
    shard = zero3_shard_group(hw, layout, by_node) if layout.zero >= 3 else None
    optimizer = optimizer_time(spec, hw, accounting, params, tensors, layout, expert_params, shard=shard,
                               expert_shard=expert_shard if layout.zero >= 3 else None) * slow
    world = d * layout.cp * t * p
    # the step's two scalar all-reduces: the loss over dp, the finite check over every rank
    scalars = 2 * collective_latency(hw, "all_reduce", size=min(world, hw.devices_per_node), stride=1)
    dp_exposed += scalars if accounting is Accounting.PARC else 0.0

    step = pipeline + dp_exposed + optimizer
    compute = micro_batches * (passes * layers_per_chunk * (forward + backward) + 3.0 * head_forward) + optimizer
    compute += compression
    tp_total = micro_batches * (passes * layers_per_chunk * (tp_forward + tp_backward) + head_comm)
    exposed = (
        micro_batches * (passes * layers_per_chunk * (exposed_forward + exposed_backward) + head_comm)
        + dp_exposed
    )
    bubble = max(0.0, span - busy_layers)
    return TimeBreakdown(
        step=step,
        compute=compute,
        exposed_comm=exposed,
        bubble=bubble,
        tp_comm=tp_total,
        dp_comm=dp_comm,
        pp_comm=2 * micro_batches * v * p2p if p > 1 else 0.0,
        ep_comm=micro_batches * v * layers_per_chunk * ep_moved,
        model_flops=model_flops_per_token(spec) * spec.train.global_batch * m.seq_len,
    )


def pipeline_bound(spec: Spec, layout: Layout, hw: Hardware, accounting: Accounting = Accounting.PARC) -> float:
    """A step time the fast ``step_time`` of ``layout`` never goes below: its pipeline (the
    blocks, head and makespan; the step adds the exposed data-parallel time and the
    optimizer, neither negative). The bounded search (``planner/bounded.py``) scores a
    layout in full only when this can beat what it must rank."""
    return _shared_pipeline(spec, layout, hw, accounting, False)[-1]


def pipeline_stage_costs(spec: Spec, layout: Layout, hw: Hardware, accounting: Accounting = Accounting.PARC):
    """``bubble.stage_costs`` of ``layout`` (unit, each virtual stage's (F, B, W)), or None for
    a kind whose order does not take them: what its exact makespan's lists are built with and
    what a build renders into train.py (Note [stage costs] in cost/bubble.py)."""
    return _shared_pipeline(spec, layout, hw, accounting, False)[-2]


def _shared_pipeline(spec: Spec, layout: Layout, hw: Hardware, accounting: Accounting, exact: bool) -> tuple:
    """``_pipeline``, shared by the layouts that agree on every field but ZeRO and
    compression (Note [planner caches])."""
    return shared((spec, hw, accounting), "time.pipeline", (exact, PIPELINE_READS(layout)),
                  lambda: _pipeline(spec, layout, hw, accounting, exact))


def _pipeline(spec: Spec, layout: Layout, hw: Hardware, accounting: Accounting, exact: bool) -> tuple:
    """``step_time``'s blocks, head and pipeline: what it reads of them, before the
    data-parallel side (neither ZeRO nor compression enters here)."""
    m = spec.model
    t, d, p, v = layout.tp, layout.dp, layout.pp, layout.chunks
    micro_batches = layout.grad_accum(spec.train.global_batch)
    tokens = layout.tokens(m.seq_len)  # this rank's: seq_len / cp of each sequence
    # runtime/layout/placement.py: the model stages (a two-way placement: p, each held twice)
    # and the chunks of a rank each micro-batch runs through (there: one of its two)
    place = placement_for(layout.schedule, p, v) if p > 1 else None
    layers_per_chunk = m.layers / (place.virtual_stages if place else p * v)
    passes = sum(place.carries(c, 0) for c in range(v)) if place else v
    size = _activation_size(spec, accounting)

    # ---- one block, one micro-batch (each distinct block setting once: Note [per-layer costs])
    slow = hw.contention  # ranks sharing a CPU core
    # one region's collective: an all-reduce, or under sp an all-gather + reduce-scatter
    # pair (on a ring the same; gloo's measured ones differ)
    kinds = ("all_gather", "reduce_scatter") if layout.sp else ("all_reduce",)
    activations = tokens * m.hidden * size
    per_collective = sum(collective_time(hw, kind, activations, size=t, stride=1) for kind in kinds)
    settings = layout.block_settings(m.layers)
    costs = {key: _shared_block_costs(spec, layout, hw, accounting, key, layers_per_chunk)
             for key in sorted(set(settings))}
    if len(costs) == 1:
        forward, backward, tp_forward, tp_backward, exposed_forward, exposed_backward, ep_moved = costs.popitem()[1]
    else:  # the mean block, weighed by how many blocks have each setting
        forward, backward, tp_forward, tp_backward, exposed_forward, exposed_backward, ep_moved = (
            sum(costs[setting][i] for setting in settings) / len(settings) for i in range(7)
        )

    # ---- the head, the embedding: last and first stage -------------------------
    rows, cols = layout.tp_grid
    head_forward = _gemm(hw, tokens, m.hidden / rows, m.padded_vocab / cols) + 6 * hw.op_overhead
    head_forward += tokens * m.padded_vocab / cols * 3 * 4.0 / hw.memory_bandwidth  # softmax, loss
    head_forward *= slow
    head_comm = 2 * per_collective  # vocab-parallel embedding forward, head input backward
    if accounting is Accounting.PARC:  # the vocab-sharded loss: max, sum and target logit per row
        head_comm += 3 * collective_time(hw, "all_reduce", tokens * 4.0, size=t, stride=1)
    grid_head = grid_head_comm(spec, layout, hw, tokens=tokens, size=size)  # Note [2D tp costs]
    head_comm = head_comm if grid_head is None else grid_head
    head = 3.0 * head_forward + head_comm

    # ---- the pipeline -------------------------------------------------------------
    chunk_forward = layers_per_chunk * (forward + exposed_forward)
    chunk_backward = layers_per_chunk * (backward + exposed_backward)
    s = layout.slices  # token slices: a slice's share of the compute, and its own smaller messages
    sent = pipeline_element(accounting)
    message = tokens * m.hidden * sent / (t if layout.sp else rows) / s
    p2p = collective_time(hw, "send_recv", message, size=2, stride=t * layout.cp * d) if p > 1 else 0.0
    if p > 1:  # cost/compress.py: the pipeline's messages compressed, if they are
        p2p, compressing = pipeline_messages(spec, hw, p2p, rows=round(message / sent / m.hidden), stages=p,
                                             stride=t * layout.cp * d)
        chunk_backward += compressing * s
    costs = stage_costs(layout.schedule, stages=p, chunks=v, forward=chunk_forward, backward=chunk_backward,
                        head_forward=head_forward)  # a kind ordered by them (bubble.py, Note [stage costs])
    span = makespan(
        layout.schedule, stages=p, micro_batches=micro_batches, chunks=v,
        forward=chunk_forward / s, backward=chunk_backward / s, comm=p2p, exact=exact, slices=s,
        slice_scale=slice_scales(spec, s), costs=costs, head=3.0 * head_forward,
    )
    busy_layers = micro_batches * passes * (chunk_forward + chunk_backward)
    pipeline = span + micro_batches * head
    return (micro_batches, layers_per_chunk, passes, forward, backward, tp_forward, tp_backward, exposed_forward,
            exposed_backward, ep_moved, head_forward, head_comm, span, busy_layers, p2p, costs, pipeline)


def _reduction(spec: Spec, layout: Layout, hw: Hardware, accounting: Accounting) -> tuple:
    """Pipeline rank 0's (elements, tensors, expert elements) and its gradient reduction and
    ZeRO 1/2 gather, seconds, before ZeRO-3 or compression replace them (``step_time``)."""
    m, t, d = spec.model, layout.tp, layout.dp
    params, tensors = rank_params(m, layout, 0)
    expert_params = rank_expert_params(m, layout, 0)  # split over ep: reduced over edp
    dense_params = params - expert_params
    grad_size = _grad_reduce_element(spec, accounting)
    grads = dense_params * grad_size
    reduce = gather = 0.0
    reducing = d * layout.cp  # replicated parameters' gradients average over dp × cp
    if reducing > 1:
        # parc: zero 0, 1 and 2 all-reduce gradient buckets during backward. Megatron's
        # zero 2 (and zero 3) reduce-scatter.
        scatter = layout.zero >= 3 or (layout.zero == 2 and accounting is Accounting.MEGATRON)
        reduce = collective_time(hw, "reduce_scatter" if scatter else "all_reduce", grads, size=reducing, stride=t)
        if 1 <= layout.zero <= 2:
            gather = collective_time(hw, "all_gather", dense_params * 4.0, size=reducing, stride=t)
    reduce += expert_reduce(hw, layout, expert_params, grad_size)
    if layout.pp > 1 and placement_for(layout.schedule, layout.pp, layout.chunks).replica(0) is not None:
        # stages held twice (Note [stage replicas]): the gradients summed with the partner's, a pipeline rank
        # away, whole or, under ZeRO-3, as fp32 shards once a step (Note [ZeRO-3 over stage replicas])
        replicas = params / reducing * 4.0 if layout.zero >= 3 and reducing > 1 else params * grad_size
        reduce += collective_time(hw, "all_reduce", replicas, size=2, stride=t * reducing)
    if 1 <= layout.zero <= 2 and expert_params:  # the experts' slices gathered over edp
        gather += collective_time(hw, "all_gather", expert_params * 4.0, size=expert_data_ranks(layout),
                                  stride=layout.expert_folds)
    return params, tensors, expert_params, reduce, gather


def _shared_block_costs(spec: Spec, layout: Layout, hw: Hardware, accounting: Accounting, key: tuple,
                        layers_per_chunk: float) -> tuple:
    """``block_costs``, computed once for the layouts that agree on what it reads (every field
    but dp, pp, the schedule and its chunks, ZeRO and compression; the block's settings,
    the blocks a chunk holds): a search's layouts differing only in those share them (Note
    [planner caches])."""
    reads = (key, layers_per_chunk, BLOCK_READS(layout))
    return shared((spec, hw, accounting), "time.block", reads,
                  lambda: block_costs(spec, layout, hw, accounting, key, layers_per_chunk=layers_per_chunk))


def block_costs(spec: Spec, layout: Layout, hw: Hardware, accounting: Accounting, key: tuple, *,
                layers_per_chunk: float) -> tuple:
    """One block with per-layer settings ``key`` (``SETTING_NAMES`` order), one micro-batch
    on one rank of ``layout`` (Note [the time model]): (forward, backward, tp forward, tp
    backward, exposed forward, exposed backward, ep moved) seconds. ``step_time`` weighs
    them over the blocks; ``cost/per_layer.py`` prices one layer of a heterogeneous layout."""
    m = spec.model
    t = layout.tp
    tokens = layout.tokens(m.seq_len)
    size = _activation_size(spec, accounting)
    slow = hw.contention  # ranks sharing a CPU core
    kinds = ("all_gather", "reduce_scatter") if layout.sp else ("all_reduce",)  # one region's collective
    activations = tokens * m.hidden * size
    per_collective = sum(collective_time(hw, kind, activations, size=t, stride=1) for kind in kinds)
    latency = sum(collective_latency(hw, kind, size=t, stride=1) for kind in kinds)
    recompute, k = (dict(zip(SETTING_NAMES, key))[name] for name in ("recompute", "overlap"))
    # k sub-batches (overlap), or S token slices: as many smaller GEMMs and op dispatches
    pieces = k * layout.slices
    sub_forward, sub_core, sub_core_backward = _block_forward(spec, layout, hw, accounting, tokens / pieces)
    forward, core = pieces * sub_forward * slow, pieces * sub_core * slow
    experts = per_slices(lambda n: moe_block(spec, layout, hw, tokens=n, k=k, size=size), tokens,
                         layout.slices)  # Note [MoE costs]; slices.py, Note [experts per slice]
    forward += experts.forward
    # backward twice the forward, but the attention core's own (flash: Note [flash attention's rate])
    backward = 2.0 * forward + pieces * slow * (sub_core_backward - 2.0 * sub_core)
    if recompute == "full":
        backward += forward
    elif recompute == "selective":
        backward += core
    tp_forward = 2 * per_collective
    tp_backward = 2 * per_collective * (2 if recompute == "full" else 1)
    grid = grid_block_comm(spec, layout, hw, tokens=tokens, size=size)  # None for 1D tp
    if grid is not None:  # Note [2D tp costs]
        tp_forward, tp_backward = grid[0], grid[1] + (grid[0] if recompute == "full" else 0.0)
    hiding = 0.0 if hw.comm_on_cores else forward  # Note [the time model]: gloo on CPU cores
    block = exposed_tp(
        tp_forward, hiding, k, latency_s=latency, blocks=min(OVERLAP_BLOCKS, max(1, round(layers_per_chunk)))
    ) if grid is None else Exposure(forward_s=grid[0], backward_s=grid[1])  # 2D: no overlap (PAR0277)
    exposed_backward = block.backward_s + (block.forward_s if recompute == "full" else 0.0)
    if layout.sp and grid is None and k == 1:
        # Note [sp inputs saved as shards] (runtime/parallel/tensor/sp_columns.py): each region's input gathered
        # again in backward, behind its input gradient's GEMMs; the Oases path (k > 1) keeps it whole
        regather = 2 * collective_time(hw, "all_gather", activations, size=t, stride=1)
        tp_backward += regather
        exposed_backward += max(0.0, regather - hiding)
    # Note [cp costs] (cost/context.py): attention's exchange over cp
    cp_forward, cp_backward, cp_moved = cp_comm(spec, layout, hw, size=size, core=core)
    recomputed = cp_forward if recompute in ("full", "selective") else 0.0
    tp_forward += cp_moved / 2
    tp_backward += cp_moved / 2 + recomputed
    recomputed += experts.exposed_forward if recompute == "full" else 0.0  # the dispatch again
    return (forward, backward, tp_forward, tp_backward,
            block.forward_s + cp_forward + experts.exposed_forward,
            exposed_backward + cp_backward + recomputed + experts.exposed_backward, experts.moved)


def compression_cost(spec: Spec, layout: Layout, params: int, hw: Hardware):
    """``cost/compress.py``'s figures for ``layout.compress`` (powersgd or topk) on pipeline rank 0."""
    if layout.compress == "topk":
        ratio = spec.parallel.compress_ratio  # the key's default under compress = auto
        return topk_cost(hw, params=params, ratio=ratio, size=layout.dp * layout.cp, stride=layout.tp)
    return powersgd_compression(spec, layout, params, hw)


def powersgd_compression(spec: Spec, layout: Layout, params: int, hw: Hardware):
    """``cost/compress.py``'s figures for pipeline rank 0 of ``layout``: its blocks' linear
    weights and the embedding (first stage) as the matrices PowerSGD factors."""
    m = spec.model
    blocks = m.layers // layout.pp
    matrices = [(n, k, blocks) for n, k in _block_gemms(m, layout.tp)]
    matrices.append((m.padded_vocab // layout.tp, m.hidden, 1))
    rank = spec.parallel.compress_rank if spec.parallel.compress == "powersgd" else RANK
    return powersgd_cost(hw, matrices, params=params, rank=rank, size=layout.dp * layout.cp, stride=layout.tp)
