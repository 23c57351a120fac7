"""llama's fused ops: RMSNorm, the residual add + RMSNorm, SwiGLU and rotary
(``parc::rms_norm_*``, ``parc::add_rms_norm_*``, ``parc::swiglu*``, ``parc::rotary_qk``), with
their autograd, and ``rotary_tables`` (the fused rotary's and the reference's). ``ops``
hands them out (Note [ops by feature] in ops.py): a build ships this module only for
arch = llama.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.utils._python_dispatch import _get_current_dispatch_mode

from .add_norm import _grad_h, _like, _promoted
from .backend import _DEVICES, _backend, _row_stats
from .dispatch import call


def rotary_tables(T, D, theta, device, start=0):
    """cos and sin of position · frequency, (T, D/2) fp32, as llama_attention.py's rotary()
    builds them, for positions start .. start + T - 1 (a context-parallel rank's tokens)."""
    inv = 1.0 / (theta ** (torch.arange(0, D, 2, dtype=torch.float32, device=device) / D))
    angles = torch.outer(torch.arange(start, start + T, dtype=torch.float32, device=device), inv)
    return angles.cos(), angles.sin()


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


@torch.library.custom_op("parc::rotary_qk", mutates_args=(), device_types=_DEVICES)
def _rotary_qk(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, sign: float) -> tuple[Tensor, Tensor]:
    """q and k rotated by the (T, D/2) tables (sign 1), or by their inverse (sign -1): one
    op (one autograd node) for both, as attention always rotates the two together."""
    out_q, out_k = _rotary_out(q), _rotary_out(k)
    _backend(q).rotary_apply(q, cos, sin, out_q, sign)
    _backend(k).rotary_apply(k, cos, sin, out_k, sign)
    return out_q, out_k


@_rotary_qk.register_fake
def _(q, k, cos, sin, sign):
    return _rotary_out(q), _rotary_out(k)


def _rotary_setup(ctx, inputs, output):
    q, k, cos, sin, sign = inputs
    ctx.save_for_backward(cos, sin)
    ctx.sign, ctx.dtypes = sign, (q.dtype, k.dtype)


def _rotary_backward(ctx, grad_q, grad_k):
    cos, sin = ctx.saved_tensors
    dq, dk = call(_rotary_qk, grad_q, grad_k, cos, sin, -ctx.sign)  # a rotation's inverse is its transpose
    return dq.to(ctx.dtypes[0]), dk.to(ctx.dtypes[1]), None, None, None


_rotary_qk.register_autograd(_rotary_backward, setup_context=_rotary_setup)

_TABLES: dict = {}
"""(T, D, theta, device, start) → ``rotary_tables``: every layer rotates at the same positions."""


def _tables(T, D, theta, device, start):
    # Kept only for plain tensors: not while tracing (fake tensors), compiling or under
    # inference mode (whose tensors backward cannot save), nor on the meta device.
    if (torch.compiler.is_compiling() or _get_current_dispatch_mode() is not None
            or torch.is_inference_mode_enabled() or device.type == "meta"):
        return rotary_tables(T, D, theta, device, start)
    key = (T, D, theta, device, start)
    if key not in _TABLES:
        if len(_TABLES) >= 64:  # positions of many slices or cp ranks: keep it bounded
            _TABLES.clear()
        _TABLES[key] = rotary_tables(T, D, theta, device, start)
    return _TABLES[key]


def rotary(q: Tensor, k: Tensor, theta: float, start: int = 0) -> tuple[Tensor, Tensor]:
    """Rotary positions start..start+T-1 on q and k, each (B, heads, T, D) (model.py's rotary())."""
    cos, sin = _tables(q.shape[-2], q.shape[-1], theta, q.device, start)
    rq, rk = call(_rotary_qk, q, k, cos, sin, 1.0)
    # computed in fp32, rounded to the inputs' dtype (bf16/fp16 compute weights, as model.py's)
    return rq.to(q.dtype), rk.to(k.dtype)


# ---- residual add + RMSNorm (Note [fused residual norm] in add_norm.py) ------------


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


def add_rms_norm(x: Tensor, residual: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """(RMSNorm(h), h) with h = x + residual, one pass; Note [fused residual norm]."""
    y, h, _ = call(add_rms_norm_fwd, *_promoted(x, residual), weight, eps)
    return y, h
