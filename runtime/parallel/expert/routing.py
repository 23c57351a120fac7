"""A MoE block's routing: each token's experts, their weights, and which slots a capacity keeps.

Takes: the router's logits (N, E) of this rank's tokens and the block's routing settings
(top_k, softmax or sigmoid scores, a capacity factor, the auxiliary-loss-free bias, and,
when the rank holds parts of the micro-batch's sequences, the groups that split them).
Gives: ``route``, which ``moe.MoEMLP`` calls before dispatching the tokens, and the
orders of the dispatch (``by_expert``, ``expert_major``, ``grouped``, ``permuted``: Note
[dispatch without masks] in moe.py), which ``moe.py`` and ``moe_overlap.py`` share.

Note [deterministic dropless routing]: each token's router scores (softmax, or sigmoid
as DeepSeek-V3) are sorted with a *stable* descending sort, so among equal scores the
lower expert index wins; its top_k experts' scores, renormalized to sum 1, weigh their
outputs (softmax: Mixtral's softmax over the chosen logits). Without a capacity every
routed token is computed (dropless). With ``capacity_factor = X`` each expert keeps at
most ceil(X · tokens · top_k / E) of its tokens, the highest-scoring first (ties: the
earlier token), and a dropped token's share is zero (Megatron's "probs" drop policy).
Nothing depends on a rank's layout, so every layout routes as one rank does.

Note [capacity under sequence parallelism]: the tokens a capacity counts are the
micro-batch's, as one rank's are, not each rank's own (Megatron ranks each tp rank's
sequence shard alone, so its drops change with tp). Under sp each tp rank routes T/tp
tokens of every sequence; the ranking needs them all, so the ranks all-gather each
token's chosen experts and scores (N·K ids and scores, not activations), rebuild one
rank's token order (sequence by sequence, the shards in rank order), rank once, and
each keeps its own tokens' part. Every layout then drops exactly the tokens one rank
drops. Under cp a rank's tokens are its chunks of each sequence (``data.context_spans``:
two load-balanced ones under ring), and under cp with sp a tp rank's shard of those; each
token goes into the gather with its index in one rank's micro-batch, and the gathered
rows sorted by it are one rank's order.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from ...distributed.comm import group_size


def route(logits, *, top_k: int, router: str, capacity_factor: float | None, bias=None, shards=None):
    """Note [deterministic dropless routing]. ``logits`` (N, E) → (experts (N, K) int64,
    weights (N, K), kept (N, K) bool, probs (N, E) for the aux loss). ``bias`` (E,): added
    to the scores only to choose the top_k (router_bias.py, Note [auxiliary-loss-free
    balancing]); the weights are the unbiased scores'. ``shards``: (groups, positions) when
    the groups' ranks hold parts of the micro-batch's sequences (Note [capacity under
    sequence parallelism])."""
    N, E = logits.shape
    logits = logits.float()
    scores = torch.softmax(logits, -1) if router == "softmax" else torch.sigmoid(logits)
    choice = scores.detach() if bias is None else scores.detach() + bias.to(scores.device, scores.dtype)
    experts = torch.sort(choice, dim=-1, descending=True, stable=True).indices[:, :top_k]
    chosen = scores.gather(1, experts)
    weights = chosen / chosen.sum(-1, keepdim=True)
    probs = scores if router == "softmax" else scores / scores.sum(-1, keepdim=True)
    kept = torch.ones_like(experts, dtype=torch.bool)
    if capacity_factor is not None and shards is not None:
        kept = _within_capacity_of_shards(experts, chosen.detach(), capacity_factor, E, *shards)
    elif capacity_factor is not None:
        kept = _within_capacity(experts, chosen.detach(), math.ceil(capacity_factor * N * top_k / E), E)
    return experts, weights, kept, probs


def _within_capacity_of_shards(experts, chosen, capacity_factor: float, E: int, groups, positions):
    """Note [capacity under sequence parallelism]: the micro-batch's drop ranking, taken whole
    on every rank of ``groups`` (the sp and cp groups that split its sequences), this rank's
    tokens' part kept. ``positions`` (N,): each of this rank's tokens' index in one rank's
    micro-batch (sequence · T + position)."""
    K = experts.shape[1]
    # ids and positions are exact in fp64: one gather a group carries all three
    packed = torch.cat([positions.to(torch.float64).unsqueeze(1), experts.to(torch.float64),
                        chosen.to(torch.float64)], dim=1)
    for group in groups:
        parts = [torch.empty_like(packed) for _ in range(group_size(group))]
        dist.all_gather(parts, packed.contiguous(), group=group)
        packed = torch.cat(parts)
    whole = packed[torch.argsort(packed[:, 0])]  # one rank's token order: row i is token i
    capacity = math.ceil(capacity_factor * whole.shape[0] * K / E)
    kept = _within_capacity(whole[:, 1:1 + K].long(), whole[:, 1 + K:].to(chosen.dtype), capacity, E)
    return kept[positions]


def _within_capacity(experts, chosen, capacity: int, E: int):
    """Which (token, slot) assignments each expert keeps: its ``capacity`` best by score,
    ties to the earlier token (stable sorts over the token-major order)."""
    flat_expert, flat_score = experts.reshape(-1), chosen.reshape(-1)
    by_score = torch.sort(flat_score, descending=True, stable=True).indices
    order = by_score[torch.sort(flat_expert[by_score], stable=True).indices]  # by expert, then score
    counts = torch.bincount(flat_expert, minlength=E)
    starts = torch.cumsum(counts, 0) - counts
    position = torch.arange(order.numel()) - starts[flat_expert[order]]
    kept = torch.empty_like(flat_expert, dtype=torch.bool)
    kept[order] = position < capacity
    return kept.view_as(experts)


def expert_major(sizes) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows that arrive by source then expert (``sizes[i][e]`` from source i for expert e)
    → the permutation that orders them by expert then source, and its inverse: a stable
    sort of the rows' experts (Note [dispatch without masks])."""
    sources, local = sizes.shape
    flat = sizes.reshape(-1).cpu()
    expert_of = torch.arange(local).repeat(sources).repeat_interleave(flat)
    regroup = torch.sort(expert_of, stable=True).indices
    return regroup, inverse(regroup)


def inverse(permutation: torch.Tensor) -> torch.Tensor:
    back = torch.empty_like(permutation)
    back[permutation] = torch.arange(permutation.numel(), device=permutation.device)
    return back


def by_expert(slot_expert, kept, experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The kept slots' indices ordered by expert, ties in slot order, and each expert's
    count of them (``kept`` None: every slot is).

    Note [dispatch without masks]: the routing's bookkeeping is sorts, bincounts and
    gathers, never a boolean mask (``x[mask]``, ``nonzero``: a host sync and a scan
    each) nor an index scatter: the kept slots by expert are one stable sort of a key
    that puts the dropped slots last; the tp shares and sub-batches one stable sort of
    their part ids (``grouped``); the arrival order under ep one stable sort of the
    rows' experts (``expert_major``), whose rows move by ``index_select`` both ways
    (``permuted``: a permutation's gradient is a gather by its inverse, not indexing's
    scatter-add into zeros). The only host reads left are the row counts the
    all-to-alls and the grouped GEMM need. Every order is the one the masks gave, so
    the numbers are the same bit for bit."""
    if kept is None:  # dropless
        return torch.sort(slot_expert, stable=True).indices, torch.bincount(slot_expert, minlength=experts)
    key = torch.where(kept.reshape(-1), slot_expert, slot_expert + experts)  # dropped slots after every kept one
    counts = torch.bincount(key, minlength=2 * experts)[:experts]
    return torch.sort(key, stable=True).indices[: int(counts.sum())], counts  # the one host read: how many


def grouped(order, part, parts: int) -> list[torch.Tensor]:
    """``order`` split by ``part`` (each entry's group, 0 .. parts − 1), each group in
    ``order``'s order: ``[order[part == i] for i in range(parts)]`` with one stable sort."""
    sizes = torch.bincount(part, minlength=parts).tolist()
    return list(torch.split(order.index_select(0, torch.sort(part, stable=True).indices), sizes))


class _Permuted(torch.autograd.Function):
    """Rows ``x[perm]`` for a permutation; the gradient goes back by its inverse, a gather
    too (indexing's backward would scatter-add into zeros)."""

    @staticmethod
    def forward(ctx, x, perm, back):
        ctx.back = back
        return x.index_select(0, perm)

    @staticmethod
    def backward(ctx, grad):
        return grad.index_select(0, ctx.back), None, None


def permuted(x, perm, back):
    """``x``'s rows in the order ``perm`` (``back`` its inverse), differentiably."""
    return _Permuted.apply(x, perm, back)
