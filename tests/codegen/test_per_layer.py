"""Per-layer layouts (Note [per-layer layout], Note [per-layer values], Note [per-layer costs]).

A spec may give `recompute` and `overlap` one value per block. The Plan records each
block's own layout; a uniform list renders exactly the scalar program; a mixed one
renders one value per block (runs folded); the cost model sums the blocks' own costs.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from parc.codegen.build import generate
from parc.codegen.planner.cost.layout import Layout
from parc.codegen.planner.cost.memory import memory
from parc.codegen.planner.cost.time import step_time
from parc.codegen.planner.cost import hardware_for
from parc.codegen.lower import lower
from parc.codegen.plan import LayerKind
from parc.runtime.layout.layer_settings import fold_runs
from parc.dsl import load, load_text
from parc.dsl.diagnostics import Diagnostics

ROOT = Path(__file__).resolve().parents[2]
TINY = str(ROOT / "examples" / "tiny.par")


def train_py(*sets: str) -> str:
    return generate(load(TINY, list(sets)))["train.py"].decode()


def test_plan_has_every_layer_in_model_order():
    plan = lower(load(TINY, ["parallel.recompute=[full, none, selective, none]"]))
    assert [layer.name for layer in plan.layers] == ["embed", "layers.0", "layers.1", "layers.2", "layers.3", "head"]
    assert [layer.kind for layer in plan.layers][::5] == [LayerKind.EMBED, LayerKind.HEAD]
    assert plan.per_block("recompute") == ("full", "none", "selective", "none")
    assert plan.uniform("recompute") is None and plan.uniform("tp") == 2
    assert all(layer.span("recompute") is not None for layer in plan.blocks)


def test_a_uniform_list_renders_the_scalar_program():
    assert train_py("parallel.recompute=[full, full, full, full]") == train_py("parallel.recompute=full")
    assert train_py("parallel.overlap=[sub_batch(2), sub_batch(2), sub_batch(2), sub_batch(2)]") == train_py(
        "parallel.overlap=sub_batch(2)"
    )


def test_a_mixed_list_renders_one_value_per_block():
    text = train_py("parallel.recompute=[full, none, selective, none]", "parallel.overlap=[sub_batch(2), none, none, none]")
    assert 'RECOMPUTE = ("full", "none", "selective", "none")' in text
    assert "OVERLAP_SUB_BATCHES = (2,) + (1,) * 3" in text
    assert "net = parallelize.recompute(net, RECOMPUTE)" in text
    assert "net = parallelize.overlap(net, OVERLAP_SUB_BATCHES)" in text


def test_runs_fold():
    assert fold_runs(["a", "a", "b", "a"]) == [("a", 2), ("b", 1), ("a", 1)]


def test_a_list_of_the_wrong_length_is_an_error_at_the_spec_line():
    with pytest.raises(Diagnostics) as caught:
        load(TINY, ["parallel.recompute=[full, none]"])
    (error,) = caught.value.errors
    assert error.code == "PAR0116" and "lists 2 values but the model has layers = 4" in error.message


def test_auto_is_not_a_list_item():
    with pytest.raises(Diagnostics):
        load(TINY, ["parallel.recompute=[full, auto, none, none]"])


def test_the_json_form_takes_lists_too():
    text = (
        '{"model": {"name": "m", "arch": "llama", "layers": 2, "hidden": 64, "heads": 4, "ffn": 128,'
        ' "vocab": 256, "seq_len": 32}, "mesh": {"nodes": 1, "devices_per_node": 2, "device": "cpu"},'
        ' "parallel": {"dp": 1, "tp": 2, "pp": 1, "recompute": ["full", "selective"],'
        ' "overlap": [{"kind": "sub_batch", "sub_batches": 2}, {"kind": "none"}]},'
        ' "train": {"global_batch": 4, "micro_batch": 2, "steps": 2}}'
    )
    spec = load_text(text, "m.json")
    assert [mode.value for mode in spec.parallel.recompute] == ["full", "selective"]
    assert spec.parallel.overlap == (2, 1)


def layout(**changes) -> Layout:
    base = Layout(dp=2, tp=2, pp=1, sp=False, zero=0, schedule="1f1b", chunks=1, recompute="none",
                  micro_batch=2)
    return replace(base, **changes)


def test_per_layer_costs_sum_the_blocks():
    spec = load(TINY)
    hw = hardware_for(spec)
    for mode in ("none", "selective", "full"):
        uniform, listed = layout(recompute=mode), layout(recompute=(mode,) * 4)
        assert memory(spec, listed).peak.total == pytest.approx(memory(spec, uniform).peak.total, rel=1e-12)
        assert step_time(spec, listed, hw).step == pytest.approx(step_time(spec, uniform, hw).step, rel=1e-12)
    mixed = layout(recompute=("full", "full", "none", "none"))
    activations = {m: memory(spec, layout(recompute=m)).peak.activations for m in ("none", "full")}
    # half the blocks keep everything, half only their input: between the two uniform layouts
    assert activations["full"] < memory(spec, mixed).peak.activations < activations["none"]
    times = {m: step_time(spec, layout(recompute=m), hw).compute for m in ("none", "full")}
    assert step_time(spec, mixed, hw).compute == pytest.approx((times["none"] + times["full"]) / 2, rel=1e-9)
