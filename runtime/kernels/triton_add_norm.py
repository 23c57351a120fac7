"""The residual add fused into LayerNorm / RMSNorm, in Triton (Note [fused residual norm]
in add_norm.py; the same functions and results as ``cpu/add_norm.cpp``).

Takes: CUDA tensors (CPU ones under ``TRITON_INTERPRET=1``: the tests). Gives:
``add_layer_norm_fwd``/``_bwd`` and ``add_rms_norm_fwd``/``_bwd``, which ``triton_ops``
re-exports for ``ops._backend``. One program per row, in column blocks as
``triton_ops._norm_fwd``. Forward: the first sweep reads x and residual and writes h
(rounded to the dtype); the later sweeps recompute h from x and residual instead of
reading h back (a program's own stores need not be visible to its other threads
without a barrier; the re-reads hit the cache). Backward: ``triton_ops._norm_bwd`` itself on h,
whose ``HAS_DH`` adds dh (rounded apart, as cpu/add_norm.cpp does) into one dx.
Written and run under the interpreter here; untested on a GPU.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .triton_common import ROW_GROUPS, _acc, _block, _norm_bwd, _rows, _stats_dtype


@triton.jit
def _sum_of(X, R, start, cols, C, ACC: tl.constexpr):
    mask = start + cols < C
    x = tl.load(X + start + cols, mask=mask, other=0.0).to(ACC)
    r = tl.load(R + start + cols, mask=mask, other=0.0).to(ACC)
    # nearest even, as torch rounds the sum (Triton's interpreter rounds toward zero regardless)
    return (x + r).to(X.dtype.element_ty, fp_downcast_rounding="rtne").to(ACC), mask


@triton.jit
def _add_norm_fwd(X, R, H, W, B, Y, MEAN, RSTD, C, eps, RMS: tl.constexpr, HAS_BIAS: tl.constexpr,
                  ACC: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    X += row * C
    R += row * C
    H += row * C
    Y += row * C
    cols = tl.arange(0, BLOCK)
    total = tl.zeros([BLOCK], dtype=ACC)
    for start in range(0, C, BLOCK):
        h, mask = _sum_of(X, R, start, cols, C, ACC)
        tl.store(H + start + cols, h.to(H.dtype.element_ty), mask=mask)
        total += h
    mean = 0.0
    if not RMS:
        mean = tl.sum(total, axis=0) / C
    squares = tl.zeros([BLOCK], dtype=ACC)
    for start in range(0, C, BLOCK):
        h, mask = _sum_of(X, R, start, cols, C, ACC)
        d = tl.where(mask, h - mean, 0.0)
        squares += d * d
    rstd = 1.0 / tl.sqrt(tl.sum(squares, axis=0) / C + eps)
    for start in range(0, C, BLOCK):
        h, mask = _sum_of(X, R, start, cols, C, ACC)
        w = tl.load(W + start + cols, mask=mask, other=0.0).to(ACC)
        y = (h - mean) * rstd * w
        if HAS_BIAS:
            y += tl.load(B + start + cols, mask=mask, other=0.0).to(ACC)
        tl.store(Y + start + cols, y.to(Y.dtype.element_ty), mask=mask)
    if not RMS:
        tl.store(MEAN + row, mean)
    tl.store(RSTD + row, rstd)


def _forward(x, residual, weight, bias, eps, rms):
    if x.shape != residual.shape or x.dtype != residual.dtype:
        raise ValueError("parc add_norm: x and residual must have one shape and dtype")
    rows, res = _rows(x), _rows(residual)
    N, C = rows.shape
    y, h = torch.empty_like(rows), torch.empty_like(rows)
    mean = torch.empty(x.shape[:-1], dtype=_stats_dtype(x), device=x.device)
    rstd = torch.empty_like(mean)
    w = weight.to(x.dtype).contiguous()
    b = w if bias is None else bias.to(x.dtype).contiguous()
    _add_norm_fwd[(N,)](rows, res, h, w, b, y, mean, rstd, C, eps, RMS=rms, HAS_BIAS=bias is not None,
                        ACC=_acc(x), BLOCK=_block(C))
    return y.view(x.shape), h.view(x.shape), mean, rstd


def _backward(grad_y, grad_h, h, weight, mean, rstd, rms):
    rows, dy = _rows(h), _rows(grad_y.to(h.dtype))
    has_dh = grad_h.numel() > 0
    dh = _rows(grad_h.to(h.dtype)) if has_dh else dy
    N, C = rows.shape
    programs = max(1, min(ROW_GROUPS, N))
    per = triton.cdiv(N, programs)
    parts = torch.zeros(2, programs, C, dtype=_stats_dtype(h), device=h.device)
    dx = torch.empty_like(rows)
    _norm_bwd[(programs,)](dy, dh, rows, weight.to(h.dtype).contiguous(), mean.contiguous(),
                           rstd.contiguous(), dx, parts[0], parts[1], N, C, per, RMS=rms, HAS_DH=has_dh,
                           ACC=_acc(h), BLOCK=_block(C))
    return dx.view(h.shape), parts[0].sum(0).to(h.dtype), parts[1].sum(0).to(h.dtype)


def add_layer_norm_fwd(x, residual, weight, bias, eps):
    return _forward(x, residual, weight, bias, eps, rms=False)


def add_layer_norm_bwd(grad_y, grad_h, h, weight, mean, rstd):
    return _backward(grad_y, grad_h, h, weight, mean, rstd, rms=False)


def add_rms_norm_fwd(x, residual, weight, eps):
    y, h, _, rstd = _forward(x, residual, weight, None, eps, rms=True)
    return y, h, rstd


def add_rms_norm_bwd(grad_y, grad_h, h, weight, rstd):
    dx, dw, _ = _backward(grad_y, grad_h, h, weight, rstd, rstd, rms=True)
    return dx, dw
