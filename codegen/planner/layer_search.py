"""The per-layer search: each block's tensor-parallel degree and settings, by dynamic programming.

Takes: a ``Spec`` with ``tp = auto``, the uniform layouts the search scored, ``Hardware``.
Gives: ``per_layer_candidates(...)`` — for each uniform layout family (the stage's
ranks, its coarse tp, micro_batch, sp, ZeRO stage, and the pipeline's pp and schedule),
the heterogeneous layout the dynamic program finds best, when it differs from a uniform
one — and ``cheapest(...)``, the dynamic program itself. Before: ``cost/per_layer.py``. After: ``search.py``.

Note [the per-layer dynamic program]: as Galvatron's, over the layers of a stage. Each
layer picks an option o = (tp, recompute, overlap) with cost time(o) and memory(o)
(``cost/per_layer.layer_cost``); neighbouring layers of different tp add the reshard's
time (``transition_cost``); the embedding adds a cost at block 0's degree, the head at
block L-1's (tied embeddings: both at block 0's, after a reshard from L-1's:
``cost/per_layer.ends``). Memory is a dimension of the program, discretized: the
usable device memory (95%, ``USABLE_MEMORY``) is cut into ``BUCKETS`` units and each
layer's bytes are rounded *up* to whole units, so every layout the program returns
fits (it may miss one within a unit of the limit). A fully recomputed block's working
set is needed once, for the largest such block: the program runs once per cap W on it
(only options whose working set is at most W, and W taken off the budget). State:
(layer, option, units used) → least time; the transition first takes the best option
of each tp class, then adds the reshard between classes, so a layer costs
O(classes² + options) list operations of BUCKETS + 1 entries. Tied embeddings couple
block 0's and block L-1's degrees; the program then runs once per block 0 class.
tests/planner/test_layer_search.py checks it against a brute force over every
per-layer assignment.

Only layouts the runtime builds are offered: each option is probed against
``runtime/layout/constraints/`` (PAR0250–PAR0255 and every other BUILD rule) and so is the
result, so options the runtime learns to build (overlap, ZeRO-3 with per-layer degrees)
join the search as the rules accept them. The cost model is the PARC accounting's; a
pipeline (1f1b, gpipe) runs the program once per stage (``layer_pipeline.py``, Note
[the per-layer program over a pipeline]). Under a pipeline a family whose layers can
take one degree only (a micro_batch that does not split) is left to
``search.mixed_recompute``: the program would only mix recompute, and a 96-layer
model's families would cost seconds.
"""

from __future__ import annotations

import math
from dataclasses import replace

from parc.dsl.spec import Spec
from parc.runtime.layout.constraints import BUILD, LAYOUT, divisors, legal
from parc.runtime.layout.layer_settings import SETTINGS

from .cost import Accounting, Estimate, Hardware, Layout, estimate
from .cost.estimate import USABLE_MEMORY, layout_values
from .cost.layout import SETTING_NAMES
from .cost.per_layer import (
    Stage, embedding_cost, ends, head_cost, hetero_supported, layer_cost, micro_batches, stage_of, transition_cost,
    working_set,
)

BUCKETS = 64
"""Units the memory budget is cut into (Note [the per-layer dynamic program])."""

INF = math.inf


def cheapest(layers: int, options: list, *, cls, cost, switch, first, last, budget: float | None,
             peak=None, coupled: bool = False, must=None, buckets: int = BUCKETS):
    """Note [the per-layer dynamic program], in general terms: (time, one option per layer)
    of least ``Σ cost(o_i)[0] + Σ switch(cls(o_{i-1}), cls(o_i)) + first(c_0)[0] +
    last(c_0, c_{L-1})[0]`` whose memory ``Σ cost(o_i)[1] + first[1] + last[1] + max peak(o_i)``
    (each term rounded up to units of budget / buckets) fits ``budget``; None if none fits.
    ``cost(o)`` → (seconds, bytes); ``first(c)`` and ``last(c_0, c_L)`` likewise;
    ``peak(o)``: bytes needed once for the largest (None: none); ``coupled``: ``last`` reads
    c_0 (else it is called with c_0 = None); ``must``: a class at least one layer takes."""
    R = buckets if budget is not None else 0
    unit = budget / buckets if budget is not None else 1.0

    def units(nbytes: float) -> int:
        return 0 if budget is None else max(0, math.ceil(nbytes / unit - 1e-9))

    classes = sorted({cls(o) for o in options})
    peaks = sorted({0.0} | ({peak(o) for o in options} if peak else set()))
    best = None
    for cap in peaks:
        cap_units = units(cap)
        if cap_units > R:
            break
        allowed = [o for o in options if not peak or peak(o) <= cap]
        for c0 in (classes if coupled else [None]):
            found = _run(layers, allowed, classes, cls, cost, switch, first, last, c0, R - cap_units, units, must)
            if found is not None and (best is None or found[0] < best[0]):
                best = found
    return best


def _run(layers, options, classes, cls, cost, switch, first, last, c0, R, units, must=None):
    """One pass of the program (Note [the per-layer dynamic program]): block 0 of class ``c0``
    (None: any), at most ``R`` units; ``must``: a class some layer has to take. A state is
    (option, whether ``must`` was taken yet); each table maps a state to its row of least
    times by units used."""
    if not options:
        return None
    weight = {o: units(cost(o)[1]) for o in options}
    if layers * min(weight.values()) > R:
        return None  # not even the lightest option on every layer fits
    seconds = {o: cost(o)[0] for o in options}

    def seen(flag: bool, o) -> bool:
        return True if must is None else flag or cls(o) == must

    table = {}
    for o in options:
        if c0 is not None and cls(o) != c0:
            continue
        row = [INF] * (R + 1)
        w = weight[o] + units(first(cls(o))[1])
        if w <= R:
            row[w] = seconds[o] + first(cls(o))[0]
        table[(o, seen(False, o))] = row
    tables = [table]
    for _ in range(1, layers):
        by_class = {}
        for (o, flag), row in table.items():
            into = by_class.get((cls(o), flag))
            by_class[(cls(o), flag)] = row if into is None else [a if a <= b else b for a, b in zip(into, row)]
        via = {}
        for (prev, flag), row in by_class.items():
            for c in classes:
                s = switch(prev, c)
                acc = via.get((c, flag), [INF] * (R + 1))
                via[(c, flag)] = [a if a <= b + s else b + s for a, b in zip(acc, row)]
        table = {}
        for (c, flag), src in via.items():
            for o in options:
                if cls(o) != c:
                    continue
                w, t = weight[o], seconds[o]
                row = [INF] * w + [x + t for x in src[: R + 1 - w]] if w <= R else [INF] * (R + 1)
                key = (o, seen(flag, o))
                old = table.get(key)
                table[key] = row if old is None else [a if a <= b else b for a, b in zip(old, row)]
        tables.append(table)
    # the end: the head (and for tied embeddings the reshard back to block 0's degree)
    best, at = INF, None
    for (o, flag), row in table.items():
        if not flag:
            continue
        end_time, end_bytes = last(c0, cls(o))
        for m in range(0, R - units(end_bytes) + 1):
            if row[m] + end_time < best:
                best, at = row[m] + end_time, ((o, flag), m)
    if at is None:
        return None
    # walk back: at each layer the predecessor the forward pass's minimum came from
    state, m = at
    chosen = [state[0]]
    for i in range(layers - 1, 0, -1):
        o, flag = state
        m -= weight[o]
        c = cls(o)
        state = min(
            ((row[m] + switch(cls(p), c), k, (p, g)) for k, ((p, g), row) in enumerate(tables[i - 1].items())
             if seen(g, o) == flag),
            key=lambda item: (item[0], item[1]),
        )[2]
        chosen.append(state[0])
    chosen.reverse()
    return best, tuple(chosen)


def tp_chain(top: int) -> list[int]:
    """The degrees a stage with coarse tp ``top`` may give its layers, largest first: each
    divides the next larger (constraints.hetero_degrees_divide), halving by the least
    prime factor: 8 → [8, 4, 2, 1]."""
    chain = [top]
    while chain[-1] > 1:
        t = chain[-1]
        chain.append(t // min(p for p in divisors(t) if p > 1))
    return chain


def per_layer_candidates(spec: Spec, scored: list[Estimate], hw: Hardware, accounting: Accounting, *,
                         pipeline_family) -> list[Estimate]:
    """Note [the per-layer dynamic program]: the per-layer search is used when the spec
    leaves ``tp`` to the planner (``tp = auto`` or ``parallel = auto``) and gives no lists.
    One candidate per one-stage family, when the program's best is not uniform.
    ``pipeline_family``: ``layer_pipeline``'s program for pp > 1 families (that module
    builds on this one, so the caller hands it in)."""
    par, layers = spec.parallel, spec.model.layers
    if par.tp is not None or par.layer_tp is not None or layers < 2 or accounting is not Accounting.PARC:
        return []

    budget = None if hw.memory is None else hw.memory * USABLE_MEMORY
    best = min((item.time.step for item in scored if item.fits and item.buildable), default=INF)
    seen, out = set(), []
    for item in scored:
        base = item.layout
        if base.tp < 2 or base.per_layer or not hetero_supported(spec, base, accounting):
            continue
        stage = stage_of(base)
        if stage in seen:
            continue
        seen.add(stage)
        if base.pp > 1 and base.micro_batch % (base.tp // tp_chain(base.tp)[1]):
            continue  # no layer can take a smaller degree (PAR0253): one degree, nothing to search
        unprobed = _options(spec, base, probe=False)
        if not unprobed or bound(spec, stage, hw, unprobed) >= best:
            continue  # Note [the per-layer dynamic program]: no layout of the family beats the best that fits
        options = _options(spec, base)
        if base.pp == 1:
            found = _family(spec, base, stage, hw, budget, options)
        else:
            found = pipeline_family(spec, base, stage, hw, budget, options)
        if found is not None:
            out.append(estimate(spec, found, hw, accounting, exact=False))
    return out


def _options(spec: Spec, base: Layout, probe: bool = True) -> list[tuple[int, tuple]]:
    """Each (tp, settings) a layer of ``base``'s family may take that the rules allow
    (probed as block 0 at that option among blocks at the coarse tp; with tied embeddings
    under a pipeline the last block too, PAR0255). A setting left to the planner tries its
    ``order``, or its ``options`` for the layer's tp and micro-batch piece (overlap).
    ``probe = False``: before the rules, only the degrees whose piece of the micro-batch is
    whole (a superset, for ``bound``)."""
    layers = spec.model.layers
    par = spec.parallel
    ends = 2 if base.pp > 1 and spec.model.tie_embeddings else 1
    out = []
    for t in tp_chain(base.tp):
        piece, rest = divmod(base.micro_batch * t, base.tp)
        if rest or not piece:
            continue  # PAR0253
        values = []
        for entry in SETTINGS:
            given = par.setting(entry.name)
            if isinstance(given, tuple):
                return []  # a per-layer list given: not searched
            if given is not None:
                values.append((given,))
            else:
                values.append(entry.order or tuple(entry.options({"tp": t, "micro_batch": piece})))
        for settings in _product(values):
            if not probe:
                out.append((t, settings))
                continue
            probe_tp = (t,) + (base.tp,) * (layers - 2) + ((t,) if ends == 2 else (base.tp,))
            trial = replace(base, layer_tp=probe_tp, **dict(zip(SETTING_NAMES, settings)))
            uniform = replace(base, tp=t, dp=base.dp * base.tp // t, micro_batch=piece,
                              sp=base.sp and t > 1, **dict(zip(SETTING_NAMES, settings)))
            if legal(layout_values(spec, trial), (LAYOUT, BUILD)) and legal(layout_values(spec, uniform), (LAYOUT,)):
                out.append((t, settings))
    return out


def _product(values: list) -> list[tuple]:
    out = [()]
    for options in values:
        out = [head + (v,) for head in out for v in options]
    return out


def bound(spec: Spec, stage: Stage, hw: Hardware, options) -> float:
    """A step time no layout of the family goes below (Note [the per-layer dynamic program]):
    every layer at its fastest option, no reshards, no memory limit, the cheapest ends; under
    a pipeline each stage's micro-batch at its fastest, through the makespan's closed form."""
    classes = sorted({t for t, _ in options})
    if stage.pp == 1:
        fastest = min(layer_cost(spec, stage, hw, t, s).time for t, s in options)
        if spec.model.tie_embeddings:
            ends_time = min(head_cost(spec, stage, hw, c).time for c in classes)
        else:
            tables = [embedding_cost(spec, stage, hw, c).time for c in classes]
            ends_time = min(head_cost(spec, stage, hw, c).time for c in classes) + min(tables) - max(tables)
        return spec.model.layers * fastest + ends_time
    from .cost.per_stage import last_stage_ends, stage_bounds

    steps = micro_batches(spec, stage)
    each = min(layer_cost(spec, stage, hw, t, s).forward + layer_cost(spec, stage, hw, t, s).backward
               for t, s in options)
    times = [(stop - start) * each for start, stop in stage_bounds(spec, stage.pp)]
    return sum(times) + (steps - 1) * max(times) + min(last_stage_ends(spec, stage, hw, c)[0] for c in classes)


def _family(spec: Spec, base: Layout, stage: Stage, hw: Hardware, budget, options=None) -> Layout | None:
    options = _options(spec, base) if options is None else options
    if len({t for t, _ in options}) < 2 and len(options) < 2:
        return None
    common = dict(
        cls=lambda o: o[0],
        cost=lambda o: _pair(layer_cost(spec, stage, hw, o[0], o[1])),
        switch=lambda a, b: transition_cost(spec, stage, hw, a, b).time,
        peak=lambda o: working_set(spec, stage, o[0]) if dict(zip(SETTING_NAMES, o[1]))["recompute"] == "full" else 0.0,
        budget=budget, buckets=BUCKETS,
        # the spec's micro_batch is the coarse split's: some layer keeps the family's tp
        must=base.tp if spec.train.micro_batch is not None else None,
    )
    if spec.model.tie_embeddings:  # the head at block 0's degree, after a reshard from block L-1's
        found = cheapest(spec.model.layers, options, first=lambda c: (0.0, 0.0),
                         last=lambda c0, c: _pair(ends(spec, stage, hw, c0, c)), coupled=True, **common)
    else:  # ends(first, last) = the table at first + (the head at last − the table at last)
        found = cheapest(
            spec.model.layers, options, first=lambda c: _pair(embedding_cost(spec, stage, hw, c)),
            last=lambda _c0, c: _pair(head_cost(spec, stage, hw, c) + embedding_cost(spec, stage, hw, c).scaled(-1)),
            **common,
        )
    if found is None:
        return None
    return layout_of(base, stage, found[1])


def _pair(cost) -> tuple[float, float]:
    return cost.time, cost.memory.total


def layout_of(base: Layout, stage: Stage, chosen) -> Layout | None:
    """The program's choice as a ``Layout``: the coarse tp is the largest chosen, the
    micro-batch that tp's piece (None when every layer agrees: a uniform layout)."""
    tps = tuple(t for t, _ in chosen)
    per_setting = list(zip(*(settings for _, settings in chosen)))
    top = max(tps)
    values = {name: (vals[0] if len(set(vals)) == 1 else tuple(vals)) for name, vals in zip(SETTING_NAMES, per_setting)}
    if len(set(tps)) == 1 and not any(isinstance(v, tuple) for v in values.values()):
        return None
    return replace(
        base, tp=top, dp=stage.ranks // top, micro_batch=stage.micro_batch * top // stage.tp,
        sp=stage.sp and top > 1, layer_tp=tps if len(set(tps)) > 1 else None, **values,
    )
