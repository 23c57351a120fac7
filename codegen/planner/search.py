"""The layout search: every valid layout of a spec's ``auto`` keys, ranked by the cost model.

Takes: a ``Spec`` (its ``None`` parallel values are ``auto``; the rest are fixed),
``Hardware`` and an ``Accounting``. Gives: ``search(...)`` → ``SearchResult``, the
estimates best first, with how many layouts were considered and how many did not
fit. ``candidates(spec)`` enumerates the layouts alone. Before: ``codegen/cost``.
After: ``codegen/cli/plan.py``, ``codegen/passes/choose_layout.py``.

The candidates are ``runtime/layout/layouts.py``'s (Note [the search space] there): every
combination the validator accepts, the same enumeration ``parc check`` asks whether any
layout exists at all (tests/planner checks the set against the validator).

Note [per-layer recompute]: with ``recompute = auto`` the candidates are the uniform
modes and, where ``full`` fits but a lighter mode does not, the mix with the fewest
full blocks that fits (``mixed_recompute``): it recomputes less than ``full`` and so
is faster, which the ranking then sees.

Note [ranking and ties]: layouts that fit come first, by predicted step time (the
global batch is fixed, so that is throughput); the best ``EXACT_TOP`` by the fast
estimate are re-scored with the simulated schedule (Note [fast and exact bubbles]) and
then ranked. Step times within ``TIE_TOLERANCE`` (0.5%) of the fastest layout not yet
ranked count as a tie — the model cannot tell such layouts apart, and a user would
rather have the memory headroom or the simpler program — and among those the next
place goes to, in order: lower peak memory (counted in steps of ``MEMORY_STEP``, 1% of
the device's memory, so a few megabytes never decide; in bytes when the device's
memory is unknown), fewer pipeline stages, lower tp, lower ZeRO stage, each per-layer
setting's own preference (``LayerSetting.tie``: less recompute — none, selective,
full —, then fewer sub-batches), sp off before on, schedule 1f1b,
interleaved, gpipe, fewer chunks, larger micro_batch, lower exact peak memory; then
the faster. So a layout is never ranked above one more than 0.5% faster than it (the
window is anchored at the fastest remaining layout, not at bucket edges).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, fields, replace

from parc.dsl.spec import PipelineSchedule, Spec
from parc.runtime.schedules.schedule import KINDS, SLICED, chunks_for
from parc.runtime.layout.layouts import layouts
from parc.runtime.layout.layer_settings import SETTINGS

from .cost import Accounting, Estimate, Hardware, Layout, estimate
from .cost.estimate import USABLE_MEMORY, layout_memory
from .cost.options import options
from .layer_pipeline import pipeline_family
from .layer_search import per_layer_candidates
from ..spec_values import spec_values

EXACT_TOP = 3
SIMPLEST_SCHEDULES = ("1f1b", "interleaved", "gpipe")
SCHEDULE_ORDER = {kind: i for i, kind in enumerate(
    SIMPLEST_SCHEDULES + tuple(kind for kind in KINDS if kind not in SIMPLEST_SCHEDULES))}
"""A tie's simpler schedule: 1f1b, interleaved, gpipe, then the schedule table's other
kinds in its order (``runtime/schedules/schedule.KINDS``)."""


class Incomplete(Exception):
    """A reader of a bounded search's result needs a place it stopped short of
    (``bounded.py``, Note [the bounded search]): ask ``search`` instead."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SearchResult:
    estimates: tuple[Estimate, ...]
    """Every layout considered, best first (Note [ranking and ties]); a bounded search's
    (``complete`` False): the first places of that ranking only."""
    considered: int
    fitting: int
    complete: bool = True
    """``estimates`` holds every layout considered."""
    unfit: tuple[Estimate, ...] | None = None
    """A bounded search's whose ``estimates`` stop among the layouts that fit: the first
    places of those that do not (place ``fitting`` + i), else None."""

    def first(self, test) -> Estimate | None:
        """The first of ``estimates`` passing ``test``, or None (Incomplete: not among the places known)."""
        found = next((item for item in self.estimates if test(item)), None)
        if found is None and not self.complete:
            raise Incomplete
        return found

    @property
    def winner(self) -> Estimate | None:
        """The best layout ``parc build`` can generate and that fits, or None."""
        return self.first(lambda item: item.fits and item.buildable)

    @property
    def best_uniform(self) -> Estimate | None:
        """The best buildable layout that fits giving every layer the same degrees and
        settings (the baseline of a per-layer winner's gain), or None."""
        return self.first(lambda item: item.fits and item.buildable and item.layout.layer_tp is None
                          and not item.layout.per_layer)


def candidates(spec: Spec) -> list[Layout]:
    """Every valid layout agreeing with the spec's fixed keys (Note [the search space] in
    ``runtime/layout/layouts.py``), as the cost model's ``Layout``."""
    return [
        Layout(**{name: values[name] for name in LAYOUT_FIELDS}
               | {"chunks": chunks_for(values["schedule"], values["chunks"]) if values["pp"] > 1 else 1})
        for values in layouts(spec_values(spec))
    ]


LAYOUT_FIELDS = tuple(item.name for item in fields(Layout))
"""The values of a completed layout the cost model's ``Layout`` holds."""


TIE_TOLERANCE = 0.005
"""Step times within this fraction of the fastest remaining layout are a tie."""

MEMORY_STEP = 0.01
"""Peak memory breaks a tie in steps of this fraction of the device's memory."""

TIE_BREAKS = (
    ("fewer pipeline stages", lambda layout: layout.pp),
    ("one tp for every layer", lambda layout: layout.layer_tp is not None),
    ("lower cp", lambda layout: layout.cp),
    ("lower tp", lambda layout: layout.tp),
    ("lower ZeRO stage", lambda layout: layout.zero),
    *((entry.tie, (lambda entry: lambda layout: entry.simpler(layout.setting(entry.name)))(entry)) for entry in SETTINGS),
    ("sp off", lambda layout: layout.sp),
    ("exact gradients (no compression)", lambda layout: layout.compress != "none"),
    ("the simpler schedule", lambda layout: SCHEDULE_ORDER[layout.schedule]),
    ("fewer chunks", lambda layout: layout.chunks),
    ("fewer token slices", lambda layout: layout.slices),
    ("a larger micro_batch", lambda layout: -layout.micro_batch),
)
"""Between the coarse and the exact peak memory of ``tie_key``: what each rule prefers."""
TIE_RULES = ("lower peak memory", *(rule for rule, _ in TIE_BREAKS), "lower peak memory")
"""The name of each place of ``tie_key``, for the "why" lines."""


def tie_key(item: Estimate, memory_unit: float | None) -> tuple:
    """Note [ranking and ties]: what decides between layouts whose step times tie;
    ``memory_unit``: bytes per step of peak memory (None: compare bytes)."""
    peak = item.memory.total
    coarse = peak if not memory_unit else math.floor(peak / memory_unit)
    return (coarse, *(key(item.layout) for _, key in TIE_BREAKS), peak)


def tie_rule(first: Estimate, second: Estimate, memory_unit: float | None) -> str | None:
    """The rule of ``TIE_RULES`` that puts ``first`` before ``second`` on a tie, or None."""
    for rule, a, b in zip(TIE_RULES, tie_key(first, memory_unit), tie_key(second, memory_unit)):
        if a != b:
            return rule if a < b else None
    return None


def tie_memory_unit(hw: Hardware) -> float | None:
    """Bytes per step of peak memory in ``tie_key``: ``MEMORY_STEP`` of the device's memory."""
    return None if hw.memory is None else hw.memory * MEMORY_STEP


def rank(items, memory_unit: float | None) -> list[Estimate]:
    """Note [ranking and ties]: fitting layouts first, then by time with ties broken."""
    items, ranked = list(items), []
    for fits in (True, False):
        group = sorted((item for item in items if item.fits == fits), key=lambda item: item.time.step)
        ranked += break_ties(group, memory_unit)
    return ranked


def break_ties(group: list[Estimate], memory_unit: float | None, least_left: float = math.inf) -> list[Estimate]:
    """``group`` sorted by step time; each place goes to the least ``tie_key`` among the
    layouts within ``TIE_TOLERANCE`` of the fastest one not yet placed. ``least_left``: a
    step time no layout outside ``group`` goes below (the bounded search's, Note [the
    bounded search]); the places stop where such a layout could join the window."""
    placed, window, out = [False] * len(group), [], []
    fastest = admitted = 0
    while len(out) < len(group):
        while placed[fastest]:
            fastest += 1
        limit = group[fastest].time.step * (1.0 + TIE_TOLERANCE)
        if limit >= least_left:
            break  # a layout outside the group could join this window
        while admitted < len(group) and group[admitted].time.step <= limit:
            heapq.heappush(window, (tie_key(group[admitted], memory_unit), admitted))
            admitted += 1
        _, index = heapq.heappop(window)
        placed[index] = True
        out.append(group[index])
    return out


def search(spec: Spec, hw: Hardware, accounting: Accounting = Accounting.PARC) -> SearchResult:
    """Note [ranking and ties]; Note [per-layer recompute]."""
    layouts = candidates(spec)
    unit = tie_memory_unit(hw)
    scored = [estimate(spec, layout, hw, accounting, exact=False) for layout in layouts]
    if spec.parallel.recompute is None:
        scored += mixed_recompute(spec, scored, hw, accounting)
    # Note [the per-layer dynamic program]
    scored += per_layer_candidates(spec, scored, hw, accounting, pipeline_family=pipeline_family)
    fast = rank(scored, unit)
    head = [estimate(spec, item.layout, hw, accounting, exact=True) for item in fast[:EXACT_TOP]]
    # The build winner must be exact too, even when zero-3 layouts crowd the top.
    tail = fast[EXACT_TOP:]
    if not any(item.fits and item.buildable for item in head):
        for index, item in enumerate(tail):
            if item.fits and item.buildable:
                head.append(estimate(spec, item.layout, hw, accounting, exact=True))
                tail = tail[:index] + tail[index + 1 :]
                break
    ranked = tuple(rank(head, unit)) + tuple(tail)
    return SearchResult(
        estimates=ranked, considered=len(scored), fitting=sum(1 for item in ranked if item.fits)
    )


def fixed_layout(spec: Spec) -> Layout | None:
    """The spec's own layout when it leaves nothing to the planner, else None."""
    par = spec.parallel
    if not spec.layout_complete:
        return None
    return Layout(
        dp=par.dp, tp=par.tp, pp=par.pp, cp=par.cp, sp=bool(par.sp), zero=par.zero, ep=par.ep,
        schedule=par.schedule.value if par.pp > 1 else "1f1b",
        chunks=chunks_for(par.schedule.value, par.chunks) if par.pp > 1 else 1,
        slices=par.slices if par.pp > 1 and par.schedule.value in SLICED else 1,
        micro_batch=spec.train.micro_batch, compress=par.compress, layer_tp=par.layer_tp,
        **{entry.name: entry.of_spec(par) for entry in options()},
        **{entry.name: par.setting(entry.name) for entry in SETTINGS},
    )


def with_layout(spec: Spec, layout: Layout) -> Spec:
    """``spec`` with ``layout`` written into its parallel block and micro_batch (for the build)."""
    return replace(
        spec,
        train=replace(spec.train, micro_batch=layout.micro_batch),
        parallel=replace(
            spec.parallel,
            dp=layout.dp, tp=layout.tp, pp=layout.pp, cp=layout.cp, sp=layout.sp, zero=layout.zero, ep=layout.ep,
            schedule=PipelineSchedule(layout.schedule), chunks=layout.chunks, slices=layout.slices,
            slice_lengths=_slice_lengths(spec, layout),
            compress=layout.compress, layer_tp=layout.layer_tp, layer_dp=layout.layer_dp,
            **{name: value for entry in options()
               for name, value in entry.to_spec(getattr(layout, entry.name), spec.parallel).items()},
        ).with_settings({entry.name: layout.setting(entry.name) for entry in SETTINGS}),
    )


def _slice_lengths(spec: Spec, layout: Layout) -> tuple[int, ...] | None:
    """The spec's uneven slice lengths where the layout keeps its sliced schedule and their
    count (the cost model prices a layout's slices by their mean length: docs/planner.md)."""
    lengths = spec.parallel.slice_lengths
    keep = lengths is not None and layout.schedule in SLICED and layout.slices == len(lengths)
    return lengths if keep else None


def mixed_recompute(spec: Spec, scored: list[Estimate], hw: Hardware, accounting: Accounting, *,
                    best: float | None = None) -> list[Estimate]:
    """Note [per-layer recompute]: Korthikanti's trade, layer by layer. Where a layout
    fits with ``recompute = full`` but not with a lighter mode, the fewest full blocks
    (the first ones: under 1F1B the first stage holds the most micro-batches in
    flight) with the lighter mode on the rest that fit — found by bisection, memory
    growing as blocks go lighter. Each such mix is one more candidate."""
    layers = spec.model.layers
    if hw.memory is None:
        return []  # the memory is unknown: every layout fits, nothing to trade
    limit = hw.memory * USABLE_MEMORY
    by_layout = {item.layout: item for item in scored}
    if best is None:  # the fastest that fits (the bounded search knows it without reading every time)
        best = min((item.time.step for item in scored if item.fits), default=math.inf)
    out = []
    for item in scored:
        layout = item.layout
        if layout.recompute != "full" or not item.fits or layers < 2:
            continue
        for lighter in ("none", "selective"):
            sibling = by_layout.get(replace(layout, recompute=lighter))
            if sibling is None or sibling.fits:
                continue  # the lighter mode fits (or is not a candidate): nothing to trade
            if sibling.time.step > best * (1 + TIE_TOLERANCE):
                continue  # a mix is slower than the lighter mode, which cannot win either
            low, high = 1, layers  # j = high full blocks fit; find the least
            while low < high:
                mid = (low + high) // 2
                trial = replace(layout, recompute=("full",) * mid + (lighter,) * (layers - mid))
                if layout_memory(spec, trial, hw, accounting).peak.total <= limit:
                    high = mid
                else:
                    low = mid + 1
            if high < layers:
                mix = replace(layout, recompute=("full",) * high + (lighter,) * (layers - high))
                out.append(estimate(spec, mix, hw, accounting, exact=False))
    return out
