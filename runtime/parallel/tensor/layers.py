"""Tensor-parallel layers: column/row-parallel linear, vocab-parallel embedding and loss.

Takes: a tp group (None for one rank) and whether activations are sequence-sharded.
Gives: modules holding this rank's shard of each weight, each with ``full_shape`` (the
unsharded weight's; the tests copy a shard out of the full tensor by it, rank_worker.py's
``load_full``, so a sharded layer equals the unsharded one; see ``model.py``). Shapes: B
batch, T sequence, C features; ``/tp`` marks a shard.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from ...distributed.comm import (
    copy_to_group,
    group_rank,
    group_size,
    reduce_from_group,
    _all_reduce,  # the loss's statistics need no autograd pair: its backward is local
)
from ...layout.roles import assign


def _mark_sharded(*params, group) -> None:
    """Tag parameters whose ranks hold different shards (gradient norms sum them over tp)."""
    for param in params:
        if param is not None and group_size(group) > 1:
            assign(param, tensor_parallel=True)


class ColumnParallelLinear(nn.Module):
    """y = x Wᵀ + b with W split by rows (output features): (B, T, in) → (B, T, out/tp).

    With sequence parallelism the input arrives as (B, T/tp, in) and is all-gathered
    along T (backward: reduce-scatter); otherwise it is replicated and its gradient
    is all-reduced in backward. Under tp > kv_heads k_proj and v_proj are
    kv_replication.py's subclass (Note [KV replication] there).
    """

    def __init__(self, in_features, out_features, *, bias, tp_group, sequence_parallel=False):
        super().__init__()
        self.tp_group, self.sequence_parallel = tp_group, sequence_parallel
        self.full_shape = (out_features, in_features)
        tp = group_size(tp_group)
        local = out_features // tp
        if local * tp != out_features:
            raise ValueError(f"out_features {out_features} not divisible by tp {tp}")
        self.weight = nn.Parameter(torch.empty(local, in_features))
        self.bias = nn.Parameter(torch.empty(local)) if bias else None
        _mark_sharded(self.weight, self.bias, group=tp_group)

    def enter(self, x):
        """The input as the matmul takes it: under SP all-gathered along T (backward:
        reduce-scatter), else as is (backward: all-reduce of its gradient). Column
        linears that read one input enter it once (``project``)."""
        if self.sequence_parallel:  # only a build under sp ships comm_scatter.py
            from ...distributed.comm_scatter import all_gather_from_group

            return all_gather_from_group(x, self.tp_group, dim=1)  # (B, T, in)
        return copy_to_group(x, self.tp_group)

    def local(self, x):
        """The matmul on an input that already entered (``enter``)."""
        return F.linear(x, self.weight, self.bias)  # (B, T, out/tp)

    def forward(self, x):
        if _keeps_shard([self]):
            return _gathered(x, self.tp_group, [self])[0]
        return self.local(self.enter(x))


def project(x, linears):
    """Each of ``linears`` applied to ``x``. Column-parallel ones sharing a group enter
    it once, as Megatron's fused QKV does: one all-gather under SP instead of one per
    linear, and one all-reduce of the summed input gradient in backward (the 2D colwise
    linears of layers2d.py alike, over their row group)."""
    first = _entry(linears[0])
    if _keeps_shard(linears) and all(_entry(m) == first for m in linears):  # Note [sp inputs saved as shards]
        return list(_gathered(x, linears[0].tp_group, linears))
    if len(linears) > 1 and first is not None and all(_entry(m) == first for m in linears):
        x = linears[0].enter(x)
        return [m.local(x) for m in linears]
    return [m(x) for m in linears]


def _entry(linear):
    """(kind, group, sequence parallel) of how a column linear's input enters its region
    (``enter``), or None for a module that enters it in its own forward. 2D linears say
    theirs (``layers2d.Linear2D.entry``: over the row group of the grid)."""
    if isinstance(linear, ColumnParallelLinear):  # Note [KV replication]'s too
        return ("1d", linear.tp_group, linear.sequence_parallel)
    return getattr(linear, "entry", None)


def _gathered(x, group, linears):
    """``linears`` on the sequence-parallel input ``x``, saved as its shard (Note [sp inputs
    saved as shards] in sp_columns.py, imported here: only a build under sp ships it)."""
    from .sp_columns import GatheredColumns

    weights, biases = [m.weight for m in linears], [m.bias for m in linears]
    return GatheredColumns.apply(x, group, len(linears), *weights, *biases)


def _keeps_shard(linears) -> bool:
    """Do these column linears take a sequence-parallel input they can save as a shard
    (plain ones; Note [KV replication]'s gather their weight instead, 2D ones their own way)?"""
    return all(type(m) is ColumnParallelLinear and m.sequence_parallel for m in linears) and (
        group_size(linears[0].tp_group) > 1)


class RowParallelLinear(nn.Module):
    """y = x Wᵀ + b with W split by columns (input features): (B, T, in/tp) → (B, T, out).

    The partial products are all-reduced (with sequence parallelism: reduce-scattered
    along T to (B, T/tp, out)); the bias is added once, after the reduction.
    """

    def __init__(self, in_features, out_features, *, bias, tp_group, sequence_parallel=False):
        super().__init__()
        self.tp_group, self.sequence_parallel = tp_group, sequence_parallel
        self.full_shape = (out_features, in_features)
        local = in_features // group_size(tp_group)
        if local * group_size(tp_group) != in_features:
            raise ValueError(f"in_features {in_features} not divisible by tp {group_size(tp_group)}")
        self.weight = nn.Parameter(torch.empty(out_features, local))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None
        _mark_sharded(self.weight, group=tp_group)
        if self.bias is not None and sequence_parallel:
            assign(self.bias, sequence_parallel=True)  # added on a sequence shard: partial grads

    def forward(self, x):
        y = F.linear(x, self.weight)
        if self.sequence_parallel:  # only a build under sp ships comm_scatter.py
            from ...distributed.comm_scatter import reduce_scatter_to_group

            y = reduce_scatter_to_group(y, self.tp_group, dim=1)  # (B, T/tp, out)
        else:
            y = reduce_from_group(y, self.tp_group)  # (B, T, out)
        return y if self.bias is None else y + self.bias


class VocabParallelEmbedding(nn.Module):
    """Token ids (B, T) → (B, T, C), rows of the table split over tp.

    Each rank looks up the ids in its row range (zeros elsewhere); the partial rows
    are all-reduced, or reduce-scattered along T to (B, T/tp, C) with sequence
    parallelism.
    """

    def __init__(self, num_embeddings, dim, *, tp_group, sequence_parallel=False):
        super().__init__()
        self.tp_group, self.sequence_parallel = tp_group, sequence_parallel
        self.full_shape = (num_embeddings, dim)
        size = group_size(tp_group)
        if num_embeddings % size:
            raise ValueError(f"vocab {num_embeddings} not divisible by tp {size}")
        self.rows = num_embeddings // size
        self.start = group_rank(tp_group) * self.rows
        self.weight = nn.Parameter(torch.empty(self.rows, dim))
        _mark_sharded(self.weight, group=tp_group)

    def forward(self, tokens):
        if group_size(self.tp_group) == 1:
            out = F.embedding(tokens, self.weight)
        else:
            local = tokens - self.start
            outside = (local < 0) | (local >= self.rows)
            out = F.embedding(local.masked_fill(outside, 0), self.weight)
            out = out.masked_fill(outside.unsqueeze(-1), 0.0)
        if self.sequence_parallel:  # only a build under sp ships comm_scatter.py
            from ...distributed.comm_scatter import reduce_scatter_to_group

            return reduce_scatter_to_group(out, self.tp_group, dim=1)
        return reduce_from_group(out, self.tp_group)


class _VocabParallelCrossEntropy(torch.autograd.Function):
    """Softmax cross-entropy over vocab shards, from three all-reduces of (B, T) stats.

    Forward: the row max (MAX), the sum of exp(logit - max) (SUM) and the target's
    shifted logit (SUM, only its owner contributes); loss = log(sum) - target.
    Backward: dlogits = softmax - onehot(target) on this rank's columns, no
    communication.
    """

    @staticmethod
    def forward(ctx, logits, targets, group, vocab_size):
        ctx.input_dtype = logits.dtype
        columns = logits.shape[-1]  # this rank's slice of the (padded) vocab
        start = group_rank(group) * columns
        if logits.dtype in (torch.float16, torch.bfloat16):
            logits = logits.float()  # softmax statistics in fp32
        if start + columns > vocab_size:  # padding columns never win the softmax
            index = torch.arange(start, start + columns, device=logits.device)
            logits = logits.masked_fill(index >= vocab_size, float("-inf"))
        peak = _all_reduce(logits.max(dim=-1).values, group, op=dist.ReduceOp.MAX)  # (B, T)
        shifted = logits - peak.unsqueeze(-1)
        exp = shifted.exp()
        total = _all_reduce(exp.sum(dim=-1), group)  # (B, T)
        local = targets - start
        inside = (local >= 0) & (local < columns)
        local = local.masked_fill(~inside, 0)
        picked = shifted.gather(-1, local.unsqueeze(-1)).squeeze(-1).masked_fill(~inside, 0.0)
        picked = _all_reduce(picked, group)  # (B, T): the target's shifted logit
        softmax = exp.div_(total.unsqueeze(-1))
        ctx.save_for_backward(softmax, local, inside)
        return total.log() - picked  # (B, T)

    @staticmethod
    def backward(ctx, grad):
        softmax, local, inside = ctx.saved_tensors
        grad_logits = softmax.clone()
        grad_logits.scatter_add_(-1, local.unsqueeze(-1), -inside.unsqueeze(-1).to(grad_logits.dtype))
        grad_logits.mul_(grad.unsqueeze(-1))
        return grad_logits.to(ctx.input_dtype), None, None, None


def vocab_parallel_cross_entropy(logits, targets, *, tp_group, vocab_size, kernels=None):
    """Per-token loss (B, T) from logits sharded over the vocab (B, T, V/tp).

    Forward: three all-reduces over ``tp_group`` of (B, T) statistics; the loss is
    the same on every tp rank, and columns at or past ``vocab_size`` are padding that
    takes no part in the softmax. Backward: each rank gets its shard of dlogits, with
    no communication. With ``tp_group=None``, plain (padding-masked) cross-entropy.
    ``kernels``: the compiled ops (``kernels.select``), which do the same between two
    fused kernels (Note [vocab-sharded cross-entropy] in kernels/ops.py); None: eager.
    """
    if kernels is not None:
        return kernels.cross_entropy(logits, targets, vocab_size=vocab_size, tp_group=tp_group)
    return _VocabParallelCrossEntropy.apply(logits, targets, tp_group, vocab_size)
