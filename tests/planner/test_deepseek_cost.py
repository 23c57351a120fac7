"""examples/deepseek-moe.par in the planner: ``first_dense_layers`` blocks are priced as dense
blocks (their MLP's parameters, compute and activations), the others as MoE blocks (cost/experts.py)."""

from __future__ import annotations

import pytest

from parc.codegen.planner.cost import estimate, hardware_for
from parc.codegen.planner.cost.experts import moe_share
from parc.codegen.planner.cost.layout import rank_expert_params, rank_params
from parc.codegen.planner.search import fixed_layout
from parc.dsl import load

DEEPSEEK = "examples/deepseek-moe.par"
LAYOUT = ["parallel.dp=32", "parallel.tp=1", "parallel.pp=1", "parallel.ep=8", "parallel.zero=2",
          "parallel.recompute=none", "train.micro_batch=2"]


def test_first_dense_layers_are_priced_as_dense_blocks():
    deepseek, all_moe = load(DEEPSEEK, LAYOUT), load(DEEPSEEK, LAYOUT + ["model.first_dense_layers=0"])
    assert moe_share(deepseek) == 26 / 27 and moe_share(all_moe) == 1.0
    dense, routed = deepseek.model.desc.blocks[0], all_moe.model.desc.blocks[0]
    assert (dense.experts, routed.experts) == (0, 64)
    one, other = fixed_layout(deepseek), fixed_layout(all_moe)
    # each rank holds E/ep experts of 26 MoE blocks, not 27; block 0's dense MLP instead
    assert rank_expert_params(deepseek.model, one, 0) * 27 == rank_expert_params(all_moe.model, other, 0) * 26
    held, _ = rank_params(deepseek.model, one, 0)
    held_moe, _ = rank_params(all_moe.model, other, 0)
    dense_mlp = sum(m.numel() for m in dense.modules if m.kind.startswith("mlp."))
    moe_mlp = sum(m.numel() for m in routed.modules if m.kind.startswith("mlp.") and m.layer != "grouped_linear")
    assert held - held_moe == dense_mlp - moe_mlp - rank_expert_params(all_moe.model, other, 0) // 27
    hw = hardware_for(deepseek)
    priced, priced_moe = estimate(deepseek, one, hw), estimate(all_moe, other, hw)
    # the all-to-alls of 26 MoE blocks, not 27; the blocks' GEMMs those of a MoE block, block 0's dense
    # MLP (ffn 10944) apart: it once stood for every block (+27% compute)
    assert priced.time.ep_comm == pytest.approx(priced_moe.time.ep_comm * 26 / 27, rel=1e-9)
    assert priced.time.compute == pytest.approx(priced_moe.time.compute, rel=0.01)
    assert priced.memory.activations < priced_moe.memory.activations
