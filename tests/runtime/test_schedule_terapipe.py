"""terapipe (Li et al., ICML 2021): 1F1B over the token slices of every micro-batch
(runtime/schedules/schedule_terapipe.py). Valid lists over stages 2-8, micro-batches 1-16 and
slices 2 and 4 (forwards in slice order, backwards in reverse), the in-flight bound reached
and never exceeded, and the simulated idle time equal to the closed form (p-1)(F+B)/S."""

import pytest

from parc.runtime.schedules.schedule import Op, build_schedule, in_flight_bound
from parc.runtime.schedules.schedule_sim import check_schedule, describe_rank, max_in_flight, simulate
from parc.runtime.schedules.schedule_terapipe import slice_scale, terapipe_idle

SIZES = [(p, m, s) for p in range(2, 9) for m in range(1, 17) for s in (2, 4)]


@pytest.mark.parametrize("stages,micro_batches,slices", SIZES)
def test_valid_bound_tight_and_bubble_is_the_closed_form(stages, micro_batches, slices):
    schedule = build_schedule("terapipe", stages=stages, micro_batches=micro_batches, slices=slices)
    assert check_schedule(schedule, micro_batches=micro_batches) == []  # includes no deadlock
    for rank, actions in enumerate(schedule):
        bound = in_flight_bound("terapipe", stages=stages, rank=rank, micro_batches=micro_batches, slices=slices)
        assert max_in_flight(actions) == bound  # reached, never exceeded
    # per micro-batch F = 1, B = 2, each slice a 1/S of them
    timeline = simulate(schedule, forward_time=1 / slices, backward_time=2 / slices)
    idle = timeline.makespan - 3 * micro_batches
    assert idle == pytest.approx(terapipe_idle(stages, 1, 2, slices))
    one_f_one_b = simulate(build_schedule("1f1b", stages=stages, micro_batches=micro_batches))
    assert idle == pytest.approx((one_f_one_b.makespan - 3 * micro_batches) / slices)


def test_rank_lists_pp2_two_slices():
    schedule = build_schedule("terapipe", stages=2, micro_batches=2, slices=2)
    # unit u = 2m + j; the last rank runs slice 1 of micro 0 backward first
    assert describe_rank(schedule[1]) == (
        "ra0<0 F0 ra1<0 F1 B1 sg1>0 ra2<0 F2 B0 sg0>0 ra3<0 F3 B3 sg3>0 B2 sg2>0")
    assert describe_rank(schedule[0]) == (
        "F0 sa0>1 F1 sa1>1 F2 sa2>1 rg1<1 B1 F3 sa3>1 rg0<1 B0 rg3<1 B3 rg2<1 B2")


def test_check_catches_slices_out_of_order():
    schedule = build_schedule("terapipe", stages=2, micro_batches=1, slices=2)
    swapped = [list(actions) for actions in schedule]
    backwards = [i for i, a in enumerate(swapped[0]) if a.op is Op.BACKWARD]
    i, j = backwards
    swapped[0][i], swapped[0][j] = swapped[0][j], swapped[0][i]
    problems = check_schedule(type(schedule)(swapped, schedule.placement, 2), micro_batches=1)
    assert any("reverse slice order" in p for p in problems)


def test_slices_only_for_terapipe():
    with pytest.raises(ValueError, match="whole sequences"):
        build_schedule("1f1b", stages=2, micro_batches=2, slices=2)


def test_uneven_slices_take_their_tokens_time():
    """terapipe(slices = [3, 1]) on pp 2, one micro-batch, F 1 and B 2 per mean slice:
    rank 1 runs F0 1.5..3, F1 3..3.5, B1 3.5..4.5, B0 4.5..7.5; rank 0 B1 4.5..5.5 and
    B0 7.5..10.5, where equal slices end at 9."""
    schedule = build_schedule("terapipe", stages=2, micro_batches=1, slices=2)
    assert slice_scale([3, 1]) == (1.5, 0.5)
    assert simulate(schedule, slice_scale=slice_scale([3, 1])).makespan == pytest.approx(10.5)
    assert simulate(schedule, slice_scale=slice_scale([2, 2])).makespan == pytest.approx(9.0)
    assert simulate(schedule).makespan == pytest.approx(9.0)
    # the same work, spread unevenly: every rank is busy as long as with equal slices
    uneven = simulate(build_schedule("terapipe", stages=4, micro_batches=8, slices=3),
                      slice_scale=slice_scale([16, 8, 8]))
    for events in uneven.ranks:
        assert sum(e.end - e.start for e in events) == pytest.approx(8 * 3 * (1 + 2))  # units × (F + B)
