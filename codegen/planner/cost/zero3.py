"""ZeRO-3's per-unit collectives: what a step's gathers and reduce-scatters cost and expose.

Takes: ``Hardware``, a ``Layout``, a rank's elements and a block's compute. Gives:
``zero3_gathers`` (Note [ZeRO-3 gathers]), ``zero3_collective`` (one unit's all-gather or
reduce-scatter), ``zero3_shard_group`` and ``zero3_gathers_per_unit`` (how many
all-gathers one unit's gather issues, by program). Before: ``cost/comm.py``. After:
``cost/time.py`` (``step_time``), ``cost/per_layer.py``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from parc.dsl.spec import Spec
from parc.runtime.layout import model_counts
from parc.runtime.schedules.schedule import SPLIT_BACKWARD
from parc.runtime.schedules.schedule_sim import weight_share

from .comm import collective_time, ring_time
from .hardware import Hardware, Link
from .layout import Accounting, Layout, expert_data_ranks, zero3_shard_ranks

_FUSED = {"attn.q_proj": "attn.qkv", "attn.k_proj": "attn.qkv", "attn.v_proj": "attn.qkv",
          "mlp.gate_proj": "mlp.fc1", "mlp.up_proj": "mlp.fc1"}
"""Module kinds Megatron-LM fuses into one linear (its qkv; SwiGLU's gate and up)."""


def zero3_gathers_per_unit(spec: Spec, accounting: Accounting) -> int:
    """All-gathers one unit's gather issues (Note [ZeRO-3 gathers]): parc's one flat buffer
    (fsdp.py); DeepSpeed's stage 3, as SC21's ZeRO-3 rows ran it, fetches a block module by
    module (one all-gather per submodule holding parameters; Megatron fuses q, k, v and
    the gate and up projections): six a GPT block, each paying the ring's latency."""
    if accounting is Accounting.PARC:
        return 1
    modules = model_counts.typical_block(spec.model.desc).modules
    return len({_FUSED.get(module.kind, module.kind) for module in modules if module.params})



@dataclass(frozen=True, slots=True)
class Zero3Gathers:
    """One step's parameter all-gathers and gradient reduce-scatters under ZeRO-3 (Note
    [ZeRO-3 gathers])."""

    total: float
    """Seconds on the link, hidden or not."""
    exposed: float
    """Seconds nothing hides."""


def zero3_gathers(hw: Hardware, layout: Layout, params: float, blocks: float, forward: float, backward: float,
                  accounting: Accounting, *, micro_batches: int, gather_element: float, grad_element: float,
                  by_node: bool = False, experts: tuple[float, int] | None = None,
                  pieces: int = 1) -> Zero3Gathers | None:
    """Note [ZeRO-3 gathers]: every micro-batch (under a sliced schedule, every slice: ``micro_batches``
    counts the passes, cost/slices.py's Note [ZeRO-3 per slice]) gathers each of the rank's B units (a block's
    parameters; the embeddings and head are spread over them) once for forward and once
    for backward (a full recompute's rerun finds its unit gathered): all-gathers of
    g = Ψ_rank/B elements of ``gather_element`` bytes over the shard group, in ``pieces``
    all-gathers each paying the ring's (n − 1)·α (``zero3_gathers_per_unit``: parc's one
    flat buffer, DeepSpeed's six a GPT block, module by module); backward also
    reduce-scatters each unit's gradient (``grad_element`` bytes), every micro-batch, as
    Megatron/DeepSpeed's program and parc's (runtime/parallel/data/fsdp.py, Note [gradients of a unit]).
    Prefetch launches unit i+1's gather when unit i starts, so the link carries one unit's
    traffic L (forward: its gather; backward: its gather and the previous unit's
    reduce-scatter) while one unit computes (c: a block's forward, or its backward with the
    recompute): per pass the first gather and the last reduce-scatter are exposed, and each
    of the other B − 1 units exposes max(0, L − φ·c), φ = ``hw.zero3_overlap`` the share of
    a block's compute that runs under a collective at full speed (``zero3_link``: the link
    ZeRO-3's collectives cross). ``by_node`` (HSDP, ``layout.by_node``): the shard group
    is the dp·cp ranks of one node (``layout.zero3_shard_ranks``), so g and r cross the node's own
    links, and once a step the replicas (one per node) all-reduce the rank's fp32 gradient
    shard, ⌈Ψ_rank/S⌉ elements, across nodes after backward, exposed whole; with ``experts``
    (their elements of Ψ_rank, and the node's edp ranks E they shard over: fsdp.py's Note
    [experts as units]) the dense shard's replicas sum ⌈(Ψ_rank − Ψ_experts)/S⌉ and the
    experts' edp/E replicas ⌈Ψ_experts/E⌉ more. With gloo on the CPU cores
    (``comm_on_cores``) nothing hides. A split backward (zero_bubble, zero_bubble_v) gathers
    each unit a third time, for its W (fsdp.py, Note [ZeRO-3 under a split backward]:
    regathered, not kept whole from B to W; a first stage's W is its whole backward, but
    the step is paced by the other stages): B passes gather under the input-gradient
    share of the backward, W passes gather and reduce-scatter under the weight share
    (``schedule_sim.weight_share``); the gathered memory stays 1 + prefetch units."""
    if layout.zero < 3 or layout.shard_ranks <= 1:
        return None
    units = max(1.0, blocks)
    shard = zero3_shard_group(hw, layout, by_node)
    g = zero3_collective(hw, layout, "all_gather", params * gather_element / units, size=shard, pieces=pieces)
    r = zero3_collective(hw, layout, "reduce_scatter", params * grad_element / units, size=shard)
    replicas = layout.shard_ranks // shard
    mine, expert_shard = experts or (0.0, 1)
    sync = collective_time(hw, "all_reduce", math.ceil((params - mine) / shard) * grad_element, size=replicas,
                           stride=shard * layout.tp) if replicas > 1 else 0.0
    expert_replicas = expert_data_ranks(layout) // expert_shard if mine else 1
    if expert_replicas > 1:  # the experts' shards, over the edp ranks of the other nodes
        sync += collective_time(hw, "all_reduce", math.ceil(mine / expert_shard) * grad_element,
                                size=expert_replicas, stride=expert_shard * layout.expert_folds)
    split = layout.schedule in SPLIT_BACKWARD
    total = micro_batches * units * ((3 if split else 2) * g + r) + sync
    if hw.comm_on_cores:
        return Zero3Gathers(total=total, exposed=total)
    phi = hw.zero3_overlap
    ahead = g + (units - 1) * max(0.0, g - phi * forward)
    if split:  # B: a gather under the input gradients; W: a gather and a reduce-scatter under the weights'
        weights = weight_share(backward)
        back = g + (units - 1) * max(0.0, g - phi * (backward - weights))
        back += g + (units - 1) * max(0.0, g + r - phi * weights) + r
    else:
        back = g + (units - 1) * max(0.0, g + r - phi * backward) + r
    return Zero3Gathers(total=total, exposed=micro_batches * (ahead + back) + sync)


def zero3_shard_group(hw: Hardware, layout: Layout, by_node: bool) -> int:
    """``layout.zero3_shard_ranks`` on ``hw``'s nodes."""
    return zero3_shard_ranks(layout, by_node=by_node, devices_per_node=hw.devices_per_node)


def zero3_collective(hw: Hardware, layout: Layout, kind: str, nbytes: float, *, size: int | None = None,
                     pieces: int = 1) -> float:
    """Seconds of one ZeRO-3 all-gather or reduce-scatter of a unit (``nbytes`` whole)
    over the shard group (``size`` ranks, default dp·cp; Note [ZeRO-3 gathers]), issued as
    ``pieces`` collectives of ``nbytes / pieces``, each paying its latency. Within a
    node: ``collective_time``. Across
    nodes each rank's share travels at ``hw.zero3_network`` × its own port's bandwidth:
    the published ZeRO-3 throughput (tests/planner/data/zero3_sc21_table2.json) shows
    the per-unit collectives of a dp group spread over nodes reach about one port per
    GPU (``hardware.ZERO3_NETWORK``, fitted with DeepSpeed's per-module latencies), far
    from the ring's ideal of every port of the node at once (``comm.link_for``)."""
    size, stride = layout.shard_ranks if size is None else size, layout.tp
    if size * stride <= hw.devices_per_node or hw.comm_on_cores:
        return pieces * collective_time(hw, kind, nbytes / pieces, size=size, stride=stride)
    link = Link(bandwidth=hw.zero3_network * hw.inter.bandwidth, latency=hw.inter.latency)
    return pieces * ring_time(kind, nbytes / pieces, ranks=size, link=link)
