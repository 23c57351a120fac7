"""Mixture of experts in the planner (codegen/planner/cost/experts.py, Note [MoE costs]): ep
in the search, experts' states split over ep and sharded over edp, the all-to-all over the
links the ep group spans, the routing imbalance, sub-batch overlap of the all-to-alls, and
the Mixtral-8x7B example, which ranks ep layouts and says what ep buys."""

from __future__ import annotations

from dataclasses import replace

import pytest

from parc.codegen.planner.cost import estimate, hardware_for
from parc.codegen.planner.cost.experts import moe_block
from parc.codegen.planner.cost.layout import rank_expert_params, rank_params
from parc.codegen.planner.cost.memory import memory
from parc.codegen.planner.search import candidates, fixed_layout, search
from parc.codegen.planner.why import why
from parc.dsl import load

MIXTRAL = "examples/mixtral-8x7b.par"


def fixed(ep, dp=8, tp=1, **sets):
    """Mixtral on one 8-GPU node's worth of ranks per layout choice (pp 8 to fit)."""
    extra = [f"{key}={value}" for key, value in sets.items()]
    return load(MIXTRAL, [f"parallel.ep={ep}", "parallel.etp=1", f"parallel.dp={dp}", f"parallel.tp={tp}",
                          f"parallel.pp={64 // (dp * tp)}", "parallel.zero=1", "parallel.recompute=full",
                          "train.micro_batch=1", *extra])


def test_ep_auto_is_searched_among_the_divisors_of_the_experts():
    spec = load(MIXTRAL)
    assert spec.parallel.ep is None
    assert {layout.ep for layout in candidates(spec)} == {1, 2, 4, 8}
    assert {layout.ep for layout in candidates(load(MIXTRAL, ["parallel.ep=2"]))} == {2}


def test_experts_split_over_ep_and_their_states_over_edp():
    one, two = fixed_layout(fixed(1)), fixed_layout(fixed(2))
    spec = fixed(2)
    whole, _ = rank_params(spec.model, one, 0)
    split, _ = rank_params(spec.model, two, 0)
    experts = rank_expert_params(spec.model, two, 0)
    assert rank_expert_params(spec.model, one, 0) == 0  # replicated experts are plain parameters
    assert whole - split == experts  # half of the experts leave each rank
    # ZeRO-1: the dense part's moments (and, bf16, fp32 masters) over dp 8, the experts' over edp = 8/2 = 4
    mem = memory(spec, two).per_rank[0]
    dense = split - experts
    per_element = 12.0 if spec.train.precision.value in ("bf16", "fp16") else 8.0
    assert mem.optimizer == per_element * (-(-dense // 8) + -(-experts // 4))


def test_all_to_all_costs_more_when_the_ep_group_leaves_the_node():
    spec = fixed(8)
    layout = fixed_layout(spec)
    hw = hardware_for(spec)
    inside = moe_block(spec, layout, hw, tokens=4096, k=1, size=2.0)
    spread = moe_block(spec, layout, replace(hw, devices_per_node=2), tokens=4096, k=1, size=2.0)
    assert 0 < inside.exposed_forward < spread.exposed_forward
    assert inside.forward == spread.forward  # the experts' compute does not depend on the links
    # without ep no token moves
    assert moe_block(spec, fixed_layout(fixed(1)), hw, tokens=4096, k=1, size=2.0).moved == 0


def test_sub_batches_hide_the_all_to_all_behind_the_experts():
    spec = fixed(8)
    layout, hw = fixed_layout(spec), hardware_for(spec)
    whole = moe_block(spec, layout, hw, tokens=4096, k=1, size=2.0)
    split = moe_block(spec, layout, hw, tokens=4096, k=4, size=2.0)
    assert split.exposed_forward < whole.exposed_forward
    assert split.exposed_backward < whole.exposed_backward


def test_routing_imbalance_slows_the_busiest_rank_and_grows_its_activations():
    balanced = fixed(8, **{"parallel.recompute": "none"})
    skewed = fixed(8, **{"parallel.recompute": "none", "model.routing_imbalance": 1.5})
    hw = hardware_for(balanced)
    a, b = (estimate(spec, fixed_layout(spec), hw) for spec in (balanced, skewed))
    assert b.time.compute > a.time.compute
    assert b.time.ep_comm > a.time.ep_comm
    assert b.memory.activations > a.memory.activations
    assert (b.memory.params, b.memory.optimizer) == (a.memory.params, a.memory.optimizer)


def test_mixtral_plans_ep_layouts_and_explains_the_winner():
    spec = load(MIXTRAL)
    hw = hardware_for(spec)
    result = search(spec, hw)
    winner = result.winner
    assert winner is not None and winner.layout.ep > 1
    ranked = {item.layout.ep for item in result.estimates}
    assert {1, 2, 4, 8} <= ranked
    lines = why(spec, result, hw)
    assert any(line.startswith(f"ep {result.estimates[0].layout.ep} over replicated experts") for line in lines)
    # the winner's layout with the experts whole on every rank (ep 1): without ZeRO-3 it does
    # not fit; under ZeRO-3 (whose units shard the experts over every rank either way) it
    # holds the same states (with bf16 parameters and fp32 masters, master.py, it then fits)
    replicated = estimate(spec, replace(winner.layout, ep=1), hw)
    states = lambda item: item.memory.params + item.memory.grads + item.memory.optimizer  # noqa: E731
    if winner.layout.zero == 3:
        assert states(replicated) == pytest.approx(states(winner), rel=1e-3)  # Note [experts as units]
        # so the why line says what ep buys there: communication and compute, not states
        line = next(line for line in lines if " over replicated experts" in line)
        assert "under ZeRO-3" in line and "not memory" in line and "data-parallel traffic" in line
    else:
        assert not replicated.fits
        assert states(replicated) > 2 * states(winner)


@pytest.mark.parametrize("ep", [1, 2, 8])
def test_the_mean_block_counts_every_expert_flop_once(ep):
    # the experts' FLOPs are the model's: top_k of E experts per token, whatever ep is
    spec = fixed(ep)
    est = estimate(spec, fixed_layout(spec), hardware_for(spec))
    assert est.time.compute > 0 and 0 < est.mfu < 1


def test_context_parallel_joins_the_experts_data_parallel_side():
    # Note [MoE under context parallelism]: expert layers fold dp·cp·tp as edp·ep·etp, so
    # the cp ranks join edp (the experts' gradient reduction, their ZeRO shards)
    from parc.codegen.planner.cost.estimate import buildable
    from parc.codegen.planner.cost.experts import expert_reduce
    from parc.codegen.planner.cost.layout import expert_data_ranks

    spec = load(MIXTRAL, ["parallel.cp=auto", "parallel.ep=2", "parallel.zero=0", "parallel.recompute=full",
                          "train.micro_batch=1", "parallel.pp=8"])
    with_cp = [layout for layout in candidates(spec) if layout.cp > 1]
    assert with_cp and all(buildable(spec, layout) for layout in with_cp)  # PAR0810/PAR0811 lifted
    layout = next(layout for layout in with_cp if layout.cp == 2 and layout.tp == 1)
    assert expert_data_ranks(layout) == layout.dp * 2 // 2
    hw = hardware_for(spec)
    flat = replace(layout, cp=1, dp=layout.dp * 2)  # the same ranks as dp: the same edp, the same reduction
    assert expert_data_ranks(flat) == expert_data_ranks(layout)
    assert expert_reduce(hw, layout, 1e9, 4.0) == expert_reduce(hw, flat, 1e9, 4.0) > 0
    # a cp rank routes its chunk: half the rows of the whole sequence per rank
    tokens = layout.micro_batch * spec.model.seq_len
    whole = moe_block(spec, flat, hw, tokens=tokens, k=1, size=2.0)
    chunk = moe_block(spec, layout, hw, tokens=tokens / 2, k=1, size=2.0)
    assert chunk.forward < whole.forward and chunk.moved < whole.moved


def test_a_moe_blocks_mlp_elementwise_is_its_experts_only():
    """A MoE block has no dense MLP: its activation and products are streamed on the routed
    rows (cost/experts.py), so the dense ffn (unused with moe_every = 1 and expert_ffn
    given) must not move the block's own forward; it once charged a dense SwiGLU's
    elementwise work on every token as well (Mixtral 8x7B held out: -12.5% -> -8.0%)."""
    from parc.codegen.planner.cost.layout import Accounting
    from parc.codegen.planner.cost.time import _block_forward

    def block(ffn, every=1):
        spec = fixed(8, **{"parallel.recompute": "none", "model.expert_ffn": 14336, "model.ffn": ffn,
                           "model.moe_every": every})
        return _block_forward(spec, fixed_layout(spec), hardware_for(spec), Accounting.PARC, 4096)

    assert block(1024) == block(14336)
    assert block(1024, every=2) != block(14336, every=2)  # dense blocks between do stream it


def test_under_hsdp_the_why_line_says_zero3_shards_over_a_node():
    """``zero_shard = node``: ZeRO-3 shards every unit, the experts too, over one node's
    ranks (fsdp.py, Note [experts as units]), not every rank: why's ep line says so, and its
    'not memory' still holds (ep 1 and the winner's ep hold the same states)."""
    spec = load(MIXTRAL, ["parallel.zero=3", "parallel.zero_shard=node", "parallel.recompute=full"])
    hw = hardware_for(spec)
    result = search(spec, hw)
    winner = result.winner
    assert winner is not None and winner.layout.ep > 1 and winner.layout.zero == 3
    line = next(line for line in why(spec, result, hw) if " over replicated experts" in line)
    assert "over the ranks of a node (zero_shard = node)" in line and "over every rank" not in line
    assert "its node's edp ranks" in line
    replicated = estimate(spec, replace(winner.layout, ep=1), hw)
    states = lambda item: item.memory.params + item.memory.grads + item.memory.optimizer  # noqa: E731
    assert states(replicated) == pytest.approx(states(winner), rel=1e-3)
