"""What only llama's attention runs: rotary positions and the q/k norms (``model.qk_norm``,
llama's only: PAR0227). A gpt build does not ship this module (features.py's "llama");
``attention.py`` imports it where a llama model asks (``Attention.rotate``, a q/k norm)
and gives ``rotary`` and ``rotary_at`` by name.

Takes: (B, heads, T, D) q and k, the rotary base ``theta`` and their positions. Gives:
``rotary`` (positions start .. start + T - 1), ``rotary_at`` (per-sequence positions,
documents.py's), ``rotate`` (an ``Attention``'s q and k over runs of global positions:
the compiled rotary where ``use_kernels`` routed it, else ``rotary``) and ``HeadNorm``.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..distributed.comm import copy_to_group


def _frequencies(x, theta):
    """(D/2,) fp32: the rotary frequency of each pair of x's head dimension D."""
    D = x.shape[-1]
    return 1.0 / (theta ** (torch.arange(0, D, 2, dtype=torch.float32, device=x.device) / D))


def rotary(x, theta, start=0):
    """Rotate (B, heads, T, D) by position start .. start + T - 1 (pairs of halves, as in Llama)."""
    T = x.shape[-2]
    angles = torch.outer(torch.arange(start, start + T, dtype=torch.float32, device=x.device), _frequencies(x, theta))
    cos, sin = angles.cos().repeat(1, 2), angles.sin().repeat(1, 2)  # (T, D)
    first, second = x.chunk(2, dim=-1)
    rotated = x * cos + torch.cat((-second, first), dim=-1) * sin  # fp32 (cos, sin are)
    return rotated.to(x.dtype)  # bf16/fp16 parameters: back to the compute dtype


def rotary_at(x, theta, positions):
    """``rotary`` at per-sequence positions: (B, heads, T, D) rotated by ``positions`` (B, T)
    (each token's position within its document, documents.py)."""
    angles = positions.to(torch.float32).unsqueeze(-1) * _frequencies(x, theta)  # (B, T, D/2)
    cos, sin = angles.cos().repeat(1, 1, 2).unsqueeze(1), angles.sin().repeat(1, 1, 2).unsqueeze(1)  # (B, 1, T, D)
    first, second = x.chunk(2, dim=-1)
    rotated = x * cos + torch.cat((-second, first), dim=-1) * sin
    return rotated.to(x.dtype)


def rotate(attn, q, k, spans):
    """``attn.rotate`` (an ``Attention``): rotary positions for (B, heads, T, D) q and k whose
    tokens are the runs ``spans`` of global positions, each run rotated at its own start."""
    def one_run(q, k, start):
        if attn.fused is not None:
            return attn.fused.rotary(q, k, attn.theta, start)
        return rotary(q, attn.theta, start), rotary(k, attn.theta, start)

    if len(spans) == 1:
        return one_run(q, k, spans[0][0])
    sizes = [stop - start for start, stop in spans]
    runs = [one_run(qs, ks, start) for qs, ks, (start, _) in
            zip(q.split(sizes, dim=2), k.split(sizes, dim=2), spans)]
    return torch.cat([r[0] for r in runs], dim=2), torch.cat([r[1] for r in runs], dim=2)


class HeadNorm(nn.Module):
    """``model.qk_norm``: RMSNorm over the last dim (a head's ``head_dim`` features) of q or k,
    one weight shared by every head (Qwen3's q_norm and k_norm). Replicated over tp, but each
    tp rank normalizes only its heads: the tensor transform sets ``tp_group`` and the weight
    enters the region through ``copy_to_group``, whose backward sums its gradient over tp,
    so no step after backward has to (always plain PyTorch: the compiled norms take rows
    of the hidden size)."""

    def __init__(self, head_dim, *, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(head_dim))
        self.tp_group = None  # parallelize.tensor (sharding.py)

    def forward(self, x):
        weight = self.weight if self.tp_group is None else copy_to_group(self.weight, self.tp_group)
        return F.rms_norm(x, (x.shape[-1],), weight, self.eps)
