"""The pipeline's makespan, from the runtime's own schedule and timeline simulator.

Takes: the schedule (kind, stages, micro-batches, chunks) and the time of one
forward and one backward of a chunk and of one stage-to-stage message. Gives:
``makespan(..., exact=)``. Before: ``cost/time.py``. After: nothing.

Note [fast and exact bubbles]: the exact makespan runs ``runtime/schedules/schedule.py``'s
``build_schedule`` through ``runtime/schedules/schedule_sim.py``'s ``simulate`` — the very
action lists the trainer executes — memoized by (kind, stages, micro-batches, chunks,
B/F, comm/F), since the timeline scales with F. That costs milliseconds, too slow for
the thousands of layouts the search scores, so the search scores with the closed
form the schedule tests prove for zero communication, (v·M + p − 1)·(F + B), plus
2·comm per micro-batch-chunk crossing (the steady state waits for each message once
each way), and then re-scores its best candidates exactly before ranking them
(``codegen/planner/search.py``). ``parc plan`` always shows exact figures.

Note [the zero-bubble closed form]: ZB-H1 idles (p − 1)(F + B − W) per rank (Qi et al.
2023) where 1F1B idles (p − 1)(F + B + W), with B the input-gradient half and W the
weight-gradient half of a backward: the closed form is 1F1B's less (p − 1)·2W, with W
``schedule_sim.weight_share`` of the backward. The simulated lists meet it for M ≥ p and
B = W ≤ F (tests/runtime, tests/planner); otherwise the exact simulation decides.

Note [closed forms]: a kind whose own module gives its closed form
(``schedule.OWN_CLOSED_FORM``: ``closed_makespan``, from the bubble its note proves) is
scored by it. A sliced kind's (``schedule.SLICED``) F, B and comm are a slice's: its lists
are 1F1B's over M·S slices (``schedule_terapipe``, Note [slices as units]), so the 1F1B
form over M·S units holds (tests/planner).

Note [steady state]: after warm-up, every schedule here repeats a period of p
micro-batches, so the makespan is affine in M; a long schedule (M > 4p) is simulated
at 2p, 3p and 4p micro-batches and, when those three points lie on one line, extended
along it (tests/planner compares that with the full simulation); otherwise the full
schedule is simulated. The lists of one (kind, p, M, chunks) are built once and simulated
with each layout's times (``_schedule``), and ZB-V's greedy keeps its inputs in ready
queues (runtime/schedules/schedule_zbv.py, Note [ZB-V ready queues]).

Note [stage costs]: a kind that orders its computes by each virtual stage's own costs
(``schedule.STAGE_COSTS``) gets them here, from the layout's chunk times (``cost/time.py``):
every virtual stage's F is a chunk's forward and its backward a chunk's, split into B and W
by ``weight_share`` as the closed form splits it; the first stage has no input gradient (its
input is tokens), so its B is nothing and its W the whole backward; the last stage adds the
head's forward (final norm, head, loss) to its F and twice that to its backward. They are
integers in tenths of the mean compute, each at least 1 (the greedy needs every compute to
take time), from the same floats by the same rounding: the build renders them into train.py
(``codegen/passes/split_pipeline.py``) and the exact makespan builds its lists with them, so
the trainer, ``parc check`` and the planner run the same order. The exact makespan simulates
those lists with each compute at its stage's cost (in the unit) and returns the span less the
head's computes, which ``cost/time.py`` adds for every micro-batch as for every kind.
"""

from __future__ import annotations

import functools

from parc.runtime.layout.placement import PLACEMENT_OF, placement_for
from parc.runtime.schedules.schedule import (
    COMPUTE, KINDS, OWN_CLOSED_FORM, SLICED, SPLIT_BACKWARD, STAGE_COSTS, build_schedule, kind_module, words,
)
from parc.runtime.schedules.schedule_sim import simulate, weight_share
from parc.runtime.schedules.schedule_terapipe import slice_scale

from .slices import REASONS as SLICE_REASONS

REASONS = {"bubble": {
    "schedule": "the schedule's order changes the idle time ("
                + ", ".join(f"{kind} {words(kind).fills}" for kind in KINDS if words(kind).fills) + ")",
    **SLICE_REASONS,
}}
"""``planner/why.py``'s reasons for a difference in the schedule (each kind that fills the
bubble its own way says how: ``Words.fills``) or in its slices (``cost/slices.py``)."""

SHAPES = {kind: words(kind).shape for kind in KINDS if words(kind).shape}
"""``parc explain``'s words for a kind whose pipeline is not one line of stages (``Words.shape``)."""

PLACEMENTS = {PLACEMENT_OF[kind]: words(kind).placement for kind in KINDS if words(kind).placement}
"""``parc explain``'s words for where a rank's chunks sit when not Megatron's c·p + r
(by ``runtime/layout/placement.py``'s kind; the schedule table's ``Words.placement``)."""


def slice_scales(spec, slices: int) -> tuple[float, ...]:
    """Uneven token slices (``parallel.slice_lengths``), where the layout keeps their count:
    each slice's tokens over the mean's; () for equal slices."""
    lengths = spec.parallel.slice_lengths
    return slice_scale(lengths) if slices > 1 and lengths and len(lengths) == slices else ()


COST_STEPS = 10
"""Note [stage costs]: the integer costs' unit is the mean compute over this."""


def stage_costs(kind: str, *, stages: int, chunks: int, forward: float, backward: float,
                head_forward: float) -> tuple[float, tuple[tuple[int, int, int], ...]] | None:
    """(unit in seconds, each virtual stage's (F, B, W) in units) for a kind that orders by
    them (Note [stage costs]), else None. ``forward``, ``backward``: a chunk's, one micro-batch."""
    if kind not in STAGE_COSTS or stages < 2 or forward <= 0:
        return None
    n = placement_for(kind, stages, chunks).virtual_stages
    rows = []
    for v in range(n):
        f, b = (forward + head_forward, backward + 2 * head_forward) if v == n - 1 else (forward, backward)
        rows.append((f, b - weight_share(b), weight_share(b)) if v else (f, 0.0, b))
    unit = sum(map(sum, rows)) / (3 * n * COST_STEPS)
    return unit, tuple(tuple(max(1, round(x / unit)) for x in row) for row in rows)


def makespan(
    kind: str, *, stages: int, micro_batches: int, chunks: int,
    forward: float, backward: float, comm: float, exact: bool, slices: int = 1,
    slice_scale: tuple[float, ...] = (), costs: tuple | None = None, head: float = 0.0,
) -> float:
    """Seconds from the first forward to the last backward of a step on the pipeline.
    ``slices`` > 1 (a sliced kind): ``forward``, ``backward`` and ``comm`` are the mean slice's;
    ``slice_scale`` (uneven slices): each slice's tokens over the mean's, which the exact
    simulation scales its compute by (the closed form takes the mean slice). ``costs``:
    ``stage_costs``'s, for the exact makespan of a kind ordered by them, less ``head`` (the
    head's computes of one micro-batch) per micro-batch (Note [stage costs])."""
    units = micro_batches * chunks * slices
    if exact and costs is not None and stages > 1:
        unit, table = costs
        return unit * _unit_makespan(kind, stages, micro_batches, chunks, 0.0, round(comm / unit, 4),
                                     costs=table) - micro_batches * head
    if stages == 1:
        return units * (forward + backward)
    if not exact or forward <= 0:
        if kind in OWN_CLOSED_FORM:  # Note [closed forms]
            return kind_module(kind).closed_makespan(stages, micro_batches, forward, backward, comm)
        closed = (units + stages - 1) * (forward + backward)
        if kind in SPLIT_BACKWARD:  # the W passes fill the drain: Note [the zero-bubble closed form]
            closed -= (stages - 1) * 2 * weight_share(backward)
        return closed + 2.0 * comm * (units + stages - 1) / chunks
    ratio_b = round(backward / forward, 3)
    ratio_c = round(comm / forward, 4)
    return forward * _unit_makespan(kind, stages, micro_batches, chunks, ratio_b, ratio_c, slices,
                                    tuple(round(x, 4) for x in slice_scale))


@functools.lru_cache(maxsize=512)
def _unit_makespan(kind: str, stages: int, micro_batches: int, chunks: int, backward: float, comm: float,
                   slices: int = 1, scale: tuple[float, ...] = (), costs: tuple | None = None) -> float:
    """Note [steady state]: long schedules are simulated at 2p, 3p and 4p micro-batches and
    extended along the line, when the three points are on one line; else in full."""
    p = stages
    if micro_batches > 4 * p:
        a, b, c = (_simulate(kind, p, n * p, chunks, backward, comm, slices, scale, costs) for n in (2, 3, 4))
        if abs((c - b) - (b - a)) <= 1e-9 * c:
            return a + (micro_batches - 2 * p) * (b - a) / p
    return _simulate(kind, p, micro_batches, chunks, backward, comm, slices, scale, costs)


@functools.lru_cache(maxsize=512)
def _simulate(kind: str, stages: int, micro_batches: int, chunks: int, backward: float, comm: float,
              slices: int = 1, scale: tuple[float, ...] = (), costs: tuple | None = None) -> float:
    schedule = _schedule(kind, stages, micro_batches, chunks, slices if kind in SLICED else 1, costs)
    if costs is not None:  # Note [stage costs]: each compute at its virtual stage's cost
        place, ops = schedule.placement, {op: i for i, op in enumerate(COMPUTE)}
        return simulate(schedule, comm_time=comm,
                        action_time=lambda rank, a: costs[place.stage(rank, a.chunk)][ops[a.op]]).makespan
    return simulate(schedule, forward_time=1.0, backward_time=backward, comm_time=comm,
                    slice_scale=scale if kind in SLICED else ()).makespan


def stage_makespan(kind: str, *, micro_batches: int, times: tuple[tuple[float, float], ...], comm: float,
                   exact: bool) -> float:
    """``makespan`` of a one-chunk pipeline (1f1b, gpipe) whose stages differ: ``times`` is each
    stage's (forward, backward) of one micro-batch. Fast: Σ_p (F_p + B_p) + (M − 1)·max_p (F_p +
    B_p) + 2·comm per crossing — the bottleneck stage sets the pace, the others fill and drain;
    equal stages give ``makespan``'s closed form. Exact: the schedule simulated with each
    rank's times (Note [steady state] as ``makespan``)."""
    p, m = len(times), micro_batches
    if p == 1:
        return m * sum(times[0])
    if not exact or min(f for f, _ in times) <= 0:
        whole = [f + b for f, b in times]
        return sum(whole) + (m - 1) * max(whole) + 2.0 * comm * (m + p - 1)
    unit = times[0][0]
    scaled = tuple((round(f / unit, 4), round(b / unit, 3)) for f, b in times)  # as ``makespan`` rounds
    return unit * _stage_unit_makespan(kind, m, scaled, round(comm / unit, 4))


@functools.lru_cache(maxsize=512)
def _stage_unit_makespan(kind: str, micro_batches: int, times: tuple, comm: float) -> float:
    p = len(times)
    if micro_batches > 4 * p:
        a, b, c = (_simulate_stages(kind, n * p, times, comm) for n in (2, 3, 4))
        if abs((c - b) - (b - a)) <= 1e-9 * c:
            return a + (micro_batches - 2 * p) * (b - a) / p
    return _simulate_stages(kind, micro_batches, times, comm)


def _simulate_stages(kind: str, micro_batches: int, times: tuple, comm: float) -> float:
    return simulate(_schedule(kind, len(times), micro_batches, 1, 1), comm_time=comm, rank_times=times).makespan


@functools.lru_cache(maxsize=64)
def _schedule(kind: str, stages: int, micro_batches: int, chunks: int, slices: int, costs: tuple | None = None):
    """The lists of ``build_schedule``, built once for every layout that shares them: layouts
    of one (kind, p, M, chunks) differ only in the times ``simulate`` gives their actions
    (Note [steady state]), except a kind ordered by its stages' costs (Note [stage costs])."""
    return build_schedule(kind, stages=stages, micro_batches=micro_batches, chunks=chunks, slices=slices,
                          costs=costs)
