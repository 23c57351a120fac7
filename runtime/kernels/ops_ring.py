"""Ring attention's step as a fused op: block attention with its log-sum-exp
(``parc::block_attention_fwd``/``_bwd``; cpu/block_attention.cpp, ``triton_ops.py``).

Takes: q, k, v of one block of keys. Gives: ``block_attention`` and
``block_attention_backward`` (``reference``'s, fused), which ``ops`` hands out (Note [ops by
feature] in ops.py): a build ships this module only with context parallelism.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .backend import _DEVICES, _backend, _stats_dtype


# ---- block attention with log-sum-exp (ring attention's step) ----------------------


def _block_out(q):
    return (torch.empty(q.shape, dtype=_stats_dtype(q), device=q.device),
            torch.empty(q.shape[:-1], dtype=_stats_dtype(q), device=q.device))


@torch.library.custom_op("parc::block_attention_fwd", mutates_args=(), device_types=_DEVICES)
def block_attention_fwd(q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: float) -> tuple[Tensor, Tensor]:
    """softmax(q kᵀ · scale) v over this block of keys and the rows' lse (stats dtype)."""
    out, lse = _backend(q).block_attention_fwd(q, k, v, causal, scale)
    return out, lse


@block_attention_fwd.register_fake
def _(q, k, v, causal, scale):
    return _block_out(q)


@torch.library.custom_op("parc::block_attention_bwd", mutates_args=(), device_types=_DEVICES)
def block_attention_bwd(grad: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, causal: bool,
                        scale: float) -> tuple[Tensor, Tensor, Tensor]:
    """dq, dk, dv of this block's share, given the rows' final output and lse (over every block)."""
    dq, dk, dv = _backend(q).block_attention_bwd(grad, q, k, v, out, lse, causal, scale)
    return dq, dk, dv


@block_attention_bwd.register_fake
def _(grad, q, k, v, out, lse, causal, scale):
    dtype = _stats_dtype(q)
    return (torch.empty(q.shape, dtype=dtype, device=q.device), torch.empty(k.shape, dtype=dtype, device=k.device),
            torch.empty(v.shape, dtype=dtype, device=v.device))


def block_attention(q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: float) -> tuple[Tensor, Tensor]:
    """q (B, H, Tq, D), k and v (B, Hkv, Tk, D) → out (B, H, Tq, D) and lse (B, H, Tq), fp32
    (fp64 for fp64): ``reference.block_attention``'s results, fused (flash attention)."""
    return block_attention_fwd(q, k, v, causal, scale)


def block_attention_backward(grad, q, k, v, out, lse, causal: bool, scale: float):
    """``reference.block_attention_backward``: (dq, dk, dv) in the stats dtype."""
    return block_attention_bwd(grad, q, k, v, out, lse, causal, scale)
