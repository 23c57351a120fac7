"""Step time of a MoE model with and without expert parallelism, on this machine's CPU ranks.

One llama with 8 experts top-2 (every block MoE) built from ``bench/specs/small.par``
with ``--set``, on 2 gloo ranks (dp = 2): ``no ep`` keeps every expert on every rank
and never moves a token (ep = 1); ``ep2`` splits the experts over the two ranks and
moves tokens by all-to-all (Note [expert dispatch], runtime/parallel/expert/moe.py); ``ep2 sub_batch(2)``
overlaps those all-to-alls with the experts (Note [expert all-to-all overlap]). Each runs
several repetitions alternating the layouts; the table gives the median step time and
the median exposed communication (``exposed_comm_s``: time blocked in collectives, the
gradient all-reduce included). The planner column is empty: parc's cost model has no
MoE terms yet (all-to-all, expert compute), so it makes no prediction for these layouts.
A benchmark, not a test: only figures from one run on one machine compare.

    python bench/moe.py [--steps 6] [--repeats 2]
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
sys.path.insert(0, str(ROOT))

from parc.codegen.build import build_to  # noqa: E402

TORCHRUN = Path(sys.executable).with_name("torchrun")
SPEC = ROOT / "bench" / "specs" / "small.par"
MODEL = ["model.arch=llama", "model.layers=2", "model.hidden=256", "model.heads=4", "model.ffn=1024",
         "model.experts=8", "model.top_k=2", "model.seq_len=128", "train.micro_batch=4", "train.global_batch=16"]
LAYOUTS = {
    "no ep (experts on every rank)": ["parallel.ep=1"],
    "ep2": ["parallel.ep=2"],
    "ep2 sub_batch(2)": ["parallel.ep=2", "parallel.overlap=sub_batch(2)"],
}
WARMUP = 2


def run(name: str, steps: int, workdir: Path) -> list[dict]:
    sets = MODEL + ["parallel.dp=2", "parallel.tp=1", "parallel.pp=1", "mesh.devices_per_node=2"] + LAYOUTS[name]
    out = Path(build_to(SPEC, workdir / name.split()[0].replace("(", ""), sets))
    metrics = out / "metrics.jsonl"
    metrics.unlink(missing_ok=True)
    command = [str(TORCHRUN), "--standalone", "--nproc-per-node=2", str(out / "train.py"),
               "--steps", str(WARMUP + steps), "--metrics-jsonl", str(metrics)]
    done = subprocess.run(command, env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True, text=True,
                          timeout=900)
    if done.returncode != 0:
        raise SystemExit(f"failed: {' '.join(command)}\n{done.stderr[-3000:]}")
    return [json.loads(line) for line in metrics.read_text().splitlines()][WARMUP:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    rows = {name: [] for name in LAYOUTS}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.repeats):
            for name in LAYOUTS:  # alternating, so a slow moment of the machine hits all
                rows[name] += run(name, args.steps, Path(tmp))
    print("llama 2 × 256, 8 experts top-2 (expert_ffn 1024), micro_batch 4 × 128 tokens, dp 2 on 2 CPU ranks")
    print(f"{'layout':32} {'step ms':>8} {'exposed comm ms':>16} {'planner ms':>11}")
    for name, records in rows.items():
        step = statistics.median(r["step_time_s"] for r in records) * 1e3
        comm = statistics.median(r["exposed_comm_s"] for r in records) * 1e3
        print(f"{name:32} {step:8.1f} {comm:16.1f} {'—':>11}")


if __name__ == "__main__":
    main()
