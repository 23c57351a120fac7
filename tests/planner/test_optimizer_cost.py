"""cost/optimizer.py: the fused AdamW update as the runtime runs it (Note [the fused AdamW's cost])."""

from dataclasses import replace

import pytest

from parc.codegen.planner.cost import hardware_for
from parc.codegen.planner.cost.layout import Accounting, Layout
from parc.codegen.planner.cost.optimizer import (
    CALL_OPS, FUSED_BYTES, MASTER_BYTES, NORM_BYTES, PAD_OPS, block_runs, optimizer_time, update_time,
)
from parc.dsl import load

TINY = "examples/tiny.par"
ONE_RANK = ["parallel.dp=1", "parallel.tp=1", "parallel.pp=1", "mesh.devices_per_node=1"]


def layout(zero=0):
    return Layout(dp=2, tp=1, pp=1, sp=False, zero=zero, schedule="1f1b", chunks=1, micro_batch=1)


def spec_of(*sets):
    return load(TINY, [*ONE_RANK, *sets])


def test_bytes_an_element_fp32_and_under_master_weights():
    hw = replace(hardware_for(spec_of()), op_overhead=0.0)
    n = 1_000_000
    fp32 = update_time(hw, elements=n, tensors=7, tails=0, calls=2, master=False, zero=False)
    master = update_time(hw, elements=n, tensors=7, tails=0, calls=2, master=True, zero=False)
    assert fp32 == pytest.approx(n * FUSED_BYTES / hw.memory_bandwidth)
    assert master == pytest.approx(n * (FUSED_BYTES + MASTER_BYTES) / hw.memory_bandwidth)


def test_ops_calls_tensors_and_remainders():
    hw = replace(hardware_for(spec_of()), memory_bandwidth=float("inf"))
    ops = update_time(hw, elements=0, tensors=10, tails=3, calls=2, master=False, zero=False) / hw.op_overhead
    assert ops == pytest.approx(2 * CALL_OPS + 10 + 3 * PAD_OPS)
    master = update_time(hw, elements=0, tensors=10, tails=0, calls=2, master=True, zero=False) / hw.op_overhead
    assert master == pytest.approx(2 * CALL_OPS + 10 + 10)  # one copy a tensor into the bf16 parameters


def test_remainders_follow_the_block_shapes():
    assert block_runs(spec_of().model, 1)[0] == 0.0  # hidden 128, ffn 512: every tensor a multiple of 64
    share, runs = block_runs(spec_of("model.hidden=100", "model.ffn=400").model, 1)
    assert 0.0 < share <= 1.0 and 0.0 < runs <= 1.0


def test_zero_updates_its_slice_and_the_layer_share_leaves_out_the_step():
    spec = spec_of()
    hw = hardware_for(spec)
    whole = optimizer_time(spec, hw, Accounting.PARC, 1_000_000, 40, layout())
    sharded = optimizer_time(spec, hw, Accounting.PARC, 1_000_000, 40, layout(1))
    assert sharded < whole
    step = optimizer_time(spec, hw, Accounting.PARC, 1_000_000, 40, layout())
    layer = optimizer_time(spec, hw, Accounting.PARC, 1_000_000, 40, layout(), whole_step=False)
    assert step - layer == pytest.approx(2 * CALL_OPS * hw.op_overhead)
    no_ops = replace(hw, op_overhead=0.0)
    assert optimizer_time(spec, no_ops, Accounting.PARC, 1_000_000, 40, layout()) == pytest.approx(
        1_000_000 * (FUSED_BYTES + NORM_BYTES) / hw.memory_bandwidth)


def test_bf16_prices_the_masters_copy_but_not_under_zero3():
    fp32, bf16 = spec_of(), spec_of("train.precision=bf16")
    hw = replace(hardware_for(fp32), op_overhead=0.0)
    n = 1_000_000
    extra = n * MASTER_BYTES / hw.memory_bandwidth
    for zero, copies in ((0, True), (1, True), (3, False)):
        a = optimizer_time(fp32, hw, Accounting.PARC, n, 40, layout(zero))
        b = optimizer_time(bf16, hw, Accounting.PARC, n, 40, layout(zero))
        shard = 2 if zero else 1
        assert b - a == pytest.approx(extra / shard if copies else 0.0)
