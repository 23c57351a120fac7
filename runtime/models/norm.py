"""The norms of the model: LayerNorm (gpt) or RMSNorm (llama), and the residual add fused
into the norm after it (Note [pending residual] in transformer.py).

Takes: the hidden size, which norm, its epsilon. Gives: ``Norm``, whose ``add_norm``
adds a pending region output to the residual stream and normalizes in one kernel when
``use_kernels`` routed it to the compiled ops.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class Norm(nn.Module):
    """LayerNorm (gpt, with bias) or RMSNorm (llama); replicated over tp (under SP its
    parameters are tagged ``sequence_parallel`` by the tensor transform: they see a shard)."""

    fused = None  # the compiled ops (kernels.select), set by use_kernels; None: plain PyTorch
    fused_add = None  # the same for the residual add before the norm in one kernel (add_norm)

    def __init__(self, hidden, *, rms, eps):
        super().__init__()
        self.rms, self.eps = rms, eps
        self.weight = nn.Parameter(torch.ones(hidden))
        self.bias = None if rms else nn.Parameter(torch.zeros(hidden))

    def forward(self, x):
        if self.fused is not None:
            if self.rms:
                return self.fused.rms_norm(x, self.weight, self.eps)
            return self.fused.layer_norm(x, self.weight, self.bias, self.eps)
        if self.rms:
            return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)
        return F.layer_norm(x, (x.shape[-1],), self.weight, self.bias, self.eps)

    def add_norm(self, x, residual):
        """(norm(h), h) with h = residual + x, the new residual stream: one kernel with the
        compiled ops (Note [fused residual norm] in kernels/add_norm.py), else the add and
        the norm. Elementwise per row, so it runs as well on a sequence shard (SP)."""
        if self.fused_add is not None:
            if self.rms:
                return self.fused_add.add_rms_norm(x, residual, self.weight, self.eps)
            return self.fused_add.add_layer_norm(x, residual, self.weight, self.bias, self.eps)
        h = residual + x
        return self(h), h
