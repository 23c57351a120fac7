"""The GPU acceptance run (bench/gpu_acceptance.sh): parc's bf16 trainer of a ~1B Llama on
one GPU against the planner's prediction and against plain PyTorch (SDPA + torch.compile).

Steps, each timed and reported in one table with a one-line verdict per figure:

1. the Triton kernel tests on the GPU (``PARC_TRITON_TESTS_ON_GPU=1 pytest
   tests/kernels/test_triton.py``);
2. ``parc profile --ranks 1 --quick`` (the machine's file; today it measures the host CPU
   only, so the GPU prediction below reads the ``device = h200`` preset, not the profile);
3. ``parc build`` of a Llama of 16 layers × 2048 hidden (32 heads, 8 kv heads, ffn 8192,
   vocab 32000, seq 2048, bf16, micro-batch 8), then its ``train.py`` on the GPU for a few
   steps: median tokens/s after warm-up, MFU (6N + 12·L·H·Q·T per token over the device's
   bf16 peak), peak allocated memory;
4. the planner's prediction of the same layout (``estimate``, ``device = h200`` preset):
   tokens/s, MFU, peak memory;
5. ``bench/torch_baseline.py --arch llama --device cuda --dtype bf16 --compile``: the same
   model and batch written with PyTorch's own modules.

``--dry-run`` runs every step on the CPU at a tiny size (2 layers × 64 hidden, seq 64,
kernels eager, no ``torch.compile``, the Triton tests skipped) so CI keeps the script
working; its figures mean nothing. Everything is local: no network, no downloads.

    python bench/gpu_acceptance.py [--dry-run] [--work DIR] [--json]
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

GPU = dict(layers=16, hidden=2048, heads=32, kv_heads=8, ffn=8192, vocab=32000, seq_len=2048, micro_batch=8,
           steps=8, warmup=3, device="h200", kernels="compiled")
TINY = dict(layers=2, hidden=64, heads=4, kv_heads=2, ffn=128, vocab=256, seq_len=64, micro_batch=2,
            steps=3, warmup=1, device="cpu", kernels="eager")

SPEC = """\
model acceptance_llama {{
  arch = llama
  layers = {layers}
  hidden = {hidden}
  heads = {heads}
  kv_heads = {kv_heads}
  ffn = {ffn}
  vocab = {vocab}
  seq_len = {seq_len}
}}
mesh {{
  nodes = 1
  devices_per_node = 1
  device = {device}
}}
parallel {{
  dp = 1
  tp = 1
  pp = 1
}}
train {{
  global_batch = {micro_batch}
  micro_batch = {micro_batch}
  steps = {total}
  precision = bf16
  kernels = {kernels}
  seed = 1
  data = synthetic
}}
"""


def run(command: list[str], *, env: dict | None = None, timeout: float = 600) -> tuple[int, str, float]:
    """(exit status, stdout + stderr, seconds) of ``command`` run from the repository root."""
    start = time.perf_counter()
    try:
        done = subprocess.run(command, cwd=ROOT, env=dict(os.environ, **(env or {})), capture_output=True,
                              text=True, timeout=timeout)
        return done.returncode, done.stdout + done.stderr, time.perf_counter() - start
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or b"").decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        return 124, out + f"\ntimed out after {timeout:.0f} s", time.perf_counter() - start


def triton_tests(dry: bool) -> dict:
    if dry:
        return {"status": "skipped", "verdict": "skipped: --dry-run (CPU; the Triton tests need a CUDA GPU)"}
    code, out, seconds = run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--noconftest",
                              "tests/kernels/test_triton.py"], env={"PARC_TRITON_TESTS_ON_GPU": "1"})
    last = out.strip().splitlines()[-1] if out.strip() else ""
    return {"status": "passed" if code == 0 else "failed", "seconds": seconds, "summary": last,
            "verdict": f"{'ok' if code == 0 else 'FAIL'}: {last}"}


def metrics_of(path: Path, warmup: int) -> dict:
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    timed = [r for r in records if r["step"] > warmup] or records[-1:]
    return {"step_time_s": statistics.median(r["step_time_s"] for r in timed),
            "peak_mem_bytes": max(r["peak_mem_bytes"] for r in records), "steps": len(records)}


def predicted(spec_path: Path, profile: Path | None):
    """The planner's estimate of the spec's layout (a CPU spec reads ``profile``)."""
    from parc.codegen.planner.cost import estimate, hardware_for
    from parc.codegen.planner.search import fixed_layout
    from parc.dsl import load

    sets = [f'mesh.profile="{profile}"'] if profile is not None else []
    spec = load(str(spec_path), sets)
    hw = hardware_for(spec)
    return spec, hw, estimate(spec, fixed_layout(spec), hw)


DRY = False
"""--dry-run: the verdicts say the figures are not judged (tiny shapes on a shared CPU)."""


def ratio_verdict(name: str, measured: float, want: float, band: float) -> str:
    error = measured / want - 1
    mark = "not judged (dry run)" if DRY else "ok" if abs(error) <= band else "OFF"
    return f"{mark}: {name} measured {100 * error:+.0f}% from the prediction (band ±{100 * band:.0f}%)"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="tiny shapes on the CPU (CI)")
    parser.add_argument("--work", type=Path, default=None, help="folder for the build and logs (default: a temp dir)")
    parser.add_argument("--json", action="store_true", help="print the results as one JSON object too")
    args = parser.parse_args()
    global DRY
    dry = DRY = args.dry_run
    shape = TINY if dry else GPU
    work = args.work or Path(tempfile.mkdtemp(prefix="parc-gpu-acceptance-"))
    work.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    results: dict = {"mode": "dry-run (CPU, tiny)" if dry else "gpu", "shape": shape}
    failed = []

    if not dry:
        import torch

        if not torch.cuda.is_available():
            print("gpu_acceptance: no CUDA GPU; run with --dry-run on a CPU")
            return 2
        results["gpu"] = torch.cuda.get_device_name(0)
    try:  # the compiler (parc build, the planner) needs lark, jinja2, jsonschema and black
        import parc.codegen.build  # noqa: F401
        import parc.dsl  # noqa: F401
    except ImportError as exc:
        print(f"gpu_acceptance: this python cannot run the compiler ({exc}); install the project's "
              "dependencies (pip install -e . from a local wheelhouse: the GPU machine has no network)")
        return 2
    results["triton"] = triton_tests(dry)
    if results["triton"]["status"] == "failed":
        failed.append("triton tests")

    # 2. the profile (the CPU spec's prediction reads it; the GPU one uses the preset)
    profile = work / "profile.json"
    code, out, seconds = run([sys.executable, "-m", "parc.codegen.cli", "profile", "--ranks", "1", "--quick",
                              "-o", str(profile)], env={"OMP_NUM_THREADS": "1"} if dry else None)
    results["profile"] = {"status": "ok" if code == 0 else "failed", "seconds": seconds}
    if code:
        print(out[-3000:])
        failed.append("parc profile")

    # 3. build and train
    total = shape["warmup"] + shape["steps"]
    spec_path = work / "acceptance.par"
    spec_path.write_text(SPEC.format(total=total, **shape))
    build = work / "build"
    code, out, seconds = run([sys.executable, "-m", "parc.codegen.cli", "build", str(spec_path), "-o", str(build),
                              "--force"])
    if code:
        print(out[-3000:])
        return report(results, failed + ["parc build"], started, args.json)
    metrics = work / "metrics.jsonl"
    metrics.unlink(missing_ok=True)
    env = {"OMP_NUM_THREADS": "2"} if dry else {}
    code, out, seconds = run([sys.executable, str(build / "train.py"), "--steps", str(total), "--metrics-jsonl",
                              str(metrics)], env=env, timeout=420)
    if code or not metrics.exists():
        print(out[-3000:])
        return report(results, failed + ["parc trainer"], started, args.json)
    measured = metrics_of(metrics, shape["warmup"])

    # 4. the planner's prediction (flops per token: the model description's, as the trainer's MFU)
    spec, hw, estimate = predicted(spec_path, profile if dry and profile.exists() else None)
    from parc.codegen.planner.cost.time import model_flops_per_token

    flops_per_token = model_flops_per_token(spec)
    tokens_per_step = shape["micro_batch"] * shape["seq_len"]
    parc_tps = tokens_per_step / measured["step_time_s"]
    results["parc"] = {"tokens_per_s": parc_tps, "mfu": parc_tps * flops_per_token / hw.peak_flops,
                       "peak_mem_bytes": measured["peak_mem_bytes"], "train_seconds": seconds}
    results["predicted"] = {"tokens_per_s": estimate.tokens_per_s, "mfu": estimate.mfu,
                            "peak_mem_bytes": estimate.memory.total, "fits": estimate.fits}

    # 5. plain PyTorch: SDPA, bf16 autocast, torch.compile (not in the dry run: minutes of C++ on a CPU)
    baseline = [sys.executable, "bench/torch_baseline.py", "--arch", "llama", "--dtype", "bf16",
                "--device", "cpu" if dry else "cuda", "--steps", str(shape["steps"]), "--warmup", str(shape["warmup"])]
    for key in ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "seq_len", "micro_batch"):
        baseline += [f"--{key.replace('_', '-')}", str(shape[key])]
    if not dry:
        baseline.append("--compile")
    code, out, seconds = run(baseline, env=env, timeout=420)
    line = next((x for x in reversed(out.splitlines()) if x.startswith("{")), None)
    if code or line is None:
        print(out[-3000:])
        failed.append("torch baseline")
    else:
        base = json.loads(line)
        base["mfu"] = base["tokens_per_s"] * flops_per_token / hw.peak_flops
        results["baseline"] = base
    return report(results, failed, started, args.json)


def report(results: dict, failed: list[str], started: float, as_json: bool) -> int:
    gib = 2**30
    results["seconds"] = time.perf_counter() - started
    results["failed"] = failed
    print(f"\nGPU acceptance — {results['mode']}" + (f" on {results['gpu']}" if "gpu" in results else ""))
    print(f"{'figure':<22} {'parc':>14} {'predicted':>14} {'pytorch':>14}  verdict")
    print(f"{'triton kernel tests':<22} {results['triton']['status']:>14} {'':>14} {'':>14}  "
          f"{results['triton']['verdict']}")
    parc, pred, base = results.get("parc"), results.get("predicted"), results.get("baseline")
    if parc and pred:
        vs = (f"; {parc['tokens_per_s'] / base['tokens_per_s']:.2f}× plain PyTorch" if base else "")
        print(f"{'tokens/s':<22} {parc['tokens_per_s']:>14,.0f} {pred['tokens_per_s']:>14,.0f} "
              f"{base['tokens_per_s'] if base else float('nan'):>14,.0f}  "
              f"{ratio_verdict('tokens/s', parc['tokens_per_s'], pred['tokens_per_s'], 0.25)}{vs}")
        print(f"{'MFU':<22} {100 * parc['mfu']:>13.1f}% {100 * pred['mfu']:>13.1f}% "
              f"{100 * base['mfu'] if base else float('nan'):>13.1f}%  "
              f"{'not judged (dry run)' if DRY else 'ok' if not base or parc['mfu'] >= base['mfu'] else 'BEHIND'}: parc "
              f"{'at or above' if not base or parc['mfu'] >= base['mfu'] else 'below'} plain PyTorch")
        print(f"{'peak memory (GiB)':<22} {parc['peak_mem_bytes'] / gib:>14.2f} {pred['peak_mem_bytes'] / gib:>14.2f} "
              f"{base['peak_mem_bytes'] / gib if base else float('nan'):>14.2f}  "
              f"{ratio_verdict('peak memory', parc['peak_mem_bytes'], pred['peak_mem_bytes'], 0.15)}"
              + (" (CPU: resident set, not the planner's bytes)" if results["mode"].startswith("dry") else ""))
    print(f"total {results['seconds']:.0f} s" + (f"; FAILED: {', '.join(failed)}" if failed else "; every step ran"))
    if as_json:
        print(json.dumps(results, indent=1, default=str))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
