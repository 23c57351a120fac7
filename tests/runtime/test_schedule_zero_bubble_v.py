"""zero_bubble_v (ZB-V, Qi et al. 2024) and stage placement as data: valid lists over
stages 2-8 and micro-batches 1-16 with the V's local hand-overs, the in-flight bound
reached and never exceeded, and a bubble below ZB-H1's at the same memory; with each
virtual stage's own costs, valid lists for any integer costs and a shorter step under them."""

import random

import pytest

from parc.runtime.layout.placement import Placement, placement_for
from parc.runtime.schedules.schedule_zbv import zero_bubble_v_bound, zero_bubble_v_orders
from parc.runtime.schedules.schedule import Op, build_schedule, in_flight_bound
from parc.runtime.schedules.schedule_sim import check_schedule, describe_rank, max_in_flight, simulate

SIZES = [(stages, micro_batches) for stages in range(2, 9) for micro_batches in range(1, 17)]


def test_megatron_placement_is_round_robin():
    place = Placement("interleaved", 4, 2)
    assert [place.stage(r, c) for c in range(2) for r in range(4)] == list(range(8))
    assert place.following(3, 0) == (0, 1) and place.previous(0, 1) == (3, 0)
    assert place.previous(0, 0) is None and place.following(3, 1) is None


def test_v_placement_goes_down_and_back_up():
    place = Placement("v", 4, 2)
    assert [place.stages_of(r) for r in range(4)] == [(0, 7), (1, 6), (2, 5), (3, 4)]
    assert all(place.holder(place.stage(r, c)) == (r, c) for r in range(4) for c in range(2))
    assert place.following(3, 0) == (3, 1)  # the turn of the V stays on the last rank
    assert place.following(1, 1) == (0, 1) and place.previous(0, 1) == (1, 1)
    assert placement_for("zero_bubble_v", 4, 2) == place
    assert placement_for("interleaved", 4, 2).kind == "interleaved"
    with pytest.raises(ValueError, match="two chunks per rank"):
        Placement("v", 4, 3)


@pytest.mark.parametrize("stages,micro_batches", SIZES)
def test_valid_no_deadlock_and_bound_is_tight(stages, micro_batches):
    schedule = build_schedule("zero_bubble_v", stages=stages, micro_batches=micro_batches, chunks=2)
    assert schedule.placement.kind == "v"
    assert check_schedule(schedule, micro_batches=micro_batches, chunks=2) == []  # includes no deadlock
    for rank, actions in enumerate(schedule):
        bound = in_flight_bound("zero_bubble_v", stages=stages, rank=rank, micro_batches=micro_batches, chunks=2)
        assert max_in_flight(actions) == bound  # reached, never exceeded
        # half a stage per chunk: at most what 1F1B's first rank holds in whole stages
        assert bound <= 2 * in_flight_bound("1f1b", stages=stages, rank=0, micro_batches=micro_batches)
        ops = [a.op for a in actions]
        assert ops.count(Op.WEIGHT) == ops.count(Op.BACKWARD) == ops.count(Op.FORWARD) == 2 * micro_batches
    # the turn of the V (stage p-1 -> p) is handed over on the last rank: no message
    last = schedule[stages - 1]
    assert not any(a.peer == stages - 1 for a in last)


@pytest.mark.parametrize("stages,micro_batches", SIZES)
def test_bubble_below_zero_bubble_h1(stages, micro_batches):
    # Same work per rank (two chunks of half a stage: F = B = W = 1 per chunk against
    # 2 per whole stage), same activation memory; the V starts rank 0's backwards while
    # the other ranks still run forwards. Qi et al. 2024 (ZB-V) report about half ZB-H1's
    # bubble: with M = p the V idles (p-1)·F per rank, ZB-H1 2(p-1)·F.
    p = stages
    zbv = simulate(build_schedule("zero_bubble_v", stages=p, micro_batches=micro_batches, chunks=2),
                   forward_time=1.0, backward_time=2.0, weight_time=1.0)
    zbh1 = simulate(build_schedule("zero_bubble", stages=p, micro_batches=micro_batches),
                    forward_time=2.0, backward_time=4.0, weight_time=2.0)
    work = 6 * micro_batches
    assert zbv.makespan - work < zbh1.makespan - work
    if micro_batches == p:
        assert zbv.makespan - work == p - 1
        assert zbh1.makespan - work == 2 * (p - 1)


def test_rank_lists_pp2():
    schedule = build_schedule("zero_bubble_v", stages=2, micro_batches=2, chunks=2)
    assert describe_rank(schedule[0], 2) == (
        "F0.0 sa0.0>1 F1.0 sa1.0>1 ra0.1<1 F0.1 B0.1 sg0.1>1 ra1.1<1 F1.1 B1.1 sg1.1>1 rg0.0<1 B0.0 "
        "W0.1 rg1.0<1 B1.0 W1.1 W0.0 W1.0")  # rank 0 holds stage 0 and the loss (stage 3)
    assert describe_rank(schedule[1], 2).startswith("ra0.0<0 F0.0 F0.1 sa0.1>0")  # F0.1 takes F0.0's output


def test_checker_catches_a_local_hand_over_out_of_order():
    schedule = build_schedule("zero_bubble_v", stages=2, micro_batches=1, chunks=2)
    rank1 = list(schedule[1])
    f0 = next(i for i, a in enumerate(rank1) if a.op is Op.FORWARD and a.chunk == 0)
    f1 = next(i for i, a in enumerate(rank1) if a.op is Op.FORWARD and a.chunk == 1)
    rank1.insert(f0, rank1.pop(f1))  # chunk 1 (stage 2) before chunk 0 (stage 1) made its input
    problems = check_schedule((schedule[0], tuple(rank1)), micro_batches=1, chunks=2,
                              placement=Placement("v", 2, 2))
    assert any("takes its input from" in p for p in problems)


def test_sizes_are_refused():
    with pytest.raises(ValueError, match="zero_bubble_v needs stages >= 2"):
        build_schedule("zero_bubble_v", stages=1, micro_batches=4, chunks=2)
    with pytest.raises(ValueError, match="runs 2 model chunks per rank"):
        build_schedule("zero_bubble_v", stages=2, micro_batches=4, chunks=1)


def plain_greedy(p: int, micro_batches: int, costs=None, reserve=False) -> tuple | None:
    """Note [ZB-V on paper] as written: each decision scans the rank's remaining lists for
    the first entry whose input has arrived. The reference ``zero_bubble_v_orders`` (Note
    [ZB-V ready queues]) must give exactly. ``costs``: (F, B, W) per virtual stage."""
    cap, last, place = zero_bubble_v_bound(p, micro_batches), 2 * p - 1, Placement("v", p, 2)
    finished, clock, in_flight, entered, waiting = {}, [0] * p, [0] * p, [0] * p, set()
    owed = [[] for _ in range(p)]
    todo = {op: [[(m, c) for m in range(micro_batches) for c in (1, 0)] for _ in range(p)] for op in "FB"}
    orders = [[] for _ in range(p)]

    def arrival(op, m, rank, c):
        stage = place.stage(rank, c)
        if op == "F":
            return 0 if stage == 0 else finished.get(("F", m, stage - 1))
        return finished.get(("F", m, stage) if stage == last else ("B", m, stage + 1))

    def choice(rank, now):
        for op in "BF":
            for m, c in todo[op][rank]:
                if (t := arrival(op, m, rank, c)) is not None and t <= now:
                    if op == "F" and in_flight[rank] >= cap - (1 if reserve and c == 0 and entered[rank] else 0):
                        break  # the oldest ready forward waits for room
                    return op, m, c
        return ("W", *owed[rank][0]) if owed[rank] else None

    unfinished = lambda: [r for r in range(p) if len(orders[r]) < 6 * micro_batches]  # noqa: E731
    while unfinished():
        rank = min(unfinished(), key=lambda r: (clock[r], r))
        step = choice(rank, clock[rank])
        if step is None:
            times = [t for op in "BF" for m, c in todo[op][rank]
                     if (t := arrival(op, m, rank, c)) is not None and t > clock[rank]]
            others = [clock[r] for r in unfinished() if r != rank]
            if not times:
                waiting.add(rank)
                if len(waiting) == len(unfinished()):
                    return None
            clock[rank] = min(times) if times else min(others) + 1 if others else clock[rank] + 1
            continue
        op, m, c = step
        waiting.clear()
        if op == "W":
            owed[rank].pop(0)
            in_flight[rank] -= 1
        else:
            todo[op][rank].remove((m, c))
            in_flight[rank] += op == "F"
            entered[rank] += (1 if c == 0 else -1) if op == "F" else 0
            if op == "B":
                owed[rank].append((m, c))
        clock[rank] += costs[place.stage(rank, c)]["FBW".index(op)] if costs else 1
        finished[(op, m, place.stage(rank, c))] = clock[rank]
        orders[rank].append(step)
    return tuple(tuple(order) for order in orders)


@pytest.mark.parametrize("stages", range(2, 9))
def test_ready_queues_are_the_plain_greedy(stages):
    """Note [ZB-V ready queues]: the same lists as the greedy that scans, p ≤ 8, M ≤ 32."""
    for micro_batches in range(1, 33):
        assert zero_bubble_v_orders(stages, micro_batches) == plain_greedy(stages, micro_batches), micro_batches


def random_costs(rng: random.Random, stages: int) -> tuple:
    return tuple(tuple(rng.randint(1, 30) for _ in "FBW") for _ in range(2 * stages))


@pytest.mark.parametrize("stages", range(2, 7))
def test_any_integer_costs_give_valid_lists(stages):
    """Note [ZB-V on paper]: a compute is ready only when its input finished by the rank's
    clock, whatever the costs: valid, deadlock-free, the bound kept, every compute once."""
    rng = random.Random(stages)
    for micro_batches in range(1, 17):
        costs = random_costs(rng, stages)
        schedule = build_schedule("zero_bubble_v", stages=stages, micro_batches=micro_batches, chunks=2, costs=costs)
        assert check_schedule(schedule, micro_batches=micro_batches, chunks=2) == [], (micro_batches, costs)
        for actions in schedule:
            assert max_in_flight(actions) <= zero_bubble_v_bound(stages, micro_batches)
            ops = [a.op for a in actions]
            assert ops.count(Op.WEIGHT) == ops.count(Op.BACKWARD) == ops.count(Op.FORWARD) == 2 * micro_batches


@pytest.mark.parametrize("stages", range(2, 6))
def test_ready_queues_are_the_plain_greedy_under_costs(stages):
    rng = random.Random(100 + stages)
    for micro_batches in range(1, 13):
        costs = random_costs(rng, stages)
        plain = plain_greedy(stages, micro_batches, costs) or plain_greedy(stages, micro_batches, costs, True)
        assert zero_bubble_v_orders(stages, micro_batches, costs) == plain


def test_costs_shorten_the_step_they_describe():
    """The bench's llama on two ranks (bench/peer_notes.md, "ZB-V against 1F1B"): the first stage
    has no B and a long W, the last holds the head. Ordered by these costs, the lists run
    shorter under them than the F = B = W order does; under F = B = W, the other way round."""
    costs = ((17, 1, 28), (17, 18, 12), (17, 18, 12), (20, 22, 11))

    def span(schedule, times):
        place = schedule.placement
        return simulate(schedule, action_time=lambda r, a: times[place.stage(r, a.chunk)]["FBW".index(a.op.value)],
                        placement=place).makespan

    plain = build_schedule("zero_bubble_v", stages=2, micro_batches=8, chunks=2)
    costed = build_schedule("zero_bubble_v", stages=2, micro_batches=8, chunks=2, costs=costs)
    assert span(costed, costs) < span(plain, costs)
    assert span(plain, ((1, 1, 1),) * 4) <= span(costed, ((1, 1, 1),) * 4)


def test_costs_are_checked():
    with pytest.raises(ValueError, match="each of its 4 virtual stages, got 3"):
        build_schedule("zero_bubble_v", stages=2, micro_batches=4, chunks=2, costs=((1, 1, 1),) * 3)
    with pytest.raises(ValueError, match="three integers >= 1"):
        build_schedule("zero_bubble_v", stages=2, micro_batches=4, chunks=2, costs=((1, 0, 1),) + ((1, 1, 1),) * 3)
    with pytest.raises(ValueError, match="three integers >= 1"):
        build_schedule("zero_bubble_v", stages=2, micro_batches=4, chunks=2, costs=((1, 1.5, 1),) + ((1, 1, 1),) * 3)
    with pytest.raises(ValueError, match="1f1b's order does not depend on the stages' costs"):
        build_schedule("1f1b", stages=2, micro_batches=4, costs=((1, 1, 1),) * 2)
