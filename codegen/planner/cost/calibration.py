"""Megatron-LM's SC21 rows as specs, their predicted TFLOP/s, and the efficiency fit.

Takes: rows of ``../shared/reference/megatron_sc21_calibration.json`` (model shape,
TP/PP/DP, batch, achieved TFLOP/s per GPU on DGX A100). Gives: ``row_spec`` (the row
as a .par spec and its fixed ``Layout``), ``predicted_tflops`` (TFLOP/s per GPU in the
paper's own count, which includes the recompute forward) and ``fit`` (the two
physical constants of Note [size-dependent efficiency], by grid search over the rows'
relative errors). Used by ``bench/planner_calibration.py`` and tests/planner.
"""

from __future__ import annotations

import functools
from dataclasses import replace

from parc.dsl import load_text

from .hardware import Hardware, from_mesh
from .layout import Accounting, Layout
from .time import step_time

ROW_SPEC = """\
model megatron_{label} {{
  arch = gpt
  layers = {layers}
  hidden = {hidden}
  heads = {heads}
  ffn = {ffn}
  vocab = {vocab}
  seq_len = {seq_len}
}}
mesh {{
  nodes = {nodes}
  devices_per_node = 8
  device = a100-80gb
}}
parallel {{
  dp = {dp}
  tp = {tp}
  pp = {pp}
  zero = {zero}
  recompute = full
  schedule = {schedule}
}}
train {{
  global_batch = {global_batch}
  micro_batch = {micro_batch}
  steps = 1
  precision = fp16
}}
"""


def row_spec(row: dict):
    """(Spec, Layout) of a calibration row: full recompute, 1f1b or interleaved(chunks)."""
    return _row_spec(tuple(sorted(row.items())))


@functools.lru_cache(maxsize=64)
def _row_spec(items: tuple):
    row = dict(items)
    chunks = row.get("virtual_pipeline_chunks") or 1
    schedule = f"interleaved(chunks = {chunks})" if chunks > 1 else "1f1b"
    text = ROW_SPEC.format(
        label=row["model_label"].replace(".", "_"), layers=row["layers"], hidden=row["hidden"],
        heads=row["heads"], ffn=4 * row["hidden"], vocab=row["vocab"], seq_len=row["seq_len"],
        nodes=row["gpus"] // 8, dp=row["dp"], tp=row["tp"], pp=row["pp"], schedule=schedule,
        global_batch=row["global_batch"], micro_batch=row["micro_batch"], zero=row.get("zero", 0),
    )
    spec = load_text(text, f"megatron-{row['model_label']}.par", buildable=False)  # Megatron's fp16
    layout = Layout(
        dp=row["dp"], tp=row["tp"], pp=row["pp"], sp=False, zero=row.get("zero", 0),
        schedule="interleaved" if chunks > 1 else "1f1b", chunks=chunks, recompute="full",
        micro_batch=row["micro_batch"],
    )
    return spec, layout


def paper_flops(row: dict) -> float:
    """FLOPs per iteration, SC21 eq. 3 (full recompute counted): 96·B·s·l·h²·(1 + s/6h + V/16lh)."""
    B, s, l, h, V = row["global_batch"], row["seq_len"], row["layers"], row["hidden"], row["vocab"]
    return 96.0 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))


def predicted_tflops(row: dict, hw: Hardware | None = None) -> float:
    spec, layout = row_spec(row)
    hw = hw or from_mesh(spec.mesh)
    time = step_time(spec, layout, hw, Accounting.MEGATRON)
    return paper_flops(row) / time.step / row["gpus"] / 1e12


def fit(rows: list[dict]) -> tuple[float, float, float]:
    """(eff_max, n_half, worst relative error) minimizing the worst error over ``rows``."""
    base = from_mesh(row_spec(rows[0])[0].mesh)
    best = None
    for eff_step in range(50, 96):
        eff_max = eff_step / 100
        for n_half in range(0, 801, 10):
            hw = replace(base, eff_max=eff_max, n_half=float(n_half))
            worst = max(abs(predicted_tflops(row, hw) / row["tflops_per_gpu"] - 1) for row in rows)
            if best is None or worst < best[2] - 1e-12:
                best = (eff_max, float(n_half), worst)
    return best


def fit_zero3(rows: list[dict], hw: Hardware | None = None) -> tuple[float, float, float]:
    """(zero3_network, zero3_overlap, worst relative error) of Note [ZeRO-3 gathers]
    minimizing the worst error over ZeRO-3 ``rows``, the GEMM efficiency held as it is:
    a grid of η in 0.1–2 ports (steps of 0.05) and φ in 0–1 (0.1), then around its best
    η ± 0.05 by 0.01 and φ ± 0.1 by 0.02."""
    base = hw or from_mesh(row_spec(rows[0])[0].mesh)

    def search(networks, overlaps, best=None):
        for network in networks:
            for overlap in overlaps:
                trial = replace(base, zero3_network=network / 100, zero3_overlap=overlap / 100)
                worst = max(abs(predicted_tflops(row, trial) / row["tflops_per_gpu"] - 1) for row in rows)
                if best is None or worst < best[2] - 1e-12:
                    best = (network / 100, overlap / 100, worst)
        return best

    network, overlap, _ = search(range(10, 201, 5), range(0, 101, 10))
    network, overlap = round(100 * network), round(100 * overlap)
    return search(range(max(10, network - 5), network + 6), range(max(0, overlap - 10), min(100, overlap + 10) + 1, 2))
