"""Heterogeneous layouts (Note [heterogeneous layouts]): `tp` and `dp` as one degree per block.

The spec keeps the coarse split (the largest tp, the fewest dp) and the lists; the Plan
gives each layer its own degrees (the embedding follows block 0, the head the last block
or, tied, the embedding); `train.py` shows LAYER_TP literally and uses the hetero runtime;
equal lists are the uniform program, byte for byte.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from parc.codegen.build import generate
from parc.codegen.lower import lower
from parc.dsl import load
from parc.dsl.diagnostics import Diagnostics

ROOT = Path(__file__).resolve().parents[2]
TINY = str(ROOT / "examples" / "tiny.par")
TWO = ["mesh.devices_per_node=2", "parallel.tp=[2, 2, 1, 1]", "parallel.dp=[1, 1, 2, 2]"]


def test_spec_keeps_the_coarse_split_and_the_lists():
    spec = load(TINY, TWO)
    assert (spec.parallel.tp, spec.parallel.dp) == (2, 1)
    assert spec.parallel.layer_tp == (2, 2, 1, 1) and spec.parallel.layer_dp == (1, 1, 2, 2)
    assert spec.parallel.degrees(4) == ((2, 2, 1, 1), (1, 1, 2, 2))


def test_plan_gives_each_layer_its_degrees():
    plan = lower(load(TINY, TWO))
    assert [(layer.name, layer.tp, layer.dp) for layer in plan.layers] == [
        ("embed", 2, 1), ("layers.0", 2, 1), ("layers.1", 2, 1), ("layers.2", 1, 2), ("layers.3", 1, 2),
        ("head", 2, 1),  # tied to the embedding: its sharding
    ]
    untied = lower(load(TINY, TWO + ["model.tie_embeddings=false"]))
    assert (untied.layers[-1].tp, untied.layers[-1].dp) == (1, 2)  # the last block's


def test_train_py_shows_the_table_and_uses_the_hetero_runtime():
    text = generate(load(TINY, TWO))["train.py"].decode()
    assert "LAYER_TP = (2,) * 2 + (1,) * 2" in text
    assert "#   layers.0-1: tp 2 × dp 1" in text and "#   layers.2-3: tp 1 × dp 2" in text
    assert "layouts = hetero.StageLayouts(grid, LAYER_TP)" in text
    assert "hetero.HeteroGradients(" in text and "hetero.clip_grad_norm_(" in text
    assert "layouts=layouts," in text
    assert "tp 2 × dp 1 (layers.0-1), tp 1 × dp 2 (layers.2-3)" in text.splitlines()[0]


def test_zero_with_lists_shards_over_each_layers_dp_group():
    """Note [ZeRO over per-layer layouts]: ZeRO-1/2 are hetero.ShardedAdamW over the layouts;
    at stage 1 HeteroGradients still reduces the gradients, at stage 2 the optimizer's own
    buckets do. ZeRO-3 is fsdp.FullyShardedAdamW given the layouts (Note [ZeRO-3 over
    per-layer layouts]); with zero_shard = node it stays PAR0254."""
    from parc.codegen.spec_values import rule_errors

    spec = load(TINY, TWO + ["parallel.zero=1"])
    assert rule_errors(spec) == []
    text = generate(spec)["train.py"].decode()
    assert "optimizer = hetero.ShardedAdamW(" in text and "stage_group=stage_group" in text
    assert "hetero.HeteroGradients(" in text and "optimizer.reduce_gradients_and_clip(GRAD_CLIP)" in text
    assert "zero.ShardedAdamW" not in text and "hetero.clip_grad_norm_(" not in text
    spec = load(TINY, TWO + ["parallel.zero=2"])
    assert rule_errors(spec) == []
    text = generate(spec)["train.py"].decode()
    assert "optimizer = hetero.ShardedAdamW(" in text and "accumulations=GRAD_ACCUM" in text
    assert "HeteroGradients" not in text and "grad_sync" not in text
    spec = load(TINY, TWO + ["parallel.zero=3"])
    assert rule_errors(spec) == []
    text = generate(spec)["train.py"].decode()
    assert "optimizer = fsdp.FullyShardedAdamW(" in text and "ZeRO-3 over each layer's own dp group" in text
    assert "layouts=layouts,\n        stage_group=stage_group,\n    )" in text
    assert "HeteroGradients" not in text and "grad_sync" not in text and "hetero.clip_grad_norm_(" not in text
    with pytest.raises(Diagnostics) as caught:
        load(TINY, TWO + ["parallel.zero=3", "parallel.zero_shard=node"])
    assert [e.code for e in caught.value.errors] == ["PAR0254"]


def test_equal_lists_are_the_uniform_program():
    listed = generate(load(TINY, ["parallel.tp=[2, 2, 2, 2]", "parallel.dp=[2, 2, 2, 2]"]))["train.py"]
    assert listed == generate(load(TINY, ["parallel.tp=2", "parallel.dp=2"]))["train.py"]  # the same citations


def test_pipeline_boundary_sets_the_activation_shape():
    text = generate(load(TINY, ["mesh.devices_per_node=4", "parallel.pp=2", "parallel.tp=[2, 1, 1, 2]",
                                "parallel.dp=[1, 2, 2, 1]"]))["train.py"].decode()
    assert "activation_shape=(MICRO_BATCH * 1 // TP, SEQ_LEN, HIDDEN)" in text


AUTO = ["parallel.tp=auto", "parallel.dp=auto", "model.vocab=32000", "model.seq_len=256", "train.micro_batch=4",
        "mesh.device=h100-80gb", "mesh.device_memory=120 MiB"]


def test_an_auto_spec_whose_plan_is_heterogeneous_builds_it():
    """The planner's per-layer winner (Note [the per-layer dynamic program]) is what parc build
    generates: LAYER_TP cited as the planner's, the hetero runtime, the plan's predicted gain."""
    from parc.codegen.spec_values import rule_errors

    spec = load(TINY, AUTO)
    assert rule_errors(spec) == []  # parc check accepts it
    files = generate(spec)
    text = files["train.py"].decode()
    assert "LAYER_TP = " in text and "hetero.StageLayouts(grid, LAYER_TP)" in text
    table = next(line for line in text.splitlines() if line.startswith("LAYER_TP = "))
    assert "(1,)" in table and ("(2,)" in table or "(4,)" in text)
    assert "(planner)" in text


def test_zero_and_recompute_auto_with_lists_are_filled_by_per_layer_costs():
    """check ⇔ build: with a tp list, `zero = auto` and `recompute = auto` are accepted and the
    build fills them (ZeRO 0: the per-layer cost model covers ZeRO 0 only)."""
    from parc.codegen.spec_values import rule_errors

    import json

    for extra, memory in (("parallel.zero=auto", "1 GiB"), ("parallel.recompute=auto", "14 MiB")):
        spec = load(TINY, TWO + [extra, f"mesh.device_memory={memory}"])
        assert rule_errors(spec) == []
        files = generate(spec)
        text = files["train.py"].decode()
        assert "LAYER_TP = (2,) * 2 + (1,) * 2" in text
        if extra == "parallel.zero=auto":
            zero = json.loads(files["plan.json"])["train"]["zero"]
            assert zero["value"] == 0 and "(planner)" in zero["span"]
        else:  # 14 MiB: only a mix with full recompute fits (the per-layer memory, not the coarse split's)
            assert 'RECOMPUTE = ("full",)' in text and "(planner)" in text
