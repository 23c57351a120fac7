"""The dense MLP: SwiGLU (llama) or GeLU with the tanh approximation (gpt).

Takes: a ``ModelConfig`` (and a width for the shared experts of moe.py). Gives: ``MLP``
with plain ``nn.Linear`` projections; the tensor transform swaps them.
"""

from __future__ import annotations

import torch.nn as nn
import torch.nn.functional as F

from ..parallel.tensor.layers import project


class MLP(nn.Module):
    fused = None  # see Norm

    def __init__(self, config, ffn=None):
        super().__init__()
        self.llama = config.arch == "llama"
        bias, ffn = not self.llama, ffn or config.ffn  # ffn: the shared experts' (moe.py)
        self.width = ffn  # global (unsharded): use_kernels decides by it
        if self.llama:
            self.gate_proj = nn.Linear(config.hidden, ffn, bias=bias)
        self.up_proj = nn.Linear(config.hidden, ffn, bias=bias)
        self.down_proj = nn.Linear(ffn, config.hidden, bias=bias)

    def activation(self, up, gate=None):
        """SwiGLU silu(gate) · up (llama) or GeLU(up) (gpt, tanh approximation; up_proj added the bias)."""
        if self.fused is not None:
            return self.fused.swiglu(gate, up) if self.llama else self.fused.bias_gelu(up)
        if self.llama:
            return F.silu(gate) * up
        return F.gelu(up, approximate="tanh")

    @property
    def columns(self):
        """The projections that open the region, in the order ``inner`` takes their outputs."""
        return (self.gate_proj, self.up_proj) if self.llama else (self.up_proj,)

    def inner(self, *projected):
        """Between the column projections and down_proj: SwiGLU(gate, up) or GeLU(up)."""
        if self.llama:
            gate, up = projected
            return self.activation(up, gate)
        return self.activation(*projected)

    def forward(self, x):
        return self.down_proj(self.inner(*project(x, self.columns)))
