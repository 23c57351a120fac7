"""The residual add fused into the norm after it: ``y, h = add_layer_norm(x, residual, weight,
bias, eps)`` and ``y, h = add_rms_norm(x, residual, weight, eps)``, h = x + residual.

Takes: the backends of ``ops.py`` (C++ ``cpu/add_norm.cpp`` on CPU, Triton
``triton_add_norm.py`` on CUDA). Gives: the helpers of the custom ops
``parc::add_layer_norm_fwd``/``_bwd`` (``ops_gpt.py``) and ``parc::add_rms_norm_fwd``/``_bwd``
(``ops_llama.py``), each beside its architecture's other ops (Note [ops by feature] in
ops.py), with their autograd and the two public functions, which ``ops`` hands out
(model.py's ``Norm.add_norm`` calls them).

Note [fused residual norm]: a pre-norm block computes ``h = h + f(norm(h))`` and then
normalizes that h again (the block's second norm, the next block's first, the final
norm). Eager CPU LayerNorm is already one fused kernel; fusing the add in front of it
saves writing h and reading it back. Forward gives y and h (h is the residual stream
the next add reads); backward takes the gradients of both and returns one tensor,
dnorm(dy) + dh, as the gradient of x and of residual (an add's gradient is the same
for both inputs). A gradient of h that is None (h unused) adds nothing. x and
residual of different dtypes are first cast to their promoted dtype, as ``+`` would.
"""

from __future__ import annotations

import torch
from torch import Tensor


def _like(x):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _grad_h(grad_h, h):
    return h.new_empty(0) if grad_h is None else grad_h  # the kernels add nothing for an empty one


def _promoted(x: Tensor, residual: Tensor):
    dtype = torch.promote_types(x.dtype, residual.dtype)
    return x.to(dtype), residual.to(dtype)
