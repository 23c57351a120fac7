"""Flash attention's own cost on the GPU presets (cost/hardware.py, Note [flash attention's
rate]): parc's causal attention core runs at the FlashAttention papers' rates and its
backward does 2.5× its forward FLOPs, where it was priced as two GEMMs at the head
dim's GEMM efficiency with a backward of twice the forward. At 8K tokens the attention is
a small share of a 405B block and barely moves; at 128K it is most of the work. Checked on
published long-context and MoE runs held out of every fit (bench/planner_published.py)."""

from __future__ import annotations

import importlib.util
import json
from dataclasses import replace
from pathlib import Path

import pytest

from parc.codegen.planner.cost import estimate, hardware_for
from parc.codegen.planner.cost.hardware import ATTENTION_BACKWARD_FLOPS, ATTENTION_EFFICIENCY
from parc.codegen.planner.cost.layout import Accounting
from parc.codegen.planner.cost.time import block_costs

ROOT = Path(__file__).resolve().parents[2]
spec_ = importlib.util.spec_from_file_location("planner_published", ROOT / "bench" / "planner_published.py")
published = importlib.util.module_from_spec(spec_)
spec_.loader.exec_module(published)
ROWS = {row["label"]: row for row in json.loads(published.ROWS.read_text())["rows"]}
LONG = "Llama 3 405B, 128K, cp 16"


def one_block(row: dict, hw):
    spec, layout = published.published_spec(row)
    key = tuple(layout.setting(name) for name in ("recompute", "overlap"))
    forward, backward, *_ = block_costs(spec, layout, hw, Accounting.PARC, key, layers_per_chunk=1)
    return spec, layout, forward, backward


def test_the_core_runs_at_flash_attentions_rates_and_its_backward_does_five_products():
    row = ROWS[LONG]
    spec, layout = published.published_spec(row)
    hw = hardware_for(spec)
    assert hw.attention == ATTENTION_EFFICIENCY["h100-80gb"]
    m = spec.model
    tokens = layout.tokens(m.seq_len)
    # causal: half of the (T/cp × T) square's two products, heads/tp of them on this rank
    flops = 0.5 * 2 * (tokens / m.seq_len) * (m.heads / layout.tp) * 2.0 * m.seq_len * m.head_dim * m.seq_len
    forward, backward = hw.attention_time(flops)
    assert forward == pytest.approx(flops / (hw.peak_flops * hw.attention[0]))
    assert backward == pytest.approx(ATTENTION_BACKWARD_FLOPS * flops / (hw.peak_flops * hw.attention[1]))
    # the block's backward is twice its forward plus what flash's backward adds over that
    _, _, f, b = one_block(row, hw)
    assert b - 2 * f == pytest.approx(backward - 2 * forward, rel=1e-9)


def test_long_context_pays_for_attention_where_short_context_hardly_does():
    def slowdown(label):
        row = ROWS[label]
        spec, layout = published.published_spec(row)
        hw = hardware_for(spec)
        gemm = replace(hw, attention=None)  # before: the core as two GEMMs, backward 2×
        return estimate(spec, layout, hw).time.step / estimate(spec, layout, gemm).time.step

    short, long = slowdown("Llama 3 405B, 8K, 8192 GPUs"), slowdown(LONG)
    assert 1.0 < short < 1.05  # at 8K the square is ~8% of the FLOPs
    assert long > 1.3  # at 128K most of the step is attention


def test_profiled_cpus_keep_the_measured_matmul_table():
    """A profile measures the machine's own GEMMs; the flash rates are the GPU presets'."""
    from parc.codegen.planner.cost.hardware import from_mesh
    from parc.dsl import load

    spec = load(str(ROOT / "examples" / "tiny.par"))
    assert from_mesh(spec.mesh).attention is None


def test_held_out_long_context_and_moe_rows_within_the_goal():
    """Every row of bench/data/published_long_context_moe.json is held out (nothing is
    fitted to them); the mean absolute error of TFLOP/s per GPU stays within 10%."""
    errors = [published.predict(row)["tflops"] / row["tflops_per_gpu"] - 1 for row in ROWS.values()]
    assert sum(abs(e) for e in errors) / len(errors) <= 0.10
    assert abs(published.predict(ROWS[LONG])["tflops"] / ROWS[LONG]["tflops_per_gpu"] - 1) <= 0.10


def test_megatron_accounting_keeps_its_own_attention():
    """Megatron-LM 2021 (the SC21 calibration's program) ran no flash attention: its core,
    softmax streaming and backward stay as they were whatever the preset's flash rates."""
    from parc.codegen.planner.cost.calibration import row_spec
    from parc.codegen.planner.cost.time import step_time

    rows = json.loads((ROOT / "tests" / "planner" / "data" / "megatron_sc21_calibration.json").read_text())["rows"]
    for row in rows:
        spec, layout = row_spec(row)
        hw = hardware_for(spec)
        assert hw.attention is not None
        assert step_time(spec, layout, hw, Accounting.MEGATRON).step == \
            step_time(spec, layout, replace(hw, attention=None), Accounting.MEGATRON).step
