"""zero_bubble (ZB-H1, Qi et al. 2023): valid lists over stages 2-8 and micro-batches
1-16, the in-flight bound reached and never exceeded, and the paper's bubbles."""

import pytest

from parc.runtime.schedules.schedule import Op, build_schedule, in_flight_bound
from parc.runtime.schedules.schedule_sim import check_schedule, max_in_flight, simulate

SIZES = [(stages, micro_batches) for stages in range(2, 9) for micro_batches in range(1, 17)]


def idle_per_rank(timeline, micro_batches, f, b, w):
    """Each rank's idle time within the makespan (its work is M·(F + B + W))."""
    return [timeline.makespan - micro_batches * (f + b + w) for _ in timeline.ranks]


@pytest.mark.parametrize("stages,micro_batches", SIZES)
def test_valid_no_deadlock_and_bound_is_tight(stages, micro_batches):
    schedule = build_schedule("zero_bubble", stages=stages, micro_batches=micro_batches)
    assert check_schedule(schedule, micro_batches=micro_batches) == []  # includes no deadlock
    for rank, actions in enumerate(schedule):
        bound = in_flight_bound("zero_bubble", stages=stages, rank=rank, micro_batches=micro_batches)
        assert max_in_flight(actions) == bound  # reached, never exceeded
        assert bound <= in_flight_bound("1f1b", stages=stages, rank=0, micro_batches=micro_batches)
        ops = [a.op for a in actions]
        assert ops.count(Op.WEIGHT) == ops.count(Op.BACKWARD) == micro_batches


@pytest.mark.parametrize("stages,micro_batches", SIZES)
def test_bubble_is_the_papers(stages, micro_batches):
    # F = B = W = 1 (the handcrafted schedules' assumption). 1F1B runs B and W as one
    # backward: it idles (p-1)(F+B+W) per rank; ZB-H1 idles (p-1)(F+B-W) once M >= p
    # (Qi et al. 2023, section 2.1: a third of 1F1B's), and less than 1F1B always.
    f = b = w = 1.0
    zb = simulate(build_schedule("zero_bubble", stages=stages, micro_batches=micro_batches),
                  forward_time=f, backward_time=b + w, weight_time=w)
    one_f_one_b = simulate(build_schedule("1f1b", stages=stages, micro_batches=micro_batches),
                           forward_time=f, backward_time=b + w)
    p = stages
    assert idle_per_rank(one_f_one_b, micro_batches, f, b, w) == [(p - 1) * (f + b + w)] * p
    if micro_batches >= p:
        assert idle_per_rank(zb, micro_batches, f, b, w) == [(p - 1) * (f + b - w)] * p
    assert zb.makespan < one_f_one_b.makespan


def test_b_and_w_take_their_own_times():
    schedule = build_schedule("zero_bubble", stages=2, micro_batches=4)
    timeline = simulate(schedule, forward_time=1.0, backward_time=3.0, weight_time=1.0)
    lengths = {(e.op, e.end - e.start) for events in timeline.ranks for e in events}
    assert lengths == {(Op.FORWARD, 1.0), (Op.BACKWARD, 2.0), (Op.WEIGHT, 1.0)}


def test_rank_lists():
    schedule = build_schedule("zero_bubble", stages=2, micro_batches=4)
    from parc.runtime.schedules.schedule_sim import describe_rank

    assert describe_rank(schedule[0]) == (
        "F0 sa0>1 F1 sa1>1 rg0<1 B0 W0 F2 sa2>1 rg1<1 B1 W1 F3 sa3>1 rg2<1 B2 W2 rg3<1 B3 W3")
    assert describe_rank(schedule[1]) == (
        "ra0<0 F0 B0 sg0>0 ra1<0 F1 B1 sg1>0 W0 ra2<0 F2 B2 sg2>0 W1 ra3<0 F3 B3 sg3>0 W2 W3")


def test_checker_catches_a_w_before_its_b():
    schedule = build_schedule("zero_bubble", stages=2, micro_batches=2)
    rank1 = list(schedule[1])
    w = next(i for i, a in enumerate(rank1) if a.op is Op.WEIGHT)
    b = next(i for i, a in enumerate(rank1) if a.op is Op.BACKWARD and a.micro == rank1[w].micro)
    rank1[w], rank1[b] = rank1[b], rank1[w]
    problems = check_schedule((schedule[0], tuple(rank1)), micro_batches=2)
    assert any("weight gradient before its backward" in p for p in problems)
    dropped = tuple(a for a in schedule[0] if not (a.op is Op.WEIGHT and a.micro == 1))
    assert any("WEIGHT of micro 1 chunk 0 missing" in p
               for p in check_schedule((dropped, schedule[1]), micro_batches=2))


def test_one_stage_is_refused():
    with pytest.raises(ValueError, match="zero_bubble needs stages >= 2"):
        build_schedule("zero_bubble", stages=1, micro_batches=4)
