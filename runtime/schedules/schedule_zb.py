"""Zero-bubble ZB-H1 (Qi et al. 2023): 1F1B's forwards and backwards with the backward
split into B (input gradient) and W (weight gradient), the W passes placed in the gaps.

Takes: pipeline stages p and micro-batches M. Gives: ``zero_bubble_orders(p, M)``, the
compute order ``(op, micro, chunk)`` of every rank, and ``zero_bubble_bound(p, M)``,
its in-flight bound, and ``WORDS`` (``schedule.Words``). Pure Python. Before: nothing.
After: ``schedule.build_schedule`` adds the sends and receives.

Note [placing the W passes]: each rank keeps 1F1B's order of F and B (warm-up of
p - r - 1 forwards, then one F, one B). The W of a micro-batch may run any time after
its B; the order is fixed by running the lists once on paper with F = B = W = 1 (the
handcrafted schedules' assumption): a rank runs its next F or B as soon as its input
has arrived, and otherwise, instead of idling, the oldest W still owed. A forward may
start only while fewer than min(p, M) micro-batches are in flight on the rank (forward
done, W not yet; the runtime keeps a micro-batch's graph until its W), so every rank
holds what 1F1B's first rank holds, and the paper's bubble (p - 1)(F + B - W) per rank
for M >= p follows (tests/runtime/test_schedules.py): the Ws the last ranks owe fill
their drain, and B alone, not B + W, is on the critical path back to rank 0.
"""

from __future__ import annotations

import functools

from .schedule import Words

FORWARD, BACKWARD, WEIGHT = "F", "B", "W"
WORDS = Words("ZB-H1: 1f1b with backward split into input and weight gradients, the weight "
              "gradients filling the bubble", fills="fills it with weight gradients")


def zero_bubble_bound(stages: int, micro_batches: int) -> int:
    """Micro-batches with forward done and W not yet, at most, on every rank."""
    return min(stages, micro_batches)


def _one_f_one_b(rank: int, stages: int, micro_batches: int) -> list[tuple[str, int]]:
    warmup = min(stages - rank - 1, micro_batches)
    order = [(FORWARD, m) for m in range(warmup)]
    for m in range(micro_batches - warmup):
        order += [(FORWARD, warmup + m), (BACKWARD, m)]
    return order + [(BACKWARD, m) for m in range(micro_batches - warmup, micro_batches)]


@functools.lru_cache(maxsize=256)
def zero_bubble_orders(stages: int, micro_batches: int) -> tuple[tuple[tuple[str, int], ...], ...]:
    """Every rank's compute order as ``(op, micro)``, op one of F, B, W (Note [placing the W passes])."""
    p, cap = stages, zero_bubble_bound(stages, micro_batches)
    todo = [_one_f_one_b(r, p, micro_batches) for r in range(p)]
    position, clock, in_flight = [0] * p, [0] * p, [0] * p
    owed: list[list[int]] = [[] for _ in range(p)]  # micro-batches whose B ran and W has not
    finished: dict[tuple[str, int, int], int] = {}  # (op, micro, rank) -> end time
    orders: list[list[tuple[str, int]]] = [[] for _ in range(p)]

    def needs(rank, op, micro):  # the compute whose result this one receives, if any
        if op == FORWARD:
            return None if rank == 0 else (FORWARD, micro, rank - 1)
        return (FORWARD, micro, rank) if rank == p - 1 else (BACKWARD, micro, rank + 1)

    while True:
        live = [r for r in range(p) if position[r] < len(todo[r]) or owed[r]]
        if not live:
            break
        # the rank that is furthest behind decides first: everything it could receive
        # by its clock has been sent by then (every compute takes time)
        ready = []
        for r in live:
            if position[r] == len(todo[r]) or owed[r]:
                ready.append(r)
                continue
            dependency = needs(r, *todo[r][position[r]])
            if dependency is None or dependency in finished:
                ready.append(r)
        rank = min(ready, key=lambda r: (clock[r], r))
        now = clock[rank]
        step = None
        if position[rank] < len(todo[rank]):
            op, micro = todo[rank][position[rank]]
            dependency = needs(rank, op, micro)
            arrival = 0 if dependency is None else finished.get(dependency)
            if arrival is not None and arrival <= now and (op != FORWARD or in_flight[rank] < cap):
                step = (op, micro)
                position[rank] += 1
            elif not owed[rank]:
                clock[rank] = arrival  # idle until the input arrives (known: it is ready)
                continue
        if step is None:
            step = (WEIGHT, owed[rank].pop(0))
        op, micro = step
        clock[rank] = now + 1
        if op == FORWARD:
            in_flight[rank] += 1
        elif op == BACKWARD:
            owed[rank].append(micro)
        else:
            in_flight[rank] -= 1
        finished[(op, micro, rank)] = clock[rank]
        orders[rank].append(step)
    return tuple(tuple(order) for order in orders)
