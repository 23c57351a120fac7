"""chimera (Li & Hoefler, SC21): two 1F1B pipelines over the same stages in opposite
directions. Valid lists over even stages 2-8 and micro-batches 1-16 (each micro-batch
through one pipeline only), the in-flight bound reached and never exceeded, and a
bubble equal to the paper's formula with F = B, and to (p-2)·B with B > F
(runtime/schedules/schedule_chimera.py, Note [Chimera's bubble])."""

import pytest

from parc.runtime.layout.placement import Placement
from parc.runtime.schedules.schedule import Op, build_schedule, in_flight_bound
from parc.runtime.schedules.schedule_chimera import chimera_idle
from parc.runtime.schedules.schedule_sim import check_schedule, describe_rank, max_in_flight, simulate

SIZES = [(stages, micro_batches) for stages in (2, 4, 6, 8) for micro_batches in range(1, 17)]


def test_chimera_placement_pairs_rank_r_with_p_minus_1_minus_r():
    place = Placement("chimera", 4, 2)
    assert [place.stages_of(r) for r in range(4)] == [(0, 3), (1, 2), (2, 1), (3, 0)]
    assert place.virtual_stages == 4  # stages of each pipeline
    assert place.following(0, 0) == (1, 0) and place.following(3, 1) == (2, 1)  # down, and up
    assert place.previous(0, 1) == (1, 1) and place.following(0, 1) is None  # rank 0 ends the up pipeline
    assert [place.carries(c, m) for m in range(2) for c in range(2)] == [True, False, False, True]
    assert [place.replica(c) for c in range(2)] == [0, 1]  # Note [stage replicas]: the up pipeline's is the copy
    assert Placement("v", 4, 2).replica(1) is None and Placement("interleaved", 4, 2).replica(1) is None
    with pytest.raises(ValueError, match="even number of ranks"):
        Placement("chimera", 3, 2)


@pytest.mark.parametrize("stages,micro_batches", SIZES)
def test_valid_no_deadlock_and_bound_is_tight(stages, micro_batches):
    schedule = build_schedule("chimera", stages=stages, micro_batches=micro_batches, chunks=2)
    assert check_schedule(schedule, micro_batches=micro_batches, chunks=2) == []  # includes no deadlock
    for rank, actions in enumerate(schedule):
        bound = in_flight_bound("chimera", stages=stages, rank=rank, micro_batches=micro_batches, chunks=2)
        assert max_in_flight(actions) == bound  # reached, never exceeded
        forwards = [a for a in actions if a.op is Op.FORWARD]
        assert len(forwards) == micro_batches  # each micro-batch once, through one of the two chunks
        assert all(a.chunk == a.micro % 2 for a in forwards)


@pytest.mark.parametrize("stages,micro_batches", SIZES)
def test_bubble_is_the_papers_formula(stages, micro_batches):
    # schedule_chimera, Note [Chimera's bubble]. Li & Hoefler's (p-2)(F+B)/2 per rank,
    # derived with equal forward and backward slots, is met exactly with F = B at every
    # even M >= p; with B = 2F (the paper's practice) the waits are backward-sized:
    # (p-2)·B exactly when M is a multiple of p, never more at even M >= p. Never more
    # than 1F1B's (p-1)(F+B) (odd M: one pipeline has one micro-batch more).
    p, m = stages, micro_batches
    schedule = build_schedule("chimera", stages=p, micro_batches=m, chunks=2)
    for backward in (1.0, 2.0):
        idle = simulate(schedule, forward_time=1.0, backward_time=backward).makespan - (1 + backward) * m
        assert idle <= (p - 1) * (1 + backward)
        if m >= p and m % 2 == 0:
            assert idle <= chimera_idle(p, 1.0, backward)
            if backward == 1.0 or m % p == 0:
                assert idle == chimera_idle(p, 1.0, backward)
    assert chimera_idle(p, 1.0, 1.0) == (p - 2) * (1.0 + 1.0) / 2  # the paper's, for F = B


def test_rank_lists_pp2():
    schedule = build_schedule("chimera", stages=2, micro_batches=4, chunks=2)
    # rank 0 holds stage 0 of the down pipeline and stage 1 (the loss) of the up one
    assert describe_rank(schedule[0], 2) == (
        "F0.0 sa0.0>1 ra1.1<1 F1.1 F2.0 sa2.0>1 B1.1 sg1.1>1 ra3.1<1 F3.1 rg0.0<1 B0.0 B3.1 sg3.1>1 rg2.0<1 B2.0")


def test_checker_catches_a_micro_batch_in_the_wrong_pipeline():
    schedule = build_schedule("chimera", stages=2, micro_batches=2, chunks=2)
    rank0 = tuple(a if a.micro != 0 else type(a)(a.op, a.micro, 1, a.peer) for a in schedule[0])
    problems = check_schedule((rank0, schedule[1]), micro_batches=2, chunks=2, placement=Placement("chimera", 2, 2))
    assert any("does not run through chunk 1" in p for p in problems)


def test_odd_stages_are_refused():
    with pytest.raises(ValueError, match="even number of stages"):
        build_schedule("chimera", stages=3, micro_batches=4, chunks=2)
