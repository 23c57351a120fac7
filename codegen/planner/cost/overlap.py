"""The exposed tensor-parallel communication of ``overlap = none`` and ``sub_batch(k)``.

Takes: the stages of a micro-batch's blocks (compute time, the collective after it,
the gradient collectives of its backward) and an α–β link. Gives: ``exposed_comm``
(forward and backward seconds per micro-batch that no compute hides) for any number
of sub-batches, ``block_stages`` (the stages of a GPT/Llama block from its sizes and
a FLOP rate) and ``exposed_tp`` (one block, from its totals: what the planner's
``codegen/planner/cost/time.py`` calls). Before: ``cost/comm.py`` (the ring), ``cost/hardware.py``
(``Link``). After: the planner's time model, ``bench/overlap.py``.

Note [the overlap model]: it replays the schedule of ``runtime/parallel/tensor/overlap.py`` on two
resources, the compute stream and one communication link (collectives run one at a
time, in launch order).
- Forward (Note [the sub-batch schedule]): stage s of sub-batch i waits its own
  previous collective, computes compute_s / k, and launches its collective of
  bytes / k; so sub-batch i's collective hides behind sub-batch i+1's compute, and
  the last sub-batch's behind stage s+1 of sub-batch 0. After the last stage every
  collective is waited. With k = 1 every collective is waited right after its
  launch: all of it is exposed.
- Backward (Note [overlap in backward]): the engine walks the stages backwards,
  sub-batch k−1 first. A stage's backward is 2 × its forward compute: first the
  input gradient (half), then the weight gradients (half). Its gradient
  collective (the column-parallel input's all-reduce, or reduce-scatter under SP)
  is launched after the input gradient and waited after the weight gradients when
  k > 1 (Megatron's overlap); with k = 1 (the plain layers) it blocks before them.
  A ``blocking`` gradient collective (SP: the all-gather of the row-parallel output's
  gradient) is waited at once in both modes.
- Collective times (ring, n ranks, B bytes): all-reduce 2(n−1)·α + 2(n−1)/n·B/β;
  all-gather and reduce-scatter (n−1)·α + (n−1)/n·B/β. A sub-batch's collective
  moves B/k bytes but pays the whole latency: sub-batching does not pay off on a
  latency-bound link.
exposed = the stream's finishing time − its compute time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from parc.runtime.layout.model_desc import ModelConfig, describe

from .comm import ring_time
from .hardware import Link


@dataclass(frozen=True, slots=True, kw_only=True)
class Collective:
    kind: str
    """``all_reduce``, ``all_gather`` or ``reduce_scatter``."""
    nbytes: float
    """The buffer of the whole micro-batch (for ``all_gather``: the gathered result)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Stage:
    """Compute between two collectives of one micro-batch, and what follows it."""

    compute_s: float
    """Forward seconds for the whole micro-batch."""
    forward: Collective | None = None
    """Launched after the stage; the next stage waits it."""
    backward: Collective | None = None
    """Gradient collective overlapping the weight gradients (Megatron) when k > 1."""
    blocking: Collective | None = None
    """Gradient collective the backward waits at once (SP's all-gather)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Exposure:
    forward_s: float
    backward_s: float

    @property
    def total_s(self) -> float:
        return self.forward_s + self.backward_s


def collective_time(collective: Collective | None, *, ranks: int, link: Link, parts: int = 1) -> float:
    """Seconds for one sub-batch's share (``nbytes / parts``) of ``collective`` on a ring."""
    if collective is None:
        return 0.0
    return ring_time(collective.kind, collective.nbytes / parts, ranks=ranks, link=link)


def exposed_comm(stages: Sequence[Stage], *, sub_batches: int, ranks: int, link: Link) -> Exposure:
    """Exposed communication of one micro-batch through ``stages``; Note [the overlap model]."""
    if sub_batches < 1:
        raise ValueError(f"sub_batches must be at least 1, not {sub_batches}")
    k = sub_batches

    def time(collective):
        return collective_time(collective, ranks=ranks, link=link, parts=k)

    # forward: the wavefront
    clock, link_free, compute = 0.0, 0.0, 0.0
    done = [0.0] * k  # when each sub-batch's last collective finishes
    for stage in stages:
        for i in range(k):
            clock = max(clock, done[i])  # wait sub-batch i's previous collective
            clock += stage.compute_s / k
            compute += stage.compute_s / k
            if stage.forward is not None:
                start = max(clock, link_free)
                link_free = done[i] = start + time(stage.forward)
    clock = max([clock, *done])
    forward = clock - compute

    # backward: stages in reverse, sub-batch k−1 first
    clock, link_free, compute = 0.0, 0.0, 0.0
    for stage in reversed(stages):
        for _ in range(k):
            if stage.blocking is not None:
                start = max(clock, link_free)
                clock = link_free = start + time(stage.blocking)
            clock += stage.compute_s / k  # the input gradient
            start = max(clock, link_free)
            end = link_free = start + time(stage.backward)
            if k == 1:
                clock = max(clock, end)  # the plain layers block here
            clock += stage.compute_s / k  # the weight gradients
            clock = max(clock, end)
            compute += 2 * stage.compute_s / k
    return Exposure(forward_s=forward, backward_s=clock - compute)


def block_stages(
    *, micro_batch: int, seq_len: int, hidden: int, ffn: int, heads: int, kv_heads: int, arch: str,
    tp: int, sequence_parallel: bool, flops_per_s: float, bytes_per_element: int = 4, head_dim: int | None = None,
) -> tuple[Stage, ...]:
    """The stages of one GPT/Llama block on one tp rank, as ``runtime/parallel/tensor/overlap.py`` runs them.

    Compute is the block's matmul FLOPs and the attention products (model_desc.py's
    BlockDesc; ``head_dim``: None for hidden / heads) at ``flops_per_s``; every collective carries the (micro_batch, seq_len,
    hidden) activations.
    """
    block = describe(ModelConfig(
        arch=arch, layers=1, hidden=hidden, heads=heads, kv_heads=kv_heads, ffn=ffn, vocab=1, padded_vocab=1,
        seq_len=seq_len, head_dim=head_dim,
    )).blocks[0]  # runtime/layout/model_desc.py: the block's shapes
    tokens = micro_batch * seq_len
    attention = 2 * tokens * block.matmul_weights("attn") + tokens * block.core_flops_per_token(seq_len)
    mlp = 2 * tokens * block.matmul_weights("mlp")
    activations = Collective(kind="all_reduce", nbytes=tokens * hidden * bytes_per_element)
    stages = []
    for flops in (attention, mlp):
        compute = flops / tp / flops_per_s
        if not sequence_parallel:
            stages.append(Stage(compute_s=compute, forward=activations, backward=activations))
            continue
        gather = Collective(kind="all_gather", nbytes=activations.nbytes)
        scatter = Collective(kind="reduce_scatter", nbytes=activations.nbytes)
        stages.append(Stage(compute_s=0.0, forward=gather))  # the norm: negligible compute
        stages.append(Stage(compute_s=compute, forward=scatter, backward=scatter, blocking=gather))
    return tuple(stages)


def exposed_tp(comm_s: float, compute_s: float, sub_batches: int, *, latency_s: float = 0.0, blocks: int = 1) -> Exposure:
    """Exposed tp seconds per block, forward and backward, from one block's totals.

    ``comm_s``: the block's two all-reduces of the whole micro-batch (one direction),
    each paying ``latency_s`` that does not shrink with sub-batches; ``compute_s``:
    the block's forward compute (backward: twice it, Note [the overlap model]). Each
    block is two equal stages, each followed by one all-reduce; ``blocks`` of them in
    a row, so the last block's collectives can hide behind the next block's start.
    This is the planner's seam (``codegen/planner/cost/time.py``).
    """
    if comm_s <= 0:
        return Exposure(forward_s=0.0, backward_s=0.0)
    latency = min(latency_s, comm_s / 2)
    # one all-reduce on 2 ranks takes 2·α + bytes/β: with β = 1, α = latency / 2 and
    # bytes = comm_s / 2 − latency, it takes comm_s / 2
    link = Link(latency=latency / 2, bandwidth=1.0)
    share = Collective(kind="all_reduce", nbytes=comm_s / 2 - latency)
    region = Stage(compute_s=compute_s / 2, forward=share, backward=share)
    whole = exposed_comm((region, region) * blocks, sub_batches=sub_batches, ranks=2, link=link)
    return Exposure(forward_s=whole.forward_s / blocks, backward_s=whole.backward_s / blocks)
