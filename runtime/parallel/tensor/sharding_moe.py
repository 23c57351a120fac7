"""The tensor transform of a MoE block's MLP (``sharding.shard`` hands it each one).

Takes: a block's ``MoE`` module, the builder of its tp degree (``sharding._Builder``), its
name, whether sequence parallelism is on and the names of a dense MLP's linears. Gives: ``shard_moe``. Only a build with
experts ships this module.
"""

from __future__ import annotations

from ...layout.roles import assign


def shard_moe(mlp, builder, prefix, sp, *, dense):
    """Note [MoE under sequence parallelism]: the router and the experts stay whole over
    tp (the experts are split by ``parallelize.experts``); the shared experts are a dense
    MLP (its linears: ``dense``, sharding.py's ``MLP``) the plan may split. Under SP each tp
    rank routes its own tokens."""
    builder.linears(mlp, prefix, ("router",))
    if mlp.shared_experts is not None:
        builder.linears(mlp.shared_experts, f"{prefix}.shared_experts", dense)
    if sp:
        mlp.seq_group = builder.group
        for p in mlp.parameters():  # the router, shared experts, experts: grads summed over tp
            assign(p, sequence_parallel=True)
