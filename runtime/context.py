"""Context parallel: attention when each rank holds T/cp contiguous tokens of every sequence.

Takes: the cp group (ranks that split each sequence; None for one rank) and the kind
(``ulysses`` or ``allgather``). Gives: ``ContextParallel``, which ``model.Attention``
asks where its tokens start and how to see the rest of the sequence. Everything else
in a block (norms, projections, MLP) is per token and runs on the T/cp tokens as is;
gradients of the replicated parameters are then partial over cp and are averaged over
dp × cp like data parallelism's (``grid.group("dp", "cp")``). Only a build with cp > 1
ships this module (``model.py`` imports it when asked for it).

Note [context-parallel attention]: rank r holds positions [r·T/cp, (r+1)·T/cp).
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

from .comm import all_gather_from_group, all_to_all, group_rank, group_size

KINDS = ("ulysses", "allgather")
"""The kinds built; ``ring`` is refused by ``constraints.build_cp_kind``."""


class ContextParallel:
    """This rank's part of each sequence and the exchanges attention needs (Note [context-parallel attention])."""

    def __init__(self, group, kind: str):
        if kind not in KINDS:
            raise ValueError(f"cp_kind must be one of {KINDS}, not {kind!r}")
        self.group, self.kind = group, kind
        self.size, self.rank = group_size(group), group_rank(group)

    def start(self, local_tokens: int) -> int:
        """The global position of this rank's first token (``local_tokens`` = T/cp)."""
        return self.rank * local_tokens

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
