"""The planner's optimizer time against the runtime's optimizer step, one thread.

For a pipeline stage of a llama (embedding + 2 blocks, hidden H, ffn 4H) at a few sizes,
times ``optimizer.step()`` of ``optim.build_optimizer`` (fp32), of ``MasterAdamW`` (bf16
parameters, fp32 masters), and ``zero.flat_adamw_`` on a ZeRO-1 dp-2 shard of the same
parameters; then the gradient-norm passes (``optim.clip_grad_norm_``, ZeRO's
``zero.global_squares``). Prints each median beside ``cost/optimizer.py``'s figure
(Note [the fused AdamW's cost]) on the CPU's default hardware (``device = cpu``, no
profile) and on a ``parc profile`` file's figures (``--profile``, fitted as ``parc plan``
fits them). The planner is given the counts the runtime has (tensors, runs, remainders),
so only its per-byte and per-op prices are checked. A benchmark, not a test.

    python bench/optimizer_cost.py [--profile PROFILE.json] [--rounds 100]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn as nn

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from parc.codegen.planner.cost import hardware_for  # noqa: E402
from parc.codegen.planner.cost.optimizer import (  # noqa: E402
    ALIGN, NORM_BYTES, NORM_OPS, ZERO_NORM_BYTES, ZERO_NORM_OPS, update_time,
)
from parc.dsl import load  # noqa: E402
from parc.runtime.optimizers.master import MasterAdamW  # noqa: E402
from parc.runtime.optimizers.optim import build_optimizer, clip_grad_norm_  # noqa: E402
from parc.runtime.parallel.data.zero import decay_runs, flat_adamw_, global_squares  # noqa: E402

HYPER = dict(lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)


def stage(hidden: int, vocab: int) -> nn.Module:
    """The parameters of a llama stage: embedding, then 2 blocks (norm, q k v o, norm, w1 w3 w2)."""
    shapes = [(vocab, hidden)]
    for _ in range(2):
        shapes += [(hidden,)] + [(hidden, hidden)] * 4 + [(hidden,), (4 * hidden, hidden), (4 * hidden, hidden),
                                                           (hidden, 4 * hidden)]
    module = nn.Module()
    module.params = nn.ParameterList(nn.Parameter(torch.randn(*s) * 0.02) for s in shapes)
    for p in module.parameters():
        p.grad = torch.randn_like(p) * 1e-3
    return module


def median(fn, rounds: int) -> float:
    for _ in range(5):
        fn()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def hardware(profile: str | None):
    sets = ['mesh.devices_per_node=1', 'mesh.nodes=1', 'parallel.dp=1', 'parallel.tp=1', 'parallel.pp=1']
    if profile:
        sets.append(f'mesh.profile="{profile}"')
    return hardware_for(load(str(ROOT / "examples/tiny.par"), sets))


def cases(hidden: int, vocab: int, rounds: int):
    """(name, elements, measured s, update counts, norm counts) of each path at this size."""
    model = stage(hidden, vocab)
    params = list(model.parameters())
    n, tensors = sum(p.numel() for p in params), len(params)
    tails = sum(1 for p in params if p.numel() % ALIGN)
    optimizer = build_optimizer(model, **HYPER)
    yield ("AdamW, fp32", n, median(optimizer.step, rounds),
           dict(tensors=tensors, tails=tails, calls=2, master=False, zero=False))
    master = MasterAdamW(stage(hidden, vocab), dtype=torch.bfloat16, **HYPER)
    for m in master.masters:
        m.grad = torch.randn_like(m) * 1e-3
    yield ("MasterAdamW, bf16", n, median(master.step, rounds),
           dict(tensors=tensors, tails=tails, calls=2, master=True, zero=False))
    flat = torch.cat([p.detach().reshape(-1) for p in params])
    decay = torch.cat([torch.full((p.numel(),), p.dim() >= 2) for p in params])
    half = (n + 1) // 2  # ZeRO-1 over dp 2: rank 0's slice
    piece, grad, mask = flat[:half].clone(), torch.randn(half) * 1e-3, decay[:half]
    runs = decay_runs(mask)
    state = {"step": 0, "exp_avg": torch.zeros(half), "exp_avg_sq": torch.zeros(half)}
    seconds = median(lambda: flat_adamw_(piece, grad, state, runs=runs, **HYPER), rounds)
    yield ("ZeRO-1 shard, flat_adamw_", half, seconds,
           dict(tensors=len(runs), tails=sum(1 for a, b, _ in runs if (b - a) % ALIGN), calls=2, master=False,
                zero=True))
    norm = median(lambda: clip_grad_norm_(model, 0.0, tp_group=None), rounds)
    yield ("norm, clip_grad_norm_", n, norm, (NORM_BYTES, NORM_OPS * tensors))
    counted, tp_mask = torch.ones(half, dtype=torch.bool), mask.clone()
    norm = median(lambda: global_squares(grad, counted=counted, tp_mask=tp_mask, tp_group=None, dp_group=None),
                  rounds)
    yield ("norm, ZeRO global_squares", half, norm, (ZERO_NORM_BYTES, ZERO_NORM_OPS))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", help="a parc profile file of this machine")
    parser.add_argument("--rounds", type=int, default=100)
    args = parser.parse_args()
    torch.set_num_threads(1)
    machines = {"cpu": hardware(None)}
    if args.profile:
        machines["profile"] = hardware(args.profile)
    for name, hw in machines.items():
        print(f"{name}: {hw.memory_bandwidth / 1e9:.1f} GB/s, {1e6 * hw.op_overhead:.2f} µs an op")
    print(f"{'hidden':>6} {'path':<27} {'elements':>9} {'measured':>9} " + " ".join(f"{k:>14}" for k in machines))
    for hidden, vocab in ((128, 512), (256, 512), (512, 1024), (100, 500)):
        for name, elements, seconds, counts in cases(hidden, vocab, args.rounds):
            row = []
            for hw in machines.values():
                if isinstance(counts, dict):
                    predicted = update_time(hw, elements=elements, **counts)
                else:
                    predicted = elements * counts[0] / hw.memory_bandwidth + counts[1] * hw.op_overhead
                row.append(f"{1e3 * predicted:6.3f} {100 * (predicted / seconds - 1):+5.0f}%")
            print(f"{hidden:>6} {name:<27} {elements:>9} {1e3 * seconds:6.3f} ms " + " ".join(f"{r:>14}" for r in row),
                  flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
