"""Initializing one rank's shard: the counter-based init next to drawing the full tensor.

For the llama-7b example's tensor-parallel rank (tp 4), each weight of one block is
initialized twice in the same run: the baseline draws the full (unsharded) tensor
with torch's generator and keeps this rank's rows or columns (what parc did before
Note [counter-based init]), the new way generates only the shard's elements
(``param_init.fill_``). Printed per weight: CPU seconds of each (best of 2, one
thread), the ratio new / baseline, and the bytes each allocates at its peak (the
full tensor vs the shard). Then the estimate for the whole 7B model on one core.

    python bench/init_shard.py
"""

from __future__ import annotations

import os
import time

import torch

from parc.runtime.models.param_init import fill_

TP, RANK, LAYERS = 4, 1, 32
WEIGHTS = {  # name: (full shape, split dim: 0 rows (column-parallel), 1 columns (row-parallel))
    "layers.0.attn.q_proj.weight": ((4096, 4096), 0),
    "layers.0.attn.k_proj.weight": ((1024, 4096), 0),
    "layers.0.attn.o_proj.weight": ((4096, 4096), 1),
    "layers.0.mlp.up_proj.weight": ((11008, 4096), 0),
    "layers.0.mlp.down_proj.weight": ((4096, 11008), 1),
}
PARAMETERS_7B = 6_738_415_616


def baseline(name, full, dim):
    generator = torch.Generator().manual_seed(1)
    whole = torch.empty(full).normal_(0.0, 0.02, generator=generator)
    return whole.chunk(TP, dim=dim)[RANK].clone()


def counter(name, full, dim):
    shape = list(full)
    shape[dim] //= TP
    offsets = [0, 0]
    offsets[dim] = RANK * shape[dim]
    return fill_(torch.empty(shape), name, full, layers=LAYERS, seed=1, offsets=offsets, shape=shape)


def best_cpu(call, *args) -> float:
    times = []
    for _ in range(2):
        start = time.process_time()
        call(*args)
        times.append(time.process_time() - start)
    return min(times)


def main() -> None:
    torch.set_num_threads(1)
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores; tp {TP}, rank {RANK}, one thread")
    print(f"{'weight':32} {'full s':>8} {'shard s':>8} {'ratio':>6} {'full MB':>8} {'shard MB':>9}")
    total_new = total_elements = 0
    for name, (full, dim) in WEIGHTS.items():
        old, new = best_cpu(baseline, name, full, dim), best_cpu(counter, name, full, dim)
        elements = full[0] * full[1]
        total_new += new
        total_elements += elements // TP
        print(f"{name:32} {old:8.2f} {new:8.2f} {new / old:6.2f} {elements * 4 / 2**20:8.1f} "
              f"{elements * 4 / TP / 2**20:9.1f}")
    per_element = total_new / total_elements
    print(f"counter-based: {per_element * 1e9:.0f} ns per element on one core; all of llama-7b "
          f"({PARAMETERS_7B / 1e9:.2f} B): {PARAMETERS_7B * per_element / 60:.1f} core-minutes, "
          f"one of the example's 8 ranks (tp 4 x pp 2): {PARAMETERS_7B / 8 * per_element / 60:.1f}")


if __name__ == "__main__":
    main()
