"""Pipeline schedules in parc's generated trainer on CPU gloo: 1f1b vs zero_bubble vs zero_bubble_v vs chimera vs terapipe.

``bench/specs/small.par`` with 8 layers (ZB-V splits them into 2·pp stages), built with pp = 2 and pp = 4 (dp = tp = 1,
8 micro-batches a step) under each schedule, run with torchrun for a few steps after
a warm-up, several repetitions alternating the schedules. The table shows the median
step time, the median exposed communication (``exposed_comm_s``: time blocked in
collectives and in waits on pipeline receives, which the executor posts ahead, p2p.py)
and, beside them, the planner's prediction for the same spec (``parc plan``'s
estimate: step time and the bubble in it; on a CPU without ``mesh.profile`` its times
are placeholders, so compare the predicted ratio, not the seconds). ``terapipe`` runs
with 2 and 4 token slices of each sequence.
A benchmark, not a test: only figures from one run on one machine compare.

    python bench/pipeline.py [--steps 4] [--repeats 2] [--ranks 2 4] [--json]
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
from parc.codegen.cli.plan import plan  # noqa: E402
from parc.dsl import Diagnostics, load  # noqa: E402

TORCHRUN = Path(sys.executable).with_name("torchrun")
SPEC = ROOT / "bench" / "specs" / "small.par"
SCHEDULES = ("1f1b", "zero_bubble", "zero_bubble_v", "chimera", "terapipe(slices = 2)", "terapipe(slices = 4)")
NOT_BUILT = ()
"""Schedules the language names that parc check refuses (none now): listed with its code."""
MICRO_BATCHES, MICRO_BATCH = 8, 2
WARMUP = 2


def sets_for(ranks: int, schedule: str) -> list[str]:
    return ["model.layers=8", f"train.micro_batch={MICRO_BATCH}", f"train.global_batch={MICRO_BATCH * MICRO_BATCHES}",
            "parallel.dp=1", "parallel.tp=1", f"parallel.pp={ranks}", f"parallel.schedule={schedule}",
            f"mesh.devices_per_node={ranks}"]


def run(ranks: int, schedule: str, steps: int, workdir: Path) -> list[dict]:
    name = schedule.replace("(slices = ", "").replace(")", "")
    out = Path(build_to(SPEC, workdir / f"pp{ranks}-{name}", sets_for(ranks, schedule)))
    metrics = out / "metrics.jsonl"
    metrics.unlink(missing_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    command = [str(TORCHRUN), "--standalone", f"--nproc-per-node={ranks}", str(out / "train.py"),
               "--steps", str(WARMUP + steps), "--metrics-jsonl", str(metrics)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise SystemExit(f"failed: {' '.join(command)}\n{done.stderr[-3000:]}")
    return [json.loads(line) for line in metrics.read_text().splitlines()][WARMUP:]


def predicted(ranks: int, schedule: str) -> tuple[float, float]:
    """(step seconds, bubble seconds) of parc plan's estimate for the spec."""
    winner = plan(load(str(SPEC), sets_for(ranks, schedule))).winner
    return winner.time.step, winner.time.bubble


def refusal(ranks: int, schedule: str) -> str:
    try:
        load(str(SPEC), sets_for(ranks, schedule))
    except Diagnostics as exc:
        return exc.errors[0].code
    return "accepted"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=4, help="timed steps per run (after 2 warm-up)")
    parser.add_argument("--repeats", type=int, default=2, help="runs of each configuration")
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--json", action="store_true", help="print the rows as a JSON list")
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for ranks in args.ranks:
            records = {schedule: [] for schedule in SCHEDULES}
            for repeat in range(args.repeats):
                for schedule in SCHEDULES:  # alternate, so drift hits both alike
                    records[schedule] += run(ranks, schedule, args.steps, Path(tmp))
                    print(f"  ... pp{ranks} {schedule} run {repeat + 1}", file=sys.stderr)
            for schedule in SCHEDULES:
                step, bubble = predicted(ranks, schedule)
                rows.append(dict(
                    ranks=ranks, schedule=schedule,
                    step_s=statistics.median(r["step_time_s"] for r in records[schedule]),
                    exposed_s=statistics.median(r["exposed_comm_s"] for r in records[schedule]),
                    predicted_step_s=step, predicted_bubble_s=bubble,
                ))
            rows += [dict(ranks=ranks, schedule=s, refused=refusal(ranks, s)) for s in NOT_BUILT]
    load_text = f"load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after, on {os.cpu_count()} cores"
    if args.json:
        print(json.dumps(dict(rows=rows, load=load_text), indent=2))
        return
    print(load_text)
    print(f"{MICRO_BATCHES} micro-batches of {MICRO_BATCH} a step; predicted: parc plan's estimate (placeholder "
          "seconds on a CPU without a profile)")
    print(f"{'pp':>3} {'schedule':<22} {'step':>10} {'exposed':>10} {'vs 1f1b':>8} "
          f"{'pred step':>10} {'pred bubble':>11} {'pred vs 1f1b':>12}")
    base = {r["ranks"]: r for r in rows if r["schedule"] == "1f1b"}
    for r in rows:
        if "refused" in r:
            print(f"{r['ranks']:>3} {r['schedule']:<22} {'not built: parc check says ' + r['refused']}")
            continue
        b = base[r["ranks"]]
        print(f"{r['ranks']:>3} {r['schedule']:<22} {1e3 * r['step_s']:>8.1f}ms {1e3 * r['exposed_s']:>8.1f}ms "
              f"{b['step_s'] / r['step_s']:>7.2f}x {1e3 * r['predicted_step_s']:>8.1f}ms "
              f"{100 * r['predicted_bubble_s'] / r['predicted_step_s']:>10.1f}% "
              f"{b['predicted_step_s'] / r['predicted_step_s']:>11.2f}x")


if __name__ == "__main__":
    main()
