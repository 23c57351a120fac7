"""What ``train.py`` says and does for a heterogeneous layout (runtime/parallel/data/hetero.py).

Takes: the Plan. Gives: ``enabled(plan)`` (the blocks' tp degrees differ), the per-layer
table (``LAYER_TP``: one degree per block, folded into runs of equal layers with the
dp each run leaves, the embedding and head's rows said in words), and the lines that
replace the uniform program's: the layouts' groups, the gradient sums over each
layer's own dp group, the gradient norm, the sequence-parallel sums, ZeRO-1/2's optimizer, ZeRO-3's arguments.

Note [heterogeneous layouts] is in runtime/parallel/data/hetero.py; ``MESH_AXES`` (DP, TP) is the
coarse split of a stage (the largest tp), the one the data is read in.
"""

from __future__ import annotations

from dataclasses import replace

from parc.runtime.layout.layer_settings import fold_runs

from .plan import LayerKind, Plan
from .plan_text import cite
from .view import Call, Step, last_call


def enabled(plan: Plan) -> bool:
    return len({(layer.tp, layer.dp) for layer in plan.layers}) > 1


def table_lines(plan: Plan, where: str) -> list[str]:
    """``LAYER_TP = (2, 2, 1, 1)`` written as runs, each with its tp × dp."""
    if not enabled(plan):
        return []
    blocks = plan.blocks
    embed = next(l for l in plan.layers if l.kind is LayerKind.EMBED)
    head = next(l for l in plan.layers if l.kind is LayerKind.HEAD)
    ranks = blocks[0].tp * blocks[0].dp
    follows = "the embedding (tied to it: one table, one sharding)" if (head.tp, head.dp) == (embed.tp, embed.dp) \
        and head.tp != blocks[-1].tp else f"layers.{len(blocks) - 1}"
    lines = [
        "",
        f"# ---- each layer's split of a stage's {ranks} ranks: tp × dp (parc_runtime/parallel/data/hetero.py) ----",
        f"# {where}: layer i runs tp LAYER_TP[i] × dp {ranks} // LAYER_TP[i]; between layers of",
        "# different degrees the batch is split or gathered. The data is read as dp DP × tp TP",
        f"# (the largest tp); embed runs tp {embed.tp} × dp {embed.dp} as layers.0, head tp {head.tp} × dp {head.dp}"
        f" as {follows}.",
        "# TP_PLAN's shapes below are at tp TP; a layer at a smaller tp splits them fewer ways.",
    ]
    index, parts = 0, []
    for (tp, dp), n in fold_runs([(b.tp, b.dp) for b in blocks]):
        names = f"layers.{index}" if n == 1 else f"layers.{index}-{index + n - 1}"
        lines.append(f"#   {names}: tp {tp} × dp {dp}")
        parts.append(f"({tp},) * {n}" if n > 1 else f"({tp},)")
        index += n
    lines.append("LAYER_TP = " + " + ".join(parts))
    return lines


def group_lines() -> list[str]:
    return [
        "# each layer's tp and dp groups over this stage's ranks, and the batch's moves between them",
        "layouts = hetero.StageLayouts(grid, LAYER_TP)",
        'stage_group = grid.group("dp", "tp")  # every rank of the stage (the gradient norm)',
    ]


def grad_sync_items() -> list:
    return [Call(
        target="grad_sync", callee="hetero.HeteroGradients", args=("net", "layouts"),
        kwargs=(("overlap", "True"), ("accumulations", "GRAD_ACCUM")),
        comments=("each layer's gradients summed over its own dp group (divided by DP, the coarse replicas),",
                  "bucket by bucket as backward produces them"),
    )]


def sp_line() -> str:
    return ("# norms saw only their sequence shard: sum their grads over their layer's tp\n"
            "hetero.allreduce_sequence_parallel_grads(net, layouts)")


def clip_call(pp, scale) -> Call:
    return Call(target="grad_norm", callee="hetero.clip_grad_norm_", args=("net", "GRAD_CLIP"),
                kwargs=(("layouts", "layouts"), ("stage_group", "stage_group"), *pp, *scale))


def zero_items(where: str, stage: int, hyper, pp, scale) -> tuple[list, Step]:
    """ZeRO-1/2 over per-layer layouts: the optimizer's items and the step's."""
    what = "AdamW state" if stage == 1 else "AdamW state and gradients"
    optimizer = [Call(
        target="optimizer", callee="hetero.ShardedAdamW", args=("net", "layouts"),
        kwargs=(("stage", "ZERO"), *hyper, ("stage_group", "stage_group"), *pp,
                *((("accumulations", "GRAD_ACCUM"),) if stage == 2 else ())),
        comments=(f"{where}: ZeRO-{stage}, {what} sharded over each layer's own dp group:",
                  "one flat fp32 buffer per tp degree, each dp rank of a layer owning one slice of it",
                  "and its Adam moments" + (" (and its gradient)" if stage == 2 else "")),
    )]
    step = Step(clip=(
        "# our slices of each layer's mean gradient; the norm is global" if stage == 1 else
        "# each layer's buckets reduced over its dp group as backward produced them, into our slices",
        Call(target="grad_norm", callee="optimizer.reduce_gradients_and_clip", args=("GRAD_CLIP",), kwargs=scale),
    ), update="optimizer.step()  # AdamW on our slices, then all-gather each over its layers' dp group")
    return optimizer, step


def fsdp_items(where: str, items: list) -> list:
    """ZeRO-3's optimizer over per-layer layouts (fsdp.py, Note [ZeRO-3 over per-layer
    layouts]): the uniform call given the layouts, each unit over its own layer's dp group."""
    call = replace(last_call(items), comments=(
        f"{where}: ZeRO-3 over each layer's own dp group: every block (and the embedding and",
        "head, by their degree) is one flat fp32 buffer sharded over the ranks of its layer's",
        "dp group; each keeps its share and the share's Adam moments, all-gathers a block",
        "before its forward and again before its backward (ZERO_PREFETCH blocks ahead), frees",
        "it after; gradients reduced over that group and divided by DP; the norm over the stage",
    ))
    return [call.given(("layouts", "layouts"), ("stage_group", "stage_group"))]


def adds(plan: Plan) -> dict:
    """The per-layer entry's sections (``features.Feature.adds``)."""
    return {"config": table_lines(plan, cite(plan.mesh.axis("tp").span)), "groups": group_lines()}
