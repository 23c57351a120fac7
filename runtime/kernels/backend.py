"""Which compiled module runs a kernel call, shared by every ``ops*.py`` module.

Takes: a tensor. Gives: ``_backend(t)`` (the Triton functions on CUDA, or under
``PARC_TRITON_ON_CPU=1``; else the compiled C++ module, loaded once), ``_row_stats``
(an empty per-row statistics tensor) and ``_DEVICES`` (the devices the custom ops
register for). Its own
module so that the ops, the fused add + norm, the feature ops (``ops_ring``, ``ops_moe``)
and the reference all import it and none imports another's module back.
"""

from __future__ import annotations

import os

import torch
from torch import Tensor

from .build import load_cpu

_cpu_module = None
"""The compiled CPU module once loaded: every kernel call asks for it, and ``load_cpu``
resolves the cache folder (environment, home, paths) under a lock each time it runs."""


def _backend(t: Tensor):
    global _cpu_module
    if t.device.type == "cuda" or os.environ.get("PARC_TRITON_ON_CPU") == "1":
        from . import triton_ops

        return triton_ops
    if _cpu_module is None:
        _cpu_module = load_cpu()
        if _cpu_module is None:
            raise RuntimeError("internal error in parc: compiled CPU kernels used while unavailable")
    return _cpu_module


def _stats_dtype(t: Tensor):
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def _row_stats(x: Tensor) -> Tensor:
    return x.new_empty(x.shape[:-1], dtype=_stats_dtype(x))


_DEVICES = ("cpu", "cuda")
