"""Pipeline schedules: every generated list is valid, its memory bound holds and is
reached, its bubble is the closed form, and the checker catches broken lists."""

from dataclasses import replace
from fractions import Fraction

import pytest

from parc.runtime.schedules.schedule import (
    Action,
    Op,
    build_schedule,
    describe,
    in_flight_bound,
    message_key,
    virtual_stage,
)
from parc.runtime.schedules.schedule_sim import (
    Deadlock,
    bubble_fraction,
    check_schedule,
    max_in_flight,
    simulate,
)

F, B = Op.FORWARD, Op.BACKWARD


def grid():
    """(kind, stages, micro_batches, chunks) for every valid size of the test grid."""
    for stages in (1, 2, 3, 4, 8):
        for micro_batches in range(1, 10):
            yield "gpipe", stages, micro_batches, 1
            yield "1f1b", stages, micro_batches, 1
            if stages >= 2 and micro_batches % stages == 0:
                for chunks in (2, 3):
                    yield "interleaved", stages, micro_batches, chunks
    for chunks in (2, 3):  # more than one group of micro-batches per chunk
        yield "interleaved", 2, 12, chunks
        yield "interleaved", 4, 16, chunks


GRID = list(grid())


def test_grid_covers_every_kind():
    assert {kind for kind, *_ in GRID} == {"gpipe", "1f1b", "interleaved"}
    assert len(GRID) > 100


@pytest.mark.parametrize("kind,stages,micro_batches,chunks", GRID)
def test_schedule_is_valid_and_its_bound_is_tight(kind, stages, micro_batches, chunks):
    schedule = build_schedule(kind, stages=stages, micro_batches=micro_batches, chunks=chunks)
    assert len(schedule) == stages
    assert check_schedule(schedule, micro_batches=micro_batches, chunks=chunks) == []
    for rank, actions in enumerate(schedule):
        bound = in_flight_bound(kind, stages=stages, rank=rank, micro_batches=micro_batches, chunks=chunks)
        assert max_in_flight(actions) == bound  # never exceeded, and reached
        if kind == "1f1b":
            assert max_in_flight(actions) <= stages - rank
        if kind == "gpipe":
            assert bound == micro_batches * chunks


@pytest.mark.parametrize("kind,stages,micro_batches,chunks", GRID)
def test_bubble_is_the_closed_form(kind, stages, micro_batches, chunks):
    # Zero communication, forward 1 and backward 2 per chunk: the pipeline fills and
    # drains once, p-1 chunk-steps of F+B per rank, against v·M of work
    # (Narayanan et al. SC21: bubble/ideal = (p-1)/(v·M)). As a fraction of the makespan
    # that is (p-1)/(v·M + p-1), for gpipe and 1f1b with v = 1.
    schedule = build_schedule(kind, stages=stages, micro_batches=micro_batches, chunks=chunks)
    timeline = simulate(schedule, forward_time=1.0, backward_time=2.0)
    closed = Fraction(stages - 1, chunks * micro_batches + stages - 1)
    assert bubble_fraction(timeline) == pytest.approx(float(closed), abs=1e-12)
    assert timeline.makespan == 3 * (chunks * micro_batches + stages - 1)
    assert all(len(events) == 2 * micro_batches * chunks for events in timeline.ranks)


def test_1f1b_rank_lists_are_megatrons():
    schedule = build_schedule("1f1b", stages=4, micro_batches=6)
    compute = [" ".join(describe(a) for a in actions if a.op in (F, B)) for actions in schedule]
    assert compute == [
        "F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5",
        "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 B4 B5",
        "F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 B5",
        "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5",
    ]
    # Receives right before their compute, sends right after.
    assert " ".join(describe(a) for a in schedule[1][:6]) == "ra0<0 F0 sa0>2 ra1<0 F1 sa1>2"
    assert " ".join(describe(a) for a in schedule[3][:5]) == "ra0<2 F0 B0 sg0>2 ra1<2"


def test_interleaved_walks_groups_of_stages_per_chunk():
    schedule = build_schedule("interleaved", stages=2, micro_batches=4, chunks=2)
    compute = [" ".join(describe(a, 2) for a in actions if a.op in (F, B)) for actions in schedule]
    assert compute == [
        # warm-up 2·(2-0-1) + (2-1)·2 = 4 forwards, then 1F1B, backwards last chunk first
        "F0.0 F1.0 F0.1 F1.1 F2.0 B0.1 F3.0 B1.1 F2.1 B0.0 F3.1 B1.0 B2.1 B3.1 B2.0 B3.0",
        "F0.0 F1.0 F0.1 B0.1 F1.1 B1.1 F2.0 B0.0 F3.0 B1.0 F2.1 B2.1 F3.1 B3.1 B2.0 B3.0",
    ]
    # The last rank's chunk 0 feeds rank 0's chunk 1, and gradients come back the same way.
    assert Action(Op.SEND_ACT, 0, 0, 0) in schedule[1]
    assert Action(Op.RECV_ACT, 0, 1, 1) in schedule[0]
    assert Action(Op.SEND_GRAD, 0, 1, 1) in schedule[0]
    assert Action(Op.RECV_GRAD, 0, 0, 0) in schedule[1]
    assert virtual_stage(1, 0, 2) + 1 == virtual_stage(0, 1, 2)


def test_interleaved_with_one_group_runs_every_forward_first():
    schedule = build_schedule("interleaved", stages=4, micro_batches=4, chunks=2)
    for rank, actions in enumerate(schedule):
        ops = [a.op for a in actions if a.op in (F, B)]
        assert ops == [F] * 8 + [B] * 8
        assert in_flight_bound("interleaved", stages=4, rank=rank, micro_batches=4, chunks=2) == 8


def test_interleaved_bound_formula():
    # min(2·(p-r-1) + (v-1)·p + 1, M·v) for M > p
    bounds = [in_flight_bound("interleaved", stages=4, rank=r, micro_batches=8, chunks=2) for r in range(4)]
    assert bounds == [11, 9, 7, 5]


def test_gpipe_runs_all_forwards_then_backwards_in_micro_order():
    schedule = build_schedule("gpipe", stages=2, micro_batches=3)
    assert [describe(a) for a in schedule[0]] == [
        "F0", "sa0>1", "F1", "sa1>1", "F2", "sa2>1", "rg0<1", "B0", "rg1<1", "B1", "rg2<1", "B2"]
    assert [describe(a) for a in schedule[1]] == [
        "ra0<0", "F0", "ra1<0", "F1", "ra2<0", "F2", "B0", "sg0>0", "B1", "sg1>0", "B2", "sg2>0"]


def test_one_stage_is_forward_backward_per_micro_batch():
    for kind in ("gpipe", "1f1b"):
        (actions,) = build_schedule(kind, stages=1, micro_batches=3)
        expected = ["F0", "F1", "F2", "B0", "B1", "B2"] if kind == "gpipe" else ["F0", "B0", "F1", "B1", "F2", "B2"]
        assert [describe(a) for a in actions] == expected


@pytest.mark.parametrize("kind,sizes,message", [
    ("interleaved", dict(stages=2, micro_batches=3, chunks=2), "divisible by stages"),
    ("interleaved", dict(stages=2, micro_batches=4, chunks=1), "chunks >= 2"),
    ("interleaved", dict(stages=1, micro_batches=4, chunks=2), "stages >= 2"),
    ("1f1b", dict(stages=0, micro_batches=4), "stages >= 1"),
    ("gpipe", dict(stages=2, micro_batches=0), "micro_batches >= 1"),
    ("1f1b", dict(stages=2, micro_batches=4, chunks=2), "one model chunk"),
    ("zero-bubble", dict(stages=2, micro_batches=4), "unknown pipeline schedule"),
])
def test_bad_sizes_raise_value_error(kind, sizes, message):
    with pytest.raises(ValueError, match=message):
        build_schedule(kind, **sizes)
    with pytest.raises(ValueError, match=message):
        in_flight_bound(kind, rank=0, **{"chunks": 1, **sizes})


def test_fewer_micro_batches_than_stages_is_allowed():
    schedule = build_schedule("1f1b", stages=4, micro_batches=2)
    assert check_schedule(schedule, micro_batches=2) == []
    assert [max_in_flight(a) for a in schedule] == [2, 2, 2, 1]


def test_message_keys_pair_sends_with_receives():
    stages = 2
    send = Action(Op.SEND_ACT, 3, 0, 1)
    recv = Action(Op.RECV_ACT, 3, 0, 0)
    assert message_key(send, 0, stages) == message_key(recv, 1, stages) == ("act", 3, 1)
    with pytest.raises(ValueError):
        message_key(Action(Op.FORWARD, 0, 0), 0, stages)


def test_communication_delays_but_never_deadlocks():
    for kind, chunks in (("gpipe", 1), ("1f1b", 1), ("interleaved", 2)):
        schedule = build_schedule(kind, stages=4, micro_batches=8, chunks=chunks)
        free = simulate(schedule)
        slow = simulate(schedule, comm_time=0.5)
        assert slow.makespan > free.makespan
        assert bubble_fraction(slow) > bubble_fraction(free)


# ---- the checker itself can fail ----------------------------------------------------


def _swap(actions, i, j):
    actions = list(actions)
    actions[i], actions[j] = actions[j], actions[i]
    return tuple(actions)


def _index(actions, op, micro, chunk=0):
    return next(i for i, a in enumerate(actions) if (a.op, a.micro, a.chunk) == (op, micro, chunk))


def test_checker_finds_a_deadlock():
    # 1f1b, 2 stages. Delay rank 0's send of micro 0's activation until after it has
    # received micro 0's gradient: every action still follows the compute it needs, but
    # rank 0 waits for a gradient that rank 1 can only make from that activation.
    schedule = build_schedule("1f1b", stages=2, micro_batches=3)
    broken = list(schedule[0])
    send = broken.pop(_index(schedule[0], Op.SEND_ACT, 0))
    broken.insert(_index(broken, B, 0) + 1, send)
    broken = (tuple(broken), schedule[1])
    problems = check_schedule(broken, micro_batches=3)
    assert len(problems) == 1 and "deadlocks" in problems[0], problems
    with pytest.raises(Deadlock, match=r"rank 0 at .*RECV_GRAD.*rank 1 at .*RECV_ACT"):
        simulate(broken)


def test_checker_finds_a_receive_after_its_compute():
    schedule = build_schedule("1f1b", stages=3, micro_batches=4)
    rank1 = schedule[1]
    recv = _index(rank1, Op.RECV_ACT, 2)
    broken = _swap(rank1, recv, recv + 1)  # F2 before ra2
    problems = check_schedule((schedule[0], broken, schedule[2]), micro_batches=4)
    assert any("receive after the compute" in p for p in problems), problems


def test_checker_finds_backward_before_forward_and_missing_messages():
    schedule = build_schedule("gpipe", stages=2, micro_batches=2)
    rank0 = [a for a in schedule[0] if a != Action(Op.SEND_ACT, 1, 0, 1)]
    problems = check_schedule((tuple(rank0), schedule[1]), micro_batches=2)
    assert any("0 SEND_ACT of micro 1" in p for p in problems), problems
    assert any("0 send(s), 1 receive(s)" in p for p in problems), problems

    rank1 = schedule[1]
    early = _swap(rank1, _index(rank1, F, 0), _index(rank1, B, 0))
    problems = check_schedule((schedule[0], early), micro_batches=2)
    assert any("backward before its forward" in p for p in problems), problems


def test_checker_finds_a_wrong_peer_and_a_duplicate():
    schedule = build_schedule("1f1b", stages=3, micro_batches=3)
    rank1 = list(schedule[1])
    i = _index(rank1, Op.SEND_ACT, 0)
    rank1[i] = replace(rank1[i], peer=0)
    problems = check_schedule((schedule[0], tuple(rank1), schedule[2]), micro_batches=3)
    assert any("peer should be rank 2" in p for p in problems), problems

    twice = schedule[0] + (Action(F, 0, 0),)
    problems = check_schedule((twice, schedule[1], schedule[2]), micro_batches=3)
    assert any("runs twice" in p for p in problems), problems


def test_each_kind_gives_what_the_schedule_table_says():
    """A kind's words (``schedule.words``: its own module's ``WORDS``) give its call in the
    spec, and ``parc explain``'s placement words exactly where the kind does not run on
    Megatron's placement; a kind of ``OWN_CLOSED_FORM`` gives ``closed_makespan``, and
    ``RUNS_WITH`` names a module of the executor's package (what the build ships)."""
    from pathlib import Path

    from parc.runtime.layout.placement import placement_for
    from parc.runtime.schedules.schedule import (
        KINDS, OWN_CLOSED_FORM, RUNS_WITH, chunks_for, kind_module, words,
    )

    for kind in KINDS:
        said = words(kind)
        assert said.doc and all(arg.minimum >= 1 for arg in said.args), kind
        megatron = placement_for(kind, 2, chunks_for(kind, 2)).kind == "interleaved"
        assert bool(said.placement) != megatron, kind
    for kind in OWN_CLOSED_FORM:
        assert kind_module(kind).closed_makespan(4, 8, 1.0, 2.0, 0.0) > 8 * 3.0, kind
    executor = Path(__file__).resolve().parents[2] / "runtime" / "parallel" / "pipeline"
    assert all((executor / f"{module}.py").is_file() for module in RUNS_WITH.values())
