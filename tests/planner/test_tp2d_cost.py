"""The planner and 2D tensor parallelism (issue 23, ATP): ``tp_shape = auto`` searches the
grids, the cost model prices each side's rings on the links it crosses (cost/tp2d.py,
Note [2D tp costs]), and ``parc plan`` says why a grid won."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from parc.codegen.planner.cost import estimate, hardware_for
from parc.codegen.planner.search import candidates, search
from parc.codegen.planner.why import why
from parc.dsl import Diagnostics, load
from parc.dsl.diagnostics import render_all

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


def test_a_tp_only_grids_fit_is_searched_over_those_grids():
    """PAR0203 on a grid (Note [2D tensor parallelism]): C splits the heads, R the hidden size.
    With 4 heads no 1D tp of 16 fits, and under ``tp_shape = auto`` the search offers the grids
    that do (C among 1, 2, 4; R = 16 / C divides hidden = 256); a written grid is held to its
    own sides, at its own line."""
    inside = ["mesh.nodes=1", "mesh.devices_per_node=16", "model.heads=4"]
    assert {layout.tp_shape for layout in candidates(load(COMMODITY_TP, inside))} == {(4, 4), (8, 2), (16, 1)}
    load(COMMODITY_TP, [*inside, "parallel.tp_shape=(4, 4)"])  # accepted
    for shape, words in (("(1, 16)", "error[PAR0203]: tp = 16 does not divide heads = 4"),
                         ("(2, 8)", "error[PAR0203]: tp_shape = (2, 8) splits the heads, the ffn and the padded vocab over "
                                    "C = 8 ranks, but C does not divide heads = 4"),
                         ("(2, 8)", "hint: tp_shape must be one of (4, 4), (8, 2), (16, 1)")):
        try:
            load(COMMODITY_TP, [*inside, f"parallel.tp_shape={shape}"])
        except Diagnostics as exc:
            assert words in render_all(exc.errors, exc.sources), (shape, render_all(exc.errors, exc.sources))
        else:
            raise AssertionError(f"tp_shape = {shape} with 4 heads was accepted")
