"""Asynchronous launches of collectives (``launch_*`` → ``comm.Pending``), for the
features that interleave them with compute: the sub-batch overlap (``overlap.py``) and the
experts' size exchange (``moe.py``). Split from ``comm.py`` so that a build without those
features does not ship them.

Each returns a ``Pending`` at once; the collective runs in the background while this
process computes, and ``Pending.wait()`` blocks (counted as exposed time) and gives the
result. No autograd here: overlap.py pairs them with backward.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from .comm import Pending, _issued, group_size
from .comm_scatter import _reduce_scatter


def launch_all_reduce(x: torch.Tensor, group) -> Pending:
    """Start summing a copy of ``x`` over ``group``."""
    if group_size(group) == 1:
        return Pending(None, x)
    x = x.contiguous().clone()
    _issued()
    return Pending(dist.all_reduce(x, group=group, async_op=True), x)


def launch_reduce_scatter(x: torch.Tensor, group, dim: int) -> Pending:
    """Start summing ``x`` over ``group``, keeping this rank's chunk of ``dim``."""
    size = group_size(group)
    if size == 1:
        return Pending(None, x)
    if x.shape[dim] % size:
        raise ValueError(f"dim {dim} of size {x.shape[dim]} does not split over {size} ranks")
    front = x.movedim(dim, 0).contiguous()  # chunk r of dim 0 goes to rank r
    out = front.new_empty((front.shape[0] // size, *front.shape[1:]))
    try:
        work = dist.reduce_scatter_tensor(out, front, group=group, async_op=True)
    except RuntimeError:  # Note [reduce-scatter on gloo]: blocking fallback
        if dist.get_backend(group) != "gloo":
            raise
        return Pending(None, _reduce_scatter(x, group, dim))
    _issued()
    return Pending(work, out, dim, front)


def launch_all_gather(x: torch.Tensor, group, dim: int) -> Pending:
    """Start concatenating every rank's ``x`` along ``dim``, in rank order."""
    size = group_size(group)
    if size == 1:
        return Pending(None, x)
    front = x.movedim(dim, 0).contiguous()
    out = front.new_empty((front.shape[0] * size, *front.shape[1:]))
    _issued()
    return Pending(dist.all_gather_into_tensor(out, front, group=group, async_op=True), out, dim, front)
