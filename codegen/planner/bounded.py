"""The bounded search: the exhaustive search's ranking, as far as ``parc plan`` reads it,
without scoring every layout's time.

Takes: a ``Spec``, ``Hardware`` and an ``Accounting``. Gives: ``bounded_search(...)`` → a
``SearchResult`` whose ``estimates`` are the first places of ``search.search``'s ranking
(``complete`` False when it stops short; ``unfit``, the first places of the layouts
that do not fit, which follow the ``fitting`` ones). A reader (``why.py``, ``cli/plan.py``)
that needs a place beyond them raises ``search.Incomplete`` and asks ``search.search``.
Before: ``search.py``, ``cost/time.py``. After: ``cli/plan.py``.

Note [the bounded search]: every candidate's memory is computed (whether it fits
decides its group, and ``parc plan`` counts those that fit), but its step time only when
it can matter. ``cost/time.pipeline_bound`` is a lower bound on a layout's fast step
time (its pipeline, without the data-parallel time and the optimizer, both ≥ 0) that
costs one shared lookup (Note [planner caches]). In each group (fitting, not fitting)
the layouts are scored in full in increasing order of their bound, the first
``SCORED`` of them; B is the least bound left unscored. The ranking (Note [ranking and
ties]) places at each step the least tie key within ``TIE_TOLERANCE`` of the fastest
layout not yet placed, f: a layout of step time t ≥ B can enter that window only when
f·(1 + TIE_TOLERANCE) ≥ t ≥ B. So every place taken while f·(1 + TIE_TOLERANCE) < B is
the exhaustive ranking's, the same layout with the same figures (the fastest layout not
yet placed is a scored one, and the window holds the same layouts); the bounded search
returns those places. The exact re-scoring of the first ``EXACT_TOP`` (and the first
buildable one that fits) and ``mixed_recompute`` read only such places, or a sibling
scored on demand when its bound does not already rule it out. Where the per-layer
search applies (``layer_search``: it reads every family's first layout and the best
time) the bounded search is the exhaustive one. tests/planner/test_search.py compares
``parc plan``'s output, table and JSON, byte for byte with the exhaustive search's.
"""

from __future__ import annotations

import math

from parc.dsl.spec import Spec

from .cost import Accounting, Estimate, Hardware, Layout, estimate
from .cost.estimate import USABLE_MEMORY, layout_memory
from .cost.per_layer import hetero_supported
from .cost.time import pipeline_bound
from .search import (
    EXACT_TOP, TIE_TOLERANCE, SearchResult, break_ties, candidates, mixed_recompute, rank, search,
    tie_memory_unit,
)

SCORED = 256
"""Layouts of each group scored in full, in increasing order of their bound."""


def bounded_search(spec: Spec, hw: Hardware, accounting: Accounting = Accounting.PARC) -> SearchResult:
    """Note [the bounded search]."""
    layouts = candidates(spec)
    if _per_layer_applies(spec, layouts, accounting):
        return search(spec, hw, accounting)
    unit = tie_memory_unit(hw)
    limit = None if hw.memory is None else hw.memory * USABLE_MEMORY
    fits = [limit is None or layout_memory(spec, layout, hw, accounting).peak.total <= limit for layout in layouts]
    bounds = [pipeline_bound(spec, layout, hw, accounting) for layout in layouts]
    scored: dict[int, Estimate] = {}
    least_left = {}
    for group in (True, False):
        order = sorted((i for i in range(len(layouts)) if fits[i] == group), key=lambda i: bounds[i])
        for i in order[:SCORED]:
            scored[i] = estimate(spec, layouts[i], hw, accounting, exact=False)
        least_left[group] = bounds[order[SCORED]] if len(order) > SCORED else math.inf
    fitting = sum(fits)
    extra = []
    if spec.parallel.recompute is None and hw.memory is not None:
        best = min((item.time.step for i, item in scored.items() if fits[i]), default=math.inf)
        if best > least_left[True]:  # the fastest layout that fits may be unscored
            return search(spec, hw, accounting)
        extra = _mixed_recompute(spec, layouts, fits, bounds, scored, best, hw, accounting)
        fitting += sum(1 for item in extra if item.fits)
    pool = [scored[i] for i in sorted(scored)] + extra  # the exhaustive search's order
    groups = {group: _placed([item for item in pool if item.fits == group], unit, least_left[group])
              for group in (True, False)}
    complete = {group: len(groups[group]) == sum(1 for item in pool if item.fits == group)
                and least_left[group] == math.inf for group in (True, False)}
    fast = groups[True] + (groups[False] if complete[True] else [])
    if len(fast) < EXACT_TOP + 1 and not (complete[True] and complete[False]):
        return search(spec, hw, accounting)
    head = [estimate(spec, item.layout, hw, accounting, exact=True) for item in fast[:EXACT_TOP]]
    tail = fast[EXACT_TOP:]
    if not any(item.fits and item.buildable for item in head):
        index = next((k for k, item in enumerate(tail) if item.fits and item.buildable), None)
        if index is None:  # the build winner lies beyond the places known: score everything
            return search(spec, hw, accounting)
        head.append(estimate(spec, tail[index].layout, hw, accounting, exact=True))
        tail = tail[:index] + tail[index + 1 :]
    ranked = tuple(rank(head, unit)) + tuple(tail)
    whole = complete[True] and complete[False]
    return SearchResult(
        estimates=ranked, considered=len(layouts) + len(extra), fitting=fitting, complete=whole,
        unfit=None if complete[True] else tuple(groups[False]),
    )


def _placed(group: list[Estimate], unit: float | None, least_left: float) -> list[Estimate]:
    """Note [the bounded search]: the places of ``search.rank`` over one group that are the
    exhaustive ranking's, when every layout not in ``group`` takes at least ``least_left``."""
    return break_ties(sorted(group, key=lambda item: item.time.step), unit, least_left)


def _per_layer_applies(spec: Spec, layouts: list[Layout], accounting: Accounting) -> bool:
    """``layer_search.per_layer_candidates`` would run its program on some family."""
    par = spec.parallel
    if par.tp is not None or par.layer_tp is not None or spec.model.layers < 2 or accounting is not Accounting.PARC:
        return False
    return any(layout.tp >= 2 and not layout.per_layer and hetero_supported(spec, layout, accounting)
               for layout in layouts)


def _mixed_recompute(spec, layouts, fits, bounds, scored, best, hw, accounting) -> list[Estimate]:
    """``search.mixed_recompute`` over the bounded search's layouts: a sibling's time is read
    (scored on demand) only when its bound does not already put it beyond the cut."""
    cut = best * (1 + TIE_TOLERANCE)

    class Lazy:
        """A layout as ``mixed_recompute`` reads it: whether it fits, then its time."""

        def __init__(self, i):
            self.layout, self.fits, self._i = layouts[i], fits[i], i

        @property
        def time(self):
            i = self._i
            if i not in scored:
                if bounds[i] > cut:
                    return _Above(bounds[i])  # its time is above its bound, above the cut: skipped either way
                scored[i] = estimate(spec, layouts[i], hw, accounting, exact=False)
            return scored[i].time

    return mixed_recompute(spec, [Lazy(i) for i in range(len(layouts))], hw, accounting, best=best)


class _Above:
    """A time known only to exceed ``step`` (``_mixed_recompute``)."""

    def __init__(self, step: float):
        self.step = step
