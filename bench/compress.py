"""Compressed communication (issue 23): bytes, loss and step time next to the exact layout.

Each row is one build of the parity GPT (tests/parity/specs/gpt.par: 2 layers, hidden
64, seq 32) on real text (tests/data/notes-on-bread.txt through ``parc data prepare``, the
text tests/parity/test_compress.py trains on: it does not change with the docs), 2 gloo ranks,
run as a user runs it (torchrun). Baselines in the same run: dp 2 exact for the dp
rows, pp 2 exact for the pp rows. Printed per row: the final loss (mean of the last 10
steps) and its gap to the baseline, the bytes per step on the compressed axis (the
logged ``comm_bytes``) and the ratio to the baseline, and the median step time ratio.
CPU step times on 2 shared cores say little about a cluster; the bytes are the figure.

    python bench/compress.py [--steps 200]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TEXT = ROOT / "tests" / "data" / "notes-on-bread.txt"
"""The text tests/parity/test_compress.py trains on (docs/DESIGN.md was, until every docs edit moved the losses)."""
PARC = [sys.executable, "-m", "parc.codegen.cli"]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
COMMON = ["model.vocab=257", "train.micro_batch=4", "mesh.devices_per_node=2", 'train.data=tokens(path = "t.bin")']
ROWS = (  # (name, axis counted, baseline row, --set values)
    ("dp2 exact", "dp", None, ["parallel.dp=2"]),
    ("dp2 powersgd(4)", "dp", "dp2 exact", ["parallel.dp=2", "parallel.compress=powersgd(rank = 4)"]),
    ("dp2 powersgd(4), no EF", "dp", "dp2 exact",
     ["parallel.dp=2", "parallel.compress=powersgd(rank = 4)", "parallel.error_feedback=false"]),
    ("dp2 topk(0.1)", "dp", "dp2 exact", ["parallel.dp=2", "parallel.compress=topk(ratio = 0.1)"]),
    ("dp2 zero1 powersgd(4)", "dp", "dp2 exact",
     ["parallel.dp=2", "parallel.zero=1", "parallel.compress=powersgd(rank = 4)"]),
    ("dp2 fp16 powersgd(4)", "dp", "dp2 exact",
     ["parallel.dp=2", "train.precision=fp16", "parallel.compress=powersgd(rank = 4)"]),
    ("pp2 exact", "pp_backward", None, ["parallel.pp=2"]),
    ("pp2 lowrank(4)", "pp_backward", "pp2 exact", ["parallel.pp=2", "parallel.compress_pp=lowrank(rank = 4)"]),
    ("pp2 lowrank(4), lazy", "pp_backward", "pp2 exact",
     ["parallel.pp=2", "parallel.compress_pp=lowrank(rank = 4, lazy_error = true)"]),
)


def run(name: str, sets: list[str], steps: int, tmp: Path, data: Path) -> list[dict]:
    out = tmp / name.replace(" ", "_").replace(",", "").replace("(", "").replace(")", "")
    overrides = [arg for value in COMMON + sets + [f"train.steps={steps}"] for arg in ("--set", value)]
    spec = ROOT / "tests" / "parity" / "specs" / "gpt.par"
    subprocess.run(PARC + ["build", str(spec), *overrides, "-o", str(out)], check=True, stdout=subprocess.DEVNULL)
    metrics = out / "metrics.jsonl"
    subprocess.run(TORCHRUN + ["train.py", "--data", str(data), "--metrics-jsonl", str(metrics)], cwd=out,
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return [json.loads(line) for line in metrics.read_text().splitlines()]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    steps = parser.parse_args().steps
    results = {}
    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        data = tmp / "t.bin"
        subprocess.run(PARC + ["data", "prepare", str(TEXT), "-o", str(data)], check=True,
                       stdout=subprocess.DEVNULL)
        print(f"{'layout':<24} {'final loss':>10} {'vs base':>8} {'bytes/step':>11} {'base/this':>9} {'time ratio':>10}")
        for name, axis, base, sets in ROWS:
            records = run(name, sets, steps, tmp, data)
            loss = statistics.fmean(r["loss"] for r in records[-10:])
            sent = statistics.fmean(r["comm_bytes"].get(axis, 0) for r in records)
            step = statistics.median(r["step_time_s"] for r in records)
            results[name] = (loss, sent, step)
            ref = results[base] if base else (loss, sent, step)
            print(f"{name:<24} {loss:>10.4f} {100 * (loss / ref[0] - 1):>+7.1f}% {sent:>11,.0f} "
                  f"{ref[1] / sent:>8.1f}× {step / ref[2]:>9.2f}×")
    print(f"({steps} steps; bytes: comm_bytes dp or pp_backward, summed over ranks; "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
