"""The residual add fused into the norm after it: ``y, h = add_layer_norm(x, residual, weight,
bias, eps)`` and ``y, h = add_rms_norm(x, residual, weight, eps)``, h = x + residual.

Takes: the backends of ``ops.py`` (C++ ``cpu/add_norm.cpp`` on CPU, Triton
``triton_ops_add_norm.py`` on CUDA). Gives: the custom ops ``parc::add_layer_norm_fwd``/
``_bwd`` and ``parc::add_rms_norm_fwd``/``_bwd`` with their autograd, and the two public
functions, which ``ops.py`` re-exports (model.py's ``Norm.add_norm`` calls them).

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

from .dispatch import call
from .backend import _DEVICES, _backend, _row_stats


def _like(x):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _grad_h(grad_h, h):
    return h.new_empty(0) if grad_h is None else grad_h  # the kernels add nothing for an empty one


# ---- LayerNorm --------------------------------------------------------------------


@torch.library.custom_op("parc::add_layer_norm_fwd", mutates_args=(), device_types=_DEVICES)
def add_layer_norm_fwd(x: Tensor, residual: Tensor, weight: Tensor, bias: Tensor,
                       eps: float) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    y, h, mean, rstd = _backend(x).add_layer_norm_fwd(x, residual, weight, bias, eps)
    return y, h, mean, rstd


@add_layer_norm_fwd.register_fake
def _(x, residual, weight, bias, eps):
    return _like(x), _like(x), _row_stats(x), _row_stats(x)


@torch.library.custom_op("parc::add_layer_norm_bwd", mutates_args=(), device_types=_DEVICES)
def add_layer_norm_bwd(grad_y: Tensor, grad_h: Tensor, h: Tensor, weight: Tensor, mean: Tensor,
                       rstd: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    dx, dw, db = _backend(h).add_layer_norm_bwd(grad_y, grad_h, h, weight, mean, rstd)
    return dx, dw, db


@add_layer_norm_bwd.register_fake
def _(grad_y, grad_h, h, weight, mean, rstd):
    return _like(h), h.new_empty(h.shape[-1:]), h.new_empty(h.shape[-1:])


def _add_layer_norm_setup(ctx, inputs, output):
    x, residual, weight, bias, eps = inputs
    ctx.save_for_backward(output[1], weight, output[2], output[3])
    ctx.bias_dtype = bias.dtype


def _add_layer_norm_backward(ctx, grad_y, grad_h, _grad_mean, _grad_rstd):
    h, weight, mean, rstd = ctx.saved_tensors
    dx, dw, db = call(add_layer_norm_bwd, grad_y, _grad_h(grad_h, h), h, weight, mean, rstd)
    return dx, dx, dw.to(weight.dtype), db.to(ctx.bias_dtype), None


add_layer_norm_fwd.register_autograd(_add_layer_norm_backward, setup_context=_add_layer_norm_setup)


# ---- RMSNorm ----------------------------------------------------------------------


@torch.library.custom_op("parc::add_rms_norm_fwd", mutates_args=(), device_types=_DEVICES)
def add_rms_norm_fwd(x: Tensor, residual: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor, Tensor]:
    y, h, rstd = _backend(x).add_rms_norm_fwd(x, residual, weight, eps)
    return y, h, rstd


@add_rms_norm_fwd.register_fake
def _(x, residual, weight, eps):
    return _like(x), _like(x), _row_stats(x)


@torch.library.custom_op("parc::add_rms_norm_bwd", mutates_args=(), device_types=_DEVICES)
def add_rms_norm_bwd(grad_y: Tensor, grad_h: Tensor, h: Tensor, weight: Tensor, rstd: Tensor) -> tuple[Tensor, Tensor]:
    dx, dw = _backend(h).add_rms_norm_bwd(grad_y, grad_h, h, weight, rstd)
    return dx, dw


@add_rms_norm_bwd.register_fake
def _(grad_y, grad_h, h, weight, rstd):
    return _like(h), h.new_empty(h.shape[-1:])


def _add_rms_norm_setup(ctx, inputs, output):
    x, residual, weight, eps = inputs
    ctx.save_for_backward(output[1], weight, output[2])


def _add_rms_norm_backward(ctx, grad_y, grad_h, _grad_rstd):
    h, weight, rstd = ctx.saved_tensors
    dx, dw = call(add_rms_norm_bwd, grad_y, _grad_h(grad_h, h), h, weight, rstd)
    return dx, dx, dw.to(weight.dtype), None


add_rms_norm_fwd.register_autograd(_add_rms_norm_backward, setup_context=_add_rms_norm_setup)


# ---- the public functions -----------------------------------------------------------


def _promoted(x: Tensor, residual: Tensor):
    dtype = torch.promote_types(x.dtype, residual.dtype)
    return x.to(dtype), residual.to(dtype)


def add_layer_norm(x: Tensor, residual: Tensor, weight: Tensor, bias: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """(LayerNorm(h), h) with h = x + residual, one pass; Note [fused residual norm]."""
    y, h, _, _ = call(add_layer_norm_fwd, *_promoted(x, residual), weight, bias, eps)
    return y, h


def add_rms_norm(x: Tensor, residual: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """(RMSNorm(h), h) with h = x + residual, one pass; Note [fused residual norm]."""
    y, h, _ = call(add_rms_norm_fwd, *_promoted(x, residual), weight, eps)
    return y, h
