"""The mixture-of-experts kernels (cpu/moe.cpp) against their eager references: the row
permutation, the weighted combine and the grouped GEMM, forward and every input gradient
in fp32 and bf16, gradcheck in float64; counts with empty experts included."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from parc.runtime.kernels import reference

from test_ops import compare

DTYPES = [torch.float32, torch.bfloat16]


def routing(tokens=13, experts=4, top_k=2, seed=0):
    """(index: each routed slot's token in expert order, counts per expert, empty expert 3)."""
    gen = torch.Generator().manual_seed(seed)
    chosen = torch.randint(0, experts - 1, (tokens * top_k,), generator=gen)  # expert 3 gets nothing
    order = torch.sort(chosen, stable=True).indices
    return order // top_k, torch.bincount(chosen, minlength=experts)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("width", [7, 70])
def test_permute_rows(ops, dtype, width):
    index, _ = routing()
    x = torch.randn(13, width).to(dtype)
    compare(lambda t: ops.permute_rows(t, index), lambda t: reference.permute_rows(t, index), (x,))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("width", [7, 70])
def test_combine_rows(ops, dtype, width):
    index, _ = routing()
    rows, weight = torch.randn(index.numel(), width).to(dtype), torch.rand(index.numel()).to(dtype)
    compare(lambda r, w: ops.combine_rows(r, index, w, 13), lambda r, w: reference.combine_rows(r, index, w, 13),
            (rows, weight))


@pytest.mark.parametrize("dtype", DTYPES)
def test_grouped_mm(ops, dtype):
    _, counts = routing()
    x, weight = torch.randn(int(counts.sum()), 24).to(dtype), (torch.randn(4, 40, 24) / 5).to(dtype)
    compare(lambda a, w: ops.grouped_mm(a, w, counts), lambda a, w: reference.grouped_mm(a, w, counts), (x, weight))


def test_gradcheck_float64(ops):
    index, counts = routing(tokens=5, experts=3, top_k=2, seed=1)
    x = torch.randn(5, 6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: ops.permute_rows(t, index), (x,))
    rows = torch.randn(index.numel(), 6, dtype=torch.float64, requires_grad=True)
    weight = torch.rand(index.numel(), dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda r, w: ops.combine_rows(r, index, w, 5), (rows, weight))
    a = torch.randn(int(counts.sum()), 4, dtype=torch.float64, requires_grad=True)
    w = torch.randn(3, 5, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda p, q: ops.grouped_mm(p, q, counts), (a, w))


def test_permute_and_combine_match_moe_eager_path(ops):
    # moe.py's eager index (bit for bit) and index_add_ (summed in row order here)
    index, _ = routing()
    x, weight = torch.randn(13, 16), torch.rand(index.numel())
    assert torch.equal(ops.permute_rows(x, index), x[index])
    rows = torch.randn(index.numel(), 16)
    eager = torch.zeros(13, 16).index_add_(0, index, rows * weight.unsqueeze(1))
    assert_close(ops.combine_rows(rows, index, weight, 13), eager)
    # deterministic: the same rows give the same bits, run after run
    assert torch.equal(ops.combine_rows(rows, index, weight, 13), ops.combine_rows(rows, index, weight, 13))
