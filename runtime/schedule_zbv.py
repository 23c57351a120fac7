"""Zero-bubble ZB-V (Qi et al. 2024): two model chunks per rank placed in a V, the
backward split into B (input gradient) and W (weight gradient).

Takes: pipeline ranks p and micro-batches M. Gives: ``zero_bubble_v_orders(p, M)``,
the compute order ``(op, micro, chunk)`` of every rank, and ``zero_bubble_v_bound(p,
M)``, its in-flight bound in micro-batch-chunks. Pure Python. Before: ``placement``
(chunk 0 of rank r is stage r, chunk 1 stage 2p-1-r). After: ``schedule.build_schedule``
adds the sends and receives.

Note [ZB-V on paper]: the order is found by running the stages once on paper with
F = B = W = 1 per chunk (the paper's assumption), each rank greedily picking, when
it is free: the ready B of the oldest micro-batch (later chunk first: it is nearer the
loss); else the ready F of the oldest micro-batch (later chunk first) while fewer than
2·min(p, M) micro-batch-chunks are in flight on the rank (forward done, W not yet);
else the oldest W it owes; else it idles until the next input arrives. A compute is
ready when the compute it needs has *finished* by the rank's clock, so the lists are
a valid execution and deadlock-free under any real timing (schedule.py, Note [the
execution model]). The cap is 1F1B's memory: each chunk holds half a stage's layers,
so 2p chunk-micro-batches are p micro-batches of a whole stage, what 1F1B's first
rank holds. Its bubble is below ZB-H1's (tests/runtime/test_schedules.py): the V
puts the first and the last stage on rank 0, so rank 0 starts its backwards while
the others still run forwards.
"""

from __future__ import annotations

import functools

from .placement import Placement

FORWARD, BACKWARD, WEIGHT = "F", "B", "W"


def zero_bubble_v_bound(stages: int, micro_batches: int) -> int:
    """Micro-batch-chunks with forward done and W not yet, at most, on every rank."""
    return 2 * min(stages, micro_batches)


@functools.lru_cache(maxsize=256)
def zero_bubble_v_orders(stages: int, micro_batches: int) -> tuple[tuple[tuple[str, int, int], ...], ...]:
    """Every rank's compute order as ``(op, micro, chunk)`` (Note [ZB-V on paper])."""
    p, cap = stages, zero_bubble_v_bound(stages, micro_batches)
    place = Placement("v", p, 2)
    last = place.virtual_stages - 1
    finished: dict[tuple[str, int, int], int] = {}  # (op, micro, stage) -> end time
    clock, in_flight = [0] * p, [0] * p
    owed: list[list[tuple[int, int]]] = [[] for _ in range(p)]  # (micro, chunk) whose B ran, W not
    forwards = [[(m, c) for m in range(micro_batches) for c in (1, 0)] for _ in range(p)]
    backwards = [list(f) for f in forwards]
    orders: list[list[tuple[str, int, int]]] = [[] for _ in range(p)]

    def arrival(op, micro, rank, chunk):  # when the input of this compute is there, or None
        stage = place.stage(rank, chunk)
        if op == FORWARD:
            return 0 if stage == 0 else finished.get((FORWARD, micro, stage - 1))
        return finished.get((FORWARD, micro, stage) if stage == last else (BACKWARD, micro, stage + 1))

    def choice(rank, now):  # (op, micro, chunk) to run at ``now``, or None
        for op, todo in ((BACKWARD, backwards[rank]), (FORWARD, forwards[rank])):
            if op == FORWARD and in_flight[rank] >= cap:
                continue
            # ``todo`` is in (micro, -chunk) order: the first ready entry is the oldest micro-batch's
            for m, c in todo:
                if (t := arrival(op, m, rank, c)) is not None and t <= now:
                    return op, m, c
        if owed[rank]:
            return (WEIGHT, *owed[rank][0])
        return None

    total = 3 * 2 * micro_batches * p
    while sum(len(o) for o in orders) < total:
        # the rank furthest behind decides first: every input it could use by its clock
        # has been produced by then (every compute takes time)
        rank = min((r for r in range(p) if len(orders[r]) < 6 * micro_batches), key=lambda r: (clock[r], r))
        step = choice(rank, clock[rank])
        if step is None:  # idle until the earliest input that will arrive
            times = [t for op, todo in ((BACKWARD, backwards[rank]), (FORWARD, forwards[rank]))
                     for m, c in todo if (t := arrival(op, m, rank, c)) is not None and t > clock[rank]]
            if times:
                clock[rank] = min(times)
            else:  # waits on a rank behind it: let that one move first
                clock[rank] = min(clock[r] for r in range(p) if r != rank and len(orders[r]) < 6 * micro_batches) + 1 \
                    if any(len(orders[r]) < 6 * micro_batches for r in range(p) if r != rank) else clock[rank] + 1
            continue
        op, micro, chunk = step
        if op == FORWARD:
            forwards[rank].remove((micro, chunk))
            in_flight[rank] += 1
        elif op == BACKWARD:
            backwards[rank].remove((micro, chunk))
            owed[rank].append((micro, chunk))
        else:
            owed[rank].pop(0)
            in_flight[rank] -= 1
        clock[rank] += 1
        finished[(op, micro, place.stage(rank, chunk))] = clock[rank]
        orders[rank].append(step)
    return tuple(tuple(order) for order in orders)
