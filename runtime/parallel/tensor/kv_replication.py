"""k_proj and v_proj when tp splits fewer kv heads than it has ranks (grouped-query
attention, tp > kv_heads): ``sharding._Builder`` makes them ``ReplicatedHeads``. Only a
build with some layer's tp above kv_heads ships this module (features.py's "kv
replication").

Takes: a column linear's sizes, its tp group and the rows of one head (head_dim).
Gives: ``ReplicatedHeads``, a ``ColumnParallelLinear`` whose forward uses its head's rows.
"""

from __future__ import annotations

import torch.nn.functional as F

from ...distributed.comm import group_rank, group_size
from ...distributed.comm_scatter import all_gather_from_group
from .layers import ColumnParallelLinear


class ReplicatedHeads(ColumnParallelLinear):
    """A column-parallel k_proj or v_proj under tp > kv_heads.

    Note [KV replication]: grouped-query attention with tp > kv_heads (as Megatron and
    vLLM) gives each tp rank one kv head, each head shared by tp / kv_heads consecutive
    ranks (those whose query heads read it). ``head_rows`` (head_dim, for k_proj and
    v_proj) asks for this when a rank's out/tp rows are fewer than one head. The weight
    is still stored split over all tp ranks (out/tp rows each: checkpoints, ZeRO and the
    gradient norm see an ordinary shard); the forward all-gathers it over tp and keeps
    this rank's head's rows, and the backward's reduce-scatter sums the gradient of each
    head over its replicas and hands each rank its shard of that sum.
    """

    def __init__(self, in_features, out_features, *, bias, tp_group, sequence_parallel=False, head_rows):
        super().__init__(in_features, out_features, bias=bias, tp_group=tp_group, sequence_parallel=sequence_parallel)
        tp, heads = group_size(tp_group), out_features // head_rows
        if heads * head_rows != out_features or tp % heads:
            raise ValueError(f"tp = {tp} is not a multiple of the {heads} heads of {out_features} rows")
        head = group_rank(tp_group) // (tp // heads)
        self.rows = slice(head * head_rows, (head + 1) * head_rows)  # the rows of the whole weight this rank uses

    def local(self, x):
        """This rank's head, from the weight gathered over tp."""
        weight = all_gather_from_group(self.weight, self.tp_group, dim=0)[self.rows]
        bias = None if self.bias is None else all_gather_from_group(self.bias, self.tp_group, dim=0)[self.rows]
        return F.linear(x, weight, bias)  # (B, T, head_rows)
