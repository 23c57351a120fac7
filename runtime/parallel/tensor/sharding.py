"""The tensor transform: a plain model's layers split over tp, as train.py's plan says.

Takes: a plain ``Transformer`` (or a pipeline rank's chunks of them) on the meta device,
the tp group, the literal ``TP_PLAN`` table, whether sequence parallelism is on, and,
under 2D tensor parallelism, the grid (``Mesh.tp_grid``, Note [2D tensor parallelism] in
layers2d.py), or under per-layer degrees the ``hetero.StageLayouts`` (Note
[heterogeneous layouts]). Gives: ``shard``, which swaps each layer the checked plan
splits for its parallel kind (``layers.py``: column, row, vocab; on a grid sharding_grid.py)
and sets the model's layout attributes (``tp_group``, ``sp``, ``block_tp``, ``head_group``
…; per-layer layouts: sharding_layouts.py; a MoE block's MLP: sharding_moe.py). It is
``parallelize.tensor``, the first transform: the layers it swaps have no values yet, so
nothing is copied; the parameters' roles it sets (``sequence_parallel``,
``tensor_parallel``, ``layer_tp``) are tags the gradient code reads.
"""

from __future__ import annotations

import functools

import torch.nn as nn

from ...distributed.comm import group_size
from .layers import ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding
from .tp_plan import TensorParallelPlan
from ...layout.roles import assign


class _Builder:
    """Hands out the layer for each module name, as the checked plan says; under 2D
    tensor parallelism (``grid``) with sharding_grid.py's ``Grid`` over it, the layers
    of ``layers2d.py``."""

    grid = None

    def __init__(self, plan: TensorParallelPlan, tp_group, sequence_parallel):
        self.plan, self.group, self.sp = plan, tp_group, sequence_parallel

    def norm(self, norm):
        """The norm itself, its parameters tagged under SP (they see a sequence shard)."""
        for p in norm.parameters():
            assign(p, sequence_parallel=self.sp)  # sees only a sequence shard under SP
        return norm

    def style(self, name):
        return self.plan.style(name)

    def linear(self, name, plain: nn.Linear, head_rows=None):
        """``plain``'s parallel kind, or ``plain`` where the plan keeps it whole.
        ``head_rows``: a head's rows (k_proj, v_proj), so tp > kv_heads replicates heads
        (Note [KV replication])."""
        style, bias = self.plan.style(name), plain.bias is not None
        sizes = (plain.in_features, plain.out_features)
        if style == "colwise" and head_rows is not None and sizes[1] // group_size(self.group) < head_rows:
            from .kv_replication import ReplicatedHeads  # only a build with tp > kv_heads ships it

            return ReplicatedHeads(*sizes, bias=bias, tp_group=self.group, sequence_parallel=self.sp,
                                   head_rows=head_rows)
        if style == "colwise":
            return ColumnParallelLinear(*sizes, bias=bias, tp_group=self.group, sequence_parallel=self.sp)
        if style == "rowwise":
            return RowParallelLinear(*sizes, bias=bias, tp_group=self.group, sequence_parallel=self.sp)
        return plain

    def linears(self, module, prefix, names, head_rows=None):
        """Swap ``module``'s linears ``names`` (those it has) for their parallel kinds."""
        for name in names:
            if hasattr(module, name):
                rows = head_rows if name in ("k_proj", "v_proj") else None
                setattr(module, name, self.linear(f"{prefix}.{name}", getattr(module, name), rows))

    def embedding(self, model):
        """The first stage's embedding: vocab-parallel where the plan says, its positions
        (gpt) replicated, tagged under SP."""
        config = model.config
        if model.vocab_parallel_embed:
            model.embed = VocabParallelEmbedding(config.padded_vocab, config.hidden, tp_group=model.tp_group,
                                                 sequence_parallel=self.sp)
        if config.arch == "gpt":
            assign(model.pos_embed.weight, sequence_parallel=self.sp)

    def head(self, model):
        """An untied head (or a later stage's copy): vocab-parallel, its rows of the
        vocabulary; else whole."""
        V, C = model.config.padded_vocab, model.config.hidden
        if model.vocab_parallel and group_size(model.head_group) > 1:
            model.head = nn.Linear(C, V // group_size(model.head_group), bias=False)
            model.head.full_shape = (V, C)
            assign(model.head.weight, tensor_parallel=True)
            model.head.tp_group = model.head_group  # where its shard starts (checkpoint_shards.py)


ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")


def shard(net, tp_group, tp_plan, *, sequence_parallel, grid=None, layouts=None):
    """Every stage of ``net`` (a ``Transformer`` or a pipeline rank's ``ModuleList`` of
    them) split over tp; gives ``net``."""
    for stage in net if isinstance(net, nn.ModuleList) else (net,):
        _shard_stage(stage, tp_group, tp_plan, bool(sequence_parallel), grid, layouts)
    return net


def _shard_stage(model, tp_group, tp_plan, sp, grid, layouts):
    config, (start, stop) = model.config, model.span
    # Note [heterogeneous layouts] (hetero.py): each block its own tp degree, or all the same
    block_tp = (group_size(tp_group),) * config.layers if layouts is None else layouts.layer_tp
    builders, plans = {}, {}
    make = _Builder
    if grid is not None:  # only a 2D build ships sharding_grid.py (and layers2d.py)
        from .sharding_grid import Grid

        make = functools.partial(type("GridBuilder", (Grid, _Builder), {}), grid=grid, config=config)
    for t in sorted({block_tp[i] for i in range(start, stop)} | {block_tp[start if start < stop else 0]}):
        group = tp_group if layouts is None else layouts.tp_group(t)
        plans[t] = TensorParallelPlan(tp_plan, config, tp_group=group, sequence_parallel=sp, grid=grid)
        builders[t] = make(plans[t], group, sp)
    # the embedding follows block 0, the head the last block (the embedding, when tied to it)
    embed_tp = block_tp[0]
    head_tp = embed_tp if config.tie_embeddings and model.first else block_tp[-1]
    head_group = tp_group
    if layouts is not None:
        tp_group = layouts.tp_group(embed_tp if model.first else block_tp[start])
        head_group = layouts.tp_group(head_tp)
        for t in (embed_tp, head_tp):
            if t not in builders:
                group = layouts.tp_group(t)
                plans[t] = TensorParallelPlan(tp_plan, config, tp_group=group, sequence_parallel=sp)
                builders[t] = _Builder(plans[t], group, sp)
    build, plan = builders[embed_tp], plans[embed_tp]
    model.tp_group, model.sp, model.tp_grid, model.layouts, model.head_group = tp_group, sp, grid, layouts, head_group
    model.block_tp = {i: block_tp[i] for i in range(start, stop)}
    model.embed_tp, model.head_tp = embed_tp, head_tp
    model.sharded, model._styles = plan.styles, {t: p.styles for t, p in plans.items()}
    model.vocab_parallel_embed = build.style("embed") == "vocab"
    # the head's own degree's plan (per-layer layouts: an untied head at tp 2 after an embedding at tp 1)
    model.vocab_parallel = builders[head_tp].style("head") == "vocab_head"
    if model.first:
        build.embedding(model)
    head_rows = config.head_dim
    for i, block in model.layers.items():
        builder = builders[model.block_tp[int(i)]]
        block.tp_group = builder.group
        block.attn_norm, block.mlp_norm = builder.norm(block.attn_norm), builder.norm(block.mlp_norm)
        builder.linears(block.attn, f"layers.{i}.attn", ATTENTION, head_rows)
        _head_norms(block.attn, builder, f"layers.{i}.attn")
        if block.moe:  # only a build with experts ships sharding_moe.py
            from .sharding_moe import shard_moe

            shard_moe(block.mlp, builder, f"layers.{i}.mlp", sp, dense=MLP)
        else:
            builder.linears(block.mlp, f"layers.{i}.mlp", MLP)
    if model.last:
        model.final_norm = build.norm(model.final_norm)
        if not (config.tie_embeddings and model.first):  # a head tied to the embedding on this stage is it
            build.head(model)
    model.tag_tied()
    if layouts is not None:  # only a build with per-layer layouts ships sharding_layouts.py
        from .sharding_layouts import tag_layouts

        tag_layouts(model)


def _head_norms(attn, builder, prefix):
    """``model.qk_norm``: the head norms stay whole, but where q_proj is split each tp rank
    normalizes its own heads, so their weights' gradients are summed over tp in backward
    (``llama_attention.HeadNorm``). A 2D grid repeats a row's heads on its R ranks: not built."""
    if attn.q_norm is None or builder.style(f"{prefix}.q_proj") is None:
        return
    if builder.grid is not None:  # constraints refuse the spec (PAR0228): this is the trainer's guard
        raise ValueError("tp plan: model.qk_norm is not built with 2D tensor parallelism (TP_SHAPE)")
    attn.q_norm.tp_group = attn.k_norm.tp_group = builder.group
