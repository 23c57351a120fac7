"""The optimizer's share of a step: AdamW's update and the gradient-norm pass, on one rank.

Takes: ``Hardware``, the rank's parameter elements and tensors, the ``Layout`` (ZeRO and
its shard) and the spec (the model's shapes, master weights). Gives: ``optimizer_time``,
and ``update_time`` (the update alone: what bench/optimizer_cost.py checks against
``optimizer.step()``). Used by ``cost/time.py`` (``step_time``) and ``cost/per_layer.py``.

Note [the fused AdamW's cost]: every parc optimizer updates through torch's fused AdamW
kernel (runtime/optimizers/adamw.py, Note [fused AdamW on shards]): one pass that reads
each parameter element, its gradient and both moments and writes the parameter and the
moments, ``FUSED_BYTES`` = 28 an fp32 element. The parameters it updates are fp32 on every
path: under bf16/fp16 parameters they are the fp32 masters (master.py; ZeRO's master
slice), which are then read again and rounded into the 2-byte parameters,
``MASTER_BYTES`` = 6 more an element and one copy a tensor (``MasterAdamW.copy_to_model``)
or one on the slice (ZeRO 1/2's ``copy_to_model``; ZeRO-3's shards are the masters, cast
when gathered: ``cost/zero3.py``). Dispatches: each fused call costs ``CALL_OPS`` (the
step counts advanced, the scratch made and split, the kernel), and there are two a step,
one a weight-decay flag: ``optim.build_optimizer``'s two groups, ``zero.flat_adamw_``'s two
lists of runs (ZeRO 1/2 and fsdp.py's ZeRO-3 alike; experts under ZeRO a second pair).
Inside a call each tensor costs about one op (its state looked up, the kernel's loop over
tensors); ZeRO's runs are slices of the flat buffer, ``SPAN_OPS`` each (four slices and
the kernel's turn). A tensor or run whose length is not a multiple of ``ALIGN`` sends its
remainder through a padded scratch row, ``PAD_OPS`` more (its four views split and the
scratch rows sliced; the copies in and out ride on two foreach calls). Whole tensors have
a remainder as often as the typical block's do at this tp (real models' dims are
multiples of 64: none); a ZeRO slice's two ends are cut anywhere, its inner runs end at
parameters. The gradient-norm pass (``optim.clip_grad_norm_``) reads each gradient,
writes its squares and sums them: ``NORM_BYTES`` an element, ``NORM_OPS`` a tensor;
ZeRO's ``zero.global_squares`` runs on the flat slice with the tp and tied-copy masks,
``ZERO_NORM_OPS`` ops and ``ZERO_NORM_BYTES`` an element. Checked against
``optimizer.step()`` on this CPU: bench/peer_notes.md, "Fused AdamW" (the figures of
bench/optimizer_cost.py). Megatron-LM's accounting is its own fused Adam: 28 bytes an
element and 4 ops, no norm pass priced.
"""

from __future__ import annotations

import functools
import math

from parc.dsl.spec import ModelSpec, Spec
from parc.runtime.layout import model_counts

from .hardware import Hardware
from .layout import Accounting, Layout, expert_data_ranks, uses_master_weights

ALIGN = 64
"""runtime/optimizers/adamw.py's ``ALIGN`` (the planner does not import torch): every
length the fused kernel gets is a multiple of it."""
FUSED_BYTES = 28.0
"""Bytes an element of the fused update: param, grad, exp_avg, exp_avg_sq read; param
and both moments written (fp32)."""
MASTER_BYTES = 6.0
"""Bytes an element of the masters rounded into 2-byte parameters: fp32 read, bf16 written."""
CALL_OPS = 4
"""Ops of one fused call: the step counts, the scratch made and split, the kernel."""
SPAN_OPS = 2
"""Ops of a ZeRO run: its four slices of the flat buffers and the kernel's turn."""
PAD_OPS = 8
"""Ops of a remainder through the scratch row: its four views and splits."""
NORM_BYTES, NORM_OPS = 12.0, 3
"""The gradient-norm pass a tensor: squares written, then read and summed."""
ZERO_NORM_BYTES, ZERO_NORM_OPS = 40.0, 9
"""ZeRO's norm on the flat slice: squares, the tied copies masked, the tp-sharded and
replicated elements selected (indices and values written) and summed apart."""
MEGATRON_BYTES, MEGATRON_OPS = 28.0, 4


@functools.lru_cache(maxsize=256)
def block_runs(model: ModelSpec, tp: int) -> tuple[float, float]:
    """(share of tensors with a remainder, weight-decay runs a tensor) of the typical
    block's parameters on one tp rank: matrices decay, vectors do not (build_optimizer)."""
    params = [p for m in model_counts.typical_block(model.desc).modules for p in m.params]
    tails = sum(1 for p in params if p.numel(tp) % ALIGN)
    flags = [len(p.shape) >= 2 for p in params]
    runs = 1 + sum(a != b for a, b in zip(flags, flags[1:]))
    return tails / len(params), runs / len(params)


def update_time(hw: Hardware, *, elements: float, tensors: float, tails: float, calls: int, master: bool,
                zero: bool) -> float:
    """Seconds of the fused AdamW update of ``elements`` in ``tensors`` tensors (ZeRO: runs
    of a flat slice), ``tails`` of them with a remainder, in ``calls`` fused calls
    (Note [the fused AdamW's cost])."""
    moved = elements * (FUSED_BYTES + (MASTER_BYTES if master else 0.0))
    ops = calls * CALL_OPS + tensors * (SPAN_OPS if zero else 1) + tails * PAD_OPS
    if master:
        ops += 1 if zero else tensors  # the masters' copy into the parameters
    return moved / hw.memory_bandwidth + ops * hw.op_overhead


def optimizer_time(spec: Spec, hw: Hardware, accounting: Accounting, params: int, tensors: int, layout: Layout,
                   expert_params: int = 0, *, shard: int | None = None, expert_shard: int | None = None,
                   whole_step: bool = True) -> float:
    """The update and the gradient-norm pass of a rank holding ``params`` elements in
    ``tensors`` tensors (Note [the fused AdamW's cost]). ``shard``: the ranks ZeRO shards the
    dense elements over (default dp·cp; HSDP's node); ``expert_shard``: the experts' (default
    edp; HSDP's node's edp ranks). ``whole_step`` false: one layer's share of a step
    (cost/per_layer.py), without the step's fused calls or a slice's cut ends."""
    elements = params
    zero = layout.zero >= 1
    if zero:  # experts split over ep are sharded over edp (runtime/parallel/data/zero.py)
        elements = math.ceil((params - expert_params) / (shard or layout.shard_ranks))
        if expert_params:
            elements += math.ceil(expert_params / (expert_shard or expert_data_ranks(layout)))
    if accounting is Accounting.MEGATRON:
        return elements * MEGATRON_BYTES / hw.memory_bandwidth + MEGATRON_OPS * hw.op_overhead
    share, runs = block_runs(spec.model, layout.tp)
    calls = (4 if zero and expert_params else 2) if whole_step else 0
    master = uses_master_weights(spec) and layout.zero <= 2
    if zero:
        spans = tensors * runs / (shard or layout.shard_ranks)
        ends = min(2.0, spans + 1) if whole_step else 0.0
        spans += ends / 2  # a slice cut inside a run holds a piece of it
        update = update_time(hw, elements=elements, tensors=spans, tails=ends + share * spans, calls=calls,
                             master=master, zero=True)
        norm = elements * ZERO_NORM_BYTES / hw.memory_bandwidth + (ZERO_NORM_OPS if whole_step else 0) * hw.op_overhead
    else:
        update = update_time(hw, elements=elements, tensors=tensors, tails=share * tensors, calls=calls, master=master,
                             zero=False)
        norm = elements * NORM_BYTES / hw.memory_bandwidth + NORM_OPS * tensors * hw.op_overhead
    return update + norm
