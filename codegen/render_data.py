"""train.py's lines for data parallelism (runtime/parallel/data/dp.py): the dp group, and the
gradient sync that averages the gradients over the ranks that saw different tokens (dp, or
dp × cp under context parallelism) while backward runs.

Takes: a ``Plan``. Gives: ``adds(plan)``, the data-parallel entry's sections (``features.Feature.adds``):
the group, the ``grad_sync`` object (``dp.GradientBuckets``, a compressing one of
compress.py, or per-layer ``hetero.HeteroGradients``) and its ``finish()`` after backward.
Before: ``passes/``. After: ``render.py`` gathers the sections.
"""

from __future__ import annotations

from . import render_compress, render_hetero, render_pipeline, render_step
from .plan import Plan
from .render_optimizer import reduced_in_bf16
from .view import Call, last_call, with_last


def adds(plan: Plan) -> dict:
    mesh, zero = plan.mesh, plan.train.zero.value
    groups = ['dp_group = grid.group("dp")  # ranks that split the batch'] \
        if mesh.size("cp") == 1 and mesh.size("dp") > 1 else []
    if render_hetero.enabled(plan) and zero not in (2, 3):  # ZeRO-2/3 reduce each layer's gradients themselves
        return {"groups": groups,
                "optimizer_extra": reduced_in_bf16(plan, render_hetero.grad_sync_items(), "each layer's dp group"),
                "after_backward": ["grad_sync.finish()  # wait the buckets: each layer's mean gradient"]}
    if zero or mesh.size("dp") * mesh.size("cp") == 1:  # ZeRO's optimizer reduces them (render_optimizer.py)
        return {"groups": groups}
    group, over = render_step.reduce_group(plan)
    compressed = render_compress.enabled(plan)
    # Note [gradient overlap] (runtime/parallel/data/dp.py): always on with dp > 1
    sync = render_compress.grad_sync_items(plan, group, over) if compressed else [Call(
        target="grad_sync", callee="dp.GradientBuckets", args=("net", group),
        kwargs=(("overlap", "True"), ("accumulations", render_step.backward_passes(plan))),
        comments=(f"each bucket of gradients is all-reduced over {over} as soon as backward has",
                  "produced it (on the last micro-batch), while backward goes on"),
    )]
    sync = reduced_in_bf16(plan, sync, over)
    if render_step.grad_reduce_dtype(plan) == "torch.float32" and not compressed:
        sync = with_last(sync, last_call(sync).given(("reduce_dtype", "torch.float32"), comment=(
            f"the {plan.train.precision.value} gradients summed over {over} in fp32 (train.grad_reduce) and divided there")))
    if render_pipeline.fused_embedding_sync(plan):  # Note [fused embedding synchronization]
        sync = with_last(sync, last_call(sync).given(("tied_group", "tied_group"), comment=(
            "the tied embedding's copies: summed over tied_group (both stages × dp), in one all-reduce")))
    # first of after_backward (view.ORDER): the lines after it change grads, and finish() writes the means back
    fp16 = plan.train.precision.value == "fp16"
    scale = ("scaled_by",) if compressed and fp16 else ()  # Note [compression under fp16]
    finish = Call(callee="grad_sync.finish", args=scale, note=f"compressed mean gradient over the {over} ranks"
                  if compressed else f"wait the buckets: mean gradient over the {over} ranks")
    return {"groups": groups, "optimizer_extra": sync, "after_backward": [finish]}
