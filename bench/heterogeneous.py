"""Step time of a heterogeneous layout vs the uniform ones on the same ranks, on CPU gloo.

A GPT with a large vocabulary and few, small blocks (``bench/specs/small.par`` with
``--set``) on 2 ranks, in three layouts built by ``parc build``: uniform ``tp 2``, uniform
``dp 2``, and ``tp = [2, 2, 1, 1]``, ``dp = [1, 1, 2, 2]`` (the embedding, tied head and the
first blocks tensor-parallel, the last blocks data-parallel; runtime/hetero.py). The runs
alternate (so drift hits all alike), several repetitions each, and the table shows the
median step time, the median exposed communication, the ratio to the best uniform
layout (< 1: the heterogeneous one is faster) and the planner's prediction (``parc plan
--json``; a per-layer list is predicted as its coarse split, the cost model having no
per-layer degrees yet: that column says so). The machine's load is printed before and
after. A benchmark, not a test: only figures from one run on one machine compare.

    python bench/heterogeneous.py [--steps 6] [--repeats 2]
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
PARC = Path(sys.executable).with_name("parc")
SPEC = ROOT / "bench" / "specs" / "small.par"
MODEL = dict(layers=4, hidden=256, heads=4, ffn=1024, seq_len=64, vocab=16384)
BATCH = dict(micro_batch=4, global_batch=16)
LAYOUTS = {
    "uniform tp2": ["parallel.tp=2", "parallel.dp=1"],
    "uniform dp2": ["parallel.tp=1", "parallel.dp=2"],
    "hetero [2,2,1,1]": ["parallel.tp=[2, 2, 1, 1]", "parallel.dp=[1, 1, 2, 2]"],
}
WARMUP = 2


def sets_of(layout: str) -> list[str]:
    sets = [f"model.{key}={value}" for key, value in MODEL.items()]
    sets += [f"train.{key}={value}" for key, value in BATCH.items()]
    return sets + ["parallel.pp=1", "parallel.sp=false", "mesh.devices_per_node=2", *LAYOUTS[layout]]


def predicted(layout: str) -> float:
    args = [str(PARC), "plan", str(SPEC), "--json"]
    for item in sets_of(layout):
        args += ["--set", item]
    done = subprocess.run(args, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise SystemExit(f"parc plan failed for {layout}:\n{done.stdout}{done.stderr}")
    return json.loads(done.stdout)["layouts"][0]["step_time_s"]


def run(layout: str, steps: int, out: Path) -> list[dict]:
    metrics = out / "metrics.jsonl"
    metrics.unlink(missing_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    command = [str(TORCHRUN), "--standalone", "--nproc-per-node=2", str(out / "train.py"),
               "--steps", str(WARMUP + steps), "--metrics-jsonl", str(metrics)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise SystemExit(f"failed: {' '.join(command)}\n{done.stderr[-3000:]}")
    return [json.loads(line) for line in metrics.read_text().splitlines()][WARMUP:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=6, help="timed steps per run (after 2 warm-up)")
    parser.add_argument("--repeats", type=int, default=2, help="runs of each layout, alternating")
    args = parser.parse_args()
    load_before = os.getloadavg()
    records: dict[str, list] = {layout: [] for layout in LAYOUTS}
    with tempfile.TemporaryDirectory() as tmp:
        builds = {layout: Path(build_to(SPEC, Path(tmp) / f"b{i}", sets_of(layout)))
                  for i, layout in enumerate(LAYOUTS)}
        for repeat in range(args.repeats):
            for layout in LAYOUTS:
                records[layout] += run(layout, args.steps, builds[layout])
                print(f"  ... {layout} run {repeat + 1}", file=sys.stderr)
    load_after = os.getloadavg()
    step = {layout: statistics.median(r["step_time_s"] for r in rows) for layout, rows in records.items()}
    exposed = {layout: statistics.median(r["exposed_comm_s"] for r in rows) for layout, rows in records.items()}
    best_uniform = min((layout for layout in LAYOUTS if layout.startswith("uniform")), key=step.get)
    print(f"model {MODEL}, {BATCH}, 2 CPU ranks (gloo), {args.repeats} × {args.steps} steps each")
    print(f"load average before {load_before[0]:.2f} {load_before[1]:.2f} {load_before[2]:.2f}, "
          f"after {load_after[0]:.2f} {load_after[1]:.2f} {load_after[2]:.2f}")
    print(f"{'layout':<18} {'step ms':>8} {'exposed ms':>10} {'vs best uniform':>16} {'predicted ms':>13}")
    for layout in LAYOUTS:
        note = " (coarse split)" if layout.startswith("hetero") else ""
        print(f"{layout:<18} {step[layout] * 1e3:8.1f} {exposed[layout] * 1e3:10.1f} "
              f"{step[layout] / step[best_uniform]:15.3f}× {predicted(layout) * 1e3:12.1f}{note}")
    print(f"best uniform: {best_uniform}")


if __name__ == "__main__":
    main()
