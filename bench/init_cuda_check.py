"""Counter-based init on CUDA next to the CPU (Note [counter-based init]): how many
float32 values differ (bit for bit), and the generation speed on each device.

    python bench/init_cuda_check.py
"""

from __future__ import annotations

import os
import time

import torch

from parc.runtime.models.param_init import fill_

NAME, SHAPE = "layers.0.mlp.up_proj.weight", (11008, 4096)


def generate(device) -> tuple[torch.Tensor, float]:
    out = torch.empty(SHAPE, device=device)
    fill_(out, NAME, SHAPE, layers=32, seed=1)  # warm-up
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    fill_(out, NAME, SHAPE, layers=32, seed=1)
    if device == "cuda":
        torch.cuda.synchronize()
    return out.cpu(), time.perf_counter() - start


def main() -> None:
    print(f"load average {os.getloadavg()[0]:.2f}; torch {torch.__version__}, {torch.get_num_threads()} CPU threads")
    cpu, cpu_s = generate("cpu")
    gpu, gpu_s = generate("cuda")
    n = cpu.numel()
    differ = (cpu != gpu).sum().item()
    print(f"{n:,} elements: cpu {cpu_s:.2f} s ({cpu_s / n * 1e9:.1f} ns/elem), cuda {gpu_s:.4f} s "
          f"({gpu_s / n * 1e9:.2f} ns/elem), ratio cpu/cuda {cpu_s / gpu_s:.0f}")
    print(f"values differing cpu vs cuda: {differ} ({differ / n:.2e}); max |diff| {(cpu - gpu).abs().max().item():.3e}")
    print(f"llama-7b (6.74 B) on one GPU at this rate: {6.74e9 * gpu_s / n:.1f} s")


if __name__ == "__main__":
    main()
