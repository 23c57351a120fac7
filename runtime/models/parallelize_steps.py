"""The work of the transforms after ``tensor``: ``context``, ``experts``, ``recompute`` and
``overlap``, which train.py calls as ``parallelize.<step>``.

Takes: a model's stages (``parallelize.stages``: the model, or a pipeline rank's chunks)
and the step's groups and settings. Gives: nothing; each changes the stages in place.
``parallelize.py`` gives them by name and runs each inside its step (Note [the order of the
transforms]: recorded, refused out of order, on the meta device). Only some layouts run
them, so a build ships this module only when its train.py does
(``features.runtime_modules``), as it ships each axis's module (context.py, moe.py,
overlap.py) only with its axis.
"""

from __future__ import annotations

from ..distributed.comm import group_size
from ..layout.rule_engine import per_layer

RECOMPUTE = ("none", "selective", "full")


def context(stages, cp_group, kind: str) -> None:
    """Attention over the ``cp_group`` ranks that split each sequence, as ``kind`` (ring,
    ulysses, allgather: Note [context-parallel attention] in context.py)."""
    if group_size(cp_group) == 1:
        return
    from ..parallel.context.context import split  # only a build with cp > 1 ships context.py

    split(stages, cp_group, kind)


def experts(stages, expert_group, expert_tp_group=None) -> None:
    """Each MoE block keeps this rank's experts of ``expert_group`` (ep) and its slice of
    each over ``expert_tp_group`` (Note [expert tensor parallelism] in moe.py)."""
    for stage in stages:
        stage.expert_split = group_size(expert_group) * group_size(expert_tp_group)
        for block in stage.layers.values():
            if block.moe:
                block.mlp.split_experts(expert_group, expert_tp_group, block.tp_group, stage.sp)


def recompute(stages, modes) -> None:
    """What each block redoes in backward: "none"; "selective" (the attention core);
    "full" (the block from its input) — one mode, or one per layer."""
    for stage in stages:
        modes_of = per_layer(modes, stage.config.layers, "recompute")
        if any(mode not in RECOMPUTE for mode in modes_of):
            raise ValueError(f"recompute must be one of {RECOMPUTE} (or one per layer), not {modes!r}")
        for i, block in stage.layers.items():
            block.recompute = modes_of[int(i)]
            block.attn.selective = block.recompute == "selective"


def overlap(stages, splits) -> None:
    """Each block's micro-batch as ``splits`` sub-batches whose tensor-parallel
    collectives overlap compute (Oases; ``parallel/tensor/overlap.py``), and a MoE
    block's expert all-to-alls (Note [expert all-to-all overlap]): one number, or one
    per layer; 1 leaves a block whole."""
    for stage in stages:
        splits_of = per_layer(splits, stage.config.layers, "overlap")
        if any(int(k) < 1 for k in splits_of):
            raise ValueError(f"overlap must be at least 1 sub-batch (or one per layer), not {splits!r}")
        for i, block in stage.layers.items():
            block.splits = int(splits_of[int(i)])
            if block.moe:
                block.mlp.splits = block.splits
