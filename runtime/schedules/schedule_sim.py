"""Run schedules on paper: the timeline, the bubble, and the checks of a schedule.

Takes: a schedule as ``schedule.build_schedule`` gives it (one tuple of ``Action`` per
pipeline rank). Gives: ``simulate`` (when each forward and backward starts and ends,
under Note [the execution model] of ``schedule``), ``bubble_fraction``,
``max_in_flight`` and ``check_schedule`` (every problem of a schedule, as text).
Pure Python. Before: ``schedule``. After: the executor's tests, the planner's bubble
model and ``parc explain``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from ..layout.placement import Placement
from .schedule import COMPUTE, RECVS, SENDS, Op, describe, message_key, remote
from .schedule_terapipe import slice_order_problems


class Deadlock(RuntimeError):
    """The lists cannot finish: every unfinished rank waits on a receive whose send never runs."""


@dataclass(frozen=True, slots=True)
class Event:
    op: Op  # FORWARD, BACKWARD or WEIGHT
    micro: int
    chunk: int
    start: float
    end: float


@dataclass(frozen=True, slots=True)
class Timeline:
    ranks: tuple[tuple[Event, ...], ...]  # per pipeline rank, its F/B events in order
    makespan: float


def splits_backward(schedule) -> bool:
    """Does the schedule run each backward as B then W (schedule, Note [B and W])?"""
    return any(action.op is Op.WEIGHT for actions in schedule for action in actions)


def weight_share(backward_time: float) -> float:
    """The W part of a whole backward, when no one says: half (F = B = W, Qi et al. 2023)."""
    return backward_time / 2


def default_placement(schedule, chunks: int | None = None) -> Placement:
    """The placement ``build_schedule`` gave the lists, else Megatron's over their ranks
    and chunks (``placement``)."""
    if getattr(schedule, "placement", None) is not None:
        return schedule.placement
    if chunks is None:
        chunks = 1 + max((a.chunk for actions in schedule for a in actions), default=0)
    return Placement("interleaved", len(schedule), chunks)


def simulate(schedule, *, forward_time: float = 1.0, backward_time: float = 2.0,
             weight_time: float | None = None, comm_time: float = 0.0,
             placement: Placement | None = None, slice_scale: tuple[float, ...] = (),
             rank_times: tuple[tuple[float, float], ...] = (), action_time=None) -> Timeline:
    """Run every rank's list in order: F takes ``forward_time`` per chunk and a whole
    backward ``backward_time``; when the schedule splits it (Note [B and W]), W takes
    ``weight_time`` of it (default half, as F = B = W of Qi et al.) and B the rest. A send
    takes no time on its rank and never waits, a receive completes at max(its rank's
    clock, the matching send's time + ``comm_time``). Raises ``Deadlock`` when the ranks
    cannot all finish (naming where each one waits). ``placement``: the schedule's
    (``placement.placement_for``); Megatron's by default. ``slice_scale`` (a sliced kind,
    ``schedule.SLICED``, with uneven slices): each slice's tokens over the mean slice's,
    scaling its unit's F, B and W (unit u is slice u % S, schedule_terapipe Note [slices
    as units]). ``rank_times``: each pipeline rank's own (forward, backward) in place of
    the two (a heterogeneous layout's stages differ: planner ``cost/per_stage.py``).
    ``action_time(rank, action)``: each compute's own time in place of all of these (a
    replay of measured computes: bench/pipe_trace.py)."""
    stages = len(schedule)
    placement = placement or default_placement(schedule)
    sent: dict[tuple, float] = {}
    clock = [0.0] * stages
    position = [0] * stages
    events: list[list[Event]] = [[] for _ in range(stages)]

    def durations(forward: float, backward: float) -> dict:
        weight = weight_share(backward) if weight_time is None else weight_time
        return {Op.FORWARD: forward, Op.BACKWARD: backward - weight if split else backward, Op.WEIGHT: weight}

    split = splits_backward(schedule)
    duration = durations(forward_time, backward_time)
    by_rank = [durations(*times) for times in rank_times] if rank_times else [duration] * stages
    progress = True
    while progress:
        progress = False
        for rank, actions in enumerate(schedule):
            while position[rank] < len(actions):
                action = actions[position[rank]]
                if action.op in RECVS:
                    key = message_key(action, rank, placement)
                    if key not in sent:
                        break  # blocked until the sender gets there
                    clock[rank] = max(clock[rank], sent.pop(key) + comm_time)
                elif action.op in SENDS:
                    key = message_key(action, rank, placement)
                    if key in sent:
                        raise ValueError(f"rank {rank} sends {key} twice")
                    sent[key] = clock[rank]
                else:
                    start = clock[rank]
                    if action_time is not None:
                        clock[rank] += action_time(rank, action)
                    else:
                        clock[rank] += by_rank[rank][action.op] * (slice_scale[action.micro % len(slice_scale)]
                                                              if slice_scale else 1.0)
                    events[rank].append(Event(action.op, action.micro, action.chunk, start, clock[rank]))
                position[rank] += 1
                progress = True
    stuck = [(rank, schedule[rank][position[rank]]) for rank in range(stages)
             if position[rank] < len(schedule[rank])]
    if stuck:
        waits = "; ".join(f"rank {rank} at {action}" for rank, action in stuck)
        raise Deadlock(f"schedule deadlocks: {waits}")
    return Timeline(tuple(tuple(e) for e in events), max(clock, default=0.0))


def bubble_fraction(timeline: Timeline) -> float:
    """Idle compute time / (ranks × makespan)."""
    if not timeline.ranks or timeline.makespan == 0:
        return 0.0
    busy = sum(e.end - e.start for events in timeline.ranks for e in events)
    return 1.0 - busy / (len(timeline.ranks) * timeline.makespan)


def max_in_flight(actions) -> int:
    """The most micro-batch-chunks of one rank's list whose forward ran and backward has
    not (its W, when the backward is split: Note [B and W])."""
    ends = Op.WEIGHT if any(action.op is Op.WEIGHT for action in actions) else Op.BACKWARD
    live = peak = 0
    for action in actions:
        if action.op is Op.FORWARD:
            live += 1
            peak = max(peak, live)
        elif action.op is ends:
            live -= 1
    return peak


def check_schedule(schedule, *, micro_batches: int, chunks: int = 1,
                   placement: Placement | None = None) -> list[str]:
    """Every problem of ``schedule`` as one line of text (an empty list: it is valid).

    Checks: each (micro, chunk) of each rank has exactly one F and one B, F first (and
    one W after its B, when the schedule splits backwards: Note [B and W]); each
    compute has its receive before it and its send after it (none on the first/last
    virtual stage), with the right peer; every send has exactly one matching receive on
    its peer and the reverse; a neighbour on the same rank (``placement``, Note
    [placements]) has no message, and its compute runs first on the rank; and the lists
    run to the end without deadlock. A sliced schedule (``schedule.SLICED``: ``micro_batches``
    micro-batches of ``schedule.slices`` units each) also runs each micro-batch's
    forwards in slice order and its backwards in reverse (schedule_terapipe, Note
    [slices as units])."""
    stages = len(schedule)
    slices = getattr(schedule, "slices", 1)
    micro_batches *= slices
    placement = placement or default_placement(schedule, chunks)
    last = placement.virtual_stages - 1
    problems: list[str] = []
    split = splits_backward(schedule)
    computes = COMPUTE if split else (Op.FORWARD, Op.BACKWARD)
    sends: Counter = Counter()
    recvs: Counter = Counter()
    for rank, actions in enumerate(schedule):
        if slices > 1:
            problems += [f"rank {rank}: {problem}" for problem in slice_order_problems(actions, slices)]
        done: dict[tuple[Op, int, int], int] = {}  # (op, micro, chunk) -> position in the list
        for index, action in enumerate(actions):
            where = f"rank {rank} #{index} {action}"
            if not (0 <= action.micro < micro_batches and 0 <= action.chunk < chunks):
                problems.append(f"{where}: micro or chunk out of range")
                continue
            if not placement.carries(action.chunk, action.micro):
                problems.append(f"{where}: micro-batch {action.micro} does not run through chunk {action.chunk}")
                continue
            if action.op in COMPUTE:
                if action.peer is not None:
                    problems.append(f"{where}: a compute action has a peer")
                if (action.op, action.micro, action.chunk) in done:
                    problems.append(f"{where}: runs twice")
                done[(action.op, action.micro, action.chunk)] = index
                if action.op is Op.BACKWARD and (Op.FORWARD, action.micro, action.chunk) not in done:
                    problems.append(f"{where}: backward before its forward")
                if action.op is Op.WEIGHT and (Op.BACKWARD, action.micro, action.chunk) not in done:
                    problems.append(f"{where}: weight gradient before its backward")
                local = _local_input(placement, rank, action)
                if local is not None and local not in done:
                    problems.append(f"{where}: runs before {local[0].name} of chunk {local[2]}, on this rank, "
                                    "that it takes its input from")
                continue
            key = message_key(action, rank, placement)
            if not 0 <= key[2] <= last:
                problems.append(f"{where}: no virtual stage {key[2]} to talk to")
                continue
            here = placement.stage(rank, action.chunk)
            line = placement.pipeline(action.chunk)
            if action.op in SENDS and action.peer != placement.holder(key[2], line)[0]:
                problems.append(f"{where}: peer should be rank {placement.holder(key[2], line)[0]}")
            neighbour = here - 1 if action.op is Op.RECV_ACT else here + 1
            if action.op in RECVS and not 0 <= neighbour <= last:
                problems.append(f"{where}: no virtual stage {neighbour} to receive from")
                continue
            if action.op in RECVS and action.peer != placement.holder(neighbour, line)[0]:
                problems.append(f"{where}: peer should be rank {placement.holder(neighbour, line)[0]}")
            (sends if action.op in SENDS else recvs)[(action.peer if action.op in SENDS else rank, key)] += 1
            # A receive feeds the compute that follows it; a send carries the compute before it.
            needs = Op.FORWARD if action.op in (Op.RECV_ACT, Op.SEND_ACT) else Op.BACKWARD
            ran = (needs, action.micro, action.chunk) in done
            if action.op in RECVS and ran:
                problems.append(f"{where}: receive after the compute that needs it")
            if action.op in SENDS and not ran:
                problems.append(f"{where}: send before the compute that produces it")
        for micro in range(micro_batches):
            for chunk in range(chunks):
                if not placement.carries(chunk, micro):  # chunk is not on micro's pipeline (Note [placements])
                    continue
                for op in computes:
                    if (op, micro, chunk) not in done:
                        problems.append(f"rank {rank}: {op.name} of micro {micro} chunk {chunk} missing")
                before = remote(placement.previous(rank, chunk), rank) is not None
                after = remote(placement.following(rank, chunk), rank) is not None
                expect = [(Op.RECV_ACT, before), (Op.SEND_ACT, after),
                          (Op.RECV_GRAD, after), (Op.SEND_GRAD, before)]
                for op, wanted in expect:
                    count = sum(1 for a in actions if (a.op, a.micro, a.chunk) == (op, micro, chunk))
                    if count != int(wanted):
                        problems.append(f"rank {rank}: {count} {op.name} of micro {micro} chunk {chunk}, "
                                        f"expected {int(wanted)}")
    for message in sorted(set(sends) | set(recvs)):
        if sends[message] != 1 or recvs[message] != 1:
            rank, key = message
            problems.append(f"message {key} to rank {rank}: {sends[message]} send(s), "
                            f"{recvs[message]} receive(s)")
    if not problems:
        try:
            simulate(schedule, placement=placement)
        except Deadlock as exc:
            problems.append(str(exc))
    return problems


def _local_input(placement: Placement, rank: int, action) -> tuple | None:
    """(op, micro, chunk) on ``rank`` whose result ``action`` (F or B) takes in memory, or None."""
    if action.op is Op.FORWARD:
        neighbour, op = placement.previous(rank, action.chunk), Op.FORWARD
    elif action.op is Op.BACKWARD:
        neighbour, op = placement.following(rank, action.chunk), Op.BACKWARD
    else:
        return None
    if neighbour is None or neighbour[0] != rank:
        return None
    return (op, action.micro, neighbour[1])


def describe_rank(actions, chunks: int = 1) -> str:
    """A rank's list as compact text (``schedule.describe`` of each action)."""
    return " ".join(describe(action, chunks) for action in actions)

