"""``parc profile`` writes a profile the planner reads through ``mesh { profile = ... }``."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from parc.codegen.cli import main
from parc.codegen.planner.cost import hardware_for
from parc.codegen.planner.cost.comm import collective_time
from parc.codegen.planner.cost.estimate import estimate
from parc.codegen.planner.cost.fit import fitted, reference_spec
from parc.codegen.planner.cost.hardware import from_mesh
from parc.codegen.planner.cost.time import step_time
from parc.codegen.planner.profile import REFERENCE_MODELS, _fit
from parc.dsl import load


def test_profile_one_rank_is_read_by_the_planner(tmp_path, capsys):
    out = tmp_path / "machine.json"
    assert main(["profile", "--ranks", "1", "--quick", "-o", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["version"] == 1 and data["ranks"] == 1 and data["cores"] >= 1
    assert [row["n"] for row in data["matmul"]] == sorted(row["n"] for row in data["matmul"])
    assert all(row["flops"] > 0 for row in data["matmul"])
    assert data["memory_bandwidth"] > 0 and data["op_overhead_s"] > 0
    assert set(data["elementwise"]["eager"]) == {"layer_norm", "rms_norm", "gelu", "swiglu"}
    spec_file = tmp_path / "tiny.par"
    spec_file.write_text(open("examples/tiny.par", encoding="utf-8").read())
    spec = load(str(spec_file), ['mesh.profile="machine.json"'])  # relative to the spec
    hw = hardware_for(spec)
    assert hw.profile == "machine.json" and hw.matmul_table and hw.elementwise_cost("eager", "gelu") > 0
    assert hw.peak_flops == pytest.approx(max(flops for _, flops in hw.matmul_table) / min(1.0, hw.gemm_scale))
    assert [ref["hidden"] for ref in data["reference_steps"]] == [ref["hidden"] for ref in REFERENCE_MODELS]
    assert all(ref["step_s"] > 0 for ref in data["reference_steps"])
    assert hw.reference_steps and hw.gemm_scale > 0 and hw.op_overhead > 0  # fitted to them
    assert "wrote" in capsys.readouterr().out


def test_fit_recovers_the_figures_the_reference_steps_were_made_with(tmp_path):
    """Note [fitting the reference steps]: steps timed on a machine whose GEMMs run at
    0.6× the square-matmul table and whose ops cost 40 µs are fitted back to exactly that."""
    spec = load("examples/tiny.par")
    table = tuple((float(n), 50e9 * n / (n + 64)) for n in (32, 64, 128, 256, 512, 1024))
    base = from_mesh(spec.mesh)
    truth = replace(base, matmul_table=table, op_overhead=40e-6, gemm_scale=1 / 0.6, cores=2, profiled_ranks=1)
    steps = []
    for ref in REFERENCE_MODELS:
        ref_spec, layout = reference_spec(ref)
        steps.append({**ref, "kernels": "compiled",
                      "step_s": step_time(ref_spec, layout, replace(truth, devices_per_node=1)).step})
    measured = replace(truth, gemm_scale=1.0, op_overhead=3e-6, reference_steps=tuple(steps))
    result = fitted(measured)
    assert result.gemm_scale == pytest.approx(1 / 0.6, rel=1e-6)
    assert result.op_overhead == pytest.approx(40e-6, rel=1e-6)
    assert fitted(base) is base  # no reference steps: nothing to fit


def test_a_fit_faster_than_the_table_raises_the_peak_so_mfu_stays_below_one():
    """A machine whose training GEMMs ran at 1/0.7 of its best square product: the fitted
    gemm_scale is 0.7, and MFU, which divided by the table's best rate, stayed above 100%
    (114.8% in one bench case) until the peak rose with the fit."""
    spec = load("examples/tiny.par")
    table = tuple((float(n), 50e9 * n / (n + 64)) for n in (32, 64, 128, 256, 512, 1024))
    base = replace(from_mesh(spec.mesh), matmul_table=table, peak_flops=table[-1][1], peak_from_table=True,
                   cores=2, profiled_ranks=1)
    truth = replace(base, op_overhead=40e-6, gemm_scale=0.7)
    steps = []
    for ref in REFERENCE_MODELS:
        ref_spec, layout = reference_spec(ref)
        steps.append({**ref, "kernels": "compiled",
                      "step_s": step_time(ref_spec, layout, replace(truth, devices_per_node=1)).step})
    result = fitted(replace(base, op_overhead=3e-6, reference_steps=tuple(steps)))
    assert result.gemm_scale == pytest.approx(0.7, rel=1e-3)
    assert result.peak_flops == pytest.approx(table[-1][1] / result.gemm_scale)
    ref_spec, layout = reference_spec(REFERENCE_MODELS[-1])
    big = replace(result, devices_per_node=1)
    assert estimate(ref_spec, layout, big).mfu <= 1.0
    given = fitted(replace(base, peak_flops=1e12, peak_from_table=False, op_overhead=3e-6,
                           reference_steps=tuple(steps)))
    assert given.peak_flops == 1e12  # a peak the spec gave is kept


def test_fit_and_measured_collectives():
    latency, bandwidth = _fit([(1024, 1e-3 + 1024 / 1e9), (4 * 2**20, 1e-3 + 4 * 2**20 / 1e9)])
    assert latency == pytest.approx(1e-3) and bandwidth == pytest.approx(1e9)


def test_alpha_beta_levels():
    spec = load("examples/gpt3-175b.par")
    hw = hardware_for(spec)
    inside = collective_time(hw, "all_reduce", 1e9, size=8, stride=1)
    across = collective_time(hw, "all_reduce", 1e9, size=8, stride=8)  # one member per node
    assert inside == pytest.approx(2 * 7 * 5e-6 + 2 * 7 / 8 * 1e9 / 300e9)
    assert across == pytest.approx(2 * 7 * 10e-6 + 2 * 7 / 8 * 1e9 / 25e9)
    rails = collective_time(hw, "all_reduce", 1e9, size=16, stride=1)  # 8 per node: 8 ports
    assert rails == pytest.approx(2 * 15 * 10e-6 + 2 * 15 / 16 * 1e9 / 200e9)
