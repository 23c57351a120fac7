"""Step time of ``overlap = none`` vs ``sub_batch(2)`` in parc's generated trainer, on CPU gloo.

Two GPT shapes built from ``bench/specs/small.par`` with ``--set``: ``comm-heavy``
(wide and shallow, short sequences: the tensor-parallel all-reduces are a large share
of the step) and ``compute-heavy`` (long sequences, big MLP: they are negligible). Each
runs on 2 and 4 ranks (tp = ranks, dp = 1), with ``none`` and ``sub_batch(2)``, several
repetitions alternating the two, and the table shows the median step time, the median
exposed communication (``exposed_comm_s``: time blocked in collectives), the
communication share of the ``none`` step, and the ratio none / sub_batch(2) (> 1: the
overlap is faster). Beside them, ``codegen/planner/cost/overlap.py``'s prediction for the
blocks on an idle machine, from an all-reduce latency, bandwidth and GEMM rate
measured here first (``--calibrate`` runs on 2 ranks): the exposed share and ratio
the schedule would give if each rank had its core to itself. A benchmark, not a test: only figures from one run on one machine
compare. The issue's goal: ≥ 1.2× where communication is ≥ 30% of the step, and no
more than 3% slower where it is negligible.

    python bench/overlap.py [--steps 8] [--repeats 3] [--ranks 2 4] [--json]
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
from parc.codegen.planner.cost.overlap import Link, block_stages, exposed_comm  # noqa: E402

TORCHRUN = Path(sys.executable).with_name("torchrun")
SPEC = ROOT / "bench" / "specs" / "small.par"
MODELS = {
    # (micro_batch 8 × seq 16) tokens through 2 blocks of 1024: small GEMMs, 512 KiB all-reduces
    "comm-heavy": dict(layers=2, hidden=1024, heads=8, ffn=1024, seq_len=16, vocab=512, micro_batch=8),
    # (micro_batch 4 × seq 256) tokens through 2 blocks of 512 with an 8× MLP: big GEMMs
    "compute-heavy": dict(layers=2, hidden=512, heads=8, ffn=4096, seq_len=256, vocab=512, micro_batch=4),
}
# GPU shapes (bench/gpu_overlap.sh): the same two kinds at sizes where a GPU is busy
GPU_MODELS = {
    "comm-heavy": dict(layers=4, hidden=8192, heads=64, ffn=8192, seq_len=256, vocab=32768, micro_batch=8),
    "compute-heavy": dict(layers=4, hidden=2048, heads=16, ffn=8192, seq_len=2048, vocab=32768, micro_batch=4),
}
OVERLAPS = ("none", "sub_batch(2)")
WARMUP = 2


def run(model: str, ranks: int, overlap: str, steps: int, workdir: Path, device: str = "cpu") -> list[dict]:
    shape = dict((MODELS if device == "cpu" else GPU_MODELS)[model])
    micro_batch = shape.pop("micro_batch")
    sets = [f"model.{key}={value}" for key, value in shape.items()]
    sets += [f"train.micro_batch={micro_batch}", f"train.global_batch={micro_batch}",
             "parallel.dp=1", f"parallel.tp={ranks}", "parallel.pp=1", "parallel.sp=false",
             f"parallel.overlap={overlap}", f"mesh.devices_per_node={ranks}", f"mesh.device={device}"]
    if device != "cpu":
        sets.append("train.precision=bf16")
    name = f"{model}-tp{ranks}-{'none' if overlap == 'none' else 'sub2'}"
    out = Path(build_to(SPEC, workdir / name, sets))
    metrics = out / "metrics.jsonl"
    metrics.unlink(missing_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS="1" if device == "cpu" else "4")
    command = [str(TORCHRUN), "--standalone", f"--nproc-per-node={ranks}", str(out / "train.py"),
               "--steps", str(WARMUP + steps), "--metrics-jsonl", str(metrics)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise SystemExit(f"failed: {' '.join(command)}\n{done.stderr[-3000:]}")
    return [json.loads(line) for line in metrics.read_text().splitlines()][WARMUP:]


def calibrate() -> None:
    """(under torchrun, 2 ranks) median all-reduce of 4 KiB and 512 KiB, one rank's GEMM rate."""
    import time

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")

    def timed(fn, repeats=30):
        times = []
        for _ in range(repeats):
            dist.barrier()
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return statistics.median(times)

    small, big = torch.zeros(1024), torch.zeros(128 * 1024)
    t_small, t_big = timed(lambda: dist.all_reduce(small)), timed(lambda: dist.all_reduce(big))
    a, w = torch.randn(128, 1024), torch.randn(512, 1024)
    flops = 2 * 128 * 1024 * 512 / timed(lambda: a @ w.t())
    if dist.get_rank() == 0:  # on 2 ranks an all-reduce takes 2α + B/β
        bandwidth = (big.numel() - small.numel()) * 4 / max(t_big - t_small, 1e-9)
        print(json.dumps(dict(latency_s=t_small / 2, bandwidth=bandwidth, flops_per_s=flops)))
    dist.destroy_process_group()


def predict(model: str, ranks: int, machine: dict) -> tuple[float, float]:
    """(exposed share of the none step, none / sub_batch(2)) for the blocks, per the cost model."""
    shape = dict(MODELS[model])
    stages = block_stages(micro_batch=shape["micro_batch"], seq_len=shape["seq_len"], hidden=shape["hidden"],
                          ffn=shape["ffn"], heads=shape["heads"], kv_heads=shape["heads"], arch="gpt", tp=ranks,
                          sequence_parallel=False, flops_per_s=machine["flops_per_s"]) * shape["layers"]
    link = Link(latency=machine["latency_s"], bandwidth=machine["bandwidth"])
    compute = 3 * sum(stage.compute_s for stage in stages)  # forward + backward (2×)
    none, sub2 = (compute + exposed_comm(stages, sub_batches=k, ranks=ranks, link=link).total_s for k in (1, 2))
    return (none - compute) / none, none / sub2


def main() -> None:
    if sys.argv[1:] == ["--calibrate"]:
        return calibrate()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=8, help="timed steps per run (after 2 warm-up)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each configuration")
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--device", default="cpu", help="mesh.device preset; not cpu: nccl, GPU shapes, bf16")
    parser.add_argument("--json", action="store_true", help="print the rows as a JSON list")
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    done = subprocess.run([str(TORCHRUN), "--standalone", "--nproc-per-node=2", __file__, "--calibrate"],
                          env=env, capture_output=True, text=True, timeout=300)
    machine = json.loads([line for line in done.stdout.splitlines() if line.startswith("{")][-1])
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for ranks in args.ranks:
            for model in args.models:
                records = {overlap: [] for overlap in OVERLAPS}
                for repeat in range(args.repeats):
                    for overlap in OVERLAPS:  # alternate, so drift hits both alike
                        records[overlap] += run(model, ranks, overlap, args.steps, Path(tmp), args.device)
                        print(f"  ... tp{ranks} {model} {overlap} run {repeat + 1}", file=sys.stderr)
                row = dict(model=model, ranks=ranks)
                for overlap in OVERLAPS:
                    key = "none" if overlap == "none" else "sub2"
                    row[f"{key}_step_s"] = statistics.median(r["step_time_s"] for r in records[overlap])
                    row[f"{key}_exposed_s"] = statistics.median(r["exposed_comm_s"] for r in records[overlap])
                row["comm_share"] = row["none_exposed_s"] / row["none_step_s"]
                row["speedup"] = row["none_step_s"] / row["sub2_step_s"]
                if args.device == "cpu":
                    row["predicted_comm_share"], row["predicted_speedup"] = predict(model, ranks, machine)
                rows.append(row)
    load = f"load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after, on {os.cpu_count()} cores"
    if args.json:
        print(json.dumps(dict(rows=rows, load=load, machine=machine), indent=2))
        return
    print(load)
    print(f"measured: all-reduce α {1e3 * machine['latency_s']:.3f} ms per ring step, "
          f"β {machine['bandwidth'] / 1e9:.1f} GB/s, GEMM {machine['flops_per_s'] / 1e9:.0f} GFLOP/s per rank")
    print(f"{'model':<14} {'ranks':>5} {'none step':>10} {'none comm':>10} {'comm share':>10} "
          f"{'sub2 step':>10} {'sub2 comm':>10} {'none/sub2':>10} {'pred share':>10} {'pred ratio':>10}")
    for r in rows:
        print(f"{r['model']:<14} {r['ranks']:>5} {1e3 * r['none_step_s']:>8.1f}ms {1e3 * r['none_exposed_s']:>8.1f}ms "
              f"{100 * r['comm_share']:>9.0f}% {1e3 * r['sub2_step_s']:>8.1f}ms {1e3 * r['sub2_exposed_s']:>8.1f}ms "
              f"{r['speedup']:>9.2f}x {100 * r.get('predicted_comm_share', float('nan')):>9.0f}% "
              f"{r.get('predicted_speedup', float('nan')):>9.2f}x")


if __name__ == "__main__":
    main()
