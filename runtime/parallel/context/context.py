"""Context parallel: attention when each rank holds T/cp contiguous tokens of every sequence.

Takes: the cp group (ranks that split each sequence; None for one rank) and the kind
(``ring``, ``ulysses`` or ``allgather``). Gives: ``ContextParallel``, which ``Attention``
asks where its tokens start and how to see the rest of the sequence, and ``split``, the
context transform (``parallelize.context``) that hands it to every block. Everything else
in a block (norms, projections, MLP) is per token and runs on the T/cp tokens as is;
gradients of the replicated parameters are then partial over cp and are averaged over
dp × cp like data parallelism's (``grid.group("dp", "cp")``). Only a build with cp > 1
ships this module (``parallelize.context`` imports it when asked for it).

Note [context-parallel attention]: rank r holds the spans of positions that
``data.context_spans`` names: [r·T/cp, (r+1)·T/cp) for ulysses and allgather; chunks r
and 2·cp−1−r of 2·cp equal chunks for ring (causal load balancing). Rotary and learned
positions are those of the rank's tokens (``positions``, ``spans``).
- ``ring``: ring attention (``ring.py``, Note [ring attention]): K/V blocks go around
  the cp group, each step's block attention with its log-sum-exp merges exactly into
  the running output; backward sends dK, dV around the ring to their owners. Memory
  per rank: this rank's T/cp queries against one T/cp block of keys at a time.
- ``ulysses`` (DeepSpeed-Ulysses): q, k, v go from sequence-sharded (B, H, T/cp, D) to
  head-sharded (B, H/cp, T, D) by one all-to-all each, attention runs on whole
  sequences for its heads (positions 0..T-1, the ordinary causal mask), and one
  all-to-all brings the output back. Backward: the inverse all-to-alls. Needs heads
  and kv_heads divisible by cp·tp (``constraints.ulysses_heads``); GQA's groups stay
  whole since both head counts split into contiguous chunks.
- ``allgather``: k and v are all-gathered along T (backward: reduce-scatter of dK,
  dV), queries stay local; the causal mask compares global positions, so a query at
  r·T/cp + i sees keys 0 .. r·T/cp + i. Rotary is applied before the gather, each
  rank at its own positions.
"""

from __future__ import annotations

import torch

from ...distributed.comm import group_rank, group_size
from ...distributed.comm_scatter import all_gather_from_group
from ...distributed.exchange import all_to_all
from ...kernels import reference
from .ring import draw_seed, ring_attention

KINDS = ("ring", "ulysses", "allgather")
"""The kinds built (``parallel.cp_kind``; ``ring`` is the key's default)."""


def context_spans(T, *, cp_rank, cp_size, cp_kind):
    """The global positions [start, stop) this context-parallel rank holds of a T-token
    sequence, in the order it holds them (Note [context-parallel attention]).

    ``ulysses`` and ``allgather``: one contiguous chunk [r·T/cp, (r+1)·T/cp). ``ring``
    (causal load balancing, as Megatron and torchtitan): T splits into 2·cp chunks of
    T/(2·cp) and rank r holds chunks r and 2·cp−1−r, so every rank has as many early
    (cheap) as late (costly) queries and every ring step the same work.
    """
    parts = 2 * cp_size if cp_kind == "ring" else cp_size
    if T % parts:
        raise ValueError(f"sequences of {T} tokens do not split into {parts} chunks (cp = {cp_size}, {cp_kind})")
    size = T // parts
    chunks = (cp_rank, parts - 1 - cp_rank) if cp_kind == "ring" else (cp_rank,)
    return tuple((c * size, (c + 1) * size) for c in chunks)


def context_chunk(inputs, targets, *, cp_rank, cp_size, cp_kind):
    """This context-parallel rank's T/cp tokens of every sequence, (B, T/cp) each: the
    spans ``context_spans`` names, of the inputs and of their targets, joined."""
    spans = context_spans(inputs.shape[1], cp_rank=cp_rank, cp_size=cp_size, cp_kind=cp_kind)
    return tuple(torch.cat([t[:, start:stop] for start, stop in spans], dim=1).contiguous() for t in (inputs, targets))


def split(stages, group, kind: str) -> None:
    """Every one of ``stages`` (the model, or a pipeline rank's chunks) attends as one rank of
    ``group`` (cp > 1): each block's attention core becomes the ``kind`` strategy; a MoE
    block's aux losses sum over the cp ranks (Note [MoE under context parallelism] in moe.py)."""
    strategy = ContextParallel(group, kind)
    for stage in stages:
        stage.context = strategy
        for block in stage.layers.values():
            block.attn.context = strategy
            if block.moe:
                block.mlp.context_group, block.mlp.context = group, strategy


class ContextParallel:
    """This rank's part of each sequence and the exchanges attention needs (Note [context-parallel attention])."""

    def __init__(self, group, kind: str):
        if kind not in KINDS:
            raise ValueError(f"cp_kind must be one of {KINDS}, not {kind!r}")
        self.group, self.kind = group, kind
        self.size, self.rank = group_size(group), group_rank(group)

    def start(self, local_tokens: int) -> int:
        """The global position of this rank's first token (``local_tokens`` = T/cp)."""
        return self.spans(local_tokens)[0][0]

    def spans(self, local_tokens: int) -> tuple[tuple[int, int], ...]:
        """The global [start, stop) of each run of consecutive positions this rank holds,
        in its order (``local_tokens`` = T/cp; Note [context-parallel attention])."""
        T = local_tokens * self.size
        return context_spans(T, cp_rank=self.rank, cp_size=self.size, cp_kind=self.kind)

    def positions(self, local_tokens: int, device) -> torch.Tensor:
        """(T/cp,) int64: the global position of each token this rank holds."""
        return torch.cat([torch.arange(start, stop, device=device) for start, stop in self.spans(local_tokens)])

    # ---- ring ----------------------------------------------------------------------

    def ring(self, q, k, v, kernels=None, documents=None, dropout=0.0) -> torch.Tensor:
        """(B, H, T/cp, D) queries, (B, Hkv, T/cp, D) keys and values of this rank's tokens
        → its rows of causal attention over the whole sequence (Note [ring attention]);
        ``kernels``: the compiled block attention, or None for the eager reference;
        ``documents`` (documents = separate): keys outside a query's document are masked,
        block by block; ``dropout``: the attention dropout probability (Note [ring
        attention with dropout]). Masks run the eager reference, which takes them."""
        scale = q.shape[-1] ** -0.5
        same = None if documents is None else documents.remember(
            ("ring", q.shape[-2]), lambda: self.block_documents(documents, q.shape[-2], q.device))
        if dropout:
            return ring_attention(q, k, v, self.group, scale, reference, same, (dropout, draw_seed()))
        return ring_attention(q, k, v, self.group, scale, kernels or reference, same)

    def block_documents(self, documents, local_tokens: int, device) -> tuple[torch.Tensor, ...]:
        """Per ring step j, (B, 1, T/cp, T/cp) bool: this rank's query and the key of the
        block it holds at step j (rank r − j's tokens) are in the same document; every
        rank has the whole sequence's ids (Note [document ids are global] in documents.py)."""
        T = local_tokens * self.size
        queries = self.positions(local_tokens, device)
        same = []
        for step in range(self.size):
            owner = (self.rank - step) % self.size
            spans = context_spans(T, cp_rank=owner, cp_size=self.size, cp_kind=self.kind)
            keys = torch.cat([torch.arange(start, stop, device=device) for start, stop in spans])
            same.append(documents.same(queries, keys))
        return tuple(same)

    # ---- ulysses -------------------------------------------------------------------

    def to_heads(self, x: torch.Tensor) -> torch.Tensor:
        """(B, H, T/cp, D) → (B, H/cp, T, D). Backward: the inverse all-to-all."""
        return all_to_all(x, self.group, scatter_dim=1, gather_dim=2)

    def to_sequence(self, x: torch.Tensor) -> torch.Tensor:
        """(B, H/cp, T, D) → (B, H, T/cp, D). Backward: the inverse all-to-all."""
        return all_to_all(x, self.group, scatter_dim=2, gather_dim=1)

    # ---- allgather -----------------------------------------------------------------

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        """(B, H, T/cp, D) → (B, H, T, D). Backward: reduce-scatter along T."""
        return all_gather_from_group(x, self.group, dim=2)

    def causal_mask(self, local_tokens: int, device) -> torch.Tensor:
        """(T/cp, T) boolean: True where a local query may attend (key position ≤ its own)."""
        start = self.start(local_tokens)
        queries = torch.arange(start, start + local_tokens, device=device).unsqueeze(1)
        keys = torch.arange(local_tokens * self.size, device=device).unsqueeze(0)
        return keys <= queries
