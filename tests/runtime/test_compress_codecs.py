"""The compression codecs alone (runtime/parallel/data/compress.py, compress_pp.py): what they send and
what error feedback restores. The trainers' convergence is tests/parity/test_compress.py."""

from __future__ import annotations

import pytest
import torch

from parc.runtime.parallel.data import compress
from parc.runtime.parallel.data.compress import powersgd_pays
from parc.runtime.parallel.pipeline.compress_pp import LowRankBackprop

SHAPE = (2, 8, 16)  # (micro_batch, tokens, hidden): a 16 × 16 matrix


def test_low_rank_gradient_goes_back_exactly():
    generator = torch.Generator().manual_seed(0)
    grad = (torch.randn(16, 2, generator=generator) @ torch.randn(2, 16, generator=generator)).view(SHAPE)
    codec = LowRankBackprop(SHAPE, rank=4, stages=(1,))
    flat = codec.encode(1, grad)
    assert flat.numel() == codec.wire_numel() == 4 * (16 + 16)
    torch.testing.assert_close(codec.decode(flat), grad, rtol=1e-5, atol=1e-5)


def test_lazy_error_sends_what_was_left_out_later():
    """A constant full-rank gradient: rank 1 alone keeps missing the same part; with the
    lazy error carried, the mean of what arrives approaches the gradient."""
    grad = torch.randn(SHAPE, generator=torch.Generator().manual_seed(1))

    def mean_received(lazy: bool, steps: int = 64) -> torch.Tensor:
        codec = LowRankBackprop(SHAPE, rank=1, stages=(1,), lazy_error=lazy)
        return sum(codec.decode(codec.encode(1, grad)) for _ in range(steps)) / steps

    exact_norm = grad.norm()
    with_error = (mean_received(True) - grad).norm() / exact_norm
    without = (mean_received(False) - grad).norm() / exact_norm
    assert with_error < 0.2 < without, (with_error, without)


def test_codec_leaves_uncompressed_stages_alone():
    codec = LowRankBackprop(SHAPE, rank=4, stages=(2, 3))
    assert codec.compresses(2) and codec.compresses(3) and not codec.compresses(1)


def test_powersgd_factors_only_matrices_that_gain():
    assert powersgd_pays((64, 64), 4)  # 4·128 < 4096
    assert not powersgd_pays((64,), 4)  # a bias goes whole
    assert not powersgd_pays((8, 8), 4)  # 4·16 = 64: nothing saved
    assert powersgd_pays((16, 4, 8), 2)  # read as 16 × 32


# fp16 (compress.py, Note [compression under fp16]): two identical ranks, simulated: the
# all-reduce doubles the buffer and the all-gather repeats this rank's part, so a
# collective-free process runs the reductions' arithmetic


class _TwoIdenticalRanks:
    """Stands in for torch.distributed inside compress.py."""

    @staticmethod
    def all_reduce(tensor, group=None):
        tensor.mul_(2)

    @staticmethod
    def all_gather(parts, mine, group=None):
        for part in parts:
            part.copy_(mine)


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 24), torch.nn.Linear(24, 16))


def _grads(model, step: int, scale: float, overflow: bool = False):
    generator = torch.Generator().manual_seed(step)
    for p in model.parameters():
        p.grad = torch.randn(p.shape, generator=generator) * scale
    if overflow:
        next(model.parameters()).grad[0, 0] = float("inf")


def _compressor(kind, model):
    if kind == "powersgd":
        reducer = compress.PowerSGDGradients(model, None, rank=2, loss_scaled=True)
    else:
        reducer = compress.TopKGradients(model, None, ratio=0.2, loss_scaled=True)
    reducer.size = 2
    return reducer


@pytest.mark.parametrize("kind", ["powersgd", "topk"])
def test_fp16_overflow_skips_the_error_feedback(kind, monkeypatch):
    """Steps at scales 2^10 then 2^4, with an overflowed step between them, give the
    gradients (over the scale) of the same steps at scale 1 without the overflow: the error
    is kept in the loss's units and the overflowed step leaves no trace."""
    monkeypatch.setattr(compress, "dist", _TwoIdenticalRanks)
    plain, scaled = _model(), _model()
    plain_reducer, scaled_reducer = _compressor(kind, plain), _compressor(kind, scaled)
    for step, scale in ((1, 2.0**10), (2, 2.0**4)):
        _grads(scaled, 99, 2.0**10, overflow=True)  # skipped: every gradient becomes inf
        scaled_reducer.finish(2.0**10)
        assert all(torch.isinf(p.grad).all() for p in scaled.parameters())
        _grads(plain, step, 1.0)
        plain_reducer.finish()
        _grads(scaled, step, scale)
        scaled_reducer.finish(scale)
        for p, q in zip(plain.parameters(), scaled.parameters()):
            torch.testing.assert_close(q.grad / scale, p.grad, rtol=1e-5, atol=1e-6)


def test_lazy_error_is_kept_unscaled_and_overflow_leaves_the_codec():
    grads = [torch.randn(SHAPE, generator=torch.Generator().manual_seed(k)) for k in range(3)]
    plain = LowRankBackprop(SHAPE, rank=2, stages=(1,), lazy_error=True)
    scaled = LowRankBackprop(SHAPE, rank=2, stages=(1,), lazy_error=True)
    for grad, scale in zip(grads, (2.0**12, 2.0**3, 2.0**7)):
        overflowed = scaled.encode(1, torch.full(SHAPE, float("inf")), scale=scale)
        assert torch.isnan(overflowed).all()
        want = plain.decode(plain.encode(1, grad))
        got = scaled.decode(scaled.encode(1, grad * scale, scale=scale)) / scale
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


class _Recorded(_TwoIdenticalRanks):
    """Two identical ranks, noting the dtype of every tensor that goes on the wire."""

    sent: list = []

    @classmethod
    def all_reduce(cls, tensor, group=None):
        cls.sent.append(tensor.dtype)
        tensor.mul_(2)

    @classmethod
    def all_gather(cls, parts, mine, group=None):
        cls.sent.append(mine.dtype)
        for part in parts:
            part.copy_(mine)


@pytest.mark.parametrize("kind", ["powersgd", "topk"])
def test_bf16_reduction_sends_bf16_and_keeps_fp32_gradients(kind, monkeypatch):
    """``reduce_dtype`` (train.grad_reduce = bf16, Note [bf16 on the wire]): every float on the
    wire is bf16, the gradients and the error feedback stay fp32, the mean is the fp32 run's
    to bf16's rounding, and an fp16 overflow still skips the step."""
    monkeypatch.setattr(compress, "dist", _Recorded)
    plain, low = _model(), _model()
    plain_reducer, low_reducer = _compressor(kind, plain), _compressor(kind, low)
    low_reducer.reduce_dtype = torch.bfloat16
    for step in (1, 2):
        _grads(plain, step, 1.0)
        plain_reducer.finish()
        _grads(low, step, 1.0)
        _Recorded.sent = []
        low_reducer.finish()
        assert {d for d in _Recorded.sent if d.is_floating_point} == {torch.bfloat16}, _Recorded.sent
        for p, q in zip(plain.parameters(), low.parameters()):
            assert q.grad.dtype == torch.float32
            torch.testing.assert_close(q.grad, p.grad, rtol=2**-7, atol=2**-7 * float(p.grad.abs().max()))
    error = low_reducer.error if kind == "topk" else low_reducer.error[0]
    assert error.dtype == torch.float32
    _grads(low, 3, 2.0**10, overflow=True)
    low_reducer.finish(2.0**10)
    assert all(torch.isinf(p.grad).all() for p in low.parameters())
