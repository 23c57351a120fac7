"""A heterogeneous layout under a pipeline: each stage's layers, the boundary messages, the makespan.

Takes: a ``Spec``, a ``Layout`` with ``layer_tp`` and pp > 1 (one chunk a rank: 1f1b,
gpipe), ``Hardware``. Gives: ``pipeline_time_memory`` (the estimate's breakdowns) and the
pieces the per-stage search prices a stage with: ``stage_bounds``, ``boundary_comm``,
``first_stage_ends``, ``last_stage_ends``. Before: ``cost/per_layer.py``. After:
``cost/estimate.py``, ``codegen/planner/layer_search.py``.

Note [per-layer layouts over a pipeline]: every stage has its own S = dp·tp ranks and its
own memory; layer i of stage p costs what it costs in one stage (Note [per-layer layout
costs]) with stage p's micro-batches in flight (``schedule.in_flight_bound``). A stage's
forward F_p and backward B_p of one micro-batch are its layers' (compute and exposed tp
collectives) plus the reshards inside it (a gather forward, a scatter's gather backward).
Activations cross a boundary at one degree d (runtime/parallel/pipeline/pipeline.py sends (MICRO_BATCH·d/TP,
T or T/d under sp, hidden); ``constraints`` PAR0255): one message costs
``boundary_comm(d)``. The makespan is the schedule's with each stage's own F_p, B_p
(``bubble.stage_makespan``: fast, Σ(F_p + B_p) + (M − 1)·max(F_p + B_p) + 2·comm per
crossing; exact, the simulated lists): the slowest stage sets the pace, so balance counts.
What is not a block is the uniform layout's: the step of U(t) at the last block's degree
less its makespan and its first stage's reduction and optimizer (``H``), plus the first
stage's own (its layers' and its embedding's at block 0's degree) — the parts of the
uniform model that happen after the flush (``cost/time.py``: stage 0's gradient
reduction, ZeRO's gathers, the optimizer); in memory, stage 0 holds U(tp[0])'s first rank
less its blocks, the last stage U(tp[-1])'s last rank less its blocks. So a layout whose
layers agree costs what the uniform one does (tests/planner/test_layer_pipeline.py).
"""

from __future__ import annotations

from dataclasses import replace

from parc.dsl.spec import Spec

from .bubble import stage_makespan
from .comm import collective_time
from .hardware import Hardware
from .layout import SETTING_NAMES, Accounting, Layout
from .memory import MemoryBreakdown, MemoryEstimate, memory
from .per_layer import (
    Cost, Stage, _memo, _uniform_estimate, embedding_cost, layer_cost, micro_batches, stage_of, transition_cost,
    uniform, working_set,
)
from .time import pipeline_element

PLAIN = ("none", 1)
"""A block with no per-layer setting (U(t)'s blocks)."""


def stage_bounds(spec: Spec, pp: int) -> tuple[tuple[int, int], ...]:
    """(start, stop) of each stage's blocks: ``parallel.stage_layers`` or an even split."""
    sizes = spec.parallel.stage_layers or (spec.model.layers // pp,) * pp
    bounds, start = [], 0
    for n in sizes:
        bounds.append((start, start + n))
        start += n
    return tuple(bounds)


@_memo
def boundary_comm(spec: Spec, stage: Stage, hw: Hardware, d: int) -> float:
    """One stage-to-stage message when the boundary's layers run at tp ``d``."""
    m = spec.model
    tokens = stage.micro_batch * d // stage.tp * m.seq_len
    message = tokens * m.hidden * pipeline_element(Accounting.PARC) / (d if stage.sp and d > 1 else 1)
    return collective_time(hw, "send_recv", message, size=2, stride=stage.ranks)


def _span(spec, stage, hw, times, d, exact) -> float:
    return stage_makespan(stage.schedule, micro_batches=micro_batches(spec, stage), times=tuple(times),
                          comm=boundary_comm(spec, stage, hw, d), exact=exact)


@_memo
def _uniform_parts(spec: Spec, stage: Stage, hw: Hardware, t: int):
    """U(t)'s fast step time breakdown, its block at rank 0, and H(t) (Note [per-layer layouts
    over a pipeline]): the step less the makespan and the first stage's post-flush work."""
    reference, _ = _uniform_estimate(spec, stage, hw, t)
    block = layer_cost(spec, stage, hw, t, PLAIN, 0)
    bounds = stage_bounds(spec, stage.pp)
    times = [((b - a) * block.forward, (b - a) * block.backward) for a, b in bounds]
    steps = micro_batches(spec, stage)
    first = (bounds[0][1] - bounds[0][0]) * block.post(steps) + embedding_cost(spec, stage, hw, t).time
    return reference, block, reference.step - _span(spec, stage, hw, times, t, False) - first


def first_stage_ends(spec: Spec, stage: Stage, hw: Hardware, t: int) -> tuple[float, MemoryBreakdown]:
    """(seconds, bytes) stage 0 adds beyond its blocks with block 0 at tp ``t``: its
    embedding's reduction and optimizer, U(t)'s first rank's memory less its blocks."""
    return embedding_cost(spec, stage, hw, t).time, _ends_memory(spec, stage, hw, t, 0)


def last_stage_ends(spec: Spec, stage: Stage, hw: Hardware, t: int) -> tuple[float, MemoryBreakdown]:
    """(seconds, bytes) the last stage adds beyond its blocks with its last block at tp ``t``:
    H(t) and U(t)'s last rank's memory less its blocks."""
    return _uniform_parts(spec, stage, hw, t)[2], _ends_memory(spec, stage, hw, t, stage.pp - 1)


@_memo
def _ends_memory(spec: Spec, stage: Stage, hw: Hardware, t: int, rank: int) -> MemoryBreakdown:
    row = memory(spec, uniform(stage, t), Accounting.PARC).per_rank[rank]
    start, stop = stage_bounds(spec, stage.pp)[rank]
    blocks = layer_cost(spec, stage, hw, t, PLAIN, rank).scaled(-(stop - start)).memory
    return MemoryBreakdown(params=row.params + blocks.params, grads=row.grads + blocks.grads,
                           optimizer=row.optimizer + blocks.optimizer,
                           activations=row.activations + blocks.activations, buffers=row.buffers + blocks.buffers)


def stage_cost(spec: Spec, stage: Stage, hw: Hardware, rank: int, tps, settings) -> tuple[Cost, float]:
    """Stage ``rank``'s blocks (``tps``, ``settings``: its layers' own) and the reshards
    between them, per step, and its largest full-recompute working set."""
    total, largest = Cost(), 0.0
    for i, (t, setting) in enumerate(zip(tps, settings)):
        total += layer_cost(spec, stage, hw, t, setting, rank)
        if i:
            total += reshard(spec, stage, hw, tps[i - 1], t)
        if dict(zip(SETTING_NAMES, setting))["recompute"] == "full":
            largest = max(largest, working_set(spec, stage, t))
    return total, largest


def reshard(spec: Spec, stage: Stage, hw: Hardware, a: int, b: int) -> Cost:
    """``transition_cost`` with its time on the micro-batch's forward (tp grows: the gather
    runs forward) or backward (tp shrinks), for the schedule."""
    cost = transition_cost(spec, stage, hw, a, b)
    if a == b:
        return cost
    each = cost.time / micro_batches(spec, stage)
    return replace(cost, forward=each if b > a else 0.0, backward=each if b < a else 0.0)


def pipeline_time_memory(spec: Spec, layout: Layout, hw: Hardware, *, exact: bool = False):
    """Note [per-layer layouts over a pipeline]: (``TimeBreakdown``, ``MemoryEstimate``)."""
    stage = stage_of(layout)
    tps, settings = layout.layer_tp, layout.block_settings(spec.model.layers)
    bounds = stage_bounds(spec, layout.pp)
    steps = micro_batches(spec, stage)
    first, last = tps[0], tps[-1]
    costs, rows = [], []
    for rank, (a, b) in enumerate(bounds):
        cost, largest = stage_cost(spec, stage, hw, rank, tps[a:b], settings[a:b])
        if a:  # a boundary whose degrees differ (not built: PAR0255) reshards as it arrives
            cost += reshard(spec, stage, hw, tps[a - 1], tps[a])
        mem = cost.memory
        for ends in ([first_stage_ends(spec, stage, hw, first)[1]] if rank == 0 else []) + (
                [last_stage_ends(spec, stage, hw, last)[1]] if rank == layout.pp - 1 else []):
            mem = (Cost(memory=mem) + Cost(memory=ends)).memory
        costs.append(cost)
        rows.append(replace(mem, buffers=mem.buffers + largest))
    d = max(tps[a - 1] for a, _ in bounds[1:])
    times = [(c.forward, c.backward) for c in costs]
    span = _span(spec, stage, hw, times, d, exact)
    reference, block, tail = _uniform_parts(spec, stage, hw, last)
    post = costs[0].post(steps) + first_stage_ends(spec, stage, hw, first)[0]
    step = span + tail + post
    busiest = max(range(layout.pp), key=lambda r: (sum(times[r]), -r))
    size = bounds[busiest][1] - bounds[busiest][0]
    compute = reference.compute + costs[busiest].compute - size * block.compute
    bubble = max(0.0, span - steps * sum(times[busiest]))
    uniform_first = (bounds[0][1] - bounds[0][0]) * block.dp_comm + embedding_cost(spec, stage, hw, last).dp_comm
    time = replace(
        reference, step=step, compute=compute, bubble=bubble, exposed_comm=step - compute - bubble,
        tp_comm=reference.tp_comm + costs[busiest].tp_comm - size * block.tp_comm,
        dp_comm=reference.dp_comm + costs[0].dp_comm + embedding_cost(spec, stage, hw, first).dp_comm - uniform_first,
        pp_comm=2 * steps * boundary_comm(spec, stage, hw, d),
    )
    peak = max(range(layout.pp), key=lambda r: (rows[r].total, -r))
    return time, MemoryEstimate(per_rank=tuple(rows), peak_rank=peak)

