"""The planner and ``compress = auto`` (issue 23): PowerSGD is searched only when allowed,
wins where the dp reduction crosses a slow link, and ``parc plan`` says why and that
the numerics change (cost/compress.py, Note [powersgd cost])."""

from __future__ import annotations

from pathlib import Path

from parc.codegen.planner.cost import hardware_for
from parc.codegen.planner.search import candidates, search
from parc.codegen.planner.why import why
from parc.dsl import load

COMMODITY = str(Path(__file__).parent / "specs" / "commodity.par")


def test_commodity_cluster_turns_powersgd_on_and_says_why():
    spec = load(COMMODITY)
    hw = hardware_for(spec)
    result = search(spec, hw)
    winner = result.winner
    assert winner is not None and winner.layout.compress == "powersgd" and winner.layout.dp == 16
    lines = why(spec, result, hw)
    line = next(line for line in lines if "compresses the dp gradients" in line)
    assert "compress = powersgd(rank = 4)" in line and "changes the numerics" in line
    speedup = float(line.split("a predicted ")[1].split("×")[0])
    assert speedup > 2.0  # the exact all-reduce of 4.9 GiB over a 10 Gb/s node link


def test_fast_links_keep_exact_gradients():
    """One node (no slow link): backward hides the exact reduction; compression only costs."""
    spec = load(COMMODITY, ["mesh.nodes=1", "mesh.devices_per_node=16"])
    winner = search(spec, hardware_for(spec)).winner
    assert winner is not None and winner.layout.compress == "none"


def test_compression_is_searched_only_when_allowed():
    for overrides in (["parallel.compress=none"], ["parallel=auto"]):
        spec = load(COMMODITY, overrides)
        assert {layout.compress for layout in candidates(spec)} == {"none"}, overrides
    assert {layout.compress for layout in candidates(load(COMMODITY))} == {"none", "powersgd", "topk"}


def test_topk_is_searched_and_priced_under_auto():
    """compress = auto offers top-k too (cost/compress.py, Note [topk cost]): on two single-device
    nodes over the slow link, top-k's two all-gathers of 1% of the entries beat the exact
    all-reduce of the same layout, and its bytes are the k (value, index) pairs."""
    from dataclasses import replace

    from parc.codegen.planner.cost import estimate
    from parc.codegen.planner.cost.compress import topk_cost

    spec = load(COMMODITY, ["mesh.devices_per_node=1", "parallel.tp=1", "parallel.pp=1"])
    hw = hardware_for(spec)
    assert {layout.compress for layout in candidates(spec)} == {"none", "powersgd", "topk"}
    result = search(spec, hw)
    topk = next(item for item in result.estimates if item.layout.compress == "topk" and item.fits)
    exact = estimate(spec, replace(topk.layout, compress="none"), hw, exact=True)
    assert topk.time.step < exact.time.step
    cost = topk_cost(hw, params=1_000_000, ratio=0.01, size=2, stride=1)
    assert cost.compressed_bytes == 8.0 * 10_000 and cost.exact_bytes == 4.0 * 1_000_000


def test_compressed_backprop_is_priced_on_the_slow_pipeline_link():
    """Note [compress_pp cost]: pp 2 across the two nodes (tp 8 inside each), so every
    stage boundary crosses the 1.25 Gb/s link. Compressing the backward messages (rank 4)
    sends 4·r·(rows + cols) bytes instead of rows·cols: the pipeline's exposed
    communication and the step fall (the forward messages keep the exact price)."""
    from parc.codegen.planner.cost import estimate
    from parc.codegen.planner.cost.compress import lowrank_backprop_cost
    from parc.codegen.planner.search import fixed_layout

    fixed = ["parallel.dp=1", "parallel.tp=8", "parallel.pp=2", "parallel.compress=none", "train.micro_batch=1"]
    exact = load(COMMODITY, fixed)
    low = load(COMMODITY, fixed + ["parallel.compress_pp=lowrank(rank = 4)"])
    hw = hardware_for(exact)
    step = {name: estimate(spec, fixed_layout(spec), hw).time.step for name, spec in (("exact", exact), ("low", low))}
    assert step["low"] < 0.75 * step["exact"]
    cost = lowrank_backprop_cost(hw, rows=2048, cols=2048, rank=4, lazy_error=False, stride=8)
    assert cost.compressed_bytes == 4.0 * 4 * (2048 + 2048) and cost.exact_bytes == 4.0 * 2048 * 2048
    assert cost.compute_s > 0 and cost.comm_s > 0
