"""Predicted vs measured step time: the planner's cost model against real trainers.

Profiles this machine right before and right after each case (``parc profile --ranks
N``, N the case's ranks: its figures are per rank with N ranks at once, under the load
of the moment — on a shared machine the load moves, so each case gets its own pair,
and the prediction is the geometric mean of the two, printed with both), then for the tiny example
and bench/specs/small.par in several layouts builds the trainer (``parc build --set
...`` with ``mesh.profile`` naming the fresh profile), runs it with torchrun on CPU
gloo, takes the median ``step_time_s`` of the metrics JSONL after warm-up, and prints
it beside the planner's prediction for the same layout (and the predicted vs measured
per-rank bytes). Goal: within ±25%. A benchmark, not a test: the figures only mean
something side by side, from one run on one machine.

    python bench/planner_accuracy.py [--steps 8] [--json] [--only "dp 2, zero 3"]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from parc.codegen.build import build_to  # noqa: E402
from parc.codegen.planner.cost import estimate, hardware_for  # noqa: E402
from parc.codegen.planner.search import fixed_layout  # noqa: E402
from parc.dsl import load  # noqa: E402

TORCHRUN = Path(sys.executable).with_name("torchrun")
WARMUP = 2

CASES = (
    ("examples/tiny.par", "dp 2", dict(dp=2)),
    ("examples/tiny.par", "tp 2", dict(tp=2)),
    ("examples/tiny.par", "pp 2", dict(pp=2)),
    ("examples/tiny.par", "dp 2 · tp 2", dict(dp=2, tp=2)),
    ("examples/tiny.par", "dp 2, zero 1", dict(dp=2, zero=1)),
    ("examples/tiny.par", "dp 2, zero 3", dict(dp=2, zero=3)),
    ("bench/specs/small.par", "one rank", dict()),
    ("bench/specs/small.par", "dp 2", dict(dp=2)),
    ("bench/specs/small.par", "tp 2, sp", dict(tp=2, sp="true")),
    ("bench/specs/small.par", "pp 2", dict(pp=2)),
)


def overrides(degrees: dict, profile: str) -> list[str]:
    dp, tp, pp = degrees.get("dp", 1), degrees.get("tp", 1), degrees.get("pp", 1)
    sets = [f"parallel.dp={dp}", f"parallel.tp={tp}", f"parallel.pp={pp}",
            f"mesh.devices_per_node={dp * tp * pp}", "mesh.nodes=1", f'mesh.profile="{profile}"',
            f"parallel.sp={degrees.get('sp', 'false')}", f"parallel.zero={degrees.get('zero', 0)}"]
    return sets


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def measure(build_dir: Path, nproc: int, steps: int) -> dict:
    metrics = build_dir / "metrics.jsonl"
    metrics.unlink(missing_ok=True)
    command = [str(TORCHRUN), f"--nproc-per-node={nproc}", "--rdzv-backend=c10d",
               f"--rdzv-endpoint=127.0.0.1:{free_port()}", str(build_dir / "train.py"),
               "--metrics-jsonl", str(metrics), "--steps", str(steps)]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    if done.returncode:
        raise SystemExit(f"trainer failed in {build_dir}:\n{done.stderr[-3000:]}")
    records = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    times = [r["step_time_s"] for r in records if r["step"] > WARMUP]
    return {"step_time_s": statistics.median(times), "record": records[-1]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--only", action="append", default=[], metavar="LAYOUT",
                        help="run only the cases of this layout label (repeatable)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="parc-planner-accuracy-"))
    folder = work
    print(f"load average before: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores", flush=True)
    rows = []
    for index, (spec_path, label, degrees) in enumerate(CASES):
        if args.only and label not in args.only:
            continue
        world = degrees.get("dp", 1) * degrees.get("tp", 1) * degrees.get("pp", 1)
        def predict(when: str):
            profile = folder / f"profile-{index}-{when}.json"
            subprocess.run([sys.executable, "-m", "parc.codegen.cli", "profile", "--ranks", str(world),
                            "-o", str(profile)], check=True, capture_output=True,
                           env=dict(os.environ, OMP_NUM_THREADS="1"))
            sets = overrides(degrees, str(profile))
            spec = load(str(ROOT / spec_path), sets)
            return spec, sets, estimate(spec, fixed_layout(spec), hardware_for(spec))

        spec, sets, before = predict("before")
        build_dir = Path(build_to(ROOT / spec_path, work / f"build{index}", sets))
        measured = measure(build_dir, world, args.steps)
        spec, sets, after = predict("after")
        predictions = [before, after]
        low, high = sorted(p.time.step for p in predictions)
        step = (low * high) ** 0.5  # the two profiles' geometric mean
        predicted = min(predictions, key=lambda p: abs(p.time.step - step))
        ratio = step / measured["step_time_s"]
        rows.append({
            "model": spec.model.name, "layout": label, "ranks": world,
            "predicted_s": step, "band_s": [low, high], "measured_s": measured["step_time_s"],
            "error": ratio - 1, "load_average": os.getloadavg()[0],
            "predicted_compute_s": predicted.time.compute,
            "predicted_comm_s": predicted.time.exposed_comm, "predicted_bubble_s": predicted.time.bubble,
        })
        print(f"{spec.model.name:<16} {label:<13} predicted {1e3 * step:8.1f} ms "
              f"[{1e3 * low:.0f}–{1e3 * high:.0f}]  measured {1e3 * measured['step_time_s']:8.1f} ms  "
              f"{100 * (ratio - 1):+6.1f}%  (load {os.getloadavg()[0]:.1f})", flush=True)
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print()
    print(f"{'model':<16} {'layout':<13} {'ranks':>5}  {'predicted':>10}  {'measured':>10}  {'error':>7}"
          f"  {'compute':>8}  {'comm':>8}  {'bubble':>8}")
    for row in rows:
        print(f"{row['model']:<16} {row['layout']:<13} {row['ranks']:>5}  {1e3 * row['predicted_s']:>7.1f} ms"
              f"  {1e3 * row['measured_s']:>7.1f} ms  {100 * row['error']:>+6.1f}%"
              f"  {1e3 * row['predicted_compute_s']:>5.1f} ms  {1e3 * row['predicted_comm_s']:>5.1f} ms"
              f"  {1e3 * row['predicted_bubble_s']:>5.1f} ms")
    for model in sorted({row["model"] for row in rows}):
        mine = [row for row in rows if row["model"] == model]
        by_prediction = [row["layout"] for row in sorted(mine, key=lambda r: r["predicted_s"])]
        by_measure = [row["layout"] for row in sorted(mine, key=lambda r: r["measured_s"])]
        agree = sum(1 for a, b in zip(by_prediction, by_measure) if a == b)
        print(f"{model}: fastest first, predicted {by_prediction}; measured {by_measure} "
              f"({agree} of {len(mine)} places agree)")
    within = sum(1 for row in rows if abs(row["error"]) <= 0.25)
    print(f"\n{within} of {len(rows)} layouts within ±25% (profiles: {folder}); "
          f"load average after: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    return 0


if __name__ == "__main__":
    sys.exit(main())
