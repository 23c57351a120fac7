"""The all-to-all exchanges: Ulysses' (context parallelism: sequence-sharded activations
become head-sharded ones and back) and the experts' exchanges of variable row counts
(expert parallelism: the dispatch and combine, and the tp ranks' shares of the routed
tokens). Split from ``comm.py`` so that a build ships them only with the features that
exchange (``context.py``, ``moe.py``): a dense build without cp does not.

Takes: tensors and a ``group`` (None: a group of one). Gives: autograd-paired
collectives, each with its backward named in its docstring.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from .comm import _issued, exposed, group_rank, group_size


def _all_to_all(x: torch.Tensor, group, scatter_dim: int, gather_dim: int) -> torch.Tensor:
    """Chunk r of ``scatter_dim`` goes to rank r; what rank i sent us is chunk i of ``gather_dim``.

    Ulysses' exchange: with ``scatter_dim`` the heads and ``gather_dim`` the sequence,
    sequence-sharded activations become head-sharded ones (and back, swapping the dims).
    """
    size = group_size(group)
    if size == 1:
        return x
    if x.shape[scatter_dim] % size:
        raise ValueError(f"dim {scatter_dim} of size {x.shape[scatter_dim]} does not split over {size} ranks")
    front = x.movedim(scatter_dim, 0).contiguous()  # chunk r of dim 0 goes to rank r
    out = torch.empty_like(front)
    _issued()
    with exposed():
        dist.all_to_all_single(out, front, group=group)
    received = out.movedim(0, scatter_dim).chunk(size, dim=scatter_dim)  # piece i: from rank i
    return torch.cat(received, dim=gather_dim).contiguous()



class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, scatter_dim, gather_dim):
        ctx.group, ctx.dims = group, (scatter_dim, gather_dim)
        return _all_to_all(x, group, scatter_dim, gather_dim)

    @staticmethod
    def backward(ctx, grad):
        scatter_dim, gather_dim = ctx.dims
        return _all_to_all(grad, ctx.group, gather_dim, scatter_dim), None, None, None


def _all_to_all_rows(x: torch.Tensor, group, send: list[int], receive: list[int]) -> torch.Tensor:
    """Rows ``send[r]`` of ``x`` (in order) go to rank r; rank i's ``receive[i]`` rows come back, in rank order."""
    out = x.new_empty((sum(receive), *x.shape[1:]))
    _issued()
    with exposed():
        dist.all_to_all_single(out, x.contiguous(), output_split_sizes=receive, input_split_sizes=send, group=group)
    return out


class _AllToAllRows(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, send, receive):
        ctx.group, ctx.splits = group, (send, receive)
        return _all_to_all_rows(x, group, send, receive)

    @staticmethod
    def backward(ctx, grad):
        send, receive = ctx.splits
        return _all_to_all_rows(grad, ctx.group, receive, send), None, None, None


def _gather_rows(x: torch.Tensor, group) -> tuple[torch.Tensor, list[int]]:
    """Every rank's rows of ``x`` (their counts may differ), concatenated in rank order."""
    size = group_size(group)
    counts = torch.tensor([x.shape[0]], dtype=torch.int64, device=x.device)
    every = [torch.empty_like(counts) for _ in range(size)]
    _issued()
    with exposed():
        dist.all_gather(every, counts, group=group)
    rows = [int(c) for c in every]
    padded = x.new_zeros((max(rows), *x.shape[1:]))
    padded[: x.shape[0]] = x
    parts = [torch.empty_like(padded) for _ in range(size)]
    _issued()
    with exposed():
        dist.all_gather(parts, padded.contiguous(), group=group)
    return torch.cat([part[:n] for part, n in zip(parts, rows)]), rows


class _GatherRows(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        out, rows = _gather_rows(x, group)
        ctx.start, ctx.rows = sum(rows[: group_rank(group)]), x.shape[0]
        return out

    @staticmethod
    def backward(ctx, grad):
        return grad[ctx.start : ctx.start + ctx.rows].contiguous(), None


def _gather_rows_known(x: torch.Tensor, group, rows: list[int]) -> torch.Tensor:
    """Every rank's rows of ``x`` (rank i has ``rows[i]``), concatenated in rank order: one
    all-to-all that sends this rank's rows to every rank (the adjoint of ``_sum_scatter_rows``)."""
    size = group_size(group)
    out = x.new_empty((sum(rows), *x.shape[1:]))
    _issued()
    with exposed():
        dist.all_to_all_single(out, x.contiguous().repeat(size, *([1] * (x.dim() - 1))),
                               output_split_sizes=list(rows), input_split_sizes=[x.shape[0]] * size, group=group)
    return out


def _sum_scatter_rows(x: torch.Tensor, group, rows: list[int]) -> torch.Tensor:
    """``x`` holds every rank's ``rows[i]`` rows in rank order; each rank gets its own rows
    summed over the group (in rank order): a reduce-scatter of variable row counts."""
    size, mine = group_size(group), rows[group_rank(group)]
    out = x.new_empty((size * mine, *x.shape[1:]))
    _issued()
    with exposed():
        dist.all_to_all_single(out, x.contiguous(), output_split_sizes=[mine] * size, input_split_sizes=list(rows),
                               group=group)
    return out.view(size, mine, *x.shape[1:]).sum(0)


class _GatherRowsSummed(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, rows):
        ctx.group, ctx.rows = group, rows
        return _gather_rows_known(x, group, rows)

    @staticmethod
    def backward(ctx, grad):
        return _sum_scatter_rows(grad, ctx.group, ctx.rows), None, None


class _ScatterRowsSummed(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, rows):
        ctx.group, ctx.rows = group, rows
        return _sum_scatter_rows(x, group, rows)

    @staticmethod
    def backward(ctx, grad):
        return _gather_rows_known(grad, ctx.group, ctx.rows), None, None


# ---- public wrappers --------------------------------------------------------------


def all_to_all(x, group, scatter_dim, gather_dim):
    """Forward: all-to-all, ``scatter_dim`` split over the ranks, what they send gathered
    along ``gather_dim``. Backward: the inverse all-to-all (the two dims swapped)."""
    return x if group_size(group) == 1 else _AllToAll.apply(x, group, scatter_dim, gather_dim)


def all_to_all_rows(x, group, send, receive):
    """Forward: ``send[r]`` rows of ``x`` to rank r, ``receive[i]`` rows from rank i (the
    expert dispatch and combine, moe.py). Backward: the same exchange the other way."""
    return x if group_size(group) == 1 else _AllToAllRows.apply(x, group, list(send), list(receive))


def gather_rows_from_group(x, group):
    """Forward: every rank's rows of ``x`` (as many as each has), in rank order. Backward:
    this rank's rows of the gradient (moe.py: the tp ranks' shares of the routed tokens)."""
    return x if group_size(group) == 1 else _GatherRows.apply(x, group)


def gather_rows_summed(x, group, rows):
    """Forward: every rank's rows of ``x`` (``rows[i]`` on rank i), in rank order.
    Backward: this rank's rows of the gradient summed over the group (moe.py, Note [expert
    tensor parallelism]: each rank's gradient is a partial sum)."""
    return x if group_size(group) == 1 else _GatherRowsSummed.apply(x, group, list(rows))


def scatter_rows_summed(x, group, rows):
    """Forward: this rank's ``rows[rank]`` of ``x`` (every rank's rows in rank order),
    summed over the group. Backward: every rank's rows of the gradient, gathered."""
    return x if group_size(group) == 1 else _ScatterRowsSummed.apply(x, group, list(rows))
