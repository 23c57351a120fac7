"""The compression codecs alone (runtime/compress.py, compress_pp.py): what they send and
what error feedback restores. The trainers' convergence is tests/parity/test_compress.py."""

from __future__ import annotations

import torch

from parc.runtime.compress import powersgd_pays
from parc.runtime.compress_pp import LowRankBackprop

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
