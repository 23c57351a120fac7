"""Compiled kernels: fused ops with autograd, C++ on CPU and Triton on CUDA.

``select(mode, device)`` is how a model picks per build: ``"eager"`` gives None
(the model keeps its plain PyTorch code); ``"compiled"`` gives the ``ops`` module
below, or None after one notice on stderr when the kernels for that device cannot be
had (no compiler, a build error, no triton). The ops themselves (``ops.py``):

    layer_norm(x, weight, bias, eps)          rms_norm(x, weight, eps)
    add_layer_norm(x, residual, weight, bias, eps) -> (y, h)   add_rms_norm(x, residual, weight, eps) -> (y, h)
    bias_gelu(x, bias=None)                   swiglu(gate, up)
    rotary(q, k, theta, start=0) -> (q, k)    cross_entropy(logits, targets, *, vocab_size, tp_group=None)
    permute_rows(x, index)                    combine_rows(rows, index, weight, tokens)
    grouped_mm(x, weight, counts)             (mixture of experts: cpu/moe.cpp, triton_moe.py)

``reference`` holds the eager references the tests and the bench compare against (and ring
attention's eager path: a build ships it with context parallelism; ``from
parc.runtime.kernels import reference`` imports it).
"""

from __future__ import annotations

import importlib.util

import torch

from .build import load_cpu, notice

MODES = ("compiled", "eager")


def select(mode: str, device):
    """The fused ops for ``device`` if ``mode`` is "compiled" and they can be had, else None."""
    if mode not in MODES:
        raise ValueError(f"kernels must be one of {MODES}, not {mode!r}")
    if mode == "eager":
        return None
    if torch.device(device).type == "cuda":
        try:
            import triton  # noqa: F401
        except ImportError as error:
            notice(f"triton is not importable: {error}")
            return None
        if importlib.util.find_spec(f"{__name__}.triton_ops") is None:
            notice("this build was made for CPU and ships no Triton kernels; build the spec for the GPU")
            return None
    elif load_cpu() is None:
        return None
    from . import ops

    return ops


__all__ = ["MODES", "reference", "select"]
