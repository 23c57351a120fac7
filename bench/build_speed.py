"""How long `parc build` takes next to `parc plan` on huge meshes (the Hardening issue).

For a 1T-parameter GPT on 3,072 GPUs (examples/gpt-1t.par) and the same model on
100,000 GPUs, each command runs as a user runs it (a fresh process, the planner
filling `parallel = auto`), best CPU seconds of 3, alternating; the baseline is
`parc plan` of the same spec in the same run, and the ratio build / plan is the
figure to watch (the goal: about 1, i.e. the build costs little more than the
search it starts with). Also printed: the size of the build's plan.json.

    python bench/build_speed.py
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PARC = [sys.executable, "-m", "parc.codegen.cli"]
HUGE = ["--set", "mesh.nodes=12500", "--set", "train.global_batch=25000", "--set", "mesh.device_memory=400 GB"]
CASES = (("gpt-1t, 3,072 GPUs", []), ("gpt-1t, 100,000 GPUs", HUGE))


def cpu_seconds(argv: list[str]) -> float:
    """CPU seconds of one child process running ``argv`` (user + system)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(argv, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> int:
    spec = str(ROOT / "examples" / "gpt-1t.par")
    print(f"{'case':<24} {'plan s':>8} {'build s':>8} {'build/plan':>10} {'plan.json':>10}")
    with tempfile.TemporaryDirectory() as tmp:
        for name, sets in CASES:
            out = Path(tmp) / name.replace(" ", "_").replace(",", "")
            plans, builds = [], []
            for _ in range(3):
                plans.append(cpu_seconds(PARC + ["plan", spec, *sets]))
                builds.append(cpu_seconds(PARC + ["build", spec, *sets, "-o", str(out), "--force"]))
            size = os.path.getsize(out / "plan.json")
            plan, build = min(plans), min(builds)
            print(f"{name:<24} {plan:>8.2f} {build:>8.2f} {build / plan:>10.2f} {size / 1e3:>8.0f} kB")
    print(f"(load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; CPU seconds, best of 3)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
