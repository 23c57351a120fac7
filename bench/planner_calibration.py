"""Calibration of the A100 presets on Megatron-LM's SC21 rows, and the check after it.

Fits the two physical constants of Note [size-dependent efficiency] (GEMM efficiency
eff_max · n / (n + n_half)) on ``../shared/reference/megatron_sc21_calibration.json``,
minimizing the worst relative error of predicted TFLOP/s per GPU, and prints each
row's prediction with the committed constants (codegen/planner/cost/hardware.py) and with the
fresh fit, beside the published figure, and beside the uncalibrated baseline (every
GEMM at the device's peak). Goal: within ±10%.

``--zero3``: the ZeRO-3 rows of SC21 Table 2 (tests/planner/data/zero3_sc21_table2.json):
fits Note [ZeRO-3 gathers]'s two constants on the 175B rows, and prints every row
(175B fitted, 530B held out) with the committed constants, the fresh fit and the model
before it (ZeRO-3's collectives at the ring's ideal bandwidth, all of a block's compute
hiding them), beside the published figure, and each model's collapse (first row over last).

    python bench/planner_calibration.py [--json] [--zero3]
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from parc.codegen.planner.cost.calibration import fit, fit_zero3, predicted_tflops, row_spec  # noqa: E402
from parc.codegen.planner.cost.hardware import GPU_EFFICIENCY, ZERO3_NETWORK, from_mesh  # noqa: E402

ROWS = ROOT / "tests" / "planner" / "data" / "megatron_sc21_calibration.json"  # from shared/reference
ZERO3_ROWS = ROOT / "tests" / "planner" / "data" / "zero3_sc21_table2.json"


def zero3(as_json: bool) -> int:
    rows = json.loads(ZERO3_ROWS.read_text())["zero3"]
    fitted_on = [row for row in rows if row["model_label"] == "175B"]
    network, overlap, worst = fit_zero3(fitted_on)
    base = from_mesh(row_spec(rows[0])[0].mesh)
    fitted = replace(base, zero3_network=network, zero3_overlap=overlap)
    # before: every port of a node at once (comm.link_for's ring) and all of a block's compute hiding
    before = replace(base, zero3_network=base.devices_per_node, zero3_overlap=1.0)
    out = [{
        "model": row["model_label"], "gpus": row["gpus"], "micro_batch": row["micro_batch"],
        "role": "fitted" if row in fitted_on else "held out", "published": row["tflops_per_gpu"],
        "committed": predicted_tflops(row, base), "fitted": predicted_tflops(row, fitted),
        "before": predicted_tflops(row, before),
    } for row in rows]
    if as_json:
        print(json.dumps({"fit": {"zero3_network": network, "zero3_overlap": overlap, "worst": worst},
                          "rows": out}, indent=1))
        return 0
    print(f"fit on 175B: zero3_network = {network:.2f}, zero3_overlap = {overlap:.2f} (worst error "
          f"{100 * worst:.1f}%); committed: {ZERO3_NETWORK['zero3_network']:.2f}, "
          f"{ZERO3_NETWORK['zero3_overlap']:.2f}")
    print(f"{'model':<6} {'gpus':>5} {'mb':>3} {'role':<9} {'published':>9}  {'committed':>14}  {'fitted':>14}  "
          f"{'before':>14}")
    for r in out:
        print(f"{r['model']:<6} {r['gpus']:>5} {r['micro_batch']:>3} {r['role']:<9} {r['published']:>9.0f}  "
              f"{cell(r, 'committed')}  {cell(r, 'fitted')}  {cell(r, 'before')}")
    for model in ("175B", "530B"):
        mine = [r for r in out if r["model"] == model]
        ratio = {key: mine[0][key] / mine[-1][key] for key in ("published", "committed", "before")}
        print(f"{model} collapse (first row / last): published {ratio['published']:.2f}×, "
              f"committed {ratio['committed']:.2f}×, before {ratio['before']:.2f}×")
    print("(TFLOP/s per GPU, SC21 eq. 3 FLOPs incl. the recompute forward; DGX A100 80 GB; "
          "rows transcribed from memory of the paper)")
    return 0


def cell(row: dict, key: str) -> str:
    """A predicted figure of ``row`` and its error against the published one."""
    return f"{row[key]:6.1f} ({100 * (row[key] / row['published'] - 1):+5.1f}%)"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--zero3", action="store_true", help="the ZeRO-3 rows of SC21 Table 2")
    args = parser.parse_args()
    if args.zero3:
        return zero3(args.json)
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
        print(f"{r['model']:<6} {r['tp']:>3} {r['pp']:>3} {r['dp']:>3}  {r['published']:>9.0f}  "
              f"{cell(r, 'committed')}  {cell(r, 'fitted')}  {cell(r, 'uncalibrated'):>16}")
    print("(TFLOP/s per GPU, SC21 eq. 3 FLOPs incl. the recompute forward; DGX A100 80 GB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
