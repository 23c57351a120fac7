"""Tokens/s of parc's generated trainer vs the same model on PyTorch's own parallel APIs.

For the tiny example and a ~10M-parameter GPT, in layouts 1, dp2 and tp2 on CPU gloo,
this builds the parc trainer (``parc build --set ...``), runs it with torchrun and takes
the median tokens/s over the steps after warm-up; then runs ``bench/torch_baseline.py``
(DTensor ColwiseParallel/RowwiseParallel for tp, DDP for dp) with the same shapes,
batch and steps, and prints both with the ratio. A benchmark, not a test: the figures
are only meaningful side by side from one run on one machine.

    python bench/throughput.py [--steps 10] [--json]
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
from parc.dsl import load  # noqa: E402

TORCHRUN = Path(sys.executable).with_name("torchrun")
MODELS = {"tiny": ROOT / "examples" / "tiny.par", "small-10M": ROOT / "bench" / "specs" / "small.par"}
LAYOUTS = {"1": dict(dp=1, tp=1), "dp2": dict(dp=2, tp=1), "tp2": dict(dp=1, tp=2)}
WARMUP = 2


def torchrun(nproc: int, argv: list[str]) -> str:
    env = dict(os.environ, OMP_NUM_THREADS=str(max(1, (os.cpu_count() or 2) // nproc)))
    command = [str(TORCHRUN), "--standalone", f"--nproc-per-node={nproc}", *argv]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise SystemExit(f"failed: {' '.join(command)}\n{done.stderr[-3000:]}")
    return done.stdout


def run_parc(spec: Path, dp: int, tp: int, steps: int, workdir: Path) -> float:
    sets = [f"parallel.dp={dp}", f"parallel.tp={tp}", "parallel.pp=1", "parallel.sp=false",
            f"mesh.devices_per_node={dp * tp}"]
    out = Path(build_to(spec, workdir / f"{spec.stem}-dp{dp}-tp{tp}", sets))
    metrics = out / "metrics.jsonl"
    torchrun(dp * tp, [str(out / "train.py"), "--steps", str(WARMUP + steps), "--metrics-jsonl", str(metrics)])
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    return statistics.median(r["tokens_per_s"] for r in records[WARMUP:])


def run_baseline(spec: Path, dp: int, tp: int, steps: int) -> float:
    s = load(str(spec))
    m, t = s.model, s.train
    grad_accum = t.global_batch // (t.micro_batch * dp)
    argv = [str(ROOT / "bench" / "torch_baseline.py"), f"--dp={dp}", f"--tp={tp}",
            f"--layers={m.layers}", f"--hidden={m.hidden}", f"--heads={m.heads}", f"--ffn={m.ffn}",
            f"--vocab={m.padded_vocab}", f"--seq-len={m.seq_len}", f"--micro-batch={t.micro_batch}",
            f"--grad-accum={grad_accum}", f"--steps={steps}", f"--warmup={WARMUP}"]
    lines = [line for line in torchrun(dp * tp, argv).splitlines() if line.startswith("{")]
    return json.loads(lines[-1])["tokens_per_s"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=10, help="timed steps per run (after 2 warm-up)")
    parser.add_argument("--json", action="store_true", help="print the rows as a JSON list")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for model, spec in MODELS.items():
            for layout, degrees in LAYOUTS.items():
                parc_tps = run_parc(spec, degrees["dp"], degrees["tp"], args.steps, Path(tmp))
                torch_tps = run_baseline(spec, degrees["dp"], degrees["tp"], args.steps)
                rows.append(dict(model=model, layout=layout, parc_tokens_per_s=parc_tps,
                                 torch_tokens_per_s=torch_tps, ratio=parc_tps / torch_tps))
                if not args.json:
                    print(f"  ... {model} {layout}: parc {parc_tps:.0f} tok/s, torch {torch_tps:.0f} tok/s", file=sys.stderr)
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print(f"{'model':<10} {'layout':<7} {'parc tok/s':>11} {'torch tok/s':>12} {'parc/torch':>11}")
    for r in rows:
        print(f"{r['model']:<10} {r['layout']:<7} {r['parc_tokens_per_s']:>11.0f} "
              f"{r['torch_tokens_per_s']:>12.0f} {r['ratio']:>10.2f}x")


if __name__ == "__main__":
    main()
