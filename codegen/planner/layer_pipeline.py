"""The per-layer search under a pipeline: the dynamic program once per stage.

Takes: a ``Spec``, a uniform pipelined layout of one chunk a rank (1f1b, gpipe) as the
family's base, its ``Stage``, ``Hardware``, the memory budget and the options of a layer
(``layer_search._options``). Gives: ``pipeline_family(...)`` — the best heterogeneous
layout of the family, or None. Before: ``layer_search.py``, ``cost/per_stage.py``.
After: ``layer_search.per_layer_candidates``.

Note [the per-layer program over a pipeline]: the stages are independent once the degree
d of every stage boundary is fixed (the runtime sends one activation shape, so both
sides of each boundary run at d: PAR0255), and with tied embeddings the degree e of
block 0 and block L-1: each stage has its own ranks and its own memory. So for each d
(and e) the program of Note [the per-layer dynamic program] runs on each stage's blocks,
its first block held to d (stages after the first) or e (the first, tied), its last to
d (stages before the last) or e (the last, tied), under the same budget, with that
stage's micro-batches in flight (1F1B holds more on early stages). The step is
Σ_p T_p + (M − 1)·max_p T_p + 2·comm(d)·(M + p − 1) + post_0 + H(tp[-1])
(Note [per-layer layouts over a pipeline]): monotone in every stage's T_p, so each
middle stage simply minimizes its T_p. The first stage also pays post_0 (its reduction
and optimizer) and the last H(t), added once, while T_p counts M times if its stage is
the slowest and once if not; these two run the program twice, weighing T_p by M and by
1, and every combination of their results is priced whole (``pipeline_time_memory``).
A family's spec micro_batch keeps the coarse tp on some layer: where no combination has
one, each stage in turn takes its best with one. tests/planner/test_layer_pipeline.py
checks the result against every per-layer assignment of a small pipelined model.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

from parc.dsl.spec import Spec

from .cost import Hardware, Layout
from .cost.layout import SETTING_NAMES
from .cost.per_layer import Stage, layer_cost, micro_batches, transition_cost, working_set
from .cost.per_stage import first_stage_ends, last_stage_ends, pipeline_time_memory, stage_bounds

INF = math.inf


def pipeline_family(spec: Spec, base: Layout, stage: Stage, hw: Hardware, budget, options) -> Layout | None:
    """Note [the per-layer program over a pipeline]."""
    from .layer_search import BUCKETS, cheapest, layout_of  # at call time: BUCKETS may be set (tests)

    bounds = stage_bounds(spec, stage.pp)
    if not options or any(stop - start < 2 for start, stop in bounds):
        return None  # a one-block stage has both its ends at the boundary degree
    classes = sorted({t for t, _ in options})
    if len(classes) < 2:
        return None  # one degree: search.mixed_recompute's mixes (Note [per-layer recompute])
    steps = micro_batches(spec, stage)
    must = base.tp if spec.train.micro_batch is not None else None
    last_rank = stage.pp - 1

    def run(rank, start, stop, d, e, weight, need):
        """One stage's program: its blocks' options with T_p weighed by ``weight``."""
        held_first = d if rank > 0 else e
        held_last = d if rank < last_rank else e

        def cost(o):
            c = layer_cost(spec, stage, hw, o[0], o[1], rank)
            seconds = weight * steps * (c.forward + c.backward) + (c.post(steps) if rank == 0 else 0.0)
            return seconds, c.memory.total

        def first(c):
            if held_first is not None and c != held_first:
                return INF, 0.0
            if rank != 0:
                return 0.0, 0.0
            seconds, mem = first_stage_ends(spec, stage, hw, c)
            return seconds, mem.total

        def last(_c0, c):
            if held_last is not None and c != held_last:
                return INF, 0.0
            if rank != last_rank:
                return 0.0, 0.0
            seconds, mem = last_stage_ends(spec, stage, hw, c)
            return seconds, mem.total

        found = cheapest(
            stop - start, options, cls=lambda o: o[0], cost=cost,
            switch=lambda a, b: weight * transition_cost(spec, stage, hw, a, b).time,
            first=first, last=last, budget=budget, buckets=BUCKETS, must=need,
            peak=lambda o: working_set(spec, stage, o[0]) if dict(zip(SETTING_NAMES, o[1]))["recompute"] == "full"
            else 0.0,
        )
        return None if found is None or found[0] == INF else found[1]

    def choices(rank, start, stop, d, e, need):
        weights = (steps, 1) if rank in (0, last_rank) else (1,)
        found = {run(rank, start, stop, d, e, w, need) for w in weights}
        return [c for c in found if c is not None]

    best = None
    for d in classes:
        for e in (classes if spec.model.tie_embeddings else [None]):
            free = [choices(rank, a, b, d, e, None) for rank, (a, b) in enumerate(bounds)]
            if not all(free):
                continue
            combos = list(itertools.product(*free))
            if must is not None and not any(must in (o[0] for part in combo for o in part) for combo in combos):
                combos = []
                for rank, (a, b) in enumerate(bounds):
                    held = choices(rank, a, b, d, e, must)
                    combos += itertools.product(*(held if r == rank else free[r] for r in range(stage.pp)))
            for combo in combos:
                chosen = tuple(o for part in combo for o in part)
                if must is not None and all(t != must for t, _ in chosen):
                    continue
                found = _priced(spec, base, stage, hw, chosen, layout_of)
                if found is not None and (budget is None or found[1] <= budget) and (
                        best is None or found[0] < best[0]):
                    best = (found[0], found[2])
    return None if best is None else best[1]


def _priced(spec, base, stage, hw, chosen, layout_of):
    """(step seconds, peak bytes, layout) of one assignment, priced per stage (its degrees
    written out even when they agree); None when it is uniform."""
    layout = layout_of(base, stage, chosen)
    if layout is None:
        return None
    degrees = tuple(t for t, _ in chosen)
    time, mem = pipeline_time_memory(spec, replace(layout, layer_tp=degrees), hw)
    return time.step, mem.peak.total, layout
