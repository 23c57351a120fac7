"""gpt's fused ops: LayerNorm, the residual add + LayerNorm and bias + GeLU
(``parc::layer_norm_*``, ``parc::add_layer_norm_*``, ``parc::bias_gelu*``), with their autograd. ``ops`` hands them out (Note [ops by feature] in ops.py): a build
ships this module only for arch = gpt.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from .add_norm import _grad_h, _like, _promoted
from .backend import _DEVICES, _backend, _row_stats
from .dispatch import call


def _or_empty(bias, x):
    return x.new_empty(0) if bias is None else bias  # the kernels read no bias from an empty one


# ---- LayerNorm --------------------------------------------------------------------


@torch.library.custom_op("parc::layer_norm_fwd", mutates_args=(), device_types=_DEVICES)
def layer_norm_fwd(x: Tensor, weight: Tensor, bias: Tensor, eps: float) -> tuple[Tensor, Tensor, Tensor]:
    y, mean, rstd = _backend(x).layer_norm_fwd(x, weight, bias, eps)
    return y, mean, rstd


@layer_norm_fwd.register_fake
def _(x, weight, bias, eps):
    return torch.empty_like(x, memory_format=torch.contiguous_format), _row_stats(x), _row_stats(x)


@torch.library.custom_op("parc::layer_norm_bwd", mutates_args=(), device_types=_DEVICES)
def layer_norm_bwd(grad: Tensor, x: Tensor, weight: Tensor, mean: Tensor, rstd: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    dx, dw, db = _backend(x).layer_norm_bwd(grad, x, weight, mean, rstd)
    return dx, dw, db


@layer_norm_bwd.register_fake
def _(grad, x, weight, mean, rstd):
    return torch.empty_like(x, memory_format=torch.contiguous_format), x.new_empty(x.shape[-1:]), x.new_empty(x.shape[-1:])


def _layer_norm_setup(ctx, inputs, output):
    x, weight, bias, eps = inputs
    ctx.save_for_backward(x, weight, output[1], output[2])
    ctx.bias_dtype = bias.dtype


def _layer_norm_backward(ctx, grad, _grad_mean, _grad_rstd):
    x, weight, mean, rstd = ctx.saved_tensors
    dx, dw, db = call(layer_norm_bwd, grad, x, weight, mean, rstd)
    return dx, dw.to(weight.dtype), db.to(ctx.bias_dtype), None


layer_norm_fwd.register_autograd(_layer_norm_backward, setup_context=_layer_norm_setup)


def layer_norm(x: Tensor, weight: Tensor, bias: Tensor, eps: float) -> Tensor:
    """LayerNorm over the last dimension, with weight and bias."""
    return call(layer_norm_fwd, x, weight, bias, eps)[0]


# ---- bias + GeLU ------------------------------------------------------------------


@torch.library.custom_op("parc::bias_gelu", mutates_args=(), device_types=_DEVICES)
def _bias_gelu(x: Tensor, bias: Optional[Tensor]) -> Tensor:
    return _backend(x).bias_gelu_fwd(x, _or_empty(bias, x))


@_bias_gelu.register_fake
def _(x, bias):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@torch.library.custom_op("parc::bias_gelu_bwd", mutates_args=(), device_types=_DEVICES)
def bias_gelu_bwd(grad: Tensor, x: Tensor, bias: Optional[Tensor]) -> list[Tensor]:
    return list(_backend(x).bias_gelu_bwd(grad, x, _or_empty(bias, x)))


@bias_gelu_bwd.register_fake
def _(grad, x, bias):
    dx = torch.empty_like(x, memory_format=torch.contiguous_format)
    return [dx] if bias is None else [dx, x.new_empty(x.shape[-1:])]


def _bias_gelu_setup(ctx, inputs, output):
    x, bias = inputs
    ctx.save_for_backward(x, bias)


def _bias_gelu_backward(ctx, grad):
    x, bias = ctx.saved_tensors
    grads = call(bias_gelu_bwd, grad, x, bias)
    return grads[0], (None if bias is None else grads[1].to(bias.dtype))


_bias_gelu.register_autograd(_bias_gelu_backward, setup_context=_bias_gelu_setup)


def bias_gelu(x: Tensor, bias: Optional[Tensor] = None) -> Tensor:
    """GeLU (tanh approximation, as GPT-2) of ``x + bias`` (bias over the last dim, optional)."""
    return call(_bias_gelu, x, bias)


# ---- residual add + LayerNorm (Note [fused residual norm] in add_norm.py) -----------


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


def add_layer_norm(x: Tensor, residual: Tensor, weight: Tensor, bias: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """(LayerNorm(h), h) with h = x + residual, one pass; Note [fused residual norm]."""
    y, h, _, _ = call(add_layer_norm_fwd, *_promoted(x, residual), weight, bias, eps)
    return y, h
