"""train.py's optimizer and the step's clip and update: plain AdamW, fp32 masters of bf16/fp16
parameters (runtime/optimizers/master.py), ZeRO-1/2 (runtime/parallel/data/zero.py), and the
ZeRO-3 and per-layer variants their feature modules give (render_fsdp.py, render_hetero.py).

Takes: a ``Plan`` and the step's groups as ``render.py`` named them (``Groups``). Gives:
``optimizer_and_step``: the optimizer section's items (its last a ``view.Call``) and the
step's; ``reduced_in_bf16``, ``train.grad_reduce = bf16`` as the arguments it gives a
gradient reduction's call (Note [a section is a list of calls] in view.py).
Before: ``render.py`` names the groups. After: ``render.py`` places the sections.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import render_compress, render_fsdp, render_hetero, render_moe, render_step
from .plan import Plan
from .plan_text import cite
from .view import Call, Item, Step, last_call, with_last

HYPER = (("lr", "LR"), ("betas", "BETAS"), ("weight_decay", "WEIGHT_DECAY"), ("eps", "EPS"))
"""AdamW's hyperparameters, the config's constants."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Groups:
    """The step's groups as train.py names them (render.py)."""

    reduce: str
    """The group gradients and the loss are averaged over: ``dp_group``, ``grad_group`` or ``None``."""
    over: str
    """Its ranks in words: ``dp`` or ``dp × cp``."""
    tp: str
    pp: tuple[tuple[str, str], ...]
    """``pp_group=pp_group`` where the layout has a pipeline."""


def compute_kwargs(plan: Plan) -> tuple[tuple[str, str], ...]:
    """ZeRO's optimizers under bf16/fp16: the parameters' dtype (the fp32 master is the shard)."""
    compute = render_step.compute_dtype(plan)
    return () if compute is None else (("compute_dtype", compute),)


def zero_reduced_in_bf16(plan: Plan, items: list[Item], over: str) -> list[Item]:
    """``train.grad_reduce = bf16`` under ZeRO: the optimizer's call sums the gradients in
    bf16 into its fp32 slices (runtime/parallel/data/zero.py, Note [bf16 reduction under ZeRO])."""
    if plan.train.grad_reduce is None:
        return items
    comment = f"{cite(plan.train.grad_reduce.span)}: gradients summed over {over} in bf16, divided and kept in fp32 (our slices)"
    return with_last(items, last_call(items).given(("reduce_dtype", "torch.bfloat16"), comment=comment))


def reduced_in_bf16(plan: Plan, items: list[Item], over: str) -> list[Item]:
    """``train.grad_reduce = bf16`` without ZeRO's own reduction: the gradient sync's call
    (``dp.GradientBuckets``, ``hetero.HeteroGradients`` or a compressing one of compress.py,
    Note [bf16 on the wire]) reduces in bf16."""
    if plan.train.grad_reduce is None:
        return items
    words = render_compress.bf16_words(plan)
    words = f"summed over {over} in bf16, divided back in fp32" if words is None else f"over {over}, {words}"
    comment = f"{cite(plan.train.grad_reduce.span)}: {words}"
    return with_last(items, last_call(items).given(("reduce_dtype", "torch.bfloat16"), comment=comment))


def optimizer_and_step(plan: Plan, groups: Groups) -> tuple[list[Item], Step]:
    """The optimizer section's items and the step's (its clip, update and reset)."""
    zero_stage, hetero = plan.train.zero.value, render_hetero.enabled(plan)
    scale = render_step.grad_scale_kwargs(plan)  # fp16: every clip divides by the loss scale first
    if zero_stage == 3:
        optimizer, step = render_fsdp.optimizer_and_step(plan, groups, HYPER, compute_kwargs(plan))
        if hetero:  # Note [ZeRO-3 over per-layer layouts] (fsdp.py)
            optimizer = render_hetero.fsdp_items(cite(plan.train.zero.span), optimizer)
        return zero_reduced_in_bf16(plan, optimizer, groups.over), step
    if zero_stage and hetero:  # Note [ZeRO over per-layer layouts]
        optimizer, step = render_hetero.zero_items(cite(plan.train.zero.span), zero_stage, HYPER, groups.pp, scale)
        if zero_stage == 2:  # stage 1's are HeteroGradients' (render_data.py)
            optimizer = zero_reduced_in_bf16(plan, optimizer, groups.over)
        return optimizer, step
    if zero_stage:
        return _sharded(plan, groups, scale)
    clip = (("tp_group", groups.tp), *groups.pp, *render_moe.group_kwargs(plan), *scale)
    if render_step.compute_dtype(plan) is not None:  # runtime/optimizers/master.py, Note [master weights]
        precision = plan.train.precision
        return [Call(
            target="optimizer", callee="master.MasterAdamW", args=("net",),
            kwargs=(("dtype", render_step.compute_dtype(plan)), *HYPER,
                    ("accumulations", render_step.backward_passes(plan))),
            comments=(f"{cite(precision.span)}: {precision.value} parameters, used as they are; the optimizer keeps",
                      "their fp32 master copy and Adam moments and writes the rounded values back after each step"),
        )], Step(clip=(
            Call(target="grad_norm", callee="optimizer.unscale_and_clip", args=("GRAD_CLIP",), kwargs=clip,
                 comments=("the gradients to fp32 (the masters'), unscaled and clipped there; the norm is global",)),
        ), update="optimizer.step()  # AdamW on the fp32 masters, rounded into the parameters")
    optimizer = [Call(target="optimizer", callee="optim.build_optimizer", args=("net",), kwargs=HYPER)]
    return optimizer, Step(clip=(
        Call(target="grad_norm", callee="optim.clip_grad_norm_", args=("net", "GRAD_CLIP"), kwargs=clip)
        if render_step.plain_clip(plan) else render_hetero.clip_call(groups.pp, scale),
    ), update="optimizer.step()", clear="optimizer.zero_grad(set_to_none=True)")


def _sharded(plan: Plan, groups: Groups, scale) -> tuple[list[Item], Step]:
    """ZeRO-1/2: zero.ShardedAdamW, after a compressing gradient sync when ``parallel.compress``."""
    zero, precision = plan.train.zero, plan.train.precision
    optimizer = [Call(
        target="optimizer", callee="zero.ShardedAdamW", args=("net",),
        kwargs=(("dp_group", groups.reduce), ("tp_group", groups.tp), ("stage", "ZERO"), *HYPER, *groups.pp,
                ("accumulations", render_step.backward_passes(plan)), *render_moe.zero_kwargs(plan),
                *compute_kwargs(plan)),
        comments=(f"{cite(zero.span)}: ZeRO-{zero.value}, {render_step.zero_words(plan)}: each {groups.over} rank",
                  "owns one slice of a flat fp32 parameter buffer and its Adam moments"
                  if render_step.compute_dtype(plan) is None else
                  f"owns one slice of a flat {precision.value} parameter buffer ({cite(precision.span)}), "
                  "its fp32 master and Adam moments"),
    )]
    reduce_words = ("buckets all-reduced while backward runs; keep our slice" if zero.value == 1
                    else "each bucket reduced as backward produced it, into our slice")
    if render_compress.enabled(plan):  # Note [compression under ZeRO] (runtime/parallel/data/zero.py)
        sync = reduced_in_bf16(plan, render_compress.grad_sync_items(plan, groups.reduce, groups.over), groups.over)
        optimizer = sync + with_last(optimizer, last_call(optimizer).given(("grad_sync", "grad_sync")))
        reduce_words = "compressed after backward, then our slice of it kept"
    return zero_reduced_in_bf16(plan, optimizer, groups.over), Step(clip=(
        f"# mean gradient over {groups.over} ({reduce_words}); the norm is global",
        Call(target="grad_norm", callee="optimizer.reduce_gradients_and_clip", args=("GRAD_CLIP",), kwargs=scale),
    ), update="optimizer.step()  # AdamW on our slice, then all-gather the parameters over dp")


def loss_scale_adds(plan: Plan) -> dict:
    """fp16's entry (runtime/optimizers/loss_scale.py): the dynamic loss scale."""
    precision, mesh = plan.train.precision, plan.mesh
    return {"record": ['"loss_scale": scaler.scale,  # fp16: the scale after this step\'s grow/backoff',
                       '"skipped_overflow_steps": scaler.skipped,'],
            "optimizer_extra": [
        f"# {cite(precision.span)}: fp16: dynamic loss scaling (grow/backoff, overflow steps skipped)",
        "# each rank scales its share of the global loss (Note [the scale of one rank's backward])",
        Call(target="scaler", callee="loss_scale.DynamicLossScale", kwargs=(
            ("rank", "dist.rank"), *((("data_ranks", render_moe.data_ranks(plan)),) if mesh.size("dp") * mesh.size("cp") > 1 else ()))),
    ]}
