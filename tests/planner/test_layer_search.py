"""The per-layer dynamic program (Note [the per-layer dynamic program]) against brute force.

The program's general form (``cheapest``) is checked on hand-built cases — one where
memory makes a mix of layer settings win, one where the reshard's cost keeps the layout
uniform — and on random small problems, each against every assignment of options to
layers. Then the planner's own use: on a 4-layer GPT with a large vocabulary and a low
memory limit on 4 ranks, every per-layer assignment of tp and recompute is costed by
``cost/per_layer.layout_cost`` and the program's choice is the cheapest that fits; a
heterogeneous layout whose layers agree costs what the uniform one does.
"""

from __future__ import annotations

import itertools
import math
import random
from dataclasses import replace
from pathlib import Path

import pytest

from parc.codegen.planner import layer_search
from parc.codegen.planner.cost import Accounting, hardware_for
from parc.codegen.planner.cost.estimate import USABLE_MEMORY, estimate
from parc.codegen.planner.cost.per_layer import Stage, layout_cost, transition_cost, uniform
from parc.codegen.planner.layer_search import cheapest
from parc.codegen.planner.search import search
from parc.dsl import load

ROOT = Path(__file__).resolve().parents[2]
SETS = ["parallel.tp=auto", "parallel.dp=auto", "parallel.recompute=auto", "model.vocab=32000",
        "model.seq_len=256", "train.micro_batch=4", "mesh.device=h100-80gb"]


def brute(layers, options, *, cls, cost, switch, first, last, budget, peak=None, coupled=False, must=None,
          buckets=layer_search.BUCKETS):
    """Every assignment, with the program's units (each term rounded up)."""
    unit = None if budget is None else budget / buckets

    def units(nbytes):
        return 0 if unit is None else max(0, math.ceil(nbytes / unit - 1e-9))

    best = None
    for chosen in itertools.product(options, repeat=layers):
        if must is not None and all(cls(o) != must for o in chosen):
            continue
        c0, cl = cls(chosen[0]), cls(chosen[-1])
        ends = last(c0 if coupled else None, cl)
        time = sum(cost(o)[0] for o in chosen) + first(c0)[0] + ends[0]
        time += sum(switch(cls(a), cls(b)) for a, b in zip(chosen, chosen[1:]))
        cap = max((peak(o) for o in chosen), default=0.0) if peak else 0.0
        used = sum(units(cost(o)[1]) for o in chosen) + units(first(c0)[1]) + units(ends[1]) + units(cap)
        if unit is not None and used > buckets:
            continue
        if best is None or time < best[0] - 1e-12:
            best = (time, chosen)
    return best


def _objective(chosen, *, cls, cost, switch, first, last, coupled=False, **_):
    c0 = cls(chosen[0])
    time = sum(cost(o)[0] for o in chosen) + first(c0)[0] + last(c0 if coupled else None, cls(chosen[-1]))[0]
    return time + sum(switch(cls(a), cls(b)) for a, b in zip(chosen, chosen[1:]))


def _problem(switch_cost):
    # A: fast and large, B: slow and small; four layers, room for two A's
    table = {"A": (1.0, 10.0), "B": (2.0, 4.0)}
    return dict(
        cls=lambda o: o, cost=table.__getitem__, switch=lambda a, b: 0.0 if a == b else switch_cost,
        first=lambda c: (0.0, 0.0), last=lambda c0, c: (0.0, 0.0), budget=30.0,
    )


def test_memory_bound_mix_wins():
    problem = _problem(0.1)
    time, chosen = cheapest(4, ["A", "B"], **problem, buckets=30)
    assert sorted(chosen) == ["A", "A", "B", "B"]
    assert sum(1 for a, b in zip(chosen, chosen[1:]) if a != b) == 1  # one reshard, not three
    assert time == pytest.approx(6.1)
    assert brute(4, ["A", "B"], **problem, buckets=30)[0] == pytest.approx(time)


def test_transition_cost_keeps_it_uniform():
    problem = _problem(5.0)
    time, chosen = cheapest(4, ["A", "B"], **problem, buckets=30)
    assert chosen == ("B",) * 4 and time == pytest.approx(8.0)
    assert brute(4, ["A", "B"], **problem, buckets=30)[0] == pytest.approx(time)


def test_nothing_fits():
    problem = {**_problem(0.0), "budget": 10.0}
    assert cheapest(4, ["A", "B"], **problem, buckets=10) is None


@pytest.mark.parametrize("seed", range(40))
def test_random_problems_agree_with_brute_force(seed):
    rng = random.Random(seed)
    layers = rng.randint(2, 4)
    classes = rng.sample([1, 2, 4, 8], rng.randint(1, 3))
    options = [(c, k) for c in classes for k in range(rng.randint(1, 2))]
    costs = {o: (rng.uniform(1, 3), rng.uniform(0, 10)) for o in options}
    switches = {(a, b): 0.0 if a == b else rng.uniform(0, 2) for a in classes for b in classes}
    firsts = {c: (rng.uniform(0, 1), rng.uniform(0, 5)) for c in classes}
    lasts = {(a, b): (rng.uniform(0, 1), rng.uniform(0, 5)) for a in classes + [None] for b in classes}
    peaks = {o: rng.choice([0.0, rng.uniform(0, 5)]) for o in options}
    coupled = rng.random() < 0.5
    problem = dict(
        cls=lambda o: o[0], cost=costs.__getitem__, switch=lambda a, b: switches[(a, b)],
        first=firsts.__getitem__, last=lambda a, b: lasts[(a, b)], peak=peaks.__getitem__,
        budget=rng.choice([None, rng.uniform(10, 40)]), coupled=coupled,
        must=rng.choice([None, classes[0]]),
    )
    found = cheapest(layers, options, **problem, buckets=16)
    expected = brute(layers, options, **problem, buckets=16)
    assert (found is None) == (expected is None)
    if found is not None:
        assert found[0] == pytest.approx(expected[0], rel=1e-12)
        assert _objective(found[1], **problem) == pytest.approx(found[0], rel=1e-12)  # the walk back is right


# ---- the planner's use -----------------------------------------------------------


def _spec(*extra):
    return load(str(ROOT / "examples" / "tiny.par"), SETS + list(extra))


def _brute_layouts(spec, base, hw):
    """Every per-layer (tp, recompute) assignment of ``base``'s family as a layout, costed."""
    stage = Stage(ranks=base.dp * base.tp, tp=base.tp, micro_batch=base.micro_batch, sp=base.sp)
    options = layer_search._options(spec, base)
    budget = hw.memory * USABLE_MEMORY
    best = None
    for chosen in itertools.product(options, repeat=spec.model.layers):
        if all(t != base.tp for t, _ in chosen):
            continue  # the spec's micro_batch is the family's coarse one
        tps = tuple(t for t, _ in chosen)
        layout = replace(base, layer_tp=tps, recompute=tuple(s[0] for _, s in chosen), overlap=chosen[0][1][1])
        cost = layout_cost(spec, layout, hw)
        if cost.memory.total <= budget and (best is None or cost.time < best[0]):
            best = (cost.time, chosen)
    return stage, best


@pytest.mark.parametrize("memory, recompute", [("80 MiB", "auto"), ("120 MiB", "none"), ("200 MiB", "none")])
def test_the_planner_program_agrees_with_brute_force(memory, recompute, monkeypatch):
    monkeypatch.setattr(layer_search, "BUCKETS", 1024)  # fine units: nothing near the limit is lost
    spec = _spec(f"mesh.device_memory={memory}", f"parallel.recompute={recompute}", "model.layers=3")
    hw = hardware_for(spec)
    base = uniform(Stage(ranks=4, tp=4, micro_batch=4, sp=False), 4)
    stage, best = _brute_layouts(spec, base, hw)
    found = layer_search._family(spec, base, stage, hw, hw.memory * USABLE_MEMORY)
    if best is None:
        assert found is None
        return
    if found is None:  # the best assignment is uniform: the program offers nothing new
        assert len({o for o in best[1]}) == 1
        return
    assert memory == "200 MiB" or len(set(found.layer_tp)) > 1  # these limits make mixed degrees win
    layout = found if found.layer_tp is not None else replace(found, layer_tp=(found.tp,) * spec.model.layers)
    assert layout_cost(spec, layout, hw).time == pytest.approx(best[0], rel=1e-9)


def test_a_low_memory_limit_makes_a_heterogeneous_layout_win():
    spec = _spec("mesh.device_memory=120 MiB")
    result = search(spec, hardware_for(spec))
    winner, uniform_best = result.winner, result.best_uniform
    assert winner.layout.layer_tp is not None and len(set(winner.layout.layer_tp)) > 1
    assert winner.time.step < uniform_best.time.step and winner.fits


def test_agreeing_layers_cost_the_uniform_layout():
    spec = _spec("mesh.device_memory=300 MiB")
    hw = hardware_for(spec)
    stage = Stage(ranks=4, tp=4, micro_batch=4, sp=False)
    for t in (4, 2, 1):
        flat = uniform(stage, t)
        hetero = replace(flat, layer_tp=(t,) * spec.model.layers)
        a, b = estimate(spec, flat, hw, Accounting.PARC), estimate(spec, hetero, hw, Accounting.PARC)
        assert b.time.step == pytest.approx(a.time.step, rel=1e-9)
        assert b.memory.total == pytest.approx(a.memory.total, rel=1e-9)


def test_reshard_cost_follows_the_runtime_steps():
    """A degree change costs one all-gather per micro-batch (forward when tp grows, backward
    when it shrinks: the same volume), two more under sp; none between equal degrees."""
    spec = _spec("mesh.device_memory=300 MiB")
    hw = hardware_for(spec)
    stage = Stage(ranks=4, tp=4, micro_batch=4, sp=False)
    assert transition_cost(spec, stage, hw, 2, 2).time == 0.0
    up, down = transition_cost(spec, stage, hw, 1, 4).time, transition_cost(spec, stage, hw, 4, 1).time
    assert up == pytest.approx(down) and up > 0
    with_sp = transition_cost(spec, replace(stage, sp=True), hw, 4, 2).time
    assert with_sp > transition_cost(spec, stage, hw, 4, 2).time


def test_a_written_list_is_predicted_per_layer():
    """``parc plan`` of a spec giving ``tp = [2, 2, 1, 1]``: costed per layer (pp = 1), and
    per stage under pp = 2 (cost/per_stage.py): no why line about the coarse split."""
    from parc.codegen.cli.plan import plan
    from parc.codegen.planner.why import why

    lists = ["parallel.tp=[2, 2, 1, 1]", "parallel.dp=[1, 1, 2, 2]", "mesh.devices_per_node=2"]
    spec = load(str(ROOT / "examples" / "tiny.par"), lists)
    hw = hardware_for(spec)
    item = plan(spec).estimates[0]
    assert item.layout.layer_tp == (2, 2, 1, 1)
    coarse = estimate(spec, replace(item.layout, layer_tp=None), hw)
    assert item.time.step != coarse.time.step and item.memory.total != coarse.memory.total
    assert not any("coarse split" in line for line in why(spec, plan(spec), hw))
    piped = load(str(ROOT / "examples" / "tiny.par"),
                 ["parallel.tp=[2, 1, 1, 2]", "parallel.dp=[1, 2, 2, 1]", "mesh.devices_per_node=4", "parallel.pp=2"])
    item = plan(piped).estimates[0]
    coarse = estimate(piped, replace(item.layout, layer_tp=None), hardware_for(piped))
    assert item.time.step != coarse.time.step and item.memory.total != coarse.memory.total
    assert not any("coarse split" in line for line in why(piped, plan(piped), hardware_for(piped)))
