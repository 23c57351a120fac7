"""The transforms that make a layout of the plain model, one line each in train.py.

Takes: the plain model of ``model.build_model`` / ``build_stages`` (on the meta device,
no values yet) and each transform's own groups and settings. Gives: ``tensor``,
``context``, ``experts``, ``recompute`` and ``overlap``, each changing the model in place
and giving it back; they run in ``ORDER`` (Note [the order of the transforms] in
runtime/layout/transforms.py) and each refuses to run out of it. Each axis's work lives
beside the axis (``parallel/tensor/sharding.py``, ``parallel/context/context.py``,
``parallel/expert/moe.py``) and is imported only when its step runs, so a build ships
only the axes it uses.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn as nn

from ..distributed.comm import group_size
from ..layout.rule_engine import per_layer
from ..layout.transforms import ORDER

RECOMPUTE = ("none", "selective", "full")


def stages(net) -> tuple:
    """The ``Transformer`` stages of ``net``: itself, or a pipeline rank's chunks."""
    return tuple(net) if isinstance(net, nn.ModuleList) else (net,)


@contextlib.contextmanager
def _step(net, name: str):
    """Record step ``name`` on every stage; refuse it after itself or a later step. The
    step runs on the meta device: what it makes has shapes, no values, until init_weights."""
    for stage in stages(net):
        done = stage.transforms
        if done and ORDER.index(done[-1]) >= ORDER.index(name):
            raise ValueError(f"parallelize.{name} after parallelize.{done[-1]}: the transforms run in the order "
                             f"{', '.join(ORDER)}, each at most once (Note [the order of the transforms])")
        if any(p.device.type != "meta" for p in stage.parameters()):
            raise ValueError(f"parallelize.{name} on a model with values: transform the plain model of "
                             "build_model before init_weights")
        stage.transforms = done + (name,)
    with torch.device("meta"):
        yield


def tensor(net, tp_group, tp_plan, *, sequence_parallel, grid=None, layouts=None):
    """Split the layers over tp as the ``tp_plan`` table says (``sharding.shard``): 1D,
    on a 2D ``grid`` (Note [2D tensor parallelism]), or each block at its own degree
    (``layouts``, Note [heterogeneous layouts]). At tp = 1 it checks the table and keeps
    every layer whole."""
    from ..parallel.tensor.sharding import shard

    with _step(net, "tensor"):
        return shard(net, tp_group, tp_plan, sequence_parallel=sequence_parallel, grid=grid, layouts=layouts)


def context(net, cp_group, kind: str):
    """Attention over the ``cp_group`` ranks that split each sequence, as ``kind`` (ring,
    ulysses, allgather: Note [context-parallel attention] in context.py)."""
    with _step(net, "context"):
        if group_size(cp_group) == 1:
            return net
        from ..parallel.context.context import split  # only a build with cp > 1 ships context.py

        return split(net, cp_group, kind)


def experts(net, expert_group, expert_tp_group=None):
    """Each MoE block keeps this rank's experts of ``expert_group`` (ep) and its slice of
    each over ``expert_tp_group`` (Note [expert tensor parallelism] in moe.py)."""
    with _step(net, "experts"):
        for stage in stages(net):
            stage.expert_split = group_size(expert_group) * group_size(expert_tp_group)
            for block in stage.layers.values():
                if block.moe:
                    block.mlp.split_experts(expert_group, expert_tp_group, block.tp_group, stage.sp)
        return net


def recompute(net, modes):
    """What each block redoes in backward: "none"; "selective" (the attention core);
    "full" (the block from its input) — one mode, or one per layer."""
    with _step(net, "recompute"):
        for stage in stages(net):
            modes_of = per_layer(modes, stage.config.layers, "recompute")
            if any(mode not in RECOMPUTE for mode in modes_of):
                raise ValueError(f"recompute must be one of {RECOMPUTE} (or one per layer), not {modes!r}")
            for i, block in stage.layers.items():
                block.recompute = modes_of[int(i)]
                block.attn.selective = block.recompute == "selective"
        return net


def overlap(net, splits):
    """Each block's micro-batch as ``splits`` sub-batches whose tensor-parallel
    collectives overlap compute (Oases; ``parallel/tensor/overlap.py``), and a MoE
    block's expert all-to-alls (Note [expert all-to-all overlap]): one number, or one
    per layer; 1 leaves a block whole."""
    with _step(net, "overlap"):
        for stage in stages(net):
            splits_of = per_layer(splits, stage.config.layers, "overlap")
            if any(int(k) < 1 for k in splits_of):
                raise ValueError(f"overlap must be at least 1 sub-batch (or one per layer), not {splits!r}")
            for i, block in stage.layers.items():
                block.splits = int(splits_of[int(i)])
                if block.moe:
                    block.mlp.splits = block.splits
        return net
