"""codegen/planner/cost/overlap.py against schedules worked out by hand (Note [the overlap model])."""

from __future__ import annotations

import pytest

from parc.codegen.planner.cost.overlap import (
    Collective,
    Link,
    Stage,
    block_stages,
    collective_time,
    exposed_comm,
    exposed_tp,
)

BANDWIDTH_ONLY = Link(latency=0.0, bandwidth=1.0)


def region(compute_s, nbytes):
    """A stage whose all-reduce (2 ranks, β = 1 byte/s) takes ``nbytes`` seconds whole."""
    collective = Collective(kind="all_reduce", nbytes=nbytes)
    return Stage(compute_s=compute_s, forward=collective, backward=collective)


def test_ring_volumes():
    link = Link(latency=0.5, bandwidth=10.0)
    # all-reduce on 4 ranks: 2·3·α + 2·3/4·B/β
    assert collective_time(Collective(kind="all_reduce", nbytes=40.0), ranks=4, link=link) == pytest.approx(3 + 6)
    # all-gather / reduce-scatter: 3·α + 3/4·B/β; a sub-batch of 2 moves half, pays every α
    for kind in ("all_gather", "reduce_scatter"):
        assert collective_time(Collective(kind=kind, nbytes=40.0), ranks=4, link=link, parts=2) == pytest.approx(
            1.5 + 1.5
        )
    assert collective_time(Collective(kind="all_reduce", nbytes=40.0), ranks=1, link=link) == 0.0


def test_none_exposes_every_collective():
    # 2 stages of 1 s compute, each all-reduce 0.5 s (2 ranks: B/β)
    stages = [region(1.0, 0.5), region(1.0, 0.5)]
    got = exposed_comm(stages, sub_batches=1, ranks=2, link=BANDWIDTH_ONLY)
    assert got.forward_s == pytest.approx(1.0)
    assert got.backward_s == pytest.approx(1.0)  # the plain layers block before the weight grads


def test_two_sub_batches_hide_all_but_the_last_share():
    # per sub-batch: compute 0.5 s, all-reduce 0.25 s. Forward: stage 0 sub 0 ends at 0.5
    # (comm 0.5-0.75), sub 1 at 1.0 (1.0-1.25), stage 1 sub 0 at 1.5 (1.5-1.75), sub 1 at
    # 2.0 (2.0-2.25): the stream ends at 2.25 after 2 s of compute. Backward: each
    # 0.25 s all-reduce hides behind a 0.5 s weight gradient.
    stages = [region(1.0, 0.5), region(1.0, 0.5)]
    got = exposed_comm(stages, sub_batches=2, ranks=2, link=BANDWIDTH_ONLY)
    assert got.forward_s == pytest.approx(0.25)
    assert got.backward_s == pytest.approx(0.0)
    assert got.total_s == pytest.approx(0.25)


def test_communication_bound_queue():
    # compute 1 s, all-reduce 4 s per stage. k = 2: sub-batch compute 0.5 s, comm 2 s.
    # link: 0.5-2.5, 2.5-4.5; stage 1 sub 0 waits 2.5, computes to 3.0, comm 4.5-6.5;
    # sub 1 waits 4.5, computes to 5.0, comm 6.5-8.5: ends at 8.5, compute 2 s.
    stages = [region(1.0, 4.0), region(1.0, 4.0)]
    assert exposed_comm(stages, sub_batches=1, ranks=2, link=BANDWIDTH_ONLY).forward_s == pytest.approx(8.0)
    assert exposed_comm(stages, sub_batches=2, ranks=2, link=BANDWIDTH_ONLY).forward_s == pytest.approx(6.5)


def test_latency_bound_link_gets_worse():
    # every all-reduce is 2·α = 1 s of latency and no volume: sub-batches pay it twice
    link = Link(latency=0.5, bandwidth=1e30)
    stages = [region(0.0, 1.0), region(0.0, 1.0)]
    assert exposed_comm(stages, sub_batches=1, ranks=2, link=link).forward_s == pytest.approx(2.0)
    assert exposed_comm(stages, sub_batches=2, ranks=2, link=link).forward_s == pytest.approx(4.0)


def test_sequence_parallel_blocking_gather():
    # SP: the norm stage (no compute) launches a 0.5 s all-gather; the main stage (1 s)
    # a 0.5 s reduce-scatter; its backward blocks on a 0.5 s all-gather, then the
    # input grad (1 s), a 0.5 s reduce-scatter, the weight grads (1 s).
    gather = Collective(kind="all_gather", nbytes=1.0)  # 2 ranks: (1/2)·B/β = 0.5 s
    scatter = Collective(kind="reduce_scatter", nbytes=1.0)
    stages = [Stage(compute_s=0.0, forward=gather), Stage(compute_s=1.0, forward=scatter, backward=scatter,
                                                          blocking=gather)]
    none = exposed_comm(stages, sub_batches=1, ranks=2, link=BANDWIDTH_ONLY)
    assert none.forward_s == pytest.approx(1.0) and none.backward_s == pytest.approx(1.0)
    # k = 2: gathers 0-0.25 and 0.25-0.5 (norms take no time); sub 0 waits 0.25,
    # computes to 0.75, scatters 0.75-1.0; sub 1 computes 0.75-1.25, scatters
    # 1.25-1.5: ends at 1.5 after 1 s of compute.
    split = exposed_comm(stages, sub_batches=2, ranks=2, link=BANDWIDTH_ONLY)
    assert split.forward_s == pytest.approx(0.5)
    # backward per sub-batch: blocking gather 0.25, input grad 0.5, scatter hidden: 2 × 0.25
    assert split.backward_s == pytest.approx(0.5)


def test_block_stages_and_the_planner_seam():
    stages = block_stages(micro_batch=2, seq_len=8, hidden=16, ffn=64, heads=2, kv_heads=2, arch="gpt", tp=2,
                          sequence_parallel=False, flops_per_s=1e6)
    assert len(stages) == 2 and all(s.forward.nbytes == 2 * 8 * 16 * 4 for s in stages)
    # attention: q,k,v 2·16·16·(2+4)·8 + products 4·2·64·2·8 + o 2·16·16·16, over tp 2
    assert stages[0].compute_s == pytest.approx((24576 + 8192 + 8192) / 2 / 1e6)
    assert stages[1].compute_s == pytest.approx(2 * 2 * 16 * 16 * 64 / 2 / 1e6)
    sp = block_stages(micro_batch=2, seq_len=8, hidden=16, ffn=64, heads=2, kv_heads=2, arch="llama", tp=2,
                      sequence_parallel=True, flops_per_s=1e6)
    assert [s.forward.kind for s in sp] == ["all_gather", "reduce_scatter"] * 2
    # the seam: one block of 2 s compute and 1 s of all-reduces, as test 2 above
    assert exposed_tp(1.0, 2.0, 1).forward_s == pytest.approx(1.0)
    assert exposed_tp(1.0, 2.0, 2).forward_s == pytest.approx(0.25)
    assert exposed_tp(0.0, 2.0, 2).total_s == 0.0
