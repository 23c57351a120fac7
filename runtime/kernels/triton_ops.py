"""The fused ops' CUDA kernels in Triton (same functions and results as the C++ module).

Takes: CUDA tensors (or CPU tensors under ``TRITON_INTERPRET=1``, which is how the
tests run these here). Gives: the functions ``ops.py`` dispatches to, with the
signatures of ``cpu/bindings.cpp``. Each program owns one row and walks it in
column blocks of at most ``MAX_BLOCK``, so any width works; fp32/bf16/fp16 compute
in fp32, fp64 in fp64. Per-column sums (dweight, dbias) go through a (programs, C)
buffer of partial sums, each program adding into its own row, summed by torch
afterwards: deterministic for a given shape.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .triton_add_norm import (  # noqa: F401  (re-exported for ops._backend)
    add_layer_norm_bwd,
    add_layer_norm_fwd,
    add_rms_norm_bwd,
    add_rms_norm_fwd,
)
from .triton_moe import (  # noqa: F401  (re-exported for ops._backend)
    combine_rows_bwd,
    combine_rows_fwd,
    grouped_mm_bwd,
    grouped_mm_fwd,
    permute_rows_bwd,
    permute_rows_fwd,
)
from .triton_common import MAX_BLOCK, ROW_GROUPS, _acc, _block, _norm_bwd, _rows, _stats_dtype  # noqa: F401

# ---- norms ------------------------------------------------------------------------


@triton.jit
def _norm_fwd(X, W, B, Y, MEAN, RSTD, C, eps, RMS: tl.constexpr, HAS_BIAS: tl.constexpr,
              ACC: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    X += row * C
    Y += row * C
    cols = tl.arange(0, BLOCK)
    mean = 0.0
    if not RMS:
        total = tl.zeros([BLOCK], dtype=ACC)
        for start in range(0, C, BLOCK):
            x = tl.load(X + start + cols, mask=start + cols < C, other=0.0).to(ACC)
            total += x
        mean = tl.sum(total, axis=0) / C
    squares = tl.zeros([BLOCK], dtype=ACC)
    for start in range(0, C, BLOCK):
        mask = start + cols < C
        x = tl.load(X + start + cols, mask=mask, other=0.0).to(ACC)
        d = tl.where(mask, x - mean, 0.0)
        squares += d * d
    rstd = 1.0 / tl.sqrt(tl.sum(squares, axis=0) / C + eps)
    for start in range(0, C, BLOCK):
        mask = start + cols < C
        x = tl.load(X + start + cols, mask=mask, other=0.0).to(ACC)
        w = tl.load(W + start + cols, mask=mask, other=0.0).to(ACC)
        y = (x - mean) * rstd * w
        if HAS_BIAS:
            y += tl.load(B + start + cols, mask=mask, other=0.0).to(ACC)
        tl.store(Y + start + cols, y.to(Y.dtype.element_ty), mask=mask)
    if not RMS:
        tl.store(MEAN + row, mean)
    tl.store(RSTD + row, rstd)


def _norm_forward(x, weight, bias, eps, rms):
    rows = _rows(x)
    N, C = rows.shape
    y = torch.empty_like(rows)
    mean = torch.empty(x.shape[:-1], dtype=_stats_dtype(x), device=x.device)
    rstd = torch.empty_like(mean)
    w = weight.to(x.dtype).contiguous()
    b = w if bias is None else bias.to(x.dtype).contiguous()
    _norm_fwd[(N,)](rows, w, b, y, mean, rstd, C, eps, RMS=rms, HAS_BIAS=bias is not None,
                    ACC=_acc(x), BLOCK=_block(C))
    return y.view(x.shape), mean, rstd


def _norm_backward(grad, x, weight, mean, rstd, rms):
    rows, dy = _rows(x), _rows(grad.to(x.dtype))
    N, C = rows.shape
    programs = max(1, min(ROW_GROUPS, N))
    per = triton.cdiv(N, programs)
    parts = torch.zeros(2, programs, C, dtype=_stats_dtype(x), device=x.device)
    dx = torch.empty_like(rows)
    _norm_bwd[(programs,)](dy, dy, rows, weight.to(x.dtype).contiguous(), mean.contiguous(), rstd.contiguous(),
                           dx, parts[0], parts[1], N, C, per, RMS=rms, HAS_DH=False, ACC=_acc(x), BLOCK=_block(C))
    return dx.view(x.shape), parts[0].sum(0).to(x.dtype), parts[1].sum(0).to(x.dtype)


def layer_norm_fwd(x, weight, bias, eps):
    return _norm_forward(x, weight, bias, eps, rms=False)


def layer_norm_bwd(grad, x, weight, mean, rstd):
    return _norm_backward(grad, x, weight, mean, rstd, rms=False)


def rms_norm_fwd(x, weight, eps):
    y, _, rstd = _norm_forward(x, weight, None, eps, rms=True)
    return y, rstd


def rms_norm_bwd(grad, x, weight, rstd):
    dx, dw, _ = _norm_backward(grad, x, weight, rstd, rstd, rms=True)
    return dx, dw


# ---- bias + GeLU, SwiGLU ----------------------------------------------------------

_BETA = 0.7978845608028654  # sqrt(2/pi)
_KAPPA = 0.044715


@triton.jit
def _gelu_fwd(X, B, Y, C, HAS_BIAS: tl.constexpr, ACC: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < C
    v = tl.load(X + row * C + cols, mask=mask, other=0.0).to(ACC)
    if HAS_BIAS:
        v += tl.load(B + cols, mask=mask, other=0.0).to(ACC)
    u2 = 2 * 0.7978845608028654 * (v + 0.044715 * v * v * v)
    tl.store(Y + row * C + cols, (v / (1.0 + tl.exp(-u2))).to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _gelu_bwd(DY, X, B, DX, DB_PART, N, C, ROWS_PER_PROGRAM, HAS_BIAS: tl.constexpr,
              ACC: tl.constexpr, BLOCK: tl.constexpr):
    program = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < C
    bias = 0.0
    if HAS_BIAS:
        bias = tl.load(B + cols, mask=mask, other=0.0).to(ACC)
    db = tl.zeros([BLOCK], dtype=ACC)
    first = program * ROWS_PER_PROGRAM
    for row in range(first, tl.minimum(first + ROWS_PER_PROGRAM, N)):
        v = tl.load(X + row * C + cols, mask=mask, other=0.0).to(ACC) + bias
        v2 = v * v
        s = 1.0 / (1.0 + tl.exp(-2 * 0.7978845608028654 * (v + 0.044715 * v2 * v)))
        d = s + 2 * 0.7978845608028654 * v * s * (1.0 - s) * (1.0 + 3 * 0.044715 * v2)
        g = tl.load(DY + row * C + cols, mask=mask, other=0.0).to(ACC) * d
        tl.store(DX + row * C + cols, g.to(DX.dtype.element_ty), mask=mask)
        db += g
    if HAS_BIAS:
        tl.store(DB_PART + program * C + cols, db, mask=mask)


def bias_gelu_fwd(x, bias):
    rows = _rows(x)
    N, C = rows.shape
    has_bias = bias is not None and bias.numel() > 0
    b = bias.to(x.dtype).contiguous() if has_bias else rows
    y = torch.empty_like(rows)
    block = _block(C)
    _gelu_fwd[(N, triton.cdiv(C, block))](rows, b, y, C, HAS_BIAS=has_bias, ACC=_acc(x), BLOCK=block)
    return y.view(x.shape)


def bias_gelu_bwd(grad, x, bias):
    rows, dy = _rows(x), _rows(grad.to(x.dtype))
    N, C = rows.shape
    has_bias = bias is not None and bias.numel() > 0
    b = bias.to(x.dtype).contiguous() if has_bias else rows
    programs = max(1, min(ROW_GROUPS, N)) if has_bias else N
    per = triton.cdiv(N, programs)
    parts = torch.zeros(programs if has_bias else 1, C, dtype=_stats_dtype(x), device=x.device)
    dx = torch.empty_like(rows)
    block = _block(C)
    _gelu_bwd[(programs, triton.cdiv(C, block))](dy, rows, b, dx, parts, N, C, per, HAS_BIAS=has_bias,
                                                 ACC=_acc(x), BLOCK=block)
    if not has_bias:
        return [dx.view(x.shape)]
    return [dx.view(x.shape), parts.sum(0).to(x.dtype)]


@triton.jit
def _swiglu_fwd(G, U, Y, total, ACC: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < total
    g = tl.load(G + offs, mask=mask, other=0.0).to(ACC)
    u = tl.load(U + offs, mask=mask, other=0.0).to(ACC)
    tl.store(Y + offs, (g / (1.0 + tl.exp(-g)) * u).to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _swiglu_bwd(DY, G, U, DG, DU, total, ACC: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < total
    g = tl.load(G + offs, mask=mask, other=0.0).to(ACC)
    u = tl.load(U + offs, mask=mask, other=0.0).to(ACC)
    dy = tl.load(DY + offs, mask=mask, other=0.0).to(ACC)
    s = 1.0 / (1.0 + tl.exp(-g))
    tl.store(DG + offs, (dy * u * s * (1.0 + g * (1.0 - s))).to(DG.dtype.element_ty), mask=mask)
    tl.store(DU + offs, (dy * g * s).to(DU.dtype.element_ty), mask=mask)


def swiglu_fwd(gate, up):
    g, u = gate.contiguous(), up.to(gate.dtype).contiguous()
    y = torch.empty_like(g)
    block = _block(g.numel())
    _swiglu_fwd[(triton.cdiv(g.numel(), block),)](g, u, y, g.numel(), ACC=_acc(gate), BLOCK=block)
    return y


def swiglu_bwd(grad, gate, up):
    g, u, dy = gate.contiguous(), up.to(gate.dtype).contiguous(), grad.to(gate.dtype).contiguous()
    dg, du = torch.empty_like(g), torch.empty_like(g)
    block = _block(g.numel())
    _swiglu_bwd[(triton.cdiv(g.numel(), block),)](dy, g, u, dg, du, g.numel(), ACC=_acc(gate), BLOCK=block)
    return dg, du


# ---- rotary -----------------------------------------------------------------------


@triton.jit
def _rotary(X, COS, SIN, OUT, H, T, HALF, xs0, xs1, xs2, os0, os1, os2, sign,
            ACC: tl.constexpr, BLOCK: tl.constexpr):
    r = tl.program_id(0)
    t = r % T
    h = (r // T) % H
    b = r // (T * H)
    X += b * xs0 + h * xs1 + t * xs2
    OUT += b * os0 + h * os1 + t * os2
    j = tl.arange(0, BLOCK)
    mask = j < HALF
    x1 = tl.load(X + j, mask=mask, other=0.0).to(ACC)
    x2 = tl.load(X + HALF + j, mask=mask, other=0.0).to(ACC)
    c = tl.load(COS + t * HALF + j, mask=mask, other=0.0).to(ACC)
    s = sign * tl.load(SIN + t * HALF + j, mask=mask, other=0.0).to(ACC)
    tl.store(OUT + j, (x1 * c + (-x2) * s).to(OUT.dtype.element_ty), mask=mask)
    tl.store(OUT + HALF + j, (x2 * c + x1 * s).to(OUT.dtype.element_ty), mask=mask)


def rotary_apply(x, cos, sin, out, sign):
    if x.stride(3) != 1:
        x = x.contiguous()
    B, H, T, D = x.shape
    acc = tl.float64 if torch.float64 in (x.dtype, out.dtype) else tl.float32
    _rotary[(B * H * T,)](x, cos, sin, out, H, T, D // 2, *x.stride()[:3], *out.stride()[:3], float(sign),
                          ACC=acc, BLOCK=_block(D // 2))


# ---- cross-entropy ----------------------------------------------------------------


@triton.jit
def _ce_stats(L, TG, MAX, SUM, PICKED, V, start, limit, ACC: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    L += row * V
    cols = tl.arange(0, BLOCK)
    # One read of the row: per lane a running max and a sum rescaled when it grows.
    lane_max = tl.full([BLOCK], float("-inf"), ACC)
    lane_sum = tl.zeros([BLOCK], dtype=ACC)
    for first in range(0, limit, BLOCK):
        x = tl.load(L + first + cols, mask=first + cols < limit, other=float("-inf")).to(ACC)
        grown = tl.maximum(lane_max, x)
        safe = tl.where(grown == float("-inf"), 0.0, grown)
        lane_sum = lane_sum * tl.exp(lane_max - safe) + tl.exp(x - safe)
        lane_max = grown
    peak = tl.max(lane_max, axis=0)
    safe_peak = tl.where(peak == float("-inf"), 0.0, peak)
    total = tl.sum(lane_sum * tl.exp(lane_max - safe_peak), axis=0)
    local = tl.load(TG + row) - start
    inside = (local >= 0) & (local < limit)
    picked = tl.load(L + tl.where(inside, local, 0), mask=inside, other=0.0).to(ACC)
    tl.store(MAX + row, peak)
    tl.store(SUM + row, total)
    tl.store(PICKED + row, tl.where(inside, picked, 0.0))


@triton.jit
def _ce_grad(L, TG, LSE, GRAD, OUT, V, start, limit, ACC: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(L + row * V + cols, mask=cols < limit, other=float("-inf")).to(ACC)
    lse = tl.load(LSE + row).to(ACC)
    g = tl.load(GRAD + row).to(ACC)
    local = tl.load(TG + row) - start
    onehot = tl.where(cols == local, 1.0, 0.0)
    tl.store(OUT + row * V + cols, ((tl.exp(x - lse) - onehot) * g).to(OUT.dtype.element_ty), mask=cols < V)


def cross_entropy_stats(logits, targets, start, vocab_size):
    rows = _rows(logits)
    N, V = rows.shape
    limit = min(V, max(0, vocab_size - start))
    shape = logits.shape[:-1]
    stats = [torch.empty(shape, dtype=_stats_dtype(logits), device=logits.device) for _ in range(3)]
    _ce_stats[(N,)](rows, targets.contiguous().view(-1).long(), *stats, V, start, limit,
                    ACC=_acc(logits), BLOCK=_block(V))
    return stats


def cross_entropy_grad(logits, targets, lse, grad, start, vocab_size):
    rows = _rows(logits)
    N, V = rows.shape
    limit = min(V, max(0, vocab_size - start))
    out = torch.empty_like(rows)
    dtype = _stats_dtype(logits)
    block = _block(V)
    _ce_grad[(N, triton.cdiv(V, block))](
        rows, targets.contiguous().view(-1).long(), lse.contiguous().view(-1).to(dtype),
        grad.contiguous().view(-1).to(dtype), out, V, start, limit, ACC=_acc(logits), BLOCK=block,
    )
    return out.view(logits.shape)


# ---- block attention with log-sum-exp (ring attention's step) ----------------------
# One program per (query block, batch·head) walks the key blocks with an online softmax
# (flash attention); backward: one program per query block for dq, one per (key block,
# batch·kv head) for dk, dv, looping over the kv head's group of query heads, so the
# group sum needs no atomics. Tensors are contiguous (B, heads, T, D); scores computed
# in the stats dtype with exact (ieee) dots. -1e30 stands for a masked score.

ATTN_BLOCK = 32


@triton.jit
def _masked(s, rows, cols, Tq, Tk, CAUSAL: tl.constexpr):
    keep = (rows[:, None] < Tq) & (cols[None, :] < Tk)
    if CAUSAL:
        keep = keep & (cols[None, :] <= rows[:, None])
    return tl.where(keep, s, -1.0e30)


@triton.jit
def _attn_fwd(Q, K, V, OUT, LSE, H, HKV, Tq, Tk, D, scale, CAUSAL: tl.constexpr, ACC: tl.constexpr,
              BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr):
    pid_m, bh = tl.program_id(0), tl.program_id(1)
    b, h = bh // H, bh % H
    kvh = b * HKV + h // (H // HKV)
    rows = pid_m * BM + tl.arange(0, BM)
    dims = tl.arange(0, BD)
    q = tl.load(Q + (bh * Tq + rows[:, None]) * D + dims[None, :],
                mask=(rows[:, None] < Tq) & (dims[None, :] < D), other=0.0).to(ACC)
    m = tl.full((BM,), -1.0e30, ACC)
    total = tl.zeros((BM,), ACC)
    acc = tl.zeros((BM, BD), ACC)
    hi = tl.minimum(Tk, (pid_m + 1) * BM) if CAUSAL else Tk
    for start in range(0, hi, BN):
        cols = start + tl.arange(0, BN)
        kv_mask = (cols[:, None] < Tk) & (dims[None, :] < D)
        k = tl.load(K + (kvh * Tk + cols[:, None]) * D + dims[None, :], mask=kv_mask, other=0.0).to(ACC)
        v = tl.load(V + (kvh * Tk + cols[:, None]) * D + dims[None, :], mask=kv_mask, other=0.0).to(ACC)
        s = _masked(tl.dot(q, tl.trans(k), input_precision="ieee") * scale, rows, cols, Tq, Tk, CAUSAL)
        m_new = tl.maximum(m, tl.max(s, axis=1))
        p = tl.exp(s - m_new[:, None])
        correction = tl.exp(m - m_new)
        total = total * correction + tl.sum(p, axis=1)
        acc = acc * correction[:, None] + tl.dot(p, v, input_precision="ieee")
        m = m_new
    out_mask = (rows[:, None] < Tq) & (dims[None, :] < D)
    tl.store(OUT + (bh * Tq + rows[:, None]) * D + dims[None, :], acc / total[:, None], mask=out_mask)
    tl.store(LSE + bh * Tq + rows, m + tl.log(total), mask=rows < Tq)


@triton.jit
def _attn_bwd_dq(Q, K, V, G, LSE, DELTA, DQ, H, HKV, Tq, Tk, D, scale, CAUSAL: tl.constexpr,
                 ACC: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr):
    pid_m, bh = tl.program_id(0), tl.program_id(1)
    b, h = bh // H, bh % H
    kvh = b * HKV + h // (H // HKV)
    rows = pid_m * BM + tl.arange(0, BM)
    dims = tl.arange(0, BD)
    row_mask = (rows[:, None] < Tq) & (dims[None, :] < D)
    q = tl.load(Q + (bh * Tq + rows[:, None]) * D + dims[None, :], mask=row_mask, other=0.0).to(ACC)
    g = tl.load(G + (bh * Tq + rows[:, None]) * D + dims[None, :], mask=row_mask, other=0.0).to(ACC)
    lse = tl.load(LSE + bh * Tq + rows, mask=rows < Tq, other=0.0).to(ACC)
    delta = tl.load(DELTA + bh * Tq + rows, mask=rows < Tq, other=0.0).to(ACC)
    dq = tl.zeros((BM, BD), ACC)
    hi = tl.minimum(Tk, (pid_m + 1) * BM) if CAUSAL else Tk
    for start in range(0, hi, BN):
        cols = start + tl.arange(0, BN)
        kv_mask = (cols[:, None] < Tk) & (dims[None, :] < D)
        k = tl.load(K + (kvh * Tk + cols[:, None]) * D + dims[None, :], mask=kv_mask, other=0.0).to(ACC)
        v = tl.load(V + (kvh * Tk + cols[:, None]) * D + dims[None, :], mask=kv_mask, other=0.0).to(ACC)
        s = _masked(tl.dot(q, tl.trans(k), input_precision="ieee") * scale, rows, cols, Tq, Tk, CAUSAL)
        p = tl.exp(s - lse[:, None])
        ds = p * (tl.dot(g, tl.trans(v), input_precision="ieee") - delta[:, None])
        dq += tl.dot(ds, k, input_precision="ieee")
    tl.store(DQ + (bh * Tq + rows[:, None]) * D + dims[None, :], dq * scale, mask=row_mask)


@triton.jit
def _attn_bwd_dkv(Q, K, V, G, LSE, DELTA, DK, DV, H, HKV, Tq, Tk, D, scale, CAUSAL: tl.constexpr,
                  ACC: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr):
    pid_n, bkv = tl.program_id(0), tl.program_id(1)
    b, hk = bkv // HKV, bkv % HKV
    group = H // HKV
    cols = pid_n * BN + tl.arange(0, BN)
    dims = tl.arange(0, BD)
    kv_mask = (cols[:, None] < Tk) & (dims[None, :] < D)
    k = tl.load(K + (bkv * Tk + cols[:, None]) * D + dims[None, :], mask=kv_mask, other=0.0).to(ACC)
    v = tl.load(V + (bkv * Tk + cols[:, None]) * D + dims[None, :], mask=kv_mask, other=0.0).to(ACC)
    dk = tl.zeros((BN, BD), ACC)
    dv = tl.zeros((BN, BD), ACC)
    lo = (pid_n * BN // BM) * BM if CAUSAL else 0
    for j in range(0, group):
        bh = b * H + hk * group + j
        for start in range(lo, Tq, BM):
            rows = start + tl.arange(0, BM)
            row_mask = (rows[:, None] < Tq) & (dims[None, :] < D)
            q = tl.load(Q + (bh * Tq + rows[:, None]) * D + dims[None, :], mask=row_mask, other=0.0).to(ACC)
            g = tl.load(G + (bh * Tq + rows[:, None]) * D + dims[None, :], mask=row_mask, other=0.0).to(ACC)
            lse = tl.load(LSE + bh * Tq + rows, mask=rows < Tq, other=0.0).to(ACC)
            delta = tl.load(DELTA + bh * Tq + rows, mask=rows < Tq, other=0.0).to(ACC)
            s = _masked(tl.dot(q, tl.trans(k), input_precision="ieee") * scale, rows, cols, Tq, Tk, CAUSAL)
            p = tl.exp(s - lse[:, None])
            dv += tl.dot(tl.trans(p), g, input_precision="ieee")
            ds = p * (tl.dot(g, tl.trans(v), input_precision="ieee") - delta[:, None])
            dk += tl.dot(tl.trans(ds), q, input_precision="ieee")
    tl.store(DK + (bkv * Tk + cols[:, None]) * D + dims[None, :], dk * scale, mask=kv_mask)
    tl.store(DV + (bkv * Tk + cols[:, None]) * D + dims[None, :], dv, mask=kv_mask)


def _attn_dims(q, k):
    B, H, Tq, D = q.shape
    return B, H, k.shape[1], Tq, k.shape[2], D, max(16, triton.next_power_of_2(D))


def block_attention_fwd(q, k, v, causal, scale):
    B, H, HKV, Tq, Tk, D, BD = _attn_dims(q, k)
    dtype = _stats_dtype(q)
    out = torch.empty((B, H, Tq, D), dtype=dtype, device=q.device)
    lse = torch.empty((B, H, Tq), dtype=dtype, device=q.device)
    _attn_fwd[(triton.cdiv(Tq, ATTN_BLOCK), B * H)](
        q.contiguous(), k.contiguous(), v.contiguous(), out, lse, H, HKV, Tq, Tk, D, scale,
        CAUSAL=bool(causal), ACC=_acc(q), BM=ATTN_BLOCK, BN=ATTN_BLOCK, BD=BD,
    )
    return out, lse


def block_attention_bwd(grad, q, k, v, out, lse, causal, scale):
    B, H, HKV, Tq, Tk, D, BD = _attn_dims(q, k)
    dtype = _stats_dtype(q)
    q, k, v, grad = q.contiguous(), k.contiguous(), v.contiguous(), grad.contiguous()
    delta = (grad.to(dtype) * out.to(dtype)).sum(-1).contiguous()  # Σ_d grad · out of the final output
    lse = lse.to(dtype).contiguous()
    dq = torch.empty((B, H, Tq, D), dtype=dtype, device=q.device)
    dk = torch.empty((B, HKV, Tk, D), dtype=dtype, device=q.device)
    dv = torch.empty_like(dk)
    common = dict(CAUSAL=bool(causal), ACC=_acc(q), BM=ATTN_BLOCK, BN=ATTN_BLOCK, BD=BD)
    _attn_bwd_dq[(triton.cdiv(Tq, ATTN_BLOCK), B * H)](
        q, k, v, grad, lse, delta, dq, H, HKV, Tq, Tk, D, scale, **common)
    _attn_bwd_dkv[(triton.cdiv(Tk, ATTN_BLOCK), B * HKV)](
        q, k, v, grad, lse, delta, dk, dv, H, HKV, Tq, Tk, D, scale, **common)
    return dq, dk, dv
