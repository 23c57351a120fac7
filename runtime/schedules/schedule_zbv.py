"""Zero-bubble ZB-V (Qi et al. 2024): two model chunks per rank placed in a V, the
backward split into B (input gradient) and W (weight gradient).

Takes: pipeline ranks p, micro-batches M and, optionally, each virtual stage's (F, B, W)
costs. Gives: ``zero_bubble_v_orders(p, M, costs)``,
the compute order ``(op, micro, chunk)`` of every rank, and ``zero_bubble_v_bound(p,
M)``, its in-flight bound in micro-batch-chunks, and ``WORDS`` (``schedule.Words``). Pure
Python. Before: ``placement`` (chunk 0 of rank r is stage r, chunk 1 stage 2p-1-r). After:
``schedule.build_schedule`` adds the sends and receives.

Note [ZB-V on paper]: the order is found by running the stages once on paper, each
compute taking its virtual stage's cost (``costs``: (F, B, W) per virtual stage, integers
≥ 1 in any unit; None: F = B = W = 1 per chunk, the paper's assumption), each rank
greedily picking, when it is free: the ready B of the oldest micro-batch (later chunk first: it is nearer the
loss); else the ready F of the oldest micro-batch (later chunk first) while fewer than
2·min(p, M) micro-batch-chunks are in flight on the rank (forward done, W not yet);
else the oldest W it owes; else it idles until the next input arrives. Unequal costs can
fill a rank's cap with chunk 0 forwards whose chunk 1 it may then not run: the paper run
cannot finish (every rank waits on another; F = B = W never does, tests/runtime). Then the
run is redone with one slot kept: while a micro-batch's chunk 0 ran here and its chunk 1
not yet, a new micro-batch starts only below cap − 1. That run always finishes: the
oldest unfinished micro-batch can always move, since what is in flight on the rank it
needs entered that rank before it, so has finished, or leaves its chunk 1 the slot. A compute is
ready when the compute it needs has *finished* by the rank's clock (every cost ≥ 1, so a
compute finishes after it starts), so the lists are a valid execution and deadlock-free
under any real timing (schedule.py, Note [the execution model]); the costs change which
ready compute comes first, never what is ready. Why costs: the first stage has no input
gradient (its B is nearly empty, its W the whole backward) and the last holds the head
and the loss; with F = B = W the order idles rank 0 before the last stage's forwards
(bench/peer_notes.md, "ZB-V against 1F1B"). The planner gives each virtual stage's
costs from its cost model (codegen/planner/cost/bubble.py, Note [stage costs]) and the
build renders them into train.py, so the trainer, ``parc check`` and the planner build
the same lists. The cap is 1F1B's memory: each chunk holds half a stage's layers,
so 2p chunk-micro-batches are p micro-batches of a whole stage, what 1F1B's first
rank holds. Its bubble is below ZB-H1's (tests/runtime/test_schedules.py): the V
puts the first and the last stage on rank 0, so rank 0 starts its backwards while
the others still run forwards.
"""

from __future__ import annotations

import collections
import functools
import heapq

from ..layout.placement import Placement
from .schedule import Words

FORWARD, BACKWARD, WEIGHT = "F", "B", "W"
WORDS = Words("ZB-V: zero-bubble over two chunks per rank in a V", placement=(
    ", in a V: chunk 0 of rank r is stage r, chunk 1 stage 2p-1-r (rank 0 holds the first and the last)"))


def zero_bubble_v_bound(stages: int, micro_batches: int) -> int:
    """Micro-batch-chunks with forward done and W not yet, at most, on every rank."""
    return 2 * min(stages, micro_batches)


def cost_problem(stages: int, costs) -> str | None:
    """Why ``costs`` cannot order ``stages`` ranks' V (2·stages rows of three integers ≥ 1), or None."""
    if costs is None:
        return None
    if len(costs) != 2 * stages:
        return f"ZB-V needs (F, B, W) of each of its {2 * stages} virtual stages, got {len(costs)}"
    for row in costs:
        if len(row) != 3 or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 1 for x in row):
            return f"a virtual stage's costs are three integers >= 1 (F, B, W), got {row!r}"
    return None


@functools.lru_cache(maxsize=256)
def zero_bubble_v_orders(stages: int, micro_batches: int, costs: tuple[tuple[int, int, int], ...] | None = None,
                         ) -> tuple[tuple[tuple[str, int, int], ...], ...]:
    """Every rank's compute order as ``(op, micro, chunk)`` (Note [ZB-V on paper]); ``costs``:
    (F, B, W) of each virtual stage in model order, None for F = B = W = 1.

    Note [ZB-V ready queues]: the greedy rank by rank, its inputs kept as events rather
    than searched for. When a compute finishes, the one compute that takes its output (the
    next stage's F, the previous stage's B, or at the turn of the V the same stage's B) is
    pushed, with that finish time, onto its rank's ``pending`` heap; when a rank decides at
    ``now`` it moves every pending input that has arrived by ``now`` into its ``ready`` heap
    for that op, ordered by (micro, -chunk): the oldest micro-batch, later chunk first, the
    order the Note picks in. A rank's clock never goes back, so ready stays ready; the
    pending heap's top is the next arrival an idle rank waits for. Same orders as the
    plain greedy that scans every rank's remaining list (tests/runtime compares the two
    for p ≤ 8, M ≤ 32), in O(p·M·log M) instead of O(p·M·(M + p)) per decision pass:
    ``parc plan`` builds them for its best layouts' exact bubbles (gpt3-175b: p = 16 at
    M = 32, 48 and 64, Note [steady state] in codegen/planner/cost/bubble.py).
    """
    problem = cost_problem(stages, costs)
    if problem:
        raise ValueError(problem)
    return _greedy(stages, micro_batches, costs, False) or _greedy(stages, micro_batches, costs, True)


def _greedy(stages: int, micro_batches: int, costs, reserve: bool):
    """Note [ZB-V ready queues]'s run; None when it cannot finish (only with costs, without
    ``reserve``: Note [ZB-V on paper])."""
    p, cap, runs = stages, zero_bubble_v_bound(stages, micro_batches), 6 * micro_batches
    place = Placement("v", p, 2)
    last = place.virtual_stages - 1
    cost = [dict(zip((FORWARD, BACKWARD, WEIGHT), costs[v] if costs else (1, 1, 1))) for v in range(last + 1)]
    clock, in_flight, done = [0] * p, [0] * p, 0
    entered = [0] * p  # micro-batches whose chunk 0 ran forward here, chunk 1 not yet
    waiting: set[int] = set()  # ranks with nothing to run and no input to come, since the last compute
    owed: list[collections.deque] = [collections.deque() for _ in range(p)]  # (micro, chunk): B ran, W not
    pending: list[list[tuple[int, int, int, str]]] = [[] for _ in range(p)]  # (arrival, micro, -chunk, op)
    ready: list[dict[str, list[tuple[int, int]]]] = [{BACKWARD: [], FORWARD: []} for _ in range(p)]
    orders: list[list[tuple[str, int, int]]] = [[] for _ in range(p)]
    pending[0] = [(0, m, 0, FORWARD) for m in range(micro_batches)]  # stage 0's inputs: there at once

    def deliver(op, micro, stage, time):  # the compute that takes this one's output learns when
        if op == FORWARD:
            op, stage = (FORWARD, stage + 1) if stage < last else (BACKWARD, stage)
        elif op == BACKWARD and stage > 0:
            stage -= 1
        else:
            return
        rank, chunk = place.holder(stage)
        heapq.heappush(pending[rank], (time, micro, -chunk, op))

    def choice(rank, now):  # (op, micro, chunk) to run at ``now``, or None
        waiting, queues = pending[rank], ready[rank]
        while waiting and waiting[0][0] <= now:
            _, micro, minus_chunk, op = heapq.heappop(waiting)
            heapq.heappush(queues[op], (micro, minus_chunk))
        if queues[BACKWARD]:
            micro, minus_chunk = heapq.heappop(queues[BACKWARD])
            return BACKWARD, micro, -minus_chunk
        if queues[FORWARD]:  # a new micro-batch keeps room for its chunk 1 (Note [ZB-V on paper])
            micro, minus_chunk = queues[FORWARD][0]
            room = cap - (1 if reserve and minus_chunk == 0 and entered[rank] else 0)
            if in_flight[rank] < room:
                heapq.heappop(queues[FORWARD])
                return FORWARD, micro, -minus_chunk
        if owed[rank]:
            return (WEIGHT, *owed[rank].popleft())
        return None

    while done < p * runs:
        # the rank furthest behind decides first: every input it could use by its clock
        # has been produced by then (every compute takes time)
        rank = min((r for r in range(p) if len(orders[r]) < runs), key=lambda r: (clock[r], r))
        step = choice(rank, clock[rank])
        if step is None:  # idle until the earliest input that will arrive
            if pending[rank]:
                clock[rank] = pending[rank][0][0]
            else:  # waits on a rank behind it: let that one move first
                waiting.add(rank)
                if len(waiting) == sum(len(order) < runs for order in orders):  # every rank waits on another
                    return None
                others = [clock[r] for r in range(p) if r != rank and len(orders[r]) < runs]
                clock[rank] = min(others) + 1 if others else clock[rank] + 1
            continue
        op, micro, chunk = step
        waiting.clear()
        in_flight[rank] += 1 if op == FORWARD else -1 if op == WEIGHT else 0
        entered[rank] += (1 if chunk == 0 else -1) if op == FORWARD else 0
        if op == BACKWARD:
            owed[rank].append((micro, chunk))
        stage = place.stage(rank, chunk)
        clock[rank] += cost[stage][op]
        deliver(op, micro, stage, clock[rank])
        orders[rank].append(step)
        done += 1
    return tuple(tuple(order) for order in orders)
