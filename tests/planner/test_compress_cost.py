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
    assert {layout.compress for layout in candidates(load(COMMODITY))} == {"none", "powersgd"}
