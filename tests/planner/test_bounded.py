"""The bounded search and the planner's caches change no figure `parc plan` shows (Note [the
bounded search] in codegen/planner/bounded.py, Note [planner caches] in cost/memo.py)."""

from __future__ import annotations

import argparse
import math

import pytest

from parc.codegen.cli.plan import _output
from parc.codegen.planner import bounded
from parc.codegen.planner.bounded import bounded_search
from parc.codegen.planner.cost import Accounting, estimate, hardware_for, memo
from parc.codegen.planner.cost.time import pipeline_bound, step_time
from parc.codegen.planner.search import Incomplete, candidates, search
from parc.dsl import load

MIXTRAL = "examples/mixtral-8x7b.par"
SMALL = "tests/planner/specs/plan_small.par"
SMALL_MOE = ["model.arch=llama", "model.experts=4", "model.top_k=2", "parallel.ep=auto", "parallel.etp=auto"]
SPECS = [
    (MIXTRAL, []),  # etp = auto, as the example ships
    (MIXTRAL, ["parallel.sp=auto"]),
    (SMALL, SMALL_MOE),  # another MoE spec: 8 ranks on one node, tp, ep and etp searched
    (SMALL, ["parallel.tp=2"]),  # dense, the per-layer program off (tp given)
]


def _text(spec, result, accounting, top: int, as_json: bool) -> str:
    return _output(spec, result, accounting, argparse.Namespace(top=top, json=as_json))


@pytest.mark.parametrize("path, sets", SPECS)
@pytest.mark.parametrize("accounting", [Accounting.PARC, Accounting.MEGATRON])
def test_bounded_plan_prints_what_the_exhaustive_search_prints(path, sets, accounting):
    spec = load(path, sets)
    hw = hardware_for(spec)
    whole = search(spec, hw, accounting)
    part = bounded_search(spec, hw, accounting)
    assert (part.considered, part.fitting) == (whole.considered, whole.fitting)
    assert whole.estimates[: len(part.estimates)] == part.estimates  # the same places, the same figures
    for top, as_json in ((1, False), (5, False), (5, True), (20, True)):
        try:
            shown = _text(spec, part, accounting, top, as_json)
        except Incomplete:
            continue  # parc plan asks the exhaustive search then
        assert shown == _text(spec, whole, accounting, top, as_json)


def test_the_bounded_search_stops_short_on_mixtral():
    spec = load(MIXTRAL)
    part = bounded_search(spec, hardware_for(spec))
    assert not part.complete and len(part.estimates) < part.fitting < part.considered
    # parc plan's default output reads only places it holds (no fall back to the whole search)
    assert "ep 8 over replicated experts" in _text(spec, part, Accounting.PARC, 5, False)


def test_a_place_the_bounded_search_does_not_hold_is_asked_for_not_guessed(monkeypatch):
    # a few places: not the best ep 1 layout (#31) the why lines name (with 32 or fewer the
    # fastest fitting layout may be unscored, and the bounded search hands over to the whole)
    monkeypatch.setattr(bounded, "SCORED", 64)
    spec = load(MIXTRAL)
    hw = hardware_for(spec)
    part = bounded_search(spec, hw)
    assert not part.complete
    for top in (0, 5):
        with pytest.raises(Incomplete):
            _text(spec, part, Accounting.PARC, top, False)
    with pytest.raises(Incomplete):
        part.first(lambda item: False)
    whole = search(spec, hw)
    assert whole.estimates[: len(part.estimates)] == part.estimates


@pytest.mark.parametrize("path, sets", SPECS[:1] + SPECS[2:3])
def test_the_bound_is_below_every_fast_step_time(path, sets):
    spec = load(path, sets)
    hw = hardware_for(spec)
    for layout in candidates(spec)[::7]:
        assert pipeline_bound(spec, layout, hw) <= step_time(spec, layout, hw, exact=False).step


@pytest.mark.parametrize("path, sets, stride", [(MIXTRAL, [], 29), (SMALL, SMALL_MOE, 13)])
def test_caches_change_no_figure(path, sets, stride):
    # every figure of a layout's estimate, from tables the search filled, equals the one
    # computed from empty tables (Note [planner caches])
    spec = load(path, sets)
    hw = hardware_for(spec)
    layouts = candidates(spec)
    warm = [estimate(spec, layout, hw, exact=False) for layout in layouts]
    for layout, item in list(zip(layouts, warm))[::stride]:
        memo.clear()
        cold = estimate(spec, layout, hw, exact=False)
        assert cold == item
        assert all(math.isfinite(x) for x in (cold.time.step, cold.memory.total))
