"""Initial values of parameters, drawn whole and keyed by name, then sharded.

Takes: a freshly built model (``model.py``) whose sharded layers know their full
shape, and the seed. Gives: ``initialize(model, seed)`` in place, and ``full_init``,
the full (unsharded) value of any one parameter.

Note [init happens before sharding]: every parameter is drawn as the full tensor
from a CPU generator seeded by (seed, logical parameter name) — zlib.crc32 of the
name, stable across processes, unlike ``hash()`` — then each rank keeps its shard
(``load_full_``). So every layout starts from the numbers one rank would, and a
parameter's value does not depend on which others exist or in what order they are
built. GPT-2 style: normal(0, 0.02), residual projections (o_proj, down_proj)
scaled by 1/√(2·layers), norm weights 1, biases 0.
"""

from __future__ import annotations

import math
import zlib

import torch
import torch.nn as nn

from .comm import group_rank, group_size


def _generator(seed: int, name: str) -> torch.Generator:
    return torch.Generator().manual_seed((seed * 1_000_003 + zlib.crc32(name.encode())) % (2**63))


def full_init(name: str, shape, *, layers: int, seed: int) -> torch.Tensor:
    """The full (unsharded) initial value of parameter ``name``; layout-independent."""
    if name.endswith(".bias"):
        return torch.zeros(shape)
    if name.endswith("norm.weight"):
        return torch.ones(shape)
    std = 0.02
    if name.endswith(("o_proj.weight", "down_proj.weight")):
        std = 0.02 / math.sqrt(2 * layers)  # GPT-2's scaled residual projections
    return torch.empty(shape).normal_(0.0, std, generator=_generator(seed, name))


@torch.no_grad()
def initialize(model: nn.Module, seed: int) -> None:
    """Set every parameter of ``model`` per Note [init happens before sharding]."""
    layers = model.config.layers
    for name, module in model.named_modules():
        if isinstance(module, (nn.Linear, nn.Embedding)) and not hasattr(module, "full_shape"):
            module.full_shape = tuple(module.weight.shape)  # a replicated layer
        if not hasattr(module, "full_shape"):
            continue  # norms are built at 1 (weight) and 0 (bias)
        # A stage's copy of a tied table is drawn as the table it copies (model.py,
        # Note [tied embeddings across stages]).
        name = getattr(module, "init_name", name)
        prefix = f"{name}." if name else ""
        weight = full_init(prefix + "weight", module.full_shape, layers=layers, seed=seed)
        bias = None
        if getattr(module, "bias", None) is not None:
            bias = full_init(prefix + "bias", (module.full_shape[0],), layers=layers, seed=seed)
        if hasattr(module, "load_full_"):
            module.load_full_(weight, bias)
            continue
        if module.weight.shape != weight.shape:  # the untied vocab-parallel head: rows split
            group = getattr(module, "tp_group", model.tp_group)  # the head's own (hetero.py)
            weight = weight.chunk(group_size(group))[group_rank(group)]
        module.weight.copy_(weight)
        if bias is not None:
            module.bias.copy_(bias)
