"""Context parallel on this machine: step time and measured activation peak of the tiny
Llama at seq_len 1024–4096, one rank (cp 1) against cp 2 (ring and ulysses), with the
planner's predictions beside them.

Each row builds the trainer (`parc build tests/parity/specs/llama.par --set ...`: 2
layers, hidden 64, 8 heads over 4 kv heads, one sequence a step, fp32, no recompute),
runs it with torchrun on CPU gloo for 3 steps, and reads the last step's
``step_time_s`` and the largest ``activation_peak_bytes`` over ranks (runtime/train/memory.py)
from its metrics JSONL. Predicted: the cost model's step time and activations for the
same layout (codegen/planner/cost). Activations fall ∝ 1/cp: the cp 2 column "×cp1"
is the measured ratio to one rank's.

    python bench/context_parallel.py [--seq-lens 1024 2048 4096] [--steps 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from parc.codegen.planner.cost import estimate, hardware_for  # noqa: E402
from parc.codegen.planner.search import fixed_layout  # noqa: E402
from parc.dsl import load  # noqa: E402

SPEC = ROOT / "tests" / "parity" / "specs" / "llama.par"
LAYOUTS = (("cp1", 1, "ring"), ("cp2 ring", 2, "ring"), ("cp2 ulysses", 2, "ulysses"))


def overrides(cp: int, kind: str, seq_len: int) -> list[str]:
    return [
        "parallel.dp=1", "parallel.tp=1", "parallel.pp=1", f"parallel.cp={cp}", f"parallel.cp_kind={kind}",
        f"mesh.devices_per_node={cp}", f"model.seq_len={seq_len}", "train.global_batch=1", "train.micro_batch=1",
    ]


def run(cp: int, kind: str, seq_len: int, steps: int, folder: Path) -> dict:
    sets = overrides(cp, kind, seq_len)
    out = folder / f"cp{cp}-{kind}-{seq_len}"
    build = [sys.executable, "-c", "import sys; from parc.codegen.cli import main; sys.exit(main())",
             "build", str(SPEC), "-o", str(out)]
    for item in sets:
        build += ["--set", item]
    subprocess.run(build, check=True, capture_output=True, text=True)
    env = dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={cp}",
                "train.py", "--steps", str(steps), "--metrics-jsonl", "m.jsonl"]
    subprocess.run(torchrun, cwd=out, env=env, check=True, capture_output=True, text=True, timeout=1200)
    last = [json.loads(line) for line in (out / "m.jsonl").read_text().splitlines()][-1]
    spec = load(str(SPEC), sets)
    layout = fixed_layout(spec)
    predicted = estimate(spec, layout, hardware_for(spec))
    return {
        "layout": f"cp{cp} {kind}" if cp > 1 else "cp1", "seq_len": seq_len,
        "step_s": last["step_time_s"],
        "activation_peak_bytes": max(row["activation_peak_bytes"] for row in last["memory_per_rank"]),
        "predicted_step_s": predicted.time.step,
        "predicted_activation_bytes": predicted.memory.activations,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq-lens", type=int, nargs="+", default=[1024, 2048, 4096])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for seq_len in args.seq_lens:
            for _, cp, kind in LAYOUTS:
                rows.append(run(cp, kind, seq_len, args.steps, Path(tmp)))
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print("tiny Llama (2 layers, hidden 64, 8 heads / 4 kv heads), 1 sequence a step, fp32, CPU gloo")
    print(f"{'seq_len':>7}  {'layout':<12} {'step s':>7} {'pred s':>7}  {'activ MiB':>9} {'pred MiB':>9} "
          f"{'pred/meas':>9} {'×cp1':>6}")
    one = {}
    for row in rows:
        mib = row["activation_peak_bytes"] / 2**20
        if row["layout"] == "cp1":
            one[row["seq_len"]] = row["activation_peak_bytes"]
        ratio = row["activation_peak_bytes"] / one[row["seq_len"]]
        print(f"{row['seq_len']:>7}  {row['layout']:<12} {row['step_s']:>7.3f} {row['predicted_step_s']:>7.3f}  "
              f"{mib:>9.2f} {row['predicted_activation_bytes'] / 2**20:>9.2f} "
              f"{row['predicted_activation_bytes'] / row['activation_peak_bytes']:>9.3f} {ratio:>6.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
