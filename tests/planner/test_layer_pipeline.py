"""The per-layer search under a pipeline (Note [the per-layer program over a pipeline]) and
the cost of a heterogeneous pipelined layout (Note [per-layer layouts over a pipeline]).

A 4-layer GPT with a large vocabulary on pp = 2 stages of 2 ranks: the program's choice
is checked against every per-layer assignment of (tp, recompute) that ``parc build``
accepts, priced whole by ``cost/per_stage.py``, under several memory limits and with the
stage boundary on a slow network (where the boundary's degree decides the message). A
heterogeneous pipelined layout whose layers agree costs what the uniform one does, ZeRO
1-3 included.
"""

from __future__ import annotations

import itertools
from dataclasses import replace
from pathlib import Path

import pytest

from parc.codegen.planner import layer_search
from parc.codegen.planner.cost import Accounting, hardware_for
from parc.codegen.planner.cost.estimate import USABLE_MEMORY, buildable, estimate
from parc.codegen.planner.cost.per_layer import Stage, micro_batches, uniform
from parc.codegen.planner.cost.per_stage import boundary_comm, pipeline_time_memory
from parc.codegen.planner.layer_pipeline import pipeline_family
from parc.codegen.planner.search import search
from parc.dsl import load

ROOT = Path(__file__).resolve().parents[2]
SETS = ["parallel.tp=auto", "parallel.dp=auto", "parallel.pp=2", "parallel.recompute=auto", "model.vocab=32000",
        "model.seq_len=256", "train.micro_batch=4", "mesh.device=h100-80gb", "mesh.devices_per_node=4"]


def _spec(*extra):
    return load(str(ROOT / "examples" / "tiny.par"), SETS + list(extra))


def _brute(spec, base, hw):
    """The fastest buildable per-layer assignment of ``base``'s family that fits, priced whole."""
    options = layer_search._options(spec, base)
    budget = hw.memory * USABLE_MEMORY
    best = None
    for chosen in itertools.product(options, repeat=spec.model.layers):
        if all(t != base.tp for t, _ in chosen):
            continue  # the spec's micro_batch is the family's coarse one
        tps = tuple(t for t, _ in chosen)
        layout = replace(base, layer_tp=tps, recompute=tuple(s[0] for _, s in chosen))
        if not buildable(spec, layout):
            continue  # PAR0255: one degree on both sides of the boundary, tied ends alike
        time, mem = pipeline_time_memory(spec, layout, hw)
        if mem.peak.total <= budget and (best is None or time.step < best[0]):
            best = (time.step, chosen)
    return best


@pytest.mark.parametrize("extra", [
    ["mesh.device_memory=110 MiB"],
    ["mesh.device_memory=120 MiB"],
    ["mesh.device_memory=200 MiB", "model.tie_embeddings=false"],
    ["mesh.device_memory=150 MiB", "mesh.nodes=2", "mesh.devices_per_node=2", "mesh.inter_node=1 Gb/s"],
])
def test_the_pipelined_program_agrees_with_brute_force(extra, monkeypatch):
    monkeypatch.setattr(layer_search, "BUCKETS", 1024)  # fine units: nothing near the limit is lost
    spec = _spec(*extra)
    hw = hardware_for(spec)
    stage = Stage(ranks=2, tp=2, micro_batch=4, sp=False, pp=2)
    base = uniform(stage, 2)
    best = _brute(spec, base, hw)
    found = pipeline_family(spec, base, stage, hw, hw.memory * USABLE_MEMORY, layer_search._options(spec, base))
    if best is None or len(set(best[1])) == 1:  # nothing fits, or the best is uniform
        assert found is None
        return
    assert found is not None
    time, mem = pipeline_time_memory(spec, replace(found, layer_tp=found.layer_tp or (2,) * 4), hw)
    assert time.step == pytest.approx(best[0], rel=1e-12)
    assert mem.peak.total <= hw.memory * USABLE_MEMORY and buildable(spec, found)


def test_a_slow_boundary_is_crossed_at_the_smaller_degree():
    """Each rank sends its piece of the micro-batch: at tp 1 half of what tp 2 sends. Over a
    1 Gb/s link the program puts the boundary at tp 1; the step counts the messages."""
    spec = _spec("mesh.device_memory=150 MiB", "mesh.nodes=2", "mesh.devices_per_node=2", "mesh.inter_node=1 Gb/s")
    hw = hardware_for(spec)
    stage = Stage(ranks=2, tp=2, micro_batch=4, sp=False, pp=2)
    assert boundary_comm(spec, stage, hw, 1) < boundary_comm(spec, stage, hw, 2)
    result = search(spec, hw)
    winner = result.winner.layout
    assert winner.layer_tp is not None and winner.layer_tp[1] == winner.layer_tp[2] == 1
    message = boundary_comm(spec, stage, hw, 1)
    assert result.winner.time.pp_comm == pytest.approx(2 * micro_batches(spec, stage) * message)
    assert result.winner.time.step < result.best_uniform.time.step


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_agreeing_layers_cost_the_uniform_pipeline(zero, schedule):
    spec = _spec("mesh.device_memory=300 MiB", "mesh.devices_per_node=8")
    hw = hardware_for(spec)
    stage = Stage(ranks=4, tp=4, micro_batch=4, sp=False, zero=zero, pp=2, schedule=schedule)
    for t in (4, 2, 1):
        flat = uniform(stage, t)
        hetero = replace(flat, layer_tp=(t,) * spec.model.layers)
        for exact in (False, True):
            a, b = (estimate(spec, item, hw, Accounting.PARC, exact=exact) for item in (flat, hetero))
            assert b.time.step == pytest.approx(a.time.step, rel=1e-9)
            assert b.memory.total == pytest.approx(a.memory.total, rel=1e-9)
            assert b.peak_rank == a.peak_rank


def test_per_layer_zero_shards_over_each_layers_dp_group():
    """ZeRO-1 keeps a layer's moments over its own dp group: a tp-1 layer (dp 4) holds a
    quarter of its moments, a tp-4 layer (dp 1) all of them."""
    from parc.codegen.planner.cost.per_layer import layer_cost

    spec = _spec("mesh.device_memory=300 MiB", "mesh.devices_per_node=4", "parallel.pp=1")
    hw = hardware_for(spec)
    plain, sharded = (Stage(ranks=4, tp=4, micro_batch=4, sp=False, zero=z) for z in (0, 1))
    for t in (1, 2):
        a = layer_cost(spec, plain, hw, t, ("none", 1)).memory
        b = layer_cost(spec, sharded, hw, t, ("none", 1)).memory
        assert b.params == a.params and b.optimizer < a.optimizer
        assert b.optimizer == pytest.approx(a.optimizer / (4 // t), rel=1e-3)  # less torch's step counts
    four = layer_cost(spec, sharded, hw, 4, ("none", 1)).memory
    assert four.optimizer == layer_cost(spec, plain, hw, 4, ("none", 1)).memory.optimizer  # dp 1: nothing to shard


def test_parallel_auto_offers_per_layer_options():
    """With ``parallel = auto`` every per-layer setting is the planner's: a layer's options
    come from each setting's own values (overlap: sub-batch counts of the layer's piece of
    the micro-batch) as far as the build rules accept them with per-layer degrees."""
    spec = load(str(ROOT / "examples" / "tiny.par"),
                ["parallel=auto", "model.vocab=32000", "model.seq_len=256", "train.micro_batch=4",
                 "mesh.device=h100-80gb"])
    base = uniform(Stage(ranks=4, tp=4, micro_batch=4, sp=False), 4)
    options = layer_search._options(spec, base)
    assert {t for t, _ in options} == {4, 2, 1}
    assert {s[0] for _, s in options} == {"none", "selective", "full"}
    assert all((4 * t // 4) % k == 0 for t, (_, k) in options)
