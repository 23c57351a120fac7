"""The planner's price of ``grad_reduce = bf16`` under every zero stage and of HSDP with
experts (codegen/planner/cost/time.py, Note [the time model]; runtime/parallel/data/zero.py's
Note [bf16 reduction under ZeRO], fsdp.py's Note [experts as units])."""

from __future__ import annotations

from parc.codegen.planner.cost import Accounting, estimate, hardware_for
from parc.codegen.planner.cost.layout import expert_shard_ranks, rank_expert_params, rank_params, zero3_shard_elements
from parc.codegen.planner.cost.memory import memory
from parc.codegen.planner.cost.time import step_time
from parc.codegen.planner.cost.zero3 import zero3_gathers
from parc.codegen.planner.search import fixed_layout, search
from parc.dsl import load

MIXTRAL = "examples/mixtral-8x7b.par"


def _mixtral(*sets: str):
    """Mixtral on 8 nodes of 8: dp 16 (two nodes a stage), pp 4, ep 2, ZeRO-3."""
    return load(MIXTRAL, ["parallel.dp=16", "parallel.tp=1", "parallel.pp=4", "parallel.ep=2", "parallel.etp=1",
                          "parallel.zero=3", "parallel.recompute=full", "train.micro_batch=1", *sets])


def test_bf16_reduction_halves_the_gradient_bytes_of_every_zero_stage():
    """The wire carries bf16 (2 bytes, not 4) whatever the stage: the data-parallel traffic
    falls, the states a rank keeps do not (its shards stay fp32)."""
    for zero in (0, 1, 2, 3):
        sets = [f"parallel.zero={zero}"]
        fp32, bf16 = _mixtral(*sets), _mixtral(*sets, "train.grad_reduce=bf16")
        layout = fixed_layout(fp32)
        hw = hardware_for(fp32)
        a, b = step_time(fp32, layout, hw), step_time(bf16, layout, hw)
        assert b.dp_comm < a.dp_comm, zero
        assert memory(bf16, layout).per_rank[0] == memory(fp32, layout).per_rank[0], zero
        # Megatron's accounting reduces in half precision already: bf16 changes nothing there
        assert step_time(bf16, layout, hw, Accounting.MEGATRON) == step_time(fp32, layout, hw, Accounting.MEGATRON)
    # ZeRO-3's reduce-scatters: exactly the bytes of a 2-byte element
    spec = _mixtral("train.grad_reduce=bf16")
    layout, hw = fixed_layout(spec), hardware_for(spec)
    params, _ = rank_params(spec.model, layout, 0)
    gathers = lambda grad: zero3_gathers(hw, layout, params, 8, 1e-3, 2e-3, Accounting.PARC,  # noqa: E731
                                         micro_batches=1, gather_element=2.0, grad_element=grad)
    assert gathers(2.0).total < gathers(4.0).total


def test_hsdp_shards_experts_over_the_node_edp_ranks_and_syncs_their_replicas():
    """Under zero_shard = node with ep 2 on nodes of 8: a stage's 16 ranks fold as edp 8 ×
    ep 2, an edp group every other rank, so 4 of it on a node: the experts' units are
    sharded over 4 (not 8) and summed with the other node's copy once a step, beside the
    dense units' shard of 8 and its replica."""
    flat, node = _mixtral(), _mixtral("parallel.zero_shard=node")
    layout, hw = fixed_layout(flat), hardware_for(flat)
    assert expert_shard_ranks(layout, by_node=False, devices_per_node=8) == 8
    assert expert_shard_ranks(layout, by_node=True, devices_per_node=8) == 4
    shard = zero3_shard_elements(node.model, layout, 0, shard=8, expert_shard=4)
    assert memory(node, layout).per_rank[0].params == 4.0 * shard
    assert shard > zero3_shard_elements(node.model, layout, 0, shard=8)  # the experts' share doubled
    params, _ = rank_params(node.model, layout, 0)
    experts = rank_expert_params(node.model, layout, 0)
    kwargs = dict(micro_batches=1, gather_element=2.0, grad_element=4.0, by_node=True)
    dense_only = zero3_gathers(hw, layout, params - experts, 8, 1e-3, 2e-3, Accounting.PARC, **kwargs)
    both = zero3_gathers(hw, layout, params, 8, 1e-3, 2e-3, Accounting.PARC, experts=(experts, 4), **kwargs)
    assert both.total > dense_only.total  # the experts' replicas are summed too
    assert estimate(node, layout, hw).buildable


def test_mixtral_plan_over_nodes_considers_hsdp_with_ep():
    """``parc plan`` on the Mixtral example under zero = 3, zero_shard = node: layouts with
    ep > 1 are priced and buildable, and one of them wins."""
    spec = load(MIXTRAL, ["parallel.zero=3", "parallel.zero_shard=node"])
    result = search(spec, hardware_for(spec))
    assert result.winner is not None and result.winner.layout.ep > 1
    assert {item.layout.ep for item in result.estimates if item.buildable} >= {1, 2, 4, 8}
