"""The planner's price of terapipe with sp, recompute and ZeRO-3 (issue 33 item 7): ZeRO-3's
passes are the slices' (codegen/planner/cost/slices.py, Note [ZeRO-3 per slice]), a recompute
reruns each slice's blocks, and the search scores such layouts and picks one."""

from __future__ import annotations

import pytest

from parc.codegen.planner.cost import estimate, hardware_for
from parc.codegen.planner.cost.time import step_time
from parc.codegen.planner.search import fixed_layout, search
from parc.dsl import load

GPT3 = "examples/gpt3-175b.par"


def _gpt3(*sets: str):
    """GPT-3 175B on 128 nodes of 8: dp 16, tp 8 with sp, pp 8, the sets' schedule and ZeRO."""
    return load(GPT3, ["parallel.dp=16", "parallel.tp=8", "parallel.pp=8", "parallel.sp=true",
                       "parallel.overlap=none", *sets])


def _priced(*sets: str):
    spec = _gpt3(*sets)
    layout, hw = fixed_layout(spec), hardware_for(spec)
    assert estimate(spec, layout, hw).buildable
    return step_time(spec, layout, hw)


def test_zero3_under_terapipe_gathers_every_slice():
    """Each slice gathers every unit for its forward and its backward and reduce-scatters
    it: twice the slices, twice ZeRO-3's traffic (no replicas: nothing once a step), while
    ZeRO-2's reduction stays once per micro-batch whatever the slices."""
    two, four = (_priced("parallel.zero=3", "parallel.recompute=none", f"parallel.schedule=terapipe(slices = {s})")
                 for s in (2, 4))
    assert four.dp_comm == pytest.approx(2 * two.dp_comm, rel=1e-9)
    zero2 = [_priced("parallel.zero=2", "parallel.recompute=none", f"parallel.schedule=terapipe(slices = {s})")
             for s in (2, 4)]
    assert zero2[0].dp_comm == pytest.approx(zero2[1].dp_comm, rel=1e-9)
    assert two.dp_comm > zero2[0].dp_comm


def test_recompute_under_terapipe_reruns_the_forward():
    """Full recompute reruns each slice's blocks in its backward: the busy time grows by
    about a forward of every block, the memory of the kept activations falls."""
    plain, full = (_priced("parallel.zero=1", f"parallel.recompute={mode}", "parallel.schedule=terapipe(slices = 4)")
                   for mode in ("none", "full"))
    assert full.compute > plain.compute
    spec = _gpt3("parallel.zero=1", "parallel.schedule=terapipe(slices = 4)", "parallel.recompute=full")
    other = _gpt3("parallel.zero=1", "parallel.schedule=terapipe(slices = 4)", "parallel.recompute=none")
    hw = hardware_for(spec)
    assert (estimate(spec, fixed_layout(spec), hw).peak_mem_bytes
            < estimate(other, fixed_layout(other), hw).peak_mem_bytes)


def test_the_search_picks_terapipe_with_sp_and_scores_zero3_and_recompute():
    """Under schedule = terapipe(slices = 4) the search's buildable layouts include sp,
    ZeRO-3 and recompute, and its winner splits the sequence over tp (sp)."""
    spec = load(GPT3, ["parallel.schedule=terapipe(slices = 4)"])
    result = search(spec, hardware_for(spec))
    built = [item.layout for item in result.estimates if item.buildable]
    assert any(layout.sp and layout.zero == 3 and layout.recompute == "full" for layout in built)
    assert result.winner.layout.schedule == "terapipe" and result.winner.layout.sp


def _mixtral(*sets: str):
    """Mixtral 8x7B on 8 nodes of 8: dp 16, pp 4, ep 2, the sets' schedule."""
    return load("examples/mixtral-8x7b.par", ["parallel.dp=16", "parallel.tp=1", "parallel.pp=4", "parallel.ep=2",
                                              "parallel.etp=1", "parallel.zero=1", "parallel.recompute=full",
                                              "parallel.overlap=none", "train.micro_batch=1", *sets])


def test_experts_under_terapipe_dispatch_every_slice():
    """Each slice's tokens go through their own all-to-alls (Note [experts per slice]): the
    same rows in S messages, each paying its latency, so the expert traffic's time grows
    with the slices; the layouts are buildable and the search under terapipe picks one."""
    times = []
    for schedule in ("1f1b", "terapipe(slices = 2)", "terapipe(slices = 4)"):
        spec = _mixtral(f"parallel.schedule={schedule}")
        layout, hw = fixed_layout(spec), hardware_for(spec)
        assert estimate(spec, layout, hw).buildable
        times.append(step_time(spec, layout, hw).ep_comm)
    assert times[0] < times[1] < times[2]
    spec = load("examples/mixtral-8x7b.par", ["parallel.schedule=terapipe(slices = 2)"])
    winner = search(spec, hardware_for(spec)).winner
    assert winner is not None and winner.buildable and winner.layout.schedule == "terapipe"



def test_full_recompute_under_terapipe_keeps_the_slices_keys_and_values(monkeypatch):
    """Every slice keeps each layer's keys and values for the later slices (Note [kept keys
    under recompute]): under full recompute they come on top of the blocks' inputs, 2 ·
    kv_heads/tp · head_dim elements a token and layer, for the slices in flight."""
    from parc.codegen.planner.cost import memory as memory_module
    from parc.runtime.schedules.schedule import in_flight_bound

    def activations() -> tuple[float, object]:
        spec = load("examples/llama-7b.par", ["parallel.dp=1", "parallel.tp=8", "parallel.pp=4", "parallel.sp=true",
                                              "parallel.zero=0", "parallel.recompute=full", "parallel.overlap=none",
                                              "mesh.nodes=4", "train.micro_batch=1",
                                              "parallel.schedule=terapipe(slices = 4)"])
        return memory_module.memory(spec, fixed_layout(spec)).per_rank[0].activations, spec

    sliced, spec = activations()
    monkeypatch.setattr(memory_module, "kept_kv_elements", lambda *args: 0.0)
    without, _ = activations()
    m, layout = spec.model, fixed_layout(spec)
    in_flight = in_flight_bound("terapipe", stages=4, rank=0, micro_batches=layout.grad_accum(spec.train.global_batch),
                                slices=4) / 4
    blocks = m.layers // 4
    kv = blocks * 2 * (m.kv_heads // 8) * m.head_dim * m.seq_len * 2.0  # bf16 elements of the rank's heads
    assert sliced - without == pytest.approx(in_flight * kv, rel=1e-12)
