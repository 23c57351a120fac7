"""The fused residual add + norm (Note [fused residual norm]) against its eager reference.

fp32 and bf16: both outputs (y and the new residual stream h) and the gradients of x,
residual, weight and bias, with gradients flowing into both y and h, then with h
unused (its gradient None). float64 gradcheck through both outputs. In fp32 the fused
op gives the very floats of the unfused compiled ops (an add, then the norm kernel;
autograd summing the two gradients of h): that is what lets a fused trainer match an
unfused one exactly (test_model_add_norm.py).
"""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from parc.runtime.kernels import reference
from test_ops import DTYPES, SHAPES, compare, leaves, randn


def cases(ops, C, dtype, eps=1e-5):
    """(name, fused, reference, extra inputs) for LayerNorm and RMSNorm."""
    w, b = randn(C, dtype=dtype, seed=1), randn(C, dtype=dtype, seed=2)
    return [
        ("layer", lambda x, r, w, b: ops.add_layer_norm(x, r, w, b, eps),
         lambda x, r, w, b: reference.add_layer_norm(x, r, w, b, eps), (w, b)),
        ("rms", lambda x, r, w: ops.add_rms_norm(x, r, w, eps),
         lambda x, r, w: reference.add_rms_norm(x, r, w, eps), (w,)),
    ]


@pytest.mark.parametrize("shape", SHAPES)
def test_add_norm_matches_reference_fp32(ops, shape):
    x = randn(*shape, scale=2.0, seed=3)
    residual = randn(*shape, scale=3.0, seed=4) + 1.5
    for _, fused, ref, params in cases(ops, shape[-1], torch.float32):
        compare(fused, ref, (x, residual, *params))


@pytest.mark.parametrize("shape", SHAPES)
def test_add_norm_matches_reference_bf16(ops, shape):
    """As fp32, except the gradient of x and residual: the sum dnorm + dh of two bf16
    gradients, each rounded once (as autograd sums them unfused). Where the two nearly
    cancel, a last-bit difference of dnorm between the kernel and torch's norm is a
    large share of the sum, so that one is checked against the fp32 truth within one
    bf16 rounding of each summand: |got − truth| ≤ 2⁻⁸·(|dnorm| + |dh|) + 2⁻⁸·|truth|."""
    x = randn(*shape, dtype=torch.bfloat16, scale=2.0, seed=3)
    residual = randn(*shape, dtype=torch.bfloat16, scale=3.0, seed=4) + 1.5
    gen = torch.Generator().manual_seed(0)
    gy, gh = (torch.randn(shape, generator=gen).to(torch.bfloat16) for _ in range(2))
    for name, fused, ref, params in cases(ops, shape[-1], torch.bfloat16):
        ours, theirs = leaves(x, residual, *params), leaves(x, residual, *params)
        out, expected = fused(*ours), ref(*theirs)
        for o, e in zip(out, expected):
            assert o.dtype == e.dtype == torch.bfloat16
            assert_close(o, e)
        torch.autograd.backward(out, [gy, gh])
        torch.autograd.backward(expected, [gy, gh])
        for a, b in zip(ours[2:], theirs[2:]):  # weight, bias
            assert_close(a.grad, b.grad)
        assert torch.equal(ours[0].grad, ours[1].grad)  # one gradient for both inputs of the add
        exact = leaves(*(t.float() for t in (x, residual, *params)))
        torch.autograd.backward(ref(*exact)[0], [gy.float()])
        dnorm = exact[0].grad.clone()  # the norm's share alone
        truth = dnorm + gh.float()
        got = ours[0].grad.float()
        bound = 2.0**-8 * (dnorm.abs() + gh.float().abs() + truth.abs())
        assert torch.all((got - truth).abs() <= bound), (name, ((got - truth).abs() - bound).max())


@pytest.mark.parametrize("dtype", DTYPES)
def test_add_norm_with_h_unused(ops, dtype):
    """Only y is used (the final norm): h's gradient is None and adds nothing."""
    x, residual = randn(4, 5, 33, dtype=dtype, seed=5), randn(4, 5, 33, dtype=dtype, seed=6)
    for _, fused, ref, params in cases(ops, 33, dtype):
        compare(lambda *a: fused(*a)[0], lambda *a: ref(*a)[0], (x, residual, *params))


def test_add_norm_promotes_like_add(ops):
    """A bf16 branch output added to an fp32 residual stream gives fp32, as ``+`` does."""
    x, residual = randn(3, 40, dtype=torch.bfloat16), randn(3, 40, seed=1)
    for _, fused, ref, params in cases(ops, 40, torch.float32):
        compare(fused, ref, (x, residual, *params))


def test_add_norm_gradcheck(ops):
    d = dict(dtype=torch.float64)
    x, residual = randn(2, 3, 9, **d, seed=7), randn(2, 3, 9, **d, seed=8)
    for _, fused, _, params in cases(ops, 9, torch.float64):
        assert torch.autograd.gradcheck(fused, leaves(x, residual, *params))
        assert torch.autograd.gradcheck(lambda *a: fused(*a)[0], leaves(x, residual, *params))


@pytest.mark.parametrize("C", [7, 1024 + 3])
def test_fused_equals_unfused_compiled_fp32(ops, C):
    """Bit for bit: y, h and every gradient equal the add followed by the norm kernel."""
    x, residual = randn(6, C, seed=9, scale=2.0), randn(6, C, seed=10)
    gy, gh = randn(6, C, seed=11), randn(6, C, seed=12)
    w, b = randn(C, seed=1), randn(C, seed=2)
    unfused = {
        "layer": lambda x, r, w, b: (lambda h: (ops.layer_norm(h, w, b, 1e-5), h))(x + r),
        "rms": lambda x, r, w: (lambda h: (ops.rms_norm(h, w, 1e-5), h))(x + r),
    }
    for name, fused, _, params in cases(ops, C, torch.float32):
        ours, theirs = leaves(x, residual, *params), leaves(x, residual, *params)
        out, expected = fused(*ours), unfused[name](*theirs)
        torch.autograd.backward(out, [gy, gh])
        torch.autograd.backward(expected, [gy, gh])
        for a, e in zip(out, expected):
            assert torch.equal(a, e), name
        for a, e in zip(ours, theirs):
            assert torch.equal(a.grad, e.grad), name


def test_add_norm_fake_tensors_trace(ops):
    from parc.runtime.kernels import ops_gpt, ops_llama

    x, r, w, b = randn(4, 16), randn(4, 16, seed=3), randn(16, seed=1), randn(16, seed=2)
    for op, args in [(ops_gpt.add_layer_norm_fwd, (x, r, w, b, 1e-5)), (ops_llama.add_rms_norm_fwd, (x, r, w, 1e-5))]:
        torch.library.opcheck(op, [a.clone().requires_grad_(True) if isinstance(a, torch.Tensor) else a for a in args])
