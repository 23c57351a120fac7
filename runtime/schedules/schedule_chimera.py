"""Chimera (Li & Hoefler, SC21): two 1F1B pipelines over the same stages in opposite
directions, the micro-batches split between them.

Takes: pipeline ranks p (even) and micro-batches M. Gives: ``chimera_orders(p, M)``,
the compute order ``(op, micro, chunk)`` of every rank, and ``chimera_bound(p, r,
M)``, rank r's in-flight bound, ``closed_makespan`` (the planner's fast bubble) and
``WORDS`` (``schedule.Words``). Pure Python. Before: ``placement`` (chunk 0 of rank r
is stage r of the down pipeline, chunk 1 stage p-1-r of the up one; even
micro-batches go down, odd ones up). After: ``schedule.build_schedule`` adds the
sends and receives.

Note [Chimera on paper]: each pipeline alone is 1F1B: stage s of a pipeline keeps at
most min(p - s, its micro-batches) forwards ahead of their backwards. The two are
merged per rank by running them once on paper (F = 1, B = 2, the paper's
assumption): a free rank runs the ready forward of the oldest micro-batch whose
pipeline is under its 1F1B bound on this rank, else the ready backward of the oldest
micro-batch, else idles until the next input arrives (forwards first: with backwards
first the two pipelines' steady states collide and the bubble grows with M). A compute is ready when the one
it needs has *finished* by the rank's clock, so the lists are a valid execution and
deadlock-free under any timing (schedule.py, Note [the execution model]). While one
pipeline fills (its first stage on rank 0), the other's first stage on rank p-1
fills from the other end.

Note [Chimera's bubble]: Li & Hoefler's bubble ratio (D-2)/(2N+D-2) is (p-2)(F+B)/2 idle
per rank; the paper derives it counting forward and backward slots of equal length. Run
with F = B, these lists idle exactly that at every even M >= p. With B > F (B = 2F in
practice, and in the order above) each of the p-2 slots in which a rank waits is a
*backward* of the other direction, not half an F+B: the lists idle (p-2)·B when M is a
multiple of p and never more at even M >= p (less at some, e.g. p = 4, M = 6, where the
two pipelines' steady states interleave without a gap); 1F1B idles (p-1)(F+B).
``chimera_idle`` is that closed form, equal to the paper's when F = B
(tests/runtime/test_schedule_chimera.py pins both).
"""

from __future__ import annotations

import functools

from ..layout.placement import Placement
from .schedule import Words

FORWARD, BACKWARD = "F", "B"
WORDS = Words(
    "two pipelines in opposite directions over the stages, pp even", fills="fills it from both ends",
    shape=" in two directions (each stage on two ranks)",
    placement=", one per pipeline: chunk 0 of rank r is stage r of the down pipeline (even micro-batches, "
              "F3.0 runs down), chunk 1 stage p-1-r of the up one (odd micro-batches, F3.1 runs up)",
)


def _per_pipeline(micro_batches: int) -> tuple[int, int]:
    """Micro-batches of the down (even) and the up (odd) pipeline."""
    return (micro_batches + 1) // 2, micro_batches // 2


def chimera_idle(stages: int, forward: float, backward: float) -> float:
    """Idle time of each rank per step for even M >= p (exact when M is a multiple of p),
    per-micro-batch times ``forward`` <= ``backward``: (p-2)·B (Note [Chimera's bubble]);
    the paper's (p-2)(F+B)/2 when F = B."""
    return (stages - 2) * max(backward, (forward + backward) / 2)


def closed_makespan(stages: int, micro_batches: int, forward: float, backward: float,
                    comm: float) -> float:
    """The planner's fast makespan (codegen/planner/cost/bubble.py): a micro-batch runs
    through one of a rank's two chunks (placement ``carries``), so the busy time is M·(F + B),
    not 2M·(F + B), plus ``chimera_idle``; messages as 1F1B's, 2·comm per crossing."""
    return (micro_batches * (forward + backward) + chimera_idle(stages, forward, backward)
            + 2.0 * comm * (micro_batches + stages - 1))


def chimera_bound(stages: int, rank: int, micro_batches: int) -> int:
    """Micro-batches with forward done and backward not yet, at most, on ``rank``: the
    down pipeline's 1F1B bound at stage r plus the up one's at stage p-1-r."""
    down, up = _per_pipeline(micro_batches)
    return min(stages - rank, down) + min(rank + 1, up)


@functools.lru_cache(maxsize=256)
def chimera_orders(stages: int, micro_batches: int) -> tuple[tuple[tuple[str, int, int], ...], ...]:
    """Every rank's compute order as ``(op, micro, chunk)`` (Note [Chimera on paper])."""
    p = stages
    place = Placement("chimera", p, 2)
    last = p - 1
    durations = {FORWARD: 1, BACKWARD: 2}
    finished: dict[tuple[str, int, int], int] = {}  # (op, micro, stage) -> end time
    clock = [0] * p
    in_flight = [[0, 0] for _ in range(p)]  # per rank, per chunk
    caps = [[min(p - place.stage(r, c), n) for c, n in enumerate(_per_pipeline(micro_batches))] for r in range(p)]
    forwards = [[(m, m % 2) for m in range(micro_batches)] for _ in range(p)]
    backwards = [list(f) for f in forwards]
    orders: list[list[tuple[str, int, int]]] = [[] for _ in range(p)]
    total = 2 * micro_batches

    def arrival(op, micro, rank, chunk):
        stage = place.stage(rank, chunk)
        if op == FORWARD:
            return 0 if stage == 0 else finished.get((FORWARD, micro, stage - 1))
        return finished.get((FORWARD, micro, stage) if stage == last else (BACKWARD, micro, stage + 1))

    def candidates(rank):
        for op, todo in ((BACKWARD, backwards[rank]), (FORWARD, forwards[rank])):
            for m, c in todo:
                if op == FORWARD and in_flight[rank][c] >= caps[rank][c]:
                    continue
                yield op, m, c

    while True:
        left = [r for r in range(p) if len(orders[r]) < total]
        if not left:
            break
        rank = min(left, key=lambda r: (clock[r], r))
        now = clock[rank]
        ready = [(op, m, c) for op, m, c in candidates(rank) if (t := arrival(op, m, rank, c)) is not None and t <= now]
        if not ready:
            later = [t for op, m, c in candidates(rank) if (t := arrival(op, m, rank, c)) is not None]
            others = [clock[r] for r in left if r != rank]
            if not later and not others:
                raise RuntimeError(f"internal error: chimera on paper is stuck at p = {p}, M = {micro_batches}")
            # idle until the next known arrival, or until a rank behind could produce one
            clock[rank] = min(later + [min(others, default=now) + 1]) if others else min(later)
            clock[rank] = max(clock[rank], now + (0 if later and min(later) > now else 1))
            continue
        op, m, c = min(ready, key=lambda x: (x[0] == BACKWARD, x[1]))  # forwards first, under the caps
        if op == FORWARD:
            forwards[rank].remove((m, c))
            in_flight[rank][c] += 1
        else:
            backwards[rank].remove((m, c))
            in_flight[rank][c] -= 1
        clock[rank] = now + durations[op]
        finished[(op, m, place.stage(rank, c))] = clock[rank]
        orders[rank].append((op, m, c))
    return tuple(tuple(order) for order in orders)
