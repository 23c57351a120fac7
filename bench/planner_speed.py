"""How fast the planner answers: `parc plan` of GPT-3 175B on 1024 GPUs and of a 1T GPT on 3072.

For each spec: the full search in process (wall and CPU seconds, best of 3), the
layouts considered, and `parc plan SPEC` as a user runs it (a fresh process: Python
and torch start-up included). Baseline, measured in the same run: scoring every
layout exactly (the runtime's schedule simulated for each), timed on every 25th
layout and scaled to all of them. Goal: 175B < 1 s, 1T < 3 s.

    python bench/planner_speed.py [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from parc.codegen.planner.cost import estimate, hardware_for  # noqa: E402
from parc.codegen.planner.cost.bubble import _simulate, _unit_makespan  # noqa: E402
from parc.codegen.planner.search import candidates, search  # noqa: E402
from parc.dsl import load  # noqa: E402

SPECS = (("examples/gpt3-175b.par", 1.0), ("examples/gpt-1t.par", 3.0))
SAMPLE = 25


def timed(fn):
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - wall, time.process_time() - cpu


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = []
    for path, goal in SPECS:
        spec = load(str(ROOT / path))
        hw = hardware_for(spec)
        runs = []
        for _ in range(3):
            _unit_makespan.cache_clear()
            _simulate.cache_clear()
            runs.append(timed(lambda: search(spec, hw)))
        result = runs[0][0]
        wall = min(r[1] for r in runs)
        cpu = min(r[2] for r in runs)
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "parc.codegen.cli", "plan", str(ROOT / path)],
                       check=True, capture_output=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
        cli = time.perf_counter() - start
        layouts = candidates(spec)
        sample = layouts[::SAMPLE]
        _unit_makespan.cache_clear()
        _simulate.cache_clear()
        _, base_wall, base_cpu = timed(lambda: [estimate(spec, layout, hw, exact=True) for layout in sample])
        scale = len(layouts) / len(sample)
        rows.append({
            "spec": path, "layouts": result.considered, "fitting": result.fitting,
            "search_wall_s": wall, "search_cpu_s": cpu, "cli_wall_s": cli, "goal_s": goal,
            "baseline_all_exact_s": base_cpu * scale, "load_average": os.getloadavg()[0],
        })
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print(f"{'spec':<26} {'layouts':>8} {'fit':>5}  {'search wall':>11}  {'search cpu':>10}  "
          f"{'parc plan':>9}  {'goal':>5}  {'baseline: all exact':>20}")
    for row in rows:
        print(f"{row['spec']:<26} {row['layouts']:>8} {row['fitting']:>5}  {row['search_wall_s']:>9.2f} s"
              f"  {row['search_cpu_s']:>8.2f} s  {row['cli_wall_s']:>7.2f} s  {row['goal_s']:>3.0f} s"
              f"  {row['baseline_all_exact_s']:>18.1f} s")
    print(f"(load average {rows[-1]['load_average']:.1f} on {os.cpu_count()} cores; search: best of 3; "
          f"baseline: CPU time of every {SAMPLE}th layout scored exactly, scaled to all)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
