"""Communication mappings for tensor and sequence parallelism (Megatron style).

Three layers: private primitives that do nothing for a group of one; autograd
Functions pairing a forward collective with its backward; public wrappers whose
docstrings name both directions. Every call takes an explicit ``group``; ``None``
means a group of one. Used by ``layers.py`` and ``model.py``.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def group_size(group) -> int:
    return 1 if group is None else dist.get_world_size(group)


def group_rank(group) -> int:
    return 0 if group is None else dist.get_rank(group)


# ---- primitives -------------------------------------------------------------------


def _all_reduce(x: torch.Tensor, group, op=dist.ReduceOp.SUM) -> torch.Tensor:
    """A reduced copy of ``x`` (never in place: ``x`` may be saved for backward)."""
    if group_size(group) == 1:
        return x
    x = x.contiguous().clone()
    dist.all_reduce(x, op=op, group=group)
    return x


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
        dist.reduce_scatter(out, parts, group=group)
        return out
    except RuntimeError:
        if dist.get_backend(group) != "gloo":
            raise
    # Note [reduce-scatter on gloo]: older torch's gloo has no reduce-scatter (every
    # rank raises before sending anything); all-reduce and keep our chunk instead:
    # the same sums, the same numbers.
    return _split(_all_reduce(x, group), group, dim)


# ---- autograd pairs ---------------------------------------------------------------


class _CopyToGroup(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, grad):
        return _all_reduce(grad, ctx.group), None


class _ReduceFromGroup(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        return _all_reduce(x, group)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


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


# ---- public wrappers --------------------------------------------------------------


def copy_to_group(x, group):
    """Forward: identity. Backward: all-reduce the gradient over ``group``."""
    return x if group_size(group) == 1 else _CopyToGroup.apply(x, group)


def reduce_from_group(x, group):
    """Forward: all-reduce over ``group``. Backward: identity."""
    return x if group_size(group) == 1 else _ReduceFromGroup.apply(x, group)


def scatter_to_group(x, group, dim):
    """Forward: keep this rank's chunk of ``dim``. Backward: all-gather along ``dim``."""
    return x if group_size(group) == 1 else _ScatterToGroup.apply(x, group, dim)


def gather_from_group(x, group, dim):
    """Forward: all-gather along ``dim``. Backward: keep this rank's chunk."""
    return x if group_size(group) == 1 else _GatherFromGroup.apply(x, group, dim)


def reduce_scatter_to_group(x, group, dim):
    """Forward: reduce-scatter along ``dim``. Backward: all-gather along ``dim``."""
    return x if group_size(group) == 1 else _ReduceScatterToGroup.apply(x, group, dim)


def all_gather_from_group(x, group, dim):
    """Forward: all-gather along ``dim``. Backward: reduce-scatter along ``dim``."""
    return x if group_size(group) == 1 else _AllGatherFromGroup.apply(x, group, dim)
