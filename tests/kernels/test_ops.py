"""Each fused CPU op against its eager reference: forward, every input gradient, gradcheck.

fp32 and bf16 use torch.testing.assert_close's default tolerances for the dtype;
shapes include one row, widths that are not a multiple of the vector width and a
very large row (1 × 65543).
"""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from parc.runtime.kernels import reference

SHAPES = [(1, 7), (3, 37), (5, 1027), (1, 65536 + 7)]
DTYPES = [torch.float32, torch.bfloat16]


def leaves(*tensors):
    return [t.detach().clone().requires_grad_(True) if t is not None else None for t in tensors]


def compare(compiled, ref, inputs, seed=0):
    """Forward and all input gradients of ``compiled`` equal ``ref``'s."""
    ours, theirs = leaves(*inputs), leaves(*inputs)
    out, expected = compiled(*ours), ref(*theirs)
    out = out if isinstance(out, tuple) else (out,)
    expected = expected if isinstance(expected, tuple) else (expected,)
    gen = torch.Generator().manual_seed(seed)
    grads = [torch.randn(e.shape, generator=gen).to(device=e.device, dtype=e.dtype) for e in expected]
    for o, e in zip(out, expected):
        assert o.dtype == e.dtype and o.shape == e.shape
        assert_close(o, e)
    torch.autograd.backward(out, grads)
    torch.autograd.backward(expected, grads)
    for a, b in zip(ours, theirs):
        if a is not None:
            assert a.grad is not None and a.grad.dtype == b.grad.dtype
            assert_close(a.grad, b.grad)


def randn(*shape, dtype=torch.float32, seed=0, scale=1.0):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=gen) * scale).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_layer_norm(ops, shape, dtype):
    C = shape[-1]
    x = randn(*shape, dtype=dtype, scale=3.0) + 1.5
    w, b = randn(C, dtype=dtype, seed=1), randn(C, dtype=dtype, seed=2)
    compare(lambda x, w, b: ops.layer_norm(x, w, b, 1e-5), lambda x, w, b: reference.layer_norm(x, w, b, 1e-5), (x, w, b))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_rms_norm(ops, shape, dtype):
    x, w = randn(*shape, dtype=dtype, scale=2.0), randn(shape[-1], dtype=dtype, seed=1)
    compare(lambda x, w: ops.rms_norm(x, w, 1e-6), lambda x, w: reference.rms_norm(x, w, 1e-6), (x, w))


@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_bias_gelu(ops, shape, dtype, with_bias):
    x = randn(*shape, dtype=dtype, scale=4.0)  # reaches both tails of the tanh
    b = randn(shape[-1], dtype=dtype, seed=1) if with_bias else None
    compare(ops.bias_gelu, reference.bias_gelu, (x, b))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_swiglu(ops, shape, dtype):
    gate, up = randn(*shape, dtype=dtype, scale=4.0), randn(*shape, dtype=dtype, seed=1)
    compare(ops.swiglu, reference.swiglu, (gate, up))


def qk(B, T, heads, kv_heads, D, dtype, seed=0):
    """q and k as Attention makes them: (B, T, heads·D) viewed and transposed to (B, heads, T, D)."""
    q = randn(B, T, heads * D, dtype=dtype, seed=seed).view(B, T, heads, D).transpose(1, 2)
    k = randn(B, T, kv_heads * D, dtype=dtype, seed=seed + 1).view(B, T, kv_heads, D).transpose(1, 2)
    return q, k


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dims", [(2, 5, 4, 2, 6), (1, 1, 1, 1, 2), (1, 33, 3, 3, 130)])
def test_rotary(ops, dims, dtype):
    q, k = qk(*dims, dtype)
    compare(lambda q, k: ops.rotary(q, k, 10000.0), lambda q, k: reference.rotary(q, k, 10000.0), (q, k))


def test_rotary_keeps_layout_and_dtype_like_the_model(ops):
    q, k = qk(2, 5, 4, 2, 8, torch.bfloat16)
    rq, rk = ops.rotary(q, k, 500.0)
    assert rq.dtype == rk.dtype == torch.bfloat16  # computed in fp32, rounded (model.py's rotary)
    assert rq.stride() == q.stride() and rk.stride() == k.stride()


def test_rotary_one_output_used(ops):
    """q and k share one op: a loss of q alone gives q its gradient (k's arrives as zeros)."""
    q, k = leaves(*qk(2, 5, 4, 2, 6, torch.float32))
    rq, _ = ops.rotary(q, k, 10000.0)
    ref_q = leaves(q)[0]
    expected, _ = reference.rotary(ref_q, k.detach(), 10000.0)
    grad = randn(*rq.shape, seed=2)
    rq.backward(grad)
    expected.backward(grad)
    assert_close(q.grad, ref_q.grad)
    assert k.grad is None or torch.all(k.grad == 0)


def test_rotary_tables_kept_only_for_plain_training_tensors(ops):
    """Every layer reuses one step's tables; none made under inference mode (backward cannot
    save those) or fake tensors (the planner's tracing) is kept for a later training step."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from parc.runtime.kernels import ops_llama

    ops_llama._TABLES.clear()
    with torch.inference_mode():
        ops.rotary(*qk(1, 7, 2, 2, 4, torch.float32), 10000.0)
    with FakeTensorMode():
        ops.rotary(*qk(1, 7, 2, 2, 4, torch.float32), 10000.0)
    assert not ops_llama._TABLES
    q, k = leaves(*qk(1, 7, 2, 2, 4, torch.float32))
    rq, rk = ops.rotary(q, k, 10000.0)
    (rq.sum() + rk.sum()).backward()  # raises if an inference-mode table was saved
    assert len(ops_llama._TABLES) == 1
    tables = next(iter(ops_llama._TABLES.values()))
    assert not torch.is_inference(tables[0]) and type(tables[0]) is torch.Tensor
    assert all(torch.equal(a, b) for a, b in zip(tables, ops_llama.rotary_tables(7, 4, 10000.0, q.device)))


def test_reference_rotary_is_the_models():
    from parc.runtime.models.attention import rotary as model_rotary

    q, _ = qk(2, 9, 4, 4, 16, torch.float32)
    assert torch.equal(reference.rotary_one(q, 10000.0), model_rotary(q, 10000.0))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,padded,vocab", [(1, 7, 7), (6, 40, 37), (3, 1031, 1000), (1, 65543, 65536)])
def test_cross_entropy(ops, rows, padded, vocab, dtype):
    logits = randn(rows, padded, dtype=dtype, scale=3.0)
    targets = torch.randint(0, vocab, (rows,), generator=torch.Generator().manual_seed(3))
    compare(
        lambda l: ops.cross_entropy(l, targets, vocab_size=vocab),
        lambda l: reference.cross_entropy(l, targets, vocab),
        (logits,),
    )


@pytest.mark.parametrize("tp", [2, 3])
def test_cross_entropy_kernels_over_vocab_shards(ops, tp):
    """Each shard's stats combine (as the three all-reduces do) into the full loss; each
    shard's grad is its columns of the full grad; padding columns (all in the last
    shard, one shard entirely padding for tp = 3) get zero."""
    from parc.runtime.kernels.ops import cross_entropy_grad, cross_entropy_stats

    rows, vocab, cols = (2, 5), 50, 24  # padded vocab tp·cols ≥ vocab
    logits = randn(*rows, tp * cols, scale=3.0).requires_grad_(True)
    targets = torch.randint(0, vocab, rows, generator=torch.Generator().manual_seed(4))
    shards = logits.detach().split(cols, dim=-1)
    stats = [cross_entropy_stats(s, targets, r * cols, vocab) for r, s in enumerate(shards)]
    peak = torch.stack([m for m, _, _ in stats]).max(0).values
    total = sum(s * (m - peak).exp() for m, s, _ in stats)
    picked = sum(p for _, _, p in stats)
    lse = peak + total.log()
    expected = reference.cross_entropy(logits, targets, vocab)
    assert_close(lse - picked, expected.detach())
    grad = randn(*rows, seed=5)
    expected.backward(grad)
    got = torch.cat([cross_entropy_grad(s, targets, lse, grad, r * cols, vocab) for r, s in enumerate(shards)], -1)
    assert_close(got, logits.grad)
    assert torch.all(got[..., vocab:] == 0)


def test_gradcheck(ops):
    """float64 gradcheck of every op (double kernels compute in double)."""
    d = dict(dtype=torch.float64)
    x, w, b = randn(3, 9, **d), randn(9, **d, seed=1), randn(9, **d, seed=2)
    checks = [
        (lambda x, w, b: ops.layer_norm(x, w, b, 1e-5), (x, w, b)),
        (lambda x, w: ops.rms_norm(x, w, 1e-5), (x, w)),
        (ops.bias_gelu, (x * 2, b)),
        (ops.bias_gelu, (x * 2,)),
        (ops.swiglu, (x * 2, randn(3, 9, **d, seed=3))),
        (lambda q, k: ops.rotary(q, k, 10000.0), qk(2, 3, 2, 1, 6, torch.float64)),
    ]
    targets = torch.tensor([0, 3, 6])
    checks.append((lambda l: ops.cross_entropy(l, targets, vocab_size=7), (x,)))
    for fn, inputs in checks:
        assert torch.autograd.gradcheck(fn, leaves(*inputs))


def test_fake_tensors_trace(ops):
    """The ops have fake implementations: torch.library's own checks pass (fake, schema, autograd)."""
    x, w, b = randn(4, 16), randn(16, seed=1), randn(16, seed=2)
    from parc.runtime.kernels import ops as module
    from parc.runtime.kernels.ops_llama import rotary_tables

    for op, args in [
        (module.layer_norm_fwd, (x, w, b, 1e-5)),
        (module.rms_norm_fwd, (x, w, 1e-5)),
        (module._bias_gelu, (x, b)),
        (module._swiglu, (x, w.expand(4, 16).contiguous())),
        (module._rotary_qk, (*qk(2, 3, 2, 1, 4, torch.float32), *rotary_tables(3, 4, 10000.0, x.device), 1.0)),
    ]:
        torch.library.opcheck(op, [a.clone().requires_grad_(a.is_floating_point()) if isinstance(a, torch.Tensor) else a for a in args])
