"""Calibration of the A100 presets on Megatron-LM's SC21 rows, and the check after it.

Fits the two physical constants of Note [size-dependent efficiency] (GEMM efficiency
eff_max · n / (n + n_half)) on ``../shared/reference/megatron_sc21_calibration.json``,
minimizing the worst relative error of predicted TFLOP/s per GPU, and prints each
row's prediction with the committed constants (codegen/planner/cost/hardware.py) and with the
fresh fit, beside the published figure, and beside the uncalibrated baseline (every
GEMM at the device's peak). Goal: within ±10%.

    python bench/planner_calibration.py [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from parc.codegen.planner.cost.calibration import fit, predicted_tflops, row_spec  # noqa: E402
from parc.codegen.planner.cost.hardware import GPU_EFFICIENCY, from_mesh  # noqa: E402

ROWS = ROOT / "tests" / "planner" / "data" / "megatron_sc21_calibration.json"  # from shared/reference


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = json.loads(ROWS.read_text())["rows"]
    eff_max, n_half, worst = fit(rows)
    base = from_mesh(row_spec(rows[0])[0].mesh)
    fitted = replace(base, eff_max=eff_max, n_half=n_half)
    peak = replace(base, eff_max=1.0, n_half=0.0)
    out = []
    for row in rows:
        out.append({
            "model": row["model_label"], "tp": row["tp"], "pp": row["pp"], "dp": row["dp"],
            "published": row["tflops_per_gpu"], "committed": predicted_tflops(row, base),
            "fitted": predicted_tflops(row, fitted), "uncalibrated": predicted_tflops(row, peak),
        })
    if args.json:
        print(json.dumps({"fit": {"eff_max": eff_max, "n_half": n_half, "worst": worst}, "rows": out}, indent=1))
        return 0
    print(f"fit: eff_max = {eff_max:.2f}, n_half = {n_half:.0f} (worst error {100 * worst:.1f}%); "
          f"committed: eff_max = {GPU_EFFICIENCY['eff_max']:.2f}, n_half = {GPU_EFFICIENCY['n_half']:.0f}")
    print(f"{'model':<6} {'tp':>3} {'pp':>3} {'dp':>3}  {'published':>9}  {'committed':>14}  "
          f"{'fitted':>14}  {'uncalibrated':>16}")
    for r in out:
        def cell(value):
            return f"{value:6.1f} ({100 * (value / r['published'] - 1):+5.1f}%)"
        print(f"{r['model']:<6} {r['tp']:>3} {r['pp']:>3} {r['dp']:>3}  {r['published']:>9.0f}  "
              f"{cell(r['committed'])}  {cell(r['fitted'])}  {cell(r['uncalibrated']):>16}")
    print("(TFLOP/s per GPU, SC21 eq. 3 FLOPs incl. the recompute forward; DGX A100 80 GB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
