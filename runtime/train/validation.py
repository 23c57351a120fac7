"""Synthetic data's validation samples, for evaluation (``train.eval``).

Takes: the training dataset (``data.SyntheticTokens``). Gives: ``ValidationStream``,
train.py's ``data.ValidationStream``: data.py gives it from here (Note [data by
feature]), so only a build that evaluates ships this module (codegen/features.py).
"""

from __future__ import annotations


class ValidationStream:
    """Synthetic data's validation samples: the training chain's, at indices training never
    reads (from ``FIRST``), so the two streams are disjoint and alike.

    A CPU generator keeps only the low 32 bits of its seed, and the seed of
    ``draws.sample_generator`` (data.py's ``_generator``) is an odd multiple of the
    index plus a constant, a bijection on the index modulo 2**32:
    training samples below 2**31 and validation samples from 2**31 (up to 2**31 of each)
    never share a seed. An offset of 2**48 would alias every sample.
    """

    FIRST = 1 << 31

    def __init__(self, dataset):
        self.dataset = dataset

    def batch(self, indices):
        return self.dataset.batch([self.FIRST + i for i in indices])
