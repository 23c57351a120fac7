"""The Triton kernels against the eager references, run on CPU by Triton's interpreter.

``TRITON_INTERPRET=1`` must be set before triton_ops is imported (it decides what
``@triton.jit`` makes), so this module sets it at import; ``PARC_TRITON_ON_CPU=1``
(set per test) sends CPU tensors through the custom ops to Triton, so the autograd
registration is exercised too. Shapes are small: the interpreter is slow. The same
checks run on a GPU with bench/gpu_kernels.sh.
"""

from __future__ import annotations

import sys
from pathlib import Path

import os

ON_GPU = os.environ.get("PARC_TRITON_TESTS_ON_GPU") == "1"  # bench/gpu_kernels.sh sets it
if not ON_GPU:
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported

import pytest  # noqa: E402
import torch  # noqa: E402

from test_ops import compare, leaves, qk, randn  # noqa: E402

triton = pytest.importorskip("triton", reason="triton is not installed: pip install -e '.[dev]'")
# The interpreter evaluates exp(-u) for very negative u as numpy does (inf, then 1/inf = 0).
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")

from parc.runtime.kernels import ops, reference  # noqa: E402
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))  # built.py
import built  # noqa: E402

DEVICE = "cuda" if ON_GPU else "cpu"
SHAPES = [(1, 7), (3, 37), (2, 4096 + 7)]  # the last: two column blocks and a tail
DTYPES = [torch.float32, torch.bfloat16]


@pytest.fixture(autouse=True)
def triton_path(monkeypatch):
    if not ON_GPU:
        monkeypatch.setenv("PARC_TRITON_ON_CPU", "1")


def on(*tensors):
    return tuple(None if t is None else t.to(DEVICE) for t in tensors)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_norms(shape, dtype):
    C = shape[-1]
    x, w, b = on(randn(*shape, dtype=dtype, scale=3.0) + 1.5, randn(C, dtype=dtype, seed=1), randn(C, dtype=dtype, seed=2))
    compare(lambda x, w, b: ops.layer_norm(x, w, b, 1e-5), lambda x, w, b: reference.layer_norm(x, w, b, 1e-5), (x, w, b))
    compare(lambda x, w: ops.rms_norm(x, w, 1e-6), lambda x, w: reference.rms_norm(x, w, 1e-6), (x, w))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_activations(shape, dtype):
    x, b, up = on(randn(*shape, dtype=dtype, scale=4.0), randn(shape[-1], dtype=dtype, seed=1), randn(*shape, dtype=dtype, seed=2))
    compare(ops.bias_gelu, reference.bias_gelu, (x, b))
    compare(ops.bias_gelu, reference.bias_gelu, (x, None))
    compare(ops.swiglu, reference.swiglu, (x, up))


@pytest.mark.parametrize("dtype", DTYPES)
def test_rotary(dtype):
    q, k = on(*qk(2, 5, 4, 2, 6, dtype))
    compare(lambda q, k: ops.rotary(q, k, 10000.0), lambda q, k: reference.rotary(q, k, 10000.0), (q, k))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,padded,vocab", [(1, 7, 7), (6, 40, 37), (2, 4096 + 40, 4096 + 3)])
def test_cross_entropy(rows, padded, vocab, dtype):
    (logits,) = on(randn(rows, padded, dtype=dtype, scale=3.0))
    targets = torch.randint(0, vocab, (rows,), generator=torch.Generator().manual_seed(3)).to(DEVICE)
    compare(lambda l: ops.cross_entropy(l, targets, vocab_size=vocab), lambda l: reference.cross_entropy(l, targets, vocab), (logits,))


def test_cross_entropy_shard_of_padding_only():
    """A vocab shard holding only padding columns: max −inf, sum 0, no target."""
    (logits,) = on(randn(3, 8))
    targets = torch.tensor([0, 1, 2], device=DEVICE)
    row_max, sum_exp, picked = ops.cross_entropy_stats(logits, targets, 16, 10)
    assert torch.all(row_max == float("-inf")) and torch.all(sum_exp == 0) and torch.all(picked == 0)


def test_gradcheck():
    """float64 (the kernels then compute in fp64); fast mode: the interpreter is slow."""
    d = dict(dtype=torch.float64)
    x, w, b = on(randn(2, 7, **d), randn(7, **d, seed=1), randn(7, **d, seed=2))
    targets = torch.tensor([0, 6], device=DEVICE)
    for fn, inputs in [
        (lambda x, w, b: ops.layer_norm(x, w, b, 1e-5), (x, w, b)),
        (lambda x, w: ops.rms_norm(x, w, 1e-5), (x, w)),
        (ops.bias_gelu, (x * 2, b)),
        (ops.swiglu, (x * 2, x.flip(0))),
        (lambda q, k: ops.rotary(q, k, 10000.0), on(*qk(1, 3, 2, 1, 6, torch.float64))),
        (lambda l: ops.cross_entropy(l, targets, vocab_size=7), (x,)),
    ]:
        assert torch.autograd.gradcheck(fn, leaves(*inputs), fast_mode=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", [(2, 4, 2, 6, 6, 8, True), (1, 2, 1, 3, 37, 8, False), (1, 2, 2, 40, 40, 16, True)])
def test_block_attention(case, dtype):
    """Ring attention's block step (ops.block_attention and its backward) against the reference;
    the last case spans two query and key blocks of the kernel."""
    B, H, Hkv, Tq, Tk, D, causal = case
    q, k, v, grad = (randn(B, heads, T, D, dtype=dtype, seed=s).to(DEVICE)
                     for s, (heads, T) in enumerate(((H, Tq), (Hkv, Tk), (Hkv, Tk), (H, Tq))))
    scale = D ** -0.5
    out, lse = ops.block_attention(q, k, v, causal, scale)
    want_out, want_lse = reference.block_attention(q, k, v, causal, scale)
    torch.testing.assert_close(out, want_out, rtol=2e-5, atol=2e-5)
    torch.testing.assert_close(lse, want_lse, rtol=2e-5, atol=2e-5)
    got = ops.block_attention_backward(grad, q, k, v, out, lse, causal, scale)
    want = reference.block_attention_backward(grad, q, k, v, want_out, want_lse, causal, scale)
    for name, a, b in zip(("dq", "dk", "dv"), got, want):
        torch.testing.assert_close(a, b, rtol=2e-5, atol=2e-5, msg=name)


@pytest.mark.parametrize("dtype", DTYPES if ON_GPU else [torch.float32])
@pytest.mark.parametrize("shape", SHAPES)
def test_add_norms(shape, dtype):
    """The residual add fused into each norm (triton_add_norm.py): y and h, gradients into both.

    bf16 on a GPU only: the interpreter rounds the fp32 → bf16 cast of h toward zero
    (fp_downcast_rounding is not emulated), so its h is one bf16 step off torch's
    nearest-even sum here and again."""
    C = shape[-1]
    x, r = on(randn(*shape, dtype=dtype, scale=2.0, seed=3), randn(*shape, dtype=dtype, scale=3.0, seed=4) + 1.5)
    w, b = on(randn(C, dtype=dtype, seed=1), randn(C, dtype=dtype, seed=2))
    compare(lambda x, r, w, b: ops.add_layer_norm(x, r, w, b, 1e-5),
            lambda x, r, w, b: reference.add_layer_norm(x, r, w, b, 1e-5), (x, r, w, b))
    compare(lambda x, r, w: ops.add_rms_norm(x, r, w, 1e-6), lambda x, r, w: reference.add_rms_norm(x, r, w, 1e-6),
            (x, r, w))
    compare(lambda x, r, w: ops.add_rms_norm(x, r, w, 1e-6)[0],  # h unused: no gradient of it
            lambda x, r, w: reference.add_rms_norm(x, r, w, 1e-6)[0], (x, r, w))


def test_add_norm_gradcheck():
    d = dict(dtype=torch.float64)
    x, r, w, b = on(randn(2, 7, **d), randn(2, 7, **d, seed=3), randn(7, **d, seed=1), randn(7, **d, seed=2))
    for fn, inputs in [
        (lambda x, r, w, b: ops.add_layer_norm(x, r, w, b, 1e-5), (x, r, w, b)),
        (lambda x, r, w: ops.add_rms_norm(x, r, w, 1e-5), (x, r, w)),
    ]:
        assert torch.autograd.gradcheck(fn, leaves(*inputs), fast_mode=True)


def _routing(tokens, experts=4, top_k=2, seed=0):
    """test_moe_ops.routing on DEVICE: expert ``experts - 1`` gets no rows."""
    from test_moe_ops import routing

    index, counts = routing(tokens, experts, top_k, seed)
    return index.to(DEVICE), counts.to(DEVICE)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("width", [7, 1024 + 5])  # the last: two column blocks and a tail
def test_moe_permute_and_combine(dtype, width):
    """triton_moe.py's gather and segment sums, forward and every gradient (rows and weights);
    bf16 rounds once, from the fp32 sum, as the reference does."""
    index, _ = _routing(5)
    x, rows, weight = on(randn(5, width, dtype=dtype), randn(index.numel(), width, dtype=dtype, seed=1),
                         torch.rand(index.numel(), generator=torch.Generator().manual_seed(2)).to(dtype))
    compare(lambda t: ops.permute_rows(t, index), lambda t: reference.permute_rows(t, index), (x,))
    compare(lambda r, w: ops.combine_rows(r, index, w, 5), lambda r, w: reference.combine_rows(r, index, w, 5),
            (rows, weight))
    # a token no slot chose (row 5 of 6) gets zero rows back, and a zero gradient
    compare(lambda r, w: ops.combine_rows(r, index, w, 6), lambda r, w: reference.combine_rows(r, index, w, 6),
            (rows, weight))


def test_moe_combine_is_deterministic_and_in_row_order():
    index, _ = _routing(5)
    rows, weight = on(randn(index.numel(), 40, seed=1), torch.rand(index.numel()))
    eager = torch.zeros(5, 40, device=DEVICE).index_add_(0, index, rows * weight.unsqueeze(1))
    out = ops.combine_rows(rows, index, weight, 5)
    torch.testing.assert_close(out, eager)
    assert torch.equal(out, ops.combine_rows(rows, index, weight, 5))


@pytest.mark.parametrize("dtype", DTYPES)
def test_moe_grouped_mm(dtype):
    """Note [grouped GEMM on CUDA]: bf16 on a GPU goes through torch's grouped GEMM, the rest
    one mm per expert; an expert with no rows gets a zero weight gradient."""
    _, counts = _routing(5)
    x, weight = on(randn(int(counts.sum()), 16, dtype=dtype), randn(4, 24, 16, dtype=dtype, seed=1, scale=0.2))
    compare(lambda a, w: ops.grouped_mm(a, w, counts), lambda a, w: reference.grouped_mm(a, w, counts), (x, weight))


def test_moe_gradcheck():
    """float64 (the interpreter computes the sums in fp64)."""
    index, counts = _routing(4, experts=3, seed=1)
    d = dict(dtype=torch.float64)
    x, rows, weight = on(randn(4, 6, **d), randn(index.numel(), 6, **d, seed=1), randn(index.numel(), **d, seed=2))
    a, w = on(randn(int(counts.sum()), 4, **d, seed=3), randn(3, 5, 4, **d, seed=4))
    for fn, inputs in [
        (lambda t: ops.permute_rows(t, index), (x,)),
        (lambda r, w: ops.combine_rows(r, index, w, 4), (rows, weight)),
        (lambda p, q: ops.grouped_mm(p, q, counts), (a, w)),
    ]:
        assert torch.autograd.gradcheck(fn, leaves(*inputs), fast_mode=True)


def test_moe_model_takes_the_triton_ops(monkeypatch):
    """A tiny llama with 4 experts, top-2, kernels = compiled on DEVICE (CUDA: Triton): its
    MoE layers call the three ops (no device gate left in moe.py), and its loss and every
    gradient match the eager build's."""
    from parc.runtime.train import data
    from parc.runtime.models import model
    from parc.runtime.layout.model_desc import ModelConfig

    config = ModelConfig(arch="llama", layers=1, hidden=16, heads=2, kv_heads=2, ffn=24, vocab=32, padded_vocab=32,
                         seq_len=8, experts=4, top_k=2)
    calls = []
    for name in ("permute_rows", "combine_rows", "grouped_mm"):
        original = getattr(ops, name)
        monkeypatch.setattr(ops, name, lambda *a, _f=original, _n=name: calls.append(_n) or _f(*a))
    x, y = data.SyntheticTokens(32, 8, seed=7).batch(data.sample_indices(1, 0, micro_batch=2, grad_accum=1,
                                                                         dp_rank=0, dp_size=1))
    results = []
    for kernels in ("compiled", "eager"):
        net = built.build(config, tp_group=None, sequence_parallel=False, tp_plan={}, seed=7, device=DEVICE,
                                kernels=kernels)
        model.use_kernels(net, kernels, DEVICE)
        loss = net(x.to(DEVICE), y.to(DEVICE))
        loss.backward()
        results.append((loss.detach(), {k: p.grad for k, p in net.named_parameters()}))
        if kernels == "compiled":
            assert sorted(set(calls)) == ["combine_rows", "grouped_mm", "permute_rows"], calls
            calls.clear()
    assert not calls
    (fused_loss, fused_grads), (eager_loss, eager_grads) = results
    torch.testing.assert_close(fused_loss, eager_loss)
    for key in eager_grads:
        torch.testing.assert_close(fused_grads[key], eager_grads[key], msg=key)
