"""The experts' fused ops: the permutation, the combine and the grouped GEMM
(``parc::permute_rows_*``, ``combine_rows_*``, ``grouped_mm_*``; cpu/moe.cpp,
``triton_moe.py``), with their autograd.

Takes: routed rows and their index. Gives: ``permute_rows``, ``combine_rows`` and
``grouped_mm``, which ``ops`` hands out (Note [ops by feature] in ops.py): a build ships
this module only with experts.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .backend import _DEVICES, _backend


# ---- mixture of experts: permutation, combine, grouped GEMM (cpu/moe.cpp, triton_moe.py) ----


@torch.library.custom_op("parc::permute_rows_fwd", mutates_args=(), device_types=_DEVICES)
def permute_rows_fwd(x: Tensor, index: Tensor) -> Tensor:
    return _backend(x).permute_rows_fwd(x, index)


@permute_rows_fwd.register_fake
def _(x, index):
    return x.new_empty(index.shape[0], x.shape[1])


@torch.library.custom_op("parc::permute_rows_bwd", mutates_args=(), device_types=_DEVICES)
def permute_rows_bwd(grad: Tensor, index: Tensor, rows: int) -> Tensor:
    return _backend(grad).permute_rows_bwd(grad, index, rows)


@permute_rows_bwd.register_fake
def _(grad, index, rows):
    return grad.new_empty(rows, grad.shape[1])


def _permute_setup(ctx, inputs, output):
    x, index = inputs
    ctx.save_for_backward(index)
    ctx.rows = x.shape[0]


def _permute_backward(ctx, grad):
    (index,) = ctx.saved_tensors
    return permute_rows_bwd(grad, index, ctx.rows), None


permute_rows_fwd.register_autograd(_permute_backward, setup_context=_permute_setup)


@torch.library.custom_op("parc::combine_rows_fwd", mutates_args=(), device_types=_DEVICES)
def combine_rows_fwd(rows: Tensor, index: Tensor, weight: Tensor, tokens: int) -> Tensor:
    return _backend(rows).combine_rows_fwd(rows, index, weight, tokens)


@combine_rows_fwd.register_fake
def _(rows, index, weight, tokens):
    return rows.new_empty(tokens, rows.shape[1])


@torch.library.custom_op("parc::combine_rows_bwd", mutates_args=(), device_types=_DEVICES)
def combine_rows_bwd(grad: Tensor, rows: Tensor, index: Tensor, weight: Tensor) -> tuple[Tensor, Tensor]:
    dy, dw = _backend(rows).combine_rows_bwd(grad, rows, index, weight)
    return dy, dw


@combine_rows_bwd.register_fake
def _(grad, rows, index, weight):
    return torch.empty_like(rows), rows.new_empty(rows.shape[0])


def _combine_setup(ctx, inputs, output):
    rows, index, weight, tokens = inputs
    ctx.save_for_backward(rows, index, weight)
    ctx.weight_dtype = weight.dtype


def _combine_backward(ctx, grad):
    rows, index, weight = ctx.saved_tensors
    dy, dw = combine_rows_bwd(grad, rows, index, weight)
    return dy, None, dw.to(ctx.weight_dtype), None


combine_rows_fwd.register_autograd(_combine_backward, setup_context=_combine_setup)


@torch.library.custom_op("parc::grouped_mm_fwd", mutates_args=(), device_types=_DEVICES)
def grouped_mm_fwd(x: Tensor, weight: Tensor, counts: Tensor) -> Tensor:
    return _backend(x).grouped_mm_fwd(x, weight, counts)


@grouped_mm_fwd.register_fake
def _(x, weight, counts):
    return x.new_empty(x.shape[0], weight.shape[1])


@torch.library.custom_op("parc::grouped_mm_bwd", mutates_args=(), device_types=_DEVICES)
def grouped_mm_bwd(grad: Tensor, x: Tensor, weight: Tensor, counts: Tensor) -> tuple[Tensor, Tensor]:
    dx, dw = _backend(x).grouped_mm_bwd(grad, x, weight, counts)
    return dx, dw


@grouped_mm_bwd.register_fake
def _(grad, x, weight, counts):
    return torch.empty_like(x), torch.empty_like(weight)


def _grouped_setup(ctx, inputs, output):
    x, weight, counts = inputs
    ctx.save_for_backward(x, weight, counts)


def _grouped_backward(ctx, grad):
    x, weight, counts = ctx.saved_tensors
    dx, dw = grouped_mm_bwd(grad, x, weight, counts)
    return dx, dw, None


grouped_mm_fwd.register_autograd(_grouped_backward, setup_context=_grouped_setup)


def permute_rows(x: Tensor, index: Tensor) -> Tensor:
    """Rows ``x[index]``: each routed slot's token, in expert order (backward: a scatter-add)."""
    return permute_rows_fwd(x, index)


def combine_rows(rows: Tensor, index: Tensor, weight: Tensor, tokens: int) -> Tensor:
    """(tokens, C): each token's routed rows times their weights, summed (in row order)."""
    return combine_rows_fwd(rows, index, weight, tokens)


def grouped_mm(x: Tensor, weight: Tensor, counts: Tensor) -> Tensor:
    """Each run of ``counts[e]`` rows of ``x`` times ``weight[e]``ᵀ, one op for all experts.
    Under autocast both go to its dtype first (as a matmul would); else ``x`` to the weight's."""
    if torch.is_autocast_enabled(x.device.type):
        dtype = torch.get_autocast_dtype(x.device.type)
        x, weight = x.to(dtype), weight.to(dtype)
    elif x.dtype != weight.dtype:
        x = x.to(weight.dtype)
    return grouped_mm_fwd(x, weight, counts)
