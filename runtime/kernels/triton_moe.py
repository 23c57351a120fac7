"""The mixture-of-experts ops on CUDA: the row permutation and the weighted combine in
Triton, the grouped GEMM through torch (the same functions and results as ``cpu/moe.cpp``).

Takes: CUDA tensors (CPU ones under ``TRITON_INTERPRET=1``: the tests). Gives:
``permute_rows_fwd``/``_bwd``, ``combine_rows_fwd``/``_bwd`` and ``grouped_mm_fwd``/``_bwd``,
which ``triton_ops`` re-exports for ``ops._backend``.

permute:  out[i] = x[index[i]]                 backward: dx[t] = Σ_{index[i] = t} grad[i]
combine:  out[t] = Σ_{index[i] = t} w[i]·y[i]   backward: dy[i] = w[i]·grad[index[i]],
                                                          dw[i] = <grad[index[i]], y[i]>
The gathers run one program per (row, column block). The scatter-adds (permute's
backward, combine's forward) are segment sums, not atomics: a stable sort of ``index``
lists each token's rows in row order, and one program per (token, column block) adds
them in that order in fp32 (fp64 for fp64) and writes once. So every sum is formed in
the order cpu/moe.cpp forms it, and the result is deterministic (atomics are not). The
sort and the segment bounds (``searchsorted``) stay on the device: no host sync.

Note [grouped GEMM on CUDA]: torch ≥ 2.10 has a public grouped GEMM,
``torch.nn.functional.grouped_mm`` (one CUTLASS launch for all experts; bf16 on SM ≥ 80,
offsets on the device). bf16 inputs whose widths are multiples of 8 (16-byte rows, its
alignment rule) take it for the forward and both backward products (dW through its
2-D × 2-D form with offsets on the shared dimension); everything else (fp32, fp16, fp64,
odd widths, a torch without it, the interpreter) runs one ``mm`` per expert into slices
of one output, as cpu/moe.cpp does (one host sync for the counts). No Triton GEMM:
CUTLASS's grouped kernel is the one to beat and torch already ships it.
Written and run under the interpreter here; the GPU path is checked by bench/gpu_kernels.sh.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .triton_common import _acc, _block

GATHER_BLOCK = 1024  # columns per program of the gathers and segment sums


def _cols_block(C: int) -> int:
    return min(GATHER_BLOCK, _block(C))


@triton.jit
def _gather(X, INDEX, W, Y, C, HAS_WEIGHT: tl.constexpr, ACC: tl.constexpr, BLOCK: tl.constexpr):
    """Y[i] = X[INDEX[i]] (· W[i])."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < C
    src = tl.load(INDEX + row)
    v = tl.load(X + src * C + cols, mask=mask, other=0.0)
    if HAS_WEIGHT:
        v = v.to(ACC) * tl.load(W + row).to(ACC)
    tl.store(Y + row * C + cols, v.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _segment_sum(SRC, ORDER, BOUNDS, W, OUT, C, HAS_WEIGHT: tl.constexpr, ACC: tl.constexpr, BLOCK: tl.constexpr):
    """OUT[t] = Σ over j in [BOUNDS[t], BOUNDS[t+1]) of SRC[ORDER[j]] (· W[ORDER[j]]), j ascending."""
    token = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < C
    acc = tl.zeros([BLOCK], dtype=ACC)
    for j in range(tl.load(BOUNDS + token), tl.load(BOUNDS + token + 1)):
        r = tl.load(ORDER + j)
        v = tl.load(SRC + r * C + cols, mask=mask, other=0.0).to(ACC)
        if HAS_WEIGHT:
            v = v * tl.load(W + r).to(ACC)
        acc += v
    tl.store(OUT + token * C + cols, acc.to(OUT.dtype.element_ty), mask=mask)


@triton.jit
def _combine_bwd(G, Y, INDEX, W, DY, DW, C, ACC: tl.constexpr, BLOCK: tl.constexpr):
    """DY[i] = W[i]·G[INDEX[i]], DW[i] = <G[INDEX[i]], Y[i]>: one program per row."""
    row = tl.program_id(0).to(tl.int64)
    src = tl.load(INDEX + row)
    w = tl.load(W + row).to(ACC)
    cols = tl.arange(0, BLOCK)
    dot = tl.zeros([BLOCK], dtype=ACC)
    for start in range(0, C, BLOCK):
        mask = start + cols < C
        g = tl.load(G + src * C + start + cols, mask=mask, other=0.0).to(ACC)
        y = tl.load(Y + row * C + start + cols, mask=mask, other=0.0).to(ACC)
        tl.store(DY + row * C + start + cols, (w * g).to(DY.dtype.element_ty), mask=mask)
        dot += g * y
    tl.store(DW + row, tl.sum(dot, axis=0).to(DW.dtype.element_ty))


def _segments(index, tokens):
    """(rows in token order, stable; bounds (tokens + 1,)): token t's rows are order[bounds[t]:bounds[t+1]]."""
    ordered, order = torch.sort(index, stable=True)
    bounds = torch.searchsorted(ordered, torch.arange(tokens + 1, device=index.device, dtype=index.dtype))
    return order, bounds


def _scatter(src, index, weight, tokens):
    src, index = src.contiguous(), index.contiguous()
    C = src.shape[1]
    out = torch.empty(tokens, C, dtype=src.dtype, device=src.device)
    if tokens == 0 or C == 0:
        return out
    order, bounds = _segments(index, tokens)
    block = _cols_block(C)
    w = src if weight is None else weight
    _segment_sum[(tokens, triton.cdiv(C, block))](src, order, bounds, w, out, C, HAS_WEIGHT=weight is not None,
                                                   ACC=_acc(src), BLOCK=block)
    return out


def permute_rows_fwd(x, index):
    x, index = x.contiguous(), index.contiguous()
    R, C = index.shape[0], x.shape[1]
    out = torch.empty(R, C, dtype=x.dtype, device=x.device)
    if R and C:
        block = _cols_block(C)
        _gather[(R, triton.cdiv(C, block))](x, index, x, out, C, HAS_WEIGHT=False, ACC=_acc(x), BLOCK=block)
    return out


def permute_rows_bwd(grad, index, rows):
    return _scatter(grad, index, None, rows)


def combine_rows_fwd(rows, index, weight, tokens):
    return _scatter(rows, index, weight.to(rows.dtype).contiguous(), tokens)


def combine_rows_bwd(grad, rows, index, weight):
    y, index = rows.contiguous(), index.contiguous()
    g = grad.to(y.dtype).contiguous()
    w = weight.to(y.dtype).contiguous()
    R, C = y.shape
    dy, dw = torch.empty_like(y), torch.empty(R, dtype=y.dtype, device=y.device)
    if R and C:
        _combine_bwd[(R,)](g, y, index, w, dy, dw, C, ACC=_acc(y), BLOCK=_cols_block(C))
    elif R:
        dw.zero_()
    return dy, dw


# ---- grouped GEMM: Note [grouped GEMM on CUDA] --------------------------------------


def _torch_grouped(x, weight):
    """Whether torch's grouped GEMM takes these operands (Note [grouped GEMM on CUDA])."""
    fn = getattr(torch.nn.functional, "grouped_mm", None)
    return (fn is not None and x.is_cuda and x.dtype == weight.dtype == torch.bfloat16
            and x.shape[1] % 8 == 0 and weight.shape[1] % 8 == 0 and torch.cuda.get_device_capability(x.device)[0] >= 8)


def _offsets(counts, device):
    return torch.cumsum(counts.to(device=device), 0).to(torch.int32)


def grouped_mm_fwd(x, weight, counts):
    x = x.contiguous()
    if _torch_grouped(x, weight):
        return torch.nn.functional.grouped_mm(x, weight.transpose(-2, -1), offs=_offsets(counts, x.device))
    out = torch.empty(x.shape[0], weight.shape[1], dtype=x.dtype, device=x.device)
    start = 0
    for e, n in enumerate(counts.tolist()):
        if n:
            torch.mm(x[start : start + n], weight[e].t(), out=out[start : start + n])
        start += n
    return out


def grouped_mm_bwd(grad, x, weight, counts):
    g, x = grad.to(x.dtype).contiguous(), x.contiguous()
    if _torch_grouped(x, weight):
        offs = _offsets(counts, x.device)
        dx = torch.nn.functional.grouped_mm(g, weight, offs=offs)
        dw = torch.nn.functional.grouped_mm(g.t(), x, offs=offs)  # (E, out, in): each run's gᵀ x
        return dx, dw.to(weight.dtype)
    dx = torch.empty_like(x)
    dw = torch.zeros_like(weight)  # an expert with no rows gets a zero gradient
    start = 0
    for e, n in enumerate(counts.tolist()):
        if n:
            torch.mm(g[start : start + n], weight[e], out=dx[start : start + n])
            torch.mm(g[start : start + n].t(), x[start : start + n], out=dw[e])
        start += n
    return dx, dw
