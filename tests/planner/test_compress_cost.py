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
