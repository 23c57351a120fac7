"""Collectives along a dim and their autograd pairs: a tensor split, gathered, reduce-scattered.

Takes: a tensor, a group (``None``: a group of one) and a dim. Gives the primitives
``_split``, ``_all_gather`` and ``_reduce_scatter`` and four autograd pairs built on them,
as comm.py's are on its all-reduce: ``reduce_scatter_to_group`` (forward: reduce-scatter
along ``dim``; backward: all-gather), ``all_gather_from_group`` (the reverse),
``scatter_to_group`` (forward: keep this rank's chunk; backward: all-gather) and
``gather_from_group`` (the reverse). Their users split or join activations along a dim:
sequence parallelism (``layers.py`` and ``transformer.py`` import this module in their sp
branches; ``sp_columns.py``), per-layer layouts' reshards (``hetero.py``), context
parallelism, KV replication, the 2D grid, the sub-batch overlap and ``comm_async.py``. So a
build ships it with those features (features.py's "sequence parallel" for the sp branches),
not with 1D tensor parallelism alone, whose collectives are all-reduces (comm.py).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from .comm import _all_reduce, _issued, exposed, group_rank, group_size

# ---- primitives -------------------------------------------------------------------


def _split(x: torch.Tensor, group, dim: int) -> torch.Tensor:
    size = group_size(group)
    if size == 1:
        return x
    if x.shape[dim] % size:
        raise ValueError(f"dim {dim} of size {x.shape[dim]} does not split over {size} ranks")
    return x.chunk(size, dim=dim)[group_rank(group)].contiguous()


def _all_gather(x: torch.Tensor, group, dim: int) -> torch.Tensor:
    size = group_size(group)
    if size == 1:
        return x
    x = x.contiguous()
    parts = [torch.empty_like(x) for _ in range(size)]
    _issued()
    with exposed():
        dist.all_gather(parts, x, group=group)
    return torch.cat(parts, dim=dim)


def _reduce_scatter(x: torch.Tensor, group, dim: int) -> torch.Tensor:
    size = group_size(group)
    if size == 1:
        return x
    if x.shape[dim] % size:
        raise ValueError(f"dim {dim} of size {x.shape[dim]} does not split over {size} ranks")
    parts = [p.contiguous() for p in x.chunk(size, dim=dim)]
    out = torch.empty_like(parts[0])
    try:
        with exposed():
            dist.reduce_scatter(out, parts, group=group)
        _issued()
        return out
    except RuntimeError:
        if dist.get_backend(group) != "gloo":
            raise
    # Note [reduce-scatter on gloo]: older torch's gloo has no reduce-scatter (every
    # rank raises before sending anything); all-reduce and keep our chunk instead:
    # the same sums, the same numbers.
    return _split(_all_reduce(x, group), group, dim)


# ---- autograd pairs ---------------------------------------------------------------


class _ReduceScatterToGroup(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, dim):
        ctx.group, ctx.dim = group, dim
        return _reduce_scatter(x, group, dim)

    @staticmethod
    def backward(ctx, grad):
        return _all_gather(grad, ctx.group, ctx.dim), None, None


class _AllGatherFromGroup(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, dim):
        ctx.group, ctx.dim = group, dim
        return _all_gather(x, group, dim)

    @staticmethod
    def backward(ctx, grad):
        return _reduce_scatter(grad, ctx.group, ctx.dim), None, None


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


# ---- public wrappers --------------------------------------------------------------


def reduce_scatter_to_group(x, group, dim):
    """Forward: reduce-scatter along ``dim``. Backward: all-gather along ``dim``."""
    return x if group_size(group) == 1 else _ReduceScatterToGroup.apply(x, group, dim)


def all_gather_from_group(x, group, dim):
    """Forward: all-gather along ``dim``. Backward: reduce-scatter along ``dim``."""
    return x if group_size(group) == 1 else _AllGatherFromGroup.apply(x, group, dim)


def scatter_to_group(x, group, dim):
    """Forward: keep this rank's chunk of ``dim``. Backward: all-gather along ``dim``."""
    return x if group_size(group) == 1 else _ScatterToGroup.apply(x, group, dim)


def gather_from_group(x, group, dim):
    """Forward: all-gather along ``dim``. Backward: keep this rank's chunk."""
    return x if group_size(group) == 1 else _GatherFromGroup.apply(x, group, dim)
