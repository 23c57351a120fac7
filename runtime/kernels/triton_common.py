"""The helpers the Triton kernels share: block sizes, accumulation dtypes, rows, and the
norms' backward kernel (the plain norms of ``triton_ops.py`` and the fused residual
norms of ``triton_add_norm.py`` both launch it). Its own module so that
``triton_ops.py`` re-exports ``triton_add_norm.py`` and ``triton_moe.py`` without
either importing it back.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

MAX_BLOCK = 4096
ROW_GROUPS = 64  # programs of a backward that sums over rows (Note in the module header)


def _block(n: int) -> int:
    return max(16, min(MAX_BLOCK, triton.next_power_of_2(max(n, 1))))


def _acc(x: torch.Tensor):
    return tl.float64 if x.dtype == torch.float64 else tl.float32


def _stats_dtype(x):
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _rows(x: torch.Tensor) -> torch.Tensor:
    return x.contiguous().view(-1, x.shape[-1])


@triton.jit
def _norm_bwd(DY, DH, X, W, MEAN, RSTD, DX, DW_PART, DB_PART, N, C, ROWS_PER_PROGRAM,
              RMS: tl.constexpr, HAS_DH: tl.constexpr, ACC: tl.constexpr, BLOCK: tl.constexpr):
    """Rows' input gradient and per-program weight/bias partial sums; with ``HAS_DH`` the
    fused residual norm's (triton_add_norm.py): X is h, and DH (the gradient of h itself)
    is added to the input gradient after its rounding, as the C++ kernel does."""
    program = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    DW_PART += program * C
    DB_PART += program * C
    first = program * ROWS_PER_PROGRAM
    for row in range(first, tl.minimum(first + ROWS_PER_PROGRAM, N)):
        mean = 0.0
        if not RMS:
            mean = tl.load(MEAN + row)
        rstd = tl.load(RSTD + row)
        sg = tl.zeros([BLOCK], dtype=ACC)
        sgx = tl.zeros([BLOCK], dtype=ACC)
        for start in range(0, C, BLOCK):
            mask = start + cols < C
            x = tl.load(X + row * C + start + cols, mask=mask, other=0.0).to(ACC)
            dy = tl.load(DY + row * C + start + cols, mask=mask, other=0.0).to(ACC)
            w = tl.load(W + start + cols, mask=mask, other=0.0).to(ACC)
            g = dy * w
            sg += g
            sgx += g * tl.where(mask, (x - mean) * rstd, 0.0)
        mg = tl.sum(sg, axis=0) / C
        mgx = tl.sum(sgx, axis=0) / C
        for start in range(0, C, BLOCK):
            mask = start + cols < C
            x = tl.load(X + row * C + start + cols, mask=mask, other=0.0).to(ACC)
            dy = tl.load(DY + row * C + start + cols, mask=mask, other=0.0).to(ACC)
            w = tl.load(W + start + cols, mask=mask, other=0.0).to(ACC)
            xhat = (x - mean) * rstd
            if RMS:
                dx = rstd * (dy * w - xhat * mgx)
            else:
                dx = rstd * (dy * w - mg - xhat * mgx)
            if HAS_DH:
                dh = tl.load(DH + row * C + start + cols, mask=mask, other=0.0).to(ACC)
                dx = dx.to(DX.dtype.element_ty).to(ACC) + dh
            tl.store(DX + row * C + start + cols, dx.to(DX.dtype.element_ty), mask=mask)
            dw = tl.load(DW_PART + start + cols, mask=mask, other=0.0)
            tl.store(DW_PART + start + cols, dw + dy * xhat, mask=mask)
            if not RMS:
                db = tl.load(DB_PART + start + cols, mask=mask, other=0.0)
                tl.store(DB_PART + start + cols, db + dy, mask=mask)
