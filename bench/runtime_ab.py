"""One trainer, two runtimes: this checkout's against a git revision's, alternating runs.

Builds ``bench/specs/small.par`` with ``--set`` once, copies the build, and in the
copy puts back the runtime files named by ``--files`` as they were at ``--before``
(``git show REV:runtime/...``). Then runs both trainers on the same ranks,
alternating (before, after, before, ...), and prints the median step time and exposed
communication of each, their ratio, and the machine's load before and after. For a
change confined to a few runtime files (the MoE dispatch, the pipeline executor) this
measures it alone: the same generated train.py, the same shapes, only those files differ.
A benchmark, not a test: only figures from one run on one machine compare.

    python bench/runtime_ab.py --before REV --files parallel/expert/moe.py ... \\
        --ranks 2 --set parallel.ep=2 model.experts=8 ... [--steps 4] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
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
WARMUP = 2


def load() -> str:
    one, five, _ = os.getloadavg()
    return f"load {one:.2f} (1 min), {five:.2f} (5 min), {os.cpu_count()} CPUs"


def run(build: Path, ranks: int, steps: int) -> list[dict]:
    metrics = build / "metrics.jsonl"
    metrics.unlink(missing_ok=True)
    command = [str(TORCHRUN), "--standalone", f"--nproc-per-node={ranks}", str(build / "train.py"),
               "--steps", str(WARMUP + steps), "--metrics-jsonl", str(metrics)]
    done = subprocess.run(command, env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True, text=True,
                          timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"failed: {' '.join(command)}\n{done.stderr[-3000:]}")
    return [json.loads(line) for line in metrics.read_text().splitlines()][WARMUP:]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="the git revision whose runtime files are 'before'")
    parser.add_argument("--files", nargs="+", required=True, help="runtime files, relative to runtime/")
    parser.add_argument("--set", nargs="*", default=[], help="the spec's --set overrides")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--steps", type=int, default=4, help=f"timed steps per run (after {WARMUP} warm-up)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--title", default="")
    args = parser.parse_args()
    start = load()
    records = {"before": [], "after": []}
    with tempfile.TemporaryDirectory() as tmp:
        after = Path(build_to(SPEC, Path(tmp) / "after", args.set))
        before = Path(tmp) / "before"
        shutil.copytree(after, before)
        for name in args.files:
            old = subprocess.run(["git", "show", f"{args.before}:runtime/{name}"], cwd=ROOT, check=True,
                                 capture_output=True, text=True).stdout
            (before / "parc_runtime" / name).write_text(old)
        for _ in range(args.repeats):  # alternating, so a slow moment of the machine hits both
            for side, build in (("before", before), ("after", after)):
                records[side] += run(build, args.ranks, args.steps)
    print(f"## {args.title or ' '.join(args.set)}: {args.ranks} ranks, medians of {args.repeats} alternating runs "
          f"x {args.steps} steps after {WARMUP} warm-up; runtime files {' '.join(args.files)} at {args.before} vs now")
    print(f"## before: {start}; after: {load()}")
    print(f"{'side':8} {'step ms':>9} {'exposed comm ms':>16}")
    steps = {}
    for side, rows in records.items():
        steps[side] = statistics.median(r["step_time_s"] for r in rows)
        comm = statistics.median(r["exposed_comm_s"] for r in rows)
        print(f"{side:8} {steps[side] * 1e3:9.1f} {comm * 1e3:16.1f}")
    print(f"after is {steps['before'] / steps['after']:.2f}x before (step time ratio)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
