"""The planner's per-layer choice against the best uniform layout, predicted and measured, on CPU gloo.

A GPT with a large vocabulary and few, small blocks (``bench/specs/small.par`` with
``--set``) on 2 CPU ranks, ``tp``, ``dp`` and ``micro_batch`` left to the planner, this machine measured
first (``parc profile --ranks 2 --quick``, unless ``--profile`` names a file). A memory
limit is then set with ``mesh.device_memory``: of 11 limits between the least and the
most any uniform layout needs, the one where the per-layer search
(codegen/planner/layer_search.py) predicts a per-layer layout to win by the most (dp 2 is
fast on a CPU: no tensor-parallel collectives, but every rank holds the whole
vocabulary; tp 2 halves it). ``parc build`` builds the planner's winner (the auto spec) and
the best uniform layout that fits (written out), the runs alternate (drift hits both
alike), and the table shows, for each: the median measured step time, the planner's
prediction, their ratio, the measured and predicted bytes per rank (parameters,
gradients, optimizer state, saved activations; the trainer's meter), and the speedup
of the per-layer layout over the uniform one, measured and predicted. The machine's
load is printed before and after. Then the same model under pp = 2 (2 stages of 2 ranks,
recompute left to the planner too), predicted only: the per-stage search's choice
(codegen/planner/layer_pipeline.py) against the best uniform pipelined layout. A
benchmark, not a test: only figures from one run on one machine compare.

    python bench/heterogeneous.py [--steps 6] [--repeats 2] [--profile FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TORCHRUN = Path(sys.executable).with_name("torchrun")
PARC = Path(sys.executable).with_name("parc")
SPEC = ROOT / "bench" / "specs" / "small.par"
MODEL = dict(layers=6, hidden=128, heads=2, ffn=512, seq_len=64, vocab=16384)
BATCH = dict(micro_batch="auto", global_batch=16)
FIXED = ["parallel.pp=1", "parallel.sp=false", "parallel.zero=0", "parallel.recompute=none",
         "parallel.overlap=none", "mesh.devices_per_node=2"]
PIPELINED = ["parallel.pp=2", "parallel.schedule=1f1b", "parallel.sp=false", "parallel.zero=0",
             "parallel.recompute=auto", "parallel.overlap=none", "mesh.devices_per_node=4"]
"""The pipelined case: 2 stages of 2 ranks, recompute left to the planner too."""
WARMUP = 2


def sets(profile: Path, memory: float | None, layout: list[str], fixed: list[str] = FIXED) -> list[str]:
    out = [f"model.{key}={value}" for key, value in MODEL.items()]
    out += [f"train.{key}={value}" for key, value in BATCH.items()]
    out += fixed + [f'mesh.profile="{profile}"']
    out += [f"mesh.device_memory={int(memory)} B"] if memory else []
    return out + layout


def parc(*args: str, timeout: int = 600) -> str:
    done = subprocess.run([str(PARC), *args], capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise SystemExit(f"parc {' '.join(args)} failed:\n{done.stdout}{done.stderr}")
    return done.stdout


def with_sets(command: list[str], items: list[str]) -> list[str]:
    for item in items:
        command += ["--set", item]
    return command


def plan(profile: Path, memory: float | None, layout: list[str], fixed: list[str] = FIXED) -> dict:
    command = ["plan", str(SPEC), "--json", "--top", "0"]
    return json.loads(parc(*with_sets(command, sets(profile, memory, layout, fixed))))


def scan(profile: Path, fixed: list[str], points: int = 12):
    """(predicted speedup, memory limit, winner, best uniform) at the limit, among ``points``
    - 1 steps between the least and the most any uniform layout needs, where a per-layer
    layout (degrees or settings) wins by the most; None if none wins."""
    from parc.codegen.planner.cost import hardware_for
    from parc.codegen.planner.search import search
    from parc.dsl import load

    auto = ["parallel.tp=auto", "parallel.dp=auto"]

    def planned(memory):
        spec = load(str(SPEC), sets(profile, memory, auto, fixed))
        return search(spec, hardware_for(spec))

    peaks = [item.memory.total for item in planned(None).estimates if item.buildable]
    low, high = min(peaks), max(peaks)
    found = None
    for k in range(1, points):
        memory = (low + (high - low) * k / points) / 0.95  # 95% is usable
        result = planned(memory)
        chosen, uniform = result.winner, result.best_uniform
        if chosen is None or uniform is None or not (chosen.layout.layer_tp or chosen.layout.per_layer):
            continue
        gain = uniform.time.step / chosen.time.step
        if found is None or gain > found[0]:
            found = (gain, memory, chosen, uniform)
    return found


def pipelined_prediction(profile: Path, points: int = 12) -> list[str]:
    """The planner's per-stage choice under pp = 2 (cost/per_stage.py, layer_pipeline.py)
    against the best uniform pipelined layout, predicted only, at the scanned limit where a
    per-layer layout wins by the most. The profile is of 2 ranks; 4 ranks on its cores
    would contend more (the figures compare the two layouts, not this machine)."""
    found = scan(profile, PIPELINED, points)
    if found is None:
        return [f"pipelined, predicted only: no per-layer layout wins at any of {points - 1} memory limits"]
    gain, memory, chosen, uniform = found
    lines = [f"pipelined, predicted only: pp 2 × 2 ranks, recompute = auto, mesh.device_memory = "
             f"{memory / 2**20:.1f} MiB (the best of {points - 1} limits scanned)"]
    for name, item in (("planner's choice", chosen), ("best uniform", uniform)):
        layout = item.layout
        words = " ".join([layout.describe(), f"mb {layout.micro_batch}", *layout.settings_words()])
        lines.append(f"  {name:<17} {words:<72} {item.time.step * 1e3:8.1f} ms {item.memory.total / 2**20:6.1f} MiB")
    lines.append(f"  predicted speedup of the per-stage choice: {gain:.2f}×")
    return lines


def state_and_activations(item: dict) -> float:
    m = item["memory"]
    return m["params_bytes"] + m["grads_bytes"] + m["optimizer_bytes"] + m["activations_bytes"]


def run(out: Path, steps: int) -> list[dict]:
    metrics = out / "metrics.jsonl"
    metrics.unlink(missing_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    command = [str(TORCHRUN), "--standalone", "--nproc-per-node=2", str(out / "train.py"),
               "--steps", str(WARMUP + steps), "--metrics-jsonl", str(metrics)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise SystemExit(f"failed: {' '.join(command)}\n{done.stderr[-3000:]}")
    return [json.loads(line) for line in metrics.read_text().splitlines()]


def measured_bytes(rows: list[dict]) -> float:
    """The most any rank held: parameters + gradients + optimizer state + peak saved activations."""
    best = 0.0
    for row in rows:
        for rank in row.get("memory_per_rank", []):
            best = max(best, rank["param_bytes"] + rank["grad_bytes"] + rank["optim_bytes"]
                       + rank["activation_peak_bytes"])
    return best


def words(item: dict) -> str:
    fold = lambda v: "[" + ", ".join(map(str, v)) + "]" if isinstance(v, list) else str(v)  # noqa: E731
    return f"tp {fold(item['tp'])} dp {fold(item['dp'])} mb {item['micro_batch']}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=6, help="timed steps per run (after 2 warm-up)")
    parser.add_argument("--repeats", type=int, default=2, help="runs of each layout, alternating")
    parser.add_argument("--profile", type=Path, help="a parc profile of 2 ranks (default: measure one now)")
    args = parser.parse_args()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        profile = args.profile
        if profile is None:
            profile, start = tmp / "profile.json", time.time()
            parc("profile", "--ranks", "2", "--quick", "-o", str(profile), timeout=1200)
            print(f"profiled this machine (2 ranks, --quick) in {time.time() - start:.0f} s", file=sys.stderr)
        profile = profile.resolve()
        pipelined = pipelined_prediction(profile)
        auto = ["parallel.tp=auto", "parallel.dp=auto"]
        free = plan(profile, None, auto)["layouts"]
        dp2 = next(x for x in free if x["tp"] == 1 and x["dp"] == 2)  # the fastest of each (any micro_batch)
        found = scan(profile, FIXED)
        if found is None:
            raise SystemExit("no memory limit makes a per-layer layout win on this profile")
        memory = found[1]
        result = plan(profile, memory, auto)
        chosen = result["layouts"][result["winner"]]
        uniform = next(x for x in result["layouts"] if x["fits"] and x["buildable"]
                       and not isinstance(x["tp"], list) and x["step_time_s"] == result["best_uniform_step_time_s"])
        builds = {"planner's choice": tmp / "chosen", "best uniform": tmp / "uniform"}
        parc(*with_sets(["build", str(SPEC), "-o", str(builds["planner's choice"])], sets(profile, memory, auto)))
        written = [f"parallel.tp={uniform['tp']}", f"parallel.dp={uniform['dp']}",
                   f"train.micro_batch={uniform['micro_batch']}"]
        parc(*with_sets(["build", str(SPEC), "-o", str(builds["best uniform"])], sets(profile, memory, written)))
        records: dict[str, list] = {name: [] for name in builds}
        for repeat in range(args.repeats):
            for name, out in builds.items():
                records[name] += run(out, args.steps)
                print(f"  ... {name} run {repeat + 1}", file=sys.stderr)
    load_after = os.getloadavg()
    items = {"planner's choice": chosen, "best uniform": uniform}
    step = {name: statistics.median(r["step_time_s"] for r in rows[WARMUP:] if "step_time_s" in r)
            for name, rows in records.items()}
    print(f"model {MODEL}, {BATCH}, 2 CPU ranks (gloo), {args.repeats} × {args.steps} steps each; "
          f"mesh.device_memory = {memory / 2**20:.1f} MiB (of 11 limits scanned, where a per-layer layout "
          "is predicted to win by the most)")
    print(f"load average before {load_before[0]:.2f} {load_before[1]:.2f} {load_before[2]:.2f}, "
          f"after {load_after[0]:.2f} {load_after[1]:.2f} {load_after[2]:.2f}")
    print(f"{'layout':<17} {'':<34} {'step ms':>8} {'pred ms':>8} {'meas/pred':>9} {'MiB':>7} {'pred MiB':>8}")
    for name, item in items.items():
        mib = measured_bytes(records[name]) / 2**20
        print(f"{name:<17} {words(item):<34} {step[name] * 1e3:8.1f} {item['step_time_s'] * 1e3:8.1f} "
              f"{step[name] / item['step_time_s']:9.2f} {mib:7.1f} {state_and_activations(item) / 2**20:8.1f}")
    measured_speedup = step["best uniform"] / step["planner's choice"]
    predicted_speedup = uniform["step_time_s"] / chosen["step_time_s"]
    print(f"speedup of the planner's choice over the best uniform: measured {measured_speedup:.2f}×, "
          f"predicted {predicted_speedup:.2f}×")
    print(f"uniform dp 2 (does not fit {memory / 2**20:.1f} MiB): predicted {dp2['step_time_s'] * 1e3:.1f} ms, "
          f"{dp2['peak_mem_bytes'] / 2**20:.1f} MiB")
    print("\n".join(pipelined))


if __name__ == "__main__":
    main()
