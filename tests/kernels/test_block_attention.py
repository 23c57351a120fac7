"""Block attention with log-sum-exp (ring attention's step): the C++ kernel against the eager
reference, the reference's backward against autograd, and blocks merged by lse against one block.

Shapes cover grouped-query heads (4 query heads over 2 kv heads), causal and unmasked
blocks, fewer queries than keys and one-token blocks.
"""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from parc.runtime.parallel.context import ring
from parc.runtime.kernels import reference

from test_ops import randn

CASES = [  # (B, H, Hkv, Tq, Tk, D, causal)
    (2, 4, 2, 6, 6, 8, True),
    (2, 4, 2, 3, 7, 8, False),
    (1, 2, 2, 1, 1, 4, True),
    (1, 3, 1, 17, 5, 16, False),
]
DTYPES = [torch.float64, torch.float32, torch.bfloat16]


def inputs(B, H, Hkv, Tq, Tk, D, dtype, seed=0):
    q = randn(B, H, Tq, D, dtype=dtype, seed=seed)
    k = randn(B, Hkv, Tk, D, dtype=dtype, seed=seed + 1)
    v = randn(B, Hkv, Tk, D, dtype=dtype, seed=seed + 2)
    grad = randn(B, H, Tq, D, dtype=dtype, seed=seed + 3)
    return q, k, v, grad


def tolerance(dtype):
    return {"rtol": 1e-12, "atol": 1e-12} if dtype == torch.float64 else {"rtol": 2e-5, "atol": 2e-5}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES)
def test_kernel_matches_reference(ops, case, dtype):
    *dims, causal = case
    q, k, v, grad = inputs(*dims, dtype)
    scale = dims[-1] ** -0.5
    out, lse = ops.block_attention(q, k, v, causal, scale)
    want_out, want_lse = reference.block_attention(q, k, v, causal, scale)
    assert out.dtype == want_out.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    assert_close(out, want_out, **tolerance(dtype))
    assert_close(lse, want_lse, **tolerance(dtype))
    got = ops.block_attention_backward(grad, q, k, v, out, lse, causal, scale)
    want = reference.block_attention_backward(grad, q, k, v, want_out, want_lse, causal, scale)
    for name, a, b in zip(("dq", "dk", "dv"), got, want):
        assert a.shape == b.shape and a.dtype == b.dtype, name
        assert_close(a, b, **tolerance(dtype), msg=name)


@pytest.mark.parametrize("case", CASES)
def test_reference_backward_is_autograd(case):
    *dims, causal = case
    q, k, v, grad = (t.requires_grad_() if i < 3 else t for i, t in enumerate(inputs(*dims, torch.float64)))
    scale = dims[-1] ** -0.5
    out, lse = reference.block_attention(q, k, v, causal, scale)
    out.backward(grad)
    got = reference.block_attention_backward(grad, q.detach(), k.detach(), v.detach(), out.detach(), lse.detach(),
                                             causal, scale)
    for name, a, leaf in zip(("dq", "dk", "dv"), got, (q, k, v)):
        assert_close(a, leaf.grad, rtol=1e-12, atol=1e-12, msg=name)


def test_causal_block_is_sdpa():
    q, k, v, _ = inputs(2, 4, 2, 9, 9, 8, torch.float64)
    out, _ = reference.block_attention(q, k, v, True, 8 ** -0.5)
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    assert_close(out, want, rtol=1e-12, atol=1e-12)


def test_blocks_merge_exactly_by_lse():
    """Attention over keys [0, 7) equals the lse-merge of blocks [0, 3) and [3, 7)."""
    q, k, v, _ = inputs(2, 4, 2, 5, 7, 8, torch.float64)
    scale = 8 ** -0.5
    want, want_lse = reference.block_attention(q, k, v, False, scale)
    out, lse = reference.block_attention(q, k[:, :, :3], v[:, :, :3], False, scale)
    ring.merge(out, lse, *reference.block_attention(q, k[:, :, 3:], v[:, :, 3:], False, scale))
    assert_close(out, want, rtol=1e-12, atol=1e-12)
    assert_close(lse, want_lse, rtol=1e-12, atol=1e-12)
