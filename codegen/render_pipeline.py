"""train.py's lines for a pipeline (runtime/parallel/pipeline/): the constants of its stages
and schedule, its groups, this rank's chunks, the executor, the gradient sums over a stage's
copies and the loss brought to every pipeline rank.

Takes: a ``Plan``. Gives: ``config_lines`` (``PP``, ``SCHEDULE``, ``CHUNKS``, the literal
``PIPELINE_STAGES`` table), ``build_items``, ``executor_items``, ``loss_lines`` and
``adds(plan)``, the pipeline entry's sections (``features.Feature.adds``): its groups and
what follows backward. Before: ``passes/``. After: ``render.py``, ``render_model.py`` and
``render_constants.py`` place the lines; render_step.py writes the step that calls the executor.
"""

from __future__ import annotations

from parc.runtime.layout.placement import placement_for

from . import render_compress, render_hetero, render_step, render_tensor
from .plan import Plan
from .plan_text import cite
from .view import Arg, Call

SCHEDULE_WORDS = {
    "gpipe": "all forwards, then all backwards",
    "1f1b": "one forward, one backward after a warmup (PipeDream-flush)",
    "interleaved": "1F1B over several model chunks per rank (Megatron interleaved)",
    "zero_bubble": "ZB-H1: backward split into B (input grad) and W (weight grad), Ws fill the bubble",
    "zero_bubble_v": "ZB-V: two chunks per rank in a V, backward split into B and W, Ws fill the bubble",
    "chimera": "Chimera: two 1F1B pipelines in opposite directions, even micro-batches down, odd up",
    "terapipe": "TeraPipe: each sequence in SLICES token slices, 1F1B over the slices, backwards in reverse",
}


PLACEMENT_WORDS = {
    "v": ("chunk 0 of pipeline", "rank r is stage r, chunk 1 stage 2·PP-1-r (a V)"),
    "chimera": ("chunk 0 of pipeline", "rank r is stage r of the down pipeline, chunk 1 stage PP-1-r of the up one"),
    "interleaved": ("chunk c of pipeline", "rank r is stage c·PP + r"),
}


def placement_kind(plan: Plan) -> str:
    """Which stage each rank's chunk runs (``runtime/layout/placement.py``)."""
    pipe = plan.pipeline
    return placement_for(pipe.schedule, pipe.size, pipe.chunks).kind


def placement_kwargs(plan: Plan) -> tuple[tuple[str, str], ...]:
    """``placement=PLACEMENT`` where the placement is not Megatron's (the default)."""
    return (("placement", "PLACEMENT"),) if placement_kind(plan) != "interleaved" else ()


def tied_embeddings(plan: Plan) -> bool:
    return any(s.name == "TIE_EMBEDDINGS" and s.value for s in plan.model.settings)


def fused_embedding_sync(plan: Plan) -> bool:
    """Is the tied embedding's sum over its first and last stage copies folded into the dp
    all-reduce (Note [fused embedding synchronization] in runtime/parallel/pipeline/pipeline.py)? Wherever its
    gradient goes through ``dp.GradientBuckets``: a pipeline of the default placement, dp·cp > 1,
    no ZeRO (reduce-scattered into shards), no compression, one layout for every block."""
    mesh = plan.mesh
    return (tied_embeddings(plan) and render_step.has_pipeline(plan) and placement_kind(plan) == "interleaved"
            and mesh.size("dp") * mesh.size("cp") > 1 and not plan.train.zero.value
            and not render_compress.enabled(plan) and not render_hetero.enabled(plan))


def config_lines(plan: Plan) -> list[str]:
    """``PP``, ``SCHEDULE``, ``CHUNKS`` and ``PIPELINE_STAGES``; empty without a pipeline."""
    pipe = plan.pipeline
    if not render_step.has_pipeline(plan):
        return []
    split = f"{cite(pipe.stage_layers_span)}: stage_layers" if pipe.stage_layers_span else "an even split"
    v = placement_kind(plan) != "interleaved"
    where = PLACEMENT_WORDS[placement_kind(plan)]
    lines = [
        f"PP = {pipe.size!r}  # {cite(pipe.span)}: pipeline stages",
        f"SCHEDULE = {pipe.schedule!r}  # {cite(pipe.schedule_span)}: {SCHEDULE_WORDS[pipe.schedule]}",
        f"CHUNKS = {pipe.chunks!r}  # model chunks (virtual stages) per pipeline rank",
        *([f"SLICES = {pipe.slices!r}  # {cite(pipe.schedule_span)}: token slices of each sequence "
           "(terapipe.py)"] if render_step.sliced(plan) and not pipe.slice_lengths else []),
        *([f"# {cite(pipe.schedule_span)}: tokens of each slice of a sequence, uneven (terapipe.py)",
           f"SLICES = {list(pipe.slice_lengths)!r}"] if render_step.sliced(plan) and pipe.slice_lengths else []),
        *([f"PLACEMENT = {placement_kind(plan)!r}  # which stage each chunk runs (runtime/layout/placement.py)"] if v else []),
        f"# layers [start, stop) of each virtual stage ({split}); {where[0]}",
        f"# {where[1]}. Under this schedule a rank idles {100 * pipe.bubble_fraction:.1f}% of the step",
        "# (forward 1, backward 2 time units); `parc explain` draws the timeline.",
        f"PIPELINE_STAGES = {pipe.stage_layers!r}",
    ]
    return lines


def group_lines(plan: Plan) -> list:
    if not render_step.has_pipeline(plan):
        return []
    lines = ['pp_group = grid.group("pp")  # ranks that hold consecutive stages']
    if placement_kind(plan) == "chimera":
        lines.append("# this rank and the one holding the same two stages the other way round")
        lines.append("replica_group = pipeline.replica_group(grid)")
    if fused_embedding_sync(plan):
        reduce_axes = ('"dp"',) if plan.mesh.size("cp") == 1 else ('"dp"', '"cp"')
        words = ("the first and last stage's ranks over dp: the tied embedding table's copies,",
                 "summed over both and averaged over dp in one all-reduce (Note [fused embedding",
                 "synchronization] in pipeline.py)")
        lines.append(Call(target="tied_group", callee="pipeline.embedding_group", args=("grid", *reduce_axes),
                          comments=words))
    elif tied_embeddings(plan):
        lines.append("# first and last stage, which both hold the tied embedding table")
        lines.append("tied_group = pipeline.tied_embedding_group(grid)")
    return lines


def build_items(plan: Plan) -> list[Call]:
    """The plain model: whole, or this pipeline rank's chunks."""
    if not render_step.has_pipeline(plan):
        return [Call(target="net", callee="model.build_model", args=("config",))]
    return [Call(target="net", callee="model.build_stages", exploded=True, args=("config",), kwargs=(
        ("stages", "PIPELINE_STAGES"), ("pp_rank", 'grid.index("pp")'), ("pp_size", "PP"), *placement_kwargs(plan)),
        comments=("this pipeline rank's chunks (one per virtual stage it holds), as nn.ModuleList",))]


def executor_items(plan: Plan) -> list:
    """The schedule's actions of this rank and the executor that runs them."""
    if not render_step.has_pipeline(plan):
        return []
    # this rank's tokens of a sequence: T, over cp, and over tp under SP
    tokens = "SEQ_LEN" + (" // CP" if plan.mesh.size("cp") > 1 else "") + render_tensor.sequence_split(plan)
    autocast = render_step.autocast_dtype(plan) or "None"
    rows = "MICRO_BATCH"
    # Note [2D tensor parallelism]: between blocks each rank holds hidden/R features
    hidden = render_tensor.hidden_split(plan)
    boundary = {plan.blocks[start].tp for start, _ in plan.pipeline.stage_layers[1:]}
    if len(boundary) == 1 and len({b.tp for b in plan.blocks}) > 1:  # heterogeneous (constraints: PAR0255)
        (tp,) = boundary
        rows = f"MICRO_BATCH * {tp} // TP"  # the coarse micro-batch's piece at the boundary's tp {tp}
        if plan.sequence_parallel.enabled:
            tokens = "SEQ_LEN" + (f" // {tp}" if tp > 1 else "")
    sliced = render_step.sliced(plan)
    slices = ((("slices", render_step.slice_count(plan)),) if sliced else ())
    costs = plan.pipeline.stage_costs  # Note [stage costs] (codegen/planner/cost/bubble.py)
    cost_lines = ["# each virtual stage's (F, B, W) of a micro-batch, from the planner's cost model: the",
                  "# schedule orders its computes by them (None: F = B = W, the paper's)",
                  f"STAGE_COSTS = {costs!r}"] if costs else []
    actions = Call(target="actions", callee="schedule.build_schedule", args=("SCHEDULE",), kwargs=(
        ("stages", "PP"), ("micro_batches", "GRAD_ACCUM"), ("chunks", "CHUNKS"), *slices,
        *((("costs", "STAGE_COSTS"),) if costs else ())), index='grid.index("pp")',
        comments=("This rank's ordered actions (forward/backward of micro-batch m, chunk c; send/recv)."
                  + (" Under terapipe" if sliced else ""),
                  *([f"an action's micro-batch is a slice: m·{render_step.slice_count(plan)} + j is slice j of "
                     "micro-batch m."] if sliced else [])))
    runner = Call(target="runner", callee="pipeline.PipelineExecutor", exploded=True, args=("net",), kwargs=(
        ("actions", "actions"), ("pp_group", "pp_group"), ("pp_ranks", 'grid.ranks("pp")'),
        ("pp_rank", 'grid.index("pp")'), ("micro_batches", "GRAD_ACCUM"),
        Arg(key="activation_shape", value=f"({rows}, {tokens}, {hidden})",
            comments=("what travels between stages: (micro-batch, tokens, hidden), fp32",)),
        ("device", "dist.device"),
        Arg(key="loss_fn", value="loss_fn", note="called on the last stage: each micro-batch's loss, your terms added"),
        Arg(key="autocast_dtype", value=autocast, comments=(
            f"{cite(plan.train.precision.span)}: {plan.train.precision.value} autocast in each stage's "
            "forward; weights, grads and Adam stay fp32",) if autocast != "None" else ()),
    ))
    runner = runner.given(*render_compress.executor_args(plan, f"(MICRO_BATCH, {tokens}, HIDDEN)"))
    runner = runner.given(*placement_kwargs(plan))
    if sliced:
        runner = runner.given(Arg(key="slices", value="tuple(SLICES)" if plan.pipeline.slice_lengths else
                                  "(SEQ_LEN // SLICES,) * SLICES", note="tokens of each slice"))
    return ["", "# ---- pipeline -----------------------------------------------------------", *cost_lines, actions,
            runner]


def stage_replicas(plan: Plan) -> bool:
    """Does the schedule hold each stage twice (chimera's two pipelines: Note [stage replicas])?"""
    return render_step.has_pipeline(plan) and placement_kind(plan) == "chimera"


def after_backward_lines(plan: Plan) -> list[str]:
    if not render_step.has_pipeline(plan):
        return []
    lines = []
    if stage_replicas(plan) and plan.train.zero.value != 3:  # ZeRO-3 sums the replicas' shards instead
        lines += ["# each stage's two replicas (down and up pipeline) get the sum of their grads",
                  "pipeline.allreduce_replica_grads(net, replica_group)"]
    if tied_embeddings(plan) and not fused_embedding_sync(plan):  # fused: grad_sync.finish() sums them
        lines += ["# the embedding's two copies (first and last stage) get the sum of their grads",
                  "pipeline.allreduce_tied_grads(net, tied_group)"]
    return lines


def loss_with_clip(plan: Plan) -> bool:
    """Does the last stage's loss travel in the clip's all-reduce over pp (Note [one
    all-reduce after backward] in runtime/train/faults.py)? Where the clip is
    ``optim.clip_grad_norm_``'s (``render_step.plain_clip``) and no fp16 loss scale
    (whose overflow skips first) divides it."""
    return (render_step.has_pipeline(plan) and render_step.plain_clip(plan)
            and plan.train.precision.value != "fp16")


def flags_with_clip(plan: Plan) -> bool:
    """And the guard's SIGTERM flags too, with no all-reduce of its own: where pp is every rank."""
    return loss_with_clip(plan) and plan.mesh.world_size == plan.pipeline.size


def loss_lines(plan: Plan) -> list[str]:
    if not render_step.has_pipeline(plan) or loss_with_clip(plan):  # summed: on every pipeline rank already
        return []
    return [
        "# the loss lives on the last stage; bring it to every pipeline rank",
        "loss_sum = pipeline.loss_over_pipeline(loss_sum, pp_group)",
    ]


def adds(plan: Plan) -> dict:
    """The pipeline entry's sections (``features.Feature.adds``)."""
    return {"groups": group_lines(plan), "pipeline": executor_items(plan), "after_backward": after_backward_lines(plan),
            "loss": loss_lines(plan)}
