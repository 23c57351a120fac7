"""Rendering of the training step: the micro-batch loop, or the pipeline executor.

Takes: a ``Plan`` and the forward lines ``render.py`` prepared (with autocast when
bf16). Gives: the lines of ``train.py`` that differ when the layout has a pipeline:
config constants (``PP``, ``SCHEDULE``, ``CHUNKS``, the literal ``PIPELINE_STAGES``
table), the pipeline's groups and executor, and the body of one optimizer step up to
the end of backward. Without a pipeline the step is the plain loop over
micro-batches; with one it hands every micro-batch to ``pipeline.PipelineExecutor``,
which runs this rank's actions of the schedule.
Before: ``codegen/render.py`` calls these. After: the template places the lines.
"""

from __future__ import annotations

from parc.runtime.layout.constraints import master_weights
from parc.runtime.layout.placement import placement_for

from . import render_compress, render_hetero
from .plan import Plan
from .plan_text import cite

SCHEDULE_WORDS = {
    "gpipe": "all forwards, then all backwards",
    "1f1b": "one forward, one backward after a warmup (PipeDream-flush)",
    "interleaved": "1F1B over several model chunks per rank (Megatron interleaved)",
    "zero_bubble": "ZB-H1: backward split into B (input grad) and W (weight grad), Ws fill the bubble",
    "zero_bubble_v": "ZB-V: two chunks per rank in a V, backward split into B and W, Ws fill the bubble",
    "chimera": "Chimera: two 1F1B pipelines in opposite directions, even micro-batches down, odd up",
    "terapipe": "TeraPipe: each sequence in SLICES token slices, 1F1B over the slices, backwards in reverse",
}


def sliced(plan: Plan) -> bool:
    """terapipe: each micro-batch's sequences run as ``SLICES`` token slices."""
    return has_pipeline(plan) and plan.pipeline.slices > 1


def backward_passes(plan: Plan) -> str:
    """How many backwards add to each gradient in a step (the gradient reducers'
    ``accumulations``): one per micro-batch, or per slice of one under terapipe."""
    return f"GRAD_ACCUM * {slice_count(plan)}" if sliced(plan) else "GRAD_ACCUM"


def slice_count(plan: Plan) -> str:
    """The generated expression for the slices per sequence: ``SLICES`` holds their count,
    or, where the spec lists them (uneven slices), each slice's tokens."""
    return "len(SLICES)" if plan.pipeline.slice_lengths else "SLICES"


PLACEMENT_WORDS = {
    "v": ("chunk 0 of pipeline", "rank r is stage r, chunk 1 stage 2·PP-1-r (a V)"),
    "chimera": ("chunk 0 of pipeline", "rank r is stage r of the down pipeline, chunk 1 stage PP-1-r of the up one"),
    "interleaved": ("chunk c of pipeline", "rank r is stage c·PP + r"),
}


def placement_kind(plan: Plan) -> str:
    """Which stage each rank's chunk runs (``runtime/layout/placement.py``)."""
    pipe = plan.pipeline
    return placement_for(pipe.schedule, pipe.size, pipe.chunks).kind


def placement_lines(plan: Plan) -> list[str]:
    """``placement=PLACEMENT,`` where the placement is not Megatron's (the default)."""
    return ["placement=PLACEMENT,"] if placement_kind(plan) != "interleaved" else []


def has_pipeline(plan: Plan) -> bool:
    return plan.pipeline.size > 1


def tied_embeddings(plan: Plan) -> bool:
    return any(s.name == "TIE_EMBEDDINGS" and s.value for s in plan.model.settings)


def fused_embedding_sync(plan: Plan) -> bool:
    """Is the tied embedding's sum over its first and last stage copies folded into the dp
    all-reduce (Note [fused embedding synchronization] in runtime/parallel/pipeline/pipeline.py)? Wherever its
    gradient goes through ``dp.GradientBuckets``: a pipeline of the default placement, dp·cp > 1,
    no ZeRO (reduce-scattered into shards), no compression, one layout for every block."""
    mesh = plan.mesh
    return (tied_embeddings(plan) and has_pipeline(plan) and placement_kind(plan) == "interleaved"
            and mesh.size("dp") * mesh.size("cp") > 1 and not plan.train.zero.value
            and not render_compress.enabled(plan) and not render_hetero.enabled(plan))


def config_lines(plan: Plan) -> list[str]:
    """``PP``, ``SCHEDULE``, ``CHUNKS`` and ``PIPELINE_STAGES``; empty without a pipeline."""
    pipe = plan.pipeline
    if not has_pipeline(plan):
        return []
    split = f"{cite(pipe.stage_layers_span)}: stage_layers" if pipe.stage_layers_span else "an even split"
    v = placement_kind(plan) != "interleaved"
    where = PLACEMENT_WORDS[placement_kind(plan)]
    lines = [
        f"PP = {pipe.size!r}  # {cite(pipe.span)}: pipeline stages",
        f"SCHEDULE = {pipe.schedule!r}  # {cite(pipe.schedule_span)}: {SCHEDULE_WORDS[pipe.schedule]}",
        f"CHUNKS = {pipe.chunks!r}  # model chunks (virtual stages) per pipeline rank",
        *([f"SLICES = {pipe.slices!r}  # {cite(pipe.schedule_span)}: token slices of each sequence "
           "(terapipe.py)"] if sliced(plan) and not pipe.slice_lengths else []),
        *([f"# {cite(pipe.schedule_span)}: tokens of each slice of a sequence, uneven (terapipe.py)",
           f"SLICES = {list(pipe.slice_lengths)!r}"] if sliced(plan) and pipe.slice_lengths else []),
        *([f"PLACEMENT = {placement_kind(plan)!r}  # which stage each chunk runs (runtime/layout/placement.py)"] if v else []),
        f"# layers [start, stop) of each virtual stage ({split}); {where[0]}",
        f"# {where[1]}. Under this schedule a rank idles {100 * pipe.bubble_fraction:.1f}% of the step",
        "# (forward 1, backward 2 time units); `parc explain` draws the timeline.",
        f"PIPELINE_STAGES = {pipe.stage_layers!r}",
    ]
    return lines


def group_lines(plan: Plan) -> list[str]:
    if not has_pipeline(plan):
        return []
    lines = ['pp_group = grid.group("pp")  # ranks that hold consecutive stages']
    if placement_kind(plan) == "chimera":
        lines.append("# this rank and the one holding the same two stages the other way round")
        lines.append("replica_group = pipeline.replica_group(grid)")
    if fused_embedding_sync(plan):
        reduce_axes = '"dp"' if plan.mesh.size("cp") == 1 else '"dp", "cp"'
        lines.append("# the first and last stage's ranks over dp: the tied embedding table's copies,")
        lines.append("# summed over both and averaged over dp in one all-reduce (Note [fused embedding")
        lines.append("# synchronization] in pipeline.py)")
        lines.append(f"tied_group = pipeline.embedding_group(grid, {reduce_axes})")
    elif tied_embeddings(plan):
        lines.append("# first and last stage, which both hold the tied embedding table")
        lines.append("tied_group = pipeline.tied_embedding_group(grid)")
    return lines


def build_lines(plan: Plan) -> list[str]:
    """The plain model: whole, or this pipeline rank's chunks."""
    if not has_pipeline(plan):
        return ["net = model.build_model(config)"]
    return [
        "# this pipeline rank's chunks (one per virtual stage it holds), as nn.ModuleList",
        "net = model.build_stages(",
        "    config,",
        "    stages=PIPELINE_STAGES,",
        '    pp_rank=grid.index("pp"),',
        "    pp_size=PP,",
        *("    " + line for line in placement_lines(plan)),
        ")",
    ]


LOW_PRECISION = {"bf16": "torch.bfloat16", "fp16": "torch.float16"}
"""``train.precision`` → the torch dtype of its compute (fp32: none)."""


def grad_reduce_dtype(plan: Plan) -> str | None:
    """The dtype gradients are summed in over the data-parallel ranks, where it is not the
    gradients' own: bf16 under ``train.grad_reduce = bf16``; fp32 for bf16/fp16 parameters'
    gradients (master.py) under the default; None otherwise (fp32 gradients, fp32 sums).
    The dense buckets and the experts' edp sum both ask here."""
    if plan.train.grad_reduce is not None:
        return "torch.bfloat16"
    return "torch.float32" if compute_dtype(plan) is not None else None


def grad_scale_arg(plan: Plan) -> str:
    """The last argument of every gradient clip of the step (``optim.clip_grad_norm_``,
    ``hetero.clip_grad_norm_``, ``unscale_and_clip``, ``reduce_gradients_and_clip``): under
    fp16 the gradients are of the scaled loss, and each clip divides them by the scale first."""
    return ", grad_scale=scaled_by" if plan.train.precision.value == "fp16" else ""


def grad_scale_kwargs(plan: Plan) -> tuple[tuple[str, str], ...]:
    """``grad_scale_arg`` as a call's keyword arguments (codegen/view.py)."""
    return (("grad_scale", "scaled_by"),) if plan.train.precision.value == "fp16" else ()


def compute_dtype(plan: Plan) -> str | None:
    """The dtype the parameters are held and used in, with fp32 master weights in the
    optimizer (runtime/optimizers/master.py, Note [master weights]); None for fp32 and where the
    forward autocasts instead (``autocast_dtype``)."""
    if autocast_dtype(plan) is not None:
        return None
    return LOW_PRECISION.get(plan.train.precision.value)


def autocast_dtype(plan: Plan) -> str | None:
    """The torch dtype the forward autocasts to over fp32 weights: only for the layouts
    whose gradient code has no low-precision compute weights yet (per-layer tp/dp,
    compressed dp gradients: they keep fp32 parameters); None otherwise."""
    precision = plan.train.precision.value
    compressed = render_compress.enabled(plan) or render_compress.pipeline_enabled(plan)
    if master_weights(precision, per_layer_tp=render_hetero.enabled(plan), compressed=compressed):
        return None
    return LOW_PRECISION.get(precision)


def executor_lines(plan: Plan) -> list[str]:
    if not has_pipeline(plan):
        return []
    # this rank's tokens of a sequence: T, over cp, and over tp under SP
    tokens = "SEQ_LEN" + (" // CP" if plan.mesh.size("cp") > 1 else "") + (
        (" // TP" if plan.mesh.tp_shape is None else " // TP_SHAPE[1]") if plan.sequence_parallel.enabled else ""
    )
    autocast = autocast_dtype(plan) or "None"
    rows = "MICRO_BATCH"
    # Note [2D tensor parallelism]: between blocks each rank holds hidden/R features
    hidden = "HIDDEN" if plan.mesh.tp_shape is None else "HIDDEN // TP_SHAPE[0]"
    boundary = {plan.blocks[start].tp for start, _ in plan.pipeline.stage_layers[1:]}
    if len(boundary) == 1 and len({b.tp for b in plan.blocks}) > 1:  # heterogeneous (constraints: PAR0255)
        (tp,) = boundary
        rows = f"MICRO_BATCH * {tp} // TP"  # the coarse micro-batch's piece at the boundary's tp {tp}
        if plan.sequence_parallel.enabled:
            tokens = "SEQ_LEN" + (f" // {tp}" if tp > 1 else "")
    return [
        "",
        "# ---- pipeline -----------------------------------------------------------",
        "# This rank's ordered actions (forward/backward of micro-batch m, chunk c; send/recv)."
        + (" Under terapipe" if sliced(plan) else ""),
        *([f"# an action's micro-batch is a slice: m·{slice_count(plan)} + j is slice j of micro-batch m."]
          if sliced(plan) else []),
        "actions = schedule.build_schedule(",
        "    SCHEDULE, stages=PP, micro_batches=GRAD_ACCUM, chunks=CHUNKS" + (f", slices={slice_count(plan)}" if sliced(plan) else ""),
        ')[grid.index("pp")]',
        "runner = pipeline.PipelineExecutor(",
        "    net,",
        "    actions=actions,",
        "    pp_group=pp_group,",
        '    pp_ranks=grid.ranks("pp"),',
        '    pp_rank=grid.index("pp"),',
        "    micro_batches=GRAD_ACCUM,",
        "    # what travels between stages: (micro-batch, tokens, hidden), fp32",
        f"    activation_shape=({rows}, {tokens}, {hidden}),",
        "    device=dist.device,",
        "    loss_fn=loss_fn,  # called on the last stage: each micro-batch's loss, your terms added",
        *([f"    # {cite(plan.train.precision.span)}: {plan.train.precision.value} autocast in each stage's "
           "forward; weights, grads and Adam stay fp32"] if autocast != "None" else []),
        f"    autocast_dtype={autocast},",
        *("    " + line for line in render_compress.executor_args(plan, f"(MICRO_BATCH, {tokens}, HIDDEN)")),
        *("    " + line for line in placement_lines(plan)),
        *([("    slices=tuple(SLICES)," if plan.pipeline.slice_lengths else
            "    slices=(SEQ_LEN // SLICES,) * SLICES,") + "  # tokens of each slice"] if sliced(plan) else []),
        ")",
    ]


def _sample_lines(dp_rank_arg: str) -> list[str]:
    return [
        "indices = data.sample_indices(",
        "    step,",
        "    micro,",
        "    micro_batch=MICRO_BATCH,",
        "    grad_accum=GRAD_ACCUM,",
        f"    dp_rank={dp_rank_arg},",
        "    dp_size=DP,",
        ")",
    ]


def separate(plan: Plan) -> bool:
    """``model.documents = separate``: the data yields each token's document id (data.py)."""
    return any(s.name == "DOCUMENTS" and s.value == "separate" for s in plan.model.settings)


def _documents(plan: Plan) -> str:
    """Under documents = separate a batch's third tensor: (B, T) document ids, whole under cp."""
    return ", documents" if separate(plan) else ""


def step_body_lines(plan: Plan, forward_lines: list[str], dp_rank_arg: str) -> list[str]:
    """One step's forward and backward, leaving ``loss_sum`` (the step's mean loss here)."""
    scale = ["scaled_by = scaler.begin(step)  # fp16: backward runs on loss × scaled_by"] \
        if plan.train.precision.value == "fp16" else []
    if scale and has_pipeline(plan):
        scale.append("runner.loss_scale = scaled_by  # the last stage's backward starts from it")
    if not has_pipeline(plan):
        lines = [*scale, "loss_sum = 0.0", "for micro in range(GRAD_ACCUM):"]
        body = _sample_lines(dp_rank_arg)
        body.append(f"inputs, targets{_documents(plan)} = dataset.batch(indices)  # (B, T) token ids each")
        if plan.mesh.size("cp") > 1:
            body += [
                "inputs, targets = data.context_chunk(",
                '    inputs, targets, cp_rank=grid.index("cp"), cp_size=CP, cp_kind=CP_KIND',
                ")  # (B, T/cp): this rank's tokens of each sequence",
            ]
        body += forward_lines
        body += [
            "(loss * scaled_by).backward()  # fp16: the scaled loss (loss_scale.py)"
            if plan.train.precision.value == "fp16" else "loss.backward()",
            "# summed on the device: one wait for it a step (below), not one a micro-batch",
            "loss_sum += loss.detach()",
        ]
        lines += ["    " + line for line in body]
        lines.append("loss_sum = loss_sum.item()")
    else:
        lines = [*scale, "batches = []  # every micro-batch of this step: the first stage reads the"]
        lines.append("# inputs, the last the targets")
        lines.append("for micro in range(GRAD_ACCUM):")
        lines += ["    " + line for line in _sample_lines(dp_rank_arg)]
        if plan.mesh.size("cp") > 1:
            documents = _documents(plan)
            lines += [
                f"    inputs, targets{documents} = dataset.batch(indices)  # (B, T) token ids each",
                "    batches.append(",
                f"        {'(*' if documents else ''}data.context_chunk(",
                '            inputs, targets, cp_rank=grid.index("cp"), cp_size=CP, cp_kind=CP_KIND',
                f"        ){documents})" if documents else "        )",
                "    )  # (B, T/cp): this rank's tokens of each sequence",
            ]
        else:
            lines.append("    batches.append(dataset.batch(indices))  # (B, T) token ids each")
        lines.append("# forward and backward of every micro-batch, in the schedule's order")
        lines.append("loss_sum = runner.step(batches)  # the last stage's mean loss, 0 elsewhere")
    # Note [counting saved activations] (memory.py): the hooks see what autograd keeps
    return ["with activations:  # measures the tensors saved for backward"] + [
        "    " + line for line in lines
    ]


def after_backward_lines(plan: Plan) -> list[str]:
    if not has_pipeline(plan):
        return []
    lines = []
    if placement_kind(plan) == "chimera":
        lines += ["# each stage's two replicas (down and up pipeline) get the sum of their grads",
                  "pipeline.allreduce_replica_grads(net, replica_group)"]
    if tied_embeddings(plan) and not fused_embedding_sync(plan):  # fused: grad_sync.finish() sums them
        lines += ["# the embedding's two copies (first and last stage) get the sum of their grads",
                  "pipeline.allreduce_tied_grads(net, tied_group)"]
    return lines


def loss_lines(plan: Plan) -> list[str]:
    if not has_pipeline(plan):
        return []
    return [
        "# the loss lives on the last stage; bring it to every pipeline rank",
        "loss_sum = pipeline.loss_over_pipeline(loss_sum, pp_group)",
    ]


def adds(plan: Plan) -> dict:
    """The pipeline entry's sections (``features.Feature.adds``)."""
    return {"groups": group_lines(plan), "after_backward": after_backward_lines(plan)}
