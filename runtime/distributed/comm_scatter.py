"""The scatter/gather autograd pair: a replicated tensor split over a group and joined back.

Takes: a tensor, a group (``None``: a group of one) and a dim. Gives:
``scatter_to_group`` (forward: keep this rank's chunk; backward: all-gather) and
``gather_from_group`` (forward: all-gather; backward: keep this rank's chunk), built on
comm.py's primitives as its own pairs are. Their users: sequence parallelism's
replicated embedding and whole head (``transformer.py``) and per-layer layouts' reshards
(``hetero.py``), so a build ships this module with the "sequence parallel" feature
(features.py), which per-layer layouts turn on too.
"""

from __future__ import annotations

import torch

from .comm import _all_gather, _split, group_size


class _ScatterToGroup(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, dim):
        ctx.group, ctx.dim = group, dim
        return _split(x, group, dim)

    @staticmethod
    def backward(ctx, grad):
        return _all_gather(grad, ctx.group, ctx.dim), None, None


class _GatherFromGroup(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, dim):
        ctx.group, ctx.dim = group, dim
        return _all_gather(x, group, dim)

    @staticmethod
    def backward(ctx, grad):
        return _split(grad, ctx.group, ctx.dim), None, None


def scatter_to_group(x, group, dim):
    """Forward: keep this rank's chunk of ``dim``. Backward: all-gather along ``dim``."""
    return x if group_size(group) == 1 else _ScatterToGroup.apply(x, group, dim)


def gather_from_group(x, group, dim):
    """Forward: all-gather along ``dim``. Backward: keep this rank's chunk."""
    return x if group_size(group) == 1 else _GatherFromGroup.apply(x, group, dim)
