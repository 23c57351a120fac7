"""The fused ops as torch custom ops (``parc::...``) with registered autograd.

Takes: the compiled CPU module (``build.py``) and the Triton kernels
(``triton_ops.py``). Gives: forward and backward ops registered with
``torch.library.custom_op`` (each with a fake implementation, so they trace), their
autograd formulas (the backward is a kernel too, never autograd through the
reference), and the public functions ``layer_norm``, ``rms_norm``, ``bias_gelu``,
``swiglu``, ``rotary`` and ``cross_entropy``; ``block_attention`` (with its backward,
called by ring attention's own autograd Function, ``ring.py``) and the experts'
``permute_rows``, ``combine_rows`` and ``grouped_mm`` are this module's too but live in
``ops_ring.py`` and ``ops_moe.py`` (Note [ops by feature]).

Each call enters its op through ``dispatch.call`` (Note [custom-op dispatch]).

Dispatch: CPU tensors run the C++ kernels, CUDA tensors the Triton ones. Setting
``PARC_TRITON_ON_CPU=1`` (with ``TRITON_INTERPRET=1``) sends CPU tensors to Triton's
interpreter: the Triton tests use it, nothing else should.

Note [vocab-sharded cross-entropy]: each rank holds columns [start, start + V/tp)
of the padded vocab. The stats kernel gives per row the local max m, the local
Σ exp(x − m) s and the target's logit (0 off its owner); three all-reduces over tp
give M = max m, S = Σ s·exp(m − M) and the target logit, so loss = M + log S −
target and lse = M + log S is all backward keeps besides the logits. The grad
kernel forms (exp(x − lse) − onehot)·grad per column: the probabilities exist only
inside that one pass.
"""

from __future__ import annotations

import importlib
from typing import Optional

import torch
from torch import Tensor

from ..distributed.comm import _all_reduce, group_rank
from .backend import _DEVICES, _backend, _row_stats, _stats_dtype  # noqa: F401
from .dispatch import call
from .backend import rotary_tables
from .add_norm import add_layer_norm, add_rms_norm  # noqa: F401  (re-exported: model.py's Norm.add_norm)

import torch.distributed as dist


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


# ---- RMSNorm ----------------------------------------------------------------------


@torch.library.custom_op("parc::rms_norm_fwd", mutates_args=(), device_types=_DEVICES)
def rms_norm_fwd(x: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    y, rstd = _backend(x).rms_norm_fwd(x, weight, eps)
    return y, rstd


@rms_norm_fwd.register_fake
def _(x, weight, eps):
    return torch.empty_like(x, memory_format=torch.contiguous_format), _row_stats(x)


@torch.library.custom_op("parc::rms_norm_bwd", mutates_args=(), device_types=_DEVICES)
def rms_norm_bwd(grad: Tensor, x: Tensor, weight: Tensor, rstd: Tensor) -> tuple[Tensor, Tensor]:
    dx, dw = _backend(x).rms_norm_bwd(grad, x, weight, rstd)
    return dx, dw


@rms_norm_bwd.register_fake
def _(grad, x, weight, rstd):
    return torch.empty_like(x, memory_format=torch.contiguous_format), x.new_empty(x.shape[-1:])


def _rms_norm_setup(ctx, inputs, output):
    x, weight, eps = inputs
    ctx.save_for_backward(x, weight, output[1])


def _rms_norm_backward(ctx, grad, _grad_rstd):
    x, weight, rstd = ctx.saved_tensors
    dx, dw = call(rms_norm_bwd, grad, x, weight, rstd)
    return dx, dw.to(weight.dtype), None


rms_norm_fwd.register_autograd(_rms_norm_backward, setup_context=_rms_norm_setup)


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """RMSNorm over the last dimension: x · rsqrt(mean(x²) + eps) · weight."""
    return call(rms_norm_fwd, x, weight, eps)[0]


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


# ---- SwiGLU -----------------------------------------------------------------------


@torch.library.custom_op("parc::swiglu", mutates_args=(), device_types=_DEVICES)
def _swiglu(gate: Tensor, up: Tensor) -> Tensor:
    return _backend(gate).swiglu_fwd(gate, up)


@_swiglu.register_fake
def _(gate, up):
    return torch.empty_like(gate, memory_format=torch.contiguous_format)


@torch.library.custom_op("parc::swiglu_bwd", mutates_args=(), device_types=_DEVICES)
def swiglu_bwd(grad: Tensor, gate: Tensor, up: Tensor) -> tuple[Tensor, Tensor]:
    dgate, dup = _backend(gate).swiglu_bwd(grad, gate, up)
    return dgate, dup


@swiglu_bwd.register_fake
def _(grad, gate, up):
    return (torch.empty_like(gate, memory_format=torch.contiguous_format),
            torch.empty_like(gate, memory_format=torch.contiguous_format))


def _swiglu_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _swiglu_backward(ctx, grad):
    gate, up = ctx.saved_tensors
    dgate, dup = call(swiglu_bwd, grad, gate, up)
    return dgate, dup.to(up.dtype)


_swiglu.register_autograd(_swiglu_backward, setup_context=_swiglu_setup)


def swiglu(gate: Tensor, up: Tensor) -> Tensor:
    """silu(gate) · up, one pass."""
    return call(_swiglu, gate, up)


# ---- rotary -----------------------------------------------------------------------


def _rotary_out(x: Tensor) -> Tensor:
    # Same layout as x (q and k arrive as transposed views), dtype as x · fp32 in model.py.
    return torch.empty_like(x, dtype=torch.promote_types(x.dtype, torch.float32))


@torch.library.custom_op("parc::rotary", mutates_args=(), device_types=_DEVICES)
def _rotary(x: Tensor, cos: Tensor, sin: Tensor, sign: float) -> Tensor:
    """x rotated by the (T, D/2) tables (sign 1), or by their inverse (sign -1)."""
    out = _rotary_out(x)
    _backend(x).rotary_apply(x, cos, sin, out, sign)
    return out


@_rotary.register_fake
def _(x, cos, sin, sign):
    return _rotary_out(x)


def _rotary_setup(ctx, inputs, output):
    x, cos, sin, sign = inputs
    ctx.save_for_backward(cos, sin)
    ctx.sign, ctx.input_dtype = sign, x.dtype


def _rotary_backward(ctx, grad):
    cos, sin = ctx.saved_tensors
    dx = call(_rotary, grad, cos, sin, -ctx.sign)  # a rotation's inverse is its transpose
    return dx.to(ctx.input_dtype), None, None, None


_rotary.register_autograd(_rotary_backward, setup_context=_rotary_setup)


def rotary(q: Tensor, k: Tensor, theta: float, start: int = 0) -> tuple[Tensor, Tensor]:
    """Rotary positions start..start+T-1 on q and k, each (B, heads, T, D) (model.py's rotary())."""
    cos, sin = rotary_tables(q.shape[-2], q.shape[-1], theta, q.device, start)
    # computed in fp32, rounded to the inputs' dtype (bf16/fp16 compute weights, as model.py's)
    return call(_rotary, q, cos, sin, 1.0).to(q.dtype), call(_rotary, k, cos, sin, 1.0).to(k.dtype)


# ---- cross-entropy ----------------------------------------------------------------


@torch.library.custom_op("parc::cross_entropy_stats", mutates_args=(), device_types=_DEVICES)
def cross_entropy_stats(logits: Tensor, targets: Tensor, start: int, vocab_size: int) -> tuple[Tensor, Tensor, Tensor]:
    """Per row of this vocab slice: (max, Σ exp(x − max), target logit or 0); Note [vocab-sharded cross-entropy]."""
    row_max, sum_exp, picked = _backend(logits).cross_entropy_stats(logits, targets, start, vocab_size)
    return row_max, sum_exp, picked


@cross_entropy_stats.register_fake
def _(logits, targets, start, vocab_size):
    return _row_stats(logits), _row_stats(logits), _row_stats(logits)


@torch.library.custom_op("parc::cross_entropy_grad", mutates_args=(), device_types=_DEVICES)
def cross_entropy_grad(logits: Tensor, targets: Tensor, lse: Tensor, grad: Tensor, start: int, vocab_size: int) -> Tensor:
    """dlogits = (exp(x − lse) − onehot(target)) · grad on this slice; padding columns get 0."""
    return _backend(logits).cross_entropy_grad(logits, targets, lse, grad, start, vocab_size)


@cross_entropy_grad.register_fake
def _(logits, targets, lse, grad, start, vocab_size):
    return torch.empty_like(logits, memory_format=torch.contiguous_format)


class _CrossEntropy(torch.autograd.Function):
    """Note [vocab-sharded cross-entropy]: three all-reduces of (B, T) stats between two kernels."""

    @staticmethod
    def forward(ctx, logits, targets, group, vocab_size):
        start = group_rank(group) * logits.shape[-1]
        row_max, sum_exp, picked = call(cross_entropy_stats, logits, targets, start, vocab_size)
        peak = _all_reduce(row_max, group, op=dist.ReduceOp.MAX)
        total = _all_reduce(sum_exp * (row_max - peak).exp(), group)
        picked = _all_reduce(picked, group)
        lse = peak + total.log()
        ctx.save_for_backward(logits, targets, lse)
        ctx.start, ctx.vocab_size = start, vocab_size
        return lse - picked

    @staticmethod
    def backward(ctx, grad):
        logits, targets, lse = ctx.saved_tensors
        dlogits = call(cross_entropy_grad, logits, targets, lse, grad, ctx.start, ctx.vocab_size)
        return dlogits, None, None, None


def cross_entropy(logits: Tensor, targets: Tensor, *, vocab_size: int, tp_group=None) -> Tensor:
    """Per-token loss (fp32) from logits (..., V/tp) sharded over ``tp_group`` (None: one rank).

    Columns at or past ``vocab_size`` of the padded vocab are padding. Forward: three
    all-reduces over tp of per-row statistics; backward: local, no communication.
    """
    return _CrossEntropy.apply(logits, targets, tp_group, vocab_size)


# ---- residual add + norm (add_norm.py) ----------------------------------------------


# Note [ops by feature]: ring attention's block attention and the experts' ops are read
# from this module (``select`` gives it; ``ring.py`` and ``moe.py`` call ``fused.<op>``)
# but each lives in its own module, which a build ships only with its feature (cp; experts:
# ``features.left_out``); a name of theirs asked of this module imports that module then.
ELSEWHERE = {
    "block_attention": "ops_ring", "block_attention_backward": "ops_ring",
    "permute_rows": "ops_moe", "combine_rows": "ops_moe", "grouped_mm": "ops_moe",
}


def __getattr__(name: str):
    if name not in ELSEWHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{ELSEWHERE[name]}", __package__), name)
