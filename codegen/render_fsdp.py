"""train.py's ZeRO-3 optimizer and step (runtime/parallel/data/fsdp.py), sharded over every
data-parallel rank or, under ``parallel.zero_shard = node``, over one node's (HSDP).

Takes: a ``Plan`` and the step's groups (``render_optimizer.Groups``). Gives:
``config_lines`` (its constants: ``ZERO_PREFETCH``, ``ZERO_SHARD``, ``DEVICES_PER_NODE``),
``optimizer_and_step``: the optimizer section's items (its last the ``fsdp.FullyShardedAdamW``
call) and the step's. Before: ``render_optimizer.py`` picks ZeRO-3. After: it gives the
call its per-layer and bf16 arguments.
"""

from __future__ import annotations

from parc.runtime.schedules import schedule

from . import render_moe, render_pipeline, render_step
from .plan import Plan
from .plan_text import cite
from .view import Call, Step, constant


def config_lines(plan: Plan) -> list[str]:
    """ZERO_PREFETCH and ZERO_SHARD (and DEVICES_PER_NODE for HSDP) under zero = 3."""
    train = plan.train
    if train.zero.value != 3:
        return []
    prefetch, shard = train.zero_prefetch, train.zero_shard
    lines = [
        constant(prefetch.name, prefetch.value, f"{cite(prefetch.span)}: blocks gathered ahead of the one computing"),
        constant(shard.name, shard.value, f"{cite(shard.span)}: "
                 + ("shard within a node, replicate across nodes (HSDP)" if shard.value == "node" else "shard over dp")),
    ]
    if shard.value == "node":
        lines.append(constant("DEVICES_PER_NODE", plan.mesh.devices_per_node, f"{cite(plan.mesh.devices_span)}: ranks per node"))
    return lines


def optimizer_and_step(plan: Plan, groups, hyper, compute) -> tuple[list, Step]:
    train, over = plan.train, groups.over
    hybrid = train.zero_shard.value == "node"
    axes_arg = '("dp",)' if plan.mesh.size("cp") == 1 else '("dp", "cp")'
    comments = [
        f"{cite(train.zero.span)}: ZeRO-3, {render_step.zero_words(plan)}: each block (and the embeddings",
        f"and head) is one flat fp32 buffer; each {over} rank keeps its share of it and the"
        if render_step.compute_dtype(plan) is None else
        f"and head) is one flat fp32 buffer (the master weights; gathered as {train.precision.value}: "
        f"{cite(train.precision.span)}); each {over} rank keeps its share of it and the",
        "share's Adam moments, all-gathers a block before its forward and again before its",
        "backward (ZERO_PREFETCH blocks ahead), frees it after; gradients reduce-scattered",
        "into fp32 shards after every micro-batch's backward (runtime/parallel/data/fsdp.py)",
    ]
    if plan.pipeline.schedule in schedule.SPLIT_BACKWARD:
        comments.append("the split backward's W gathers its blocks once more (Note [ZeRO-3 under a split backward])")
    items, dp_arg, replicate = [], groups.reduce, ()
    if hybrid:
        where = f"{cite(train.zero_shard.span)}: shard over the {over} ranks of one node, replicate across nodes"
        items = [
            Call(target="shard_group, replicate_group", callee="fsdp.node_groups",
                 args=("grid", axes_arg, "DEVICES_PER_NODE"), comments=(*comments, where)),
            *render_moe.node_group_lines(plan),
        ]
        comments, dp_arg, replicate = [], "shard_group", (("replicate_group", "replicate_group"),)
    if render_pipeline.stage_replicas(plan):  # Note [ZeRO-3 over stage replicas] (fsdp.py)
        comments.append("the other pipeline's copies of our stages: their shards summed with ours once a step")
        replicate += (("replica_group", "replica_group"),)
    items.append(Call(
        target="optimizer", callee="fsdp.FullyShardedAdamW", args=("net",),
        kwargs=(("dp_group", dp_arg), ("tp_group", groups.tp), *hyper, *groups.pp, *replicate,
                ("accumulations", render_step.backward_passes(plan)), ("prefetch", "ZERO_PREFETCH"),
                *render_moe.zero_kwargs(plan, by_node=hybrid), *compute),
        comments=tuple(comments),
    ))
    return items, Step(clip=(
        f"# mean gradient over {over} (each block's summed into our shards pass by pass); the norm is global",
        Call(target="grad_norm", callee="optimizer.reduce_gradients_and_clip", args=("GRAD_CLIP",),
             kwargs=render_step.grad_scale_kwargs(plan)),
    ), update="optimizer.step()  # AdamW on our shards: the next forward gathers the new parameters")
