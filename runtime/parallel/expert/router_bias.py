"""Auxiliary-loss-free load balancing (DeepSeek-V3): each MoE block's router bias, updated after each step.

Takes: the model (its ``MoEMLP`` blocks, built with ``router_bias_update > 0``) and the
step's ``expert_tokens`` of ``moe.step_metrics``. Gives: ``update_router_bias``, which
train.py calls after the optimizer step.

Note [auxiliary-loss-free balancing]: a MoE block with ``model.router_bias_update = r``
holds a per-expert bias ``router_bias`` (E,), a buffer: not a parameter, never in the
optimizer, saved in checkpoints (checkpoint_shards.buffer_pieces). ``moe.route`` adds it
to the router's scores only to choose each token's top_k experts; the gate weights stay
the unbiased scores', so the bias has no gradient and changes the output only through
which experts are chosen. After each optimizer step ``bias_e += r · sign(mean load −
load_e)``, the loads being the step's routed tokens per expert summed over every rank
that routes (``step_metrics``' ``expert_tokens``: one all-reduce over the world, tp
replicas counted once, all micro-batches), so an over-loaded expert is chosen less and an
idle one more. The loads are integers summed exactly and the sign compares ``E · load_e``
with their total (no rounding), so every rank, in every layout, adds the same ±r to the
same bias: layouts stay exact against one rank.
"""

from __future__ import annotations

import torch

from .moe import moe_blocks


@torch.no_grad()
def update_router_bias(model, expert_tokens: dict) -> None:
    """``bias_e += r · sign(mean − load_e)`` for each MoE block of this rank (Note [auxiliary-loss-free
    balancing]); ``expert_tokens``: ``layers.i`` → the step's tokens per expert over every rank."""
    for layer, module in moe_blocks(model):
        if module.router_bias is None:
            continue
        loads = torch.tensor(expert_tokens[f"layers.{layer}"], dtype=torch.int64)
        direction = torch.sign(loads.sum() - loads.numel() * loads)  # sign(mean − load), exactly
        module.router_bias += module.bias_rate * direction.to(module.router_bias)


def load_ratio(tokens) -> float:
    """max / mean of one block's per-expert loads (1: even); the bench's and the tests' measure."""
    loads = torch.as_tensor(tokens, dtype=torch.float64)
    return float(loads.max() / loads.mean()) if loads.sum() > 0 else 1.0
