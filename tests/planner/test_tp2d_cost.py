"""The planner and 2D tensor parallelism (issue 23, ATP): ``tp_shape = auto`` searches the
grids, the cost model prices each side's rings on the links it crosses (cost/tp2d.py,
Note [2D tp costs]), and ``parc plan`` says why a grid won."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from parc.codegen.planner.cost import estimate, hardware_for
from parc.codegen.planner.search import candidates, search
from parc.codegen.planner.why import why
from parc.dsl import load

COMMODITY_TP = str(Path(__file__).parent / "specs" / "commodity_tp.par")


def test_tp_across_nodes_takes_the_grid_whose_columns_cross_least():
    spec = load(COMMODITY_TP)
    hw = hardware_for(spec)
    result = search(spec, hw)
    winner = result.winner
    assert winner is not None and winner.layout.tp_shape == (2, 8)  # rows of 8 fill a node
    line = next(line for line in why(spec, result, hw) if "arranges tp as a 2 × 8 grid" in line)
    assert "tp 16 spans 2 nodes" in line and "each column of 2 crosses the network" in line
    assert "parc cannot build 1D tp across nodes (PAR0217)" in line  # and what 1D would cost, either way


def test_2d_beats_1d_across_nodes_when_latency_bound_and_loses_on_bandwidth():
    """The cost model's two sides of ATP's claim, at the same degrees. Across the slow links
    a 2 × 8 grid's column rings pay 2 network hops where 1D's 16-rank ring pays 30: with
    small micro-batches (latency-bound) the grid wins. With large ones the bytes decide, and
    1D's ring, spread over every device's share of the NICs, moves fewer of them over the
    network than the grid's columns (the projections' outputs, 1/8 each)."""
    spec = load(COMMODITY_TP)
    hw = hardware_for(spec)
    small = next(layout for layout in candidates(spec) if layout.micro_batch == 1)
    flat = estimate(spec, replace(small, tp_shape=None), hw, exact=True)
    grids = {shape: estimate(spec, replace(small, tp_shape=shape), hw, exact=True).time.step
             for shape in ((2, 8), (4, 4), (8, 2))}
    assert grids[(2, 8)] < flat.time.step / 2
    assert grids[(2, 8)] < grids[(4, 4)] < grids[(8, 2)]  # more rows: more ranks on each slow ring
    large = replace(small, micro_batch=16, tp_shape=None)
    assert estimate(spec, large, hw, exact=True).time.step < estimate(
        spec, replace(large, tp_shape=(2, 8)), hw, exact=True).time.step


def test_tp_shape_is_searched_only_when_auto():
    shapes = {layout.tp_shape for layout in candidates(load(COMMODITY_TP))}
    assert shapes == {(2, 8), (4, 4), (8, 2), (16, 1)}  # 1D tp cannot span nodes (PAR0217)
    inside = load(COMMODITY_TP, ["mesh.nodes=1", "mesh.devices_per_node=16"])
    assert {layout.tp_shape for layout in candidates(inside)} == {None, (2, 8), (4, 4), (8, 2), (16, 1)}
    fixed = load(COMMODITY_TP, ["mesh.nodes=1", "mesh.devices_per_node=16", "parallel.tp_shape=(1, 16)"])
    assert {layout.tp_shape for layout in candidates(fixed)} == {None}
