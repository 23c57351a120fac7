"""Rendering of the training step: the micro-batch loop, or the pipeline executor's step.

Takes: a ``Plan`` and the forward lines ``render.py`` prepared (with autocast when
bf16). Gives: the body of one optimizer step up to the end of backward (without a
pipeline the plain loop over micro-batches; with one, every micro-batch handed to the
executor that render_pipeline.py sets up), and the step's dtypes: the parameters'
(``compute_dtype``), the forward's autocast, the gradients' reduction, the loss scale's
argument of every clip; and how many backwards add to a gradient (``backward_passes``).
Before: ``codegen/render.py`` calls these. After: the template places the lines.
"""

from __future__ import annotations

from parc.runtime.layout.constraints import master_weights

from . import render_compress, render_context, render_hetero
from .plan import Plan
from .view import Call


ZERO_WORDS = {
    1: "AdamW state sharded over dp",
    2: "AdamW state and gradients sharded over dp",
    3: "parameters, gradients and AdamW state sharded over dp",
}


def zero_words(plan: Plan) -> str:
    """What the ZeRO stage shards, over the ranks it shards over (dp; dp × cp under cp)."""
    words = ZERO_WORDS[plan.train.zero.value]
    return words + " × cp" if plan.mesh.size("cp") > 1 else words


def reduce_group(plan: Plan) -> tuple[str, str]:
    """Gradients and the loss are means over the ranks that saw different tokens: dp, and
    under context parallel dp × cp (each cp rank holds T/cp tokens of every sequence); that
    group's name in train.py and its ranks in words."""
    return ("dp_group", "dp") if plan.mesh.size("cp") == 1 else ("grad_group", "dp × cp")


def reducing(plan: Plan) -> bool:
    return plan.mesh.size("dp") * plan.mesh.size("cp") > 1


def sliced(plan: Plan) -> bool:
    """A sliced schedule: each micro-batch's sequences run as ``SLICES`` token slices."""
    return has_pipeline(plan) and plan.pipeline.slices > 1


def backward_passes(plan: Plan) -> str:
    """How many backwards add to each gradient in a step (the gradient reducers'
    ``accumulations``): one per micro-batch, or per slice of one under a sliced schedule."""
    return f"GRAD_ACCUM * {slice_count(plan)}" if sliced(plan) else "GRAD_ACCUM"


def slice_count(plan: Plan) -> str:
    """The generated expression for the slices per sequence: ``SLICES`` holds their count,
    or, where the spec lists them (uneven slices), each slice's tokens."""
    return "len(SLICES)" if plan.pipeline.slice_lengths else "SLICES"


def has_pipeline(plan: Plan) -> bool:
    return plan.pipeline.size > 1


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


def grad_scale_kwargs(plan: Plan) -> tuple[tuple[str, str], ...]:
    """The last argument of every gradient clip of the step (``optim.clip_grad_norm_``,
    ``hetero.clip_grad_norm_``, ``unscale_and_clip``, ``reduce_gradients_and_clip``): under
    fp16 the gradients are of the scaled loss, and each clip divides them by the scale first."""
    return (("grad_scale", "scaled_by"),) if plan.train.precision.value == "fp16" else ()


def compute_dtype(plan: Plan) -> str | None:
    """The dtype the parameters are held and used in, with fp32 master weights in the
    optimizer (runtime/optimizers/master.py, Note [master weights]); None for fp32 and where the
    forward autocasts instead (``autocast_dtype``)."""
    if autocast_dtype(plan) is not None:
        return None
    return LOW_PRECISION.get(plan.train.precision.value)


def plain_clip(plan: Plan) -> bool:
    """Whether the step clips with ``optim.clip_grad_norm_`` (render_optimizer's
    ``optimizer_and_step``, its last branch): fp32 or autocast parameters, no ZeRO, one
    layout for every block. The one place that says so; a pipeline's loss rides in that
    clip's all-reduce only there (``render_pipeline.loss_with_clip``)."""
    return not plan.train.zero.value and not render_hetero.enabled(plan) and compute_dtype(plan) is None


def autocast_dtype(plan: Plan) -> str | None:
    """The torch dtype the forward autocasts to over fp32 weights: only for the layouts
    whose gradient code has no low-precision compute weights yet (per-layer tp/dp,
    compressed dp gradients: they keep fp32 parameters); None otherwise."""
    precision = plan.train.precision.value
    compressed = render_compress.enabled(plan) or render_compress.pipeline_enabled(plan)
    if master_weights(precision, per_layer_tp=render_hetero.enabled(plan), compressed=compressed):
        return None
    return LOW_PRECISION.get(precision)


def _sample_lines(dp_rank_arg: str) -> list[str]:
    """The indices of micro-batch ``micro`` of ``step``: this dp rank's samples of it."""
    return Call(target="indices", callee="data.sample_indices", exploded=True, args=("step", "micro"), kwargs=(
        ("micro_batch", "MICRO_BATCH"), ("grad_accum", "GRAD_ACCUM"), ("dp_rank", dp_rank_arg), ("dp_size", "DP"),
    )).lines()


CHUNK_NOTE = "(B, T/cp): this rank's tokens of each sequence"


def _context_chunk(**more) -> Call:
    """``data.context_chunk``'s call: this rank's tokens of each sequence of the batch."""
    return Call(callee="data.context_chunk", args=("inputs", "targets"), kwargs=render_context.CHUNK_ARGS, **more)


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
            body += _context_chunk(target="inputs, targets", note=CHUNK_NOTE).lines()
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
        lines = [*scale, "# micro-batch `micro` of this step, made when the executor first reads it",
                 "# (the first stage its inputs, the last its targets): Note [data when needed]",
                 "# in parc_runtime/parallel/pipeline/pipeline.py",
                 "def batch(micro):"]
        lines += ["    " + line for line in _sample_lines(dp_rank_arg)]
        if plan.mesh.size("cp") > 1:
            documents = _documents(plan)
            chunk = _context_chunk().expression()
            lines += [
                f"    inputs, targets{documents} = dataset.batch(indices)  # (B, T) each",
                f"    # {CHUNK_NOTE}",
                f"    return {f'(*{chunk}, documents)' if documents else chunk}",
            ]
        else:
            lines.append("    return dataset.batch(indices)  # (B, T) token ids each")
        lines.append("")
        lines.append("# forward and backward of every micro-batch, in the schedule's order")
        lines.append("loss_sum = runner.step(batch)  # the last stage's mean loss, 0 elsewhere")
    # Note [counting saved activations] (memory.py): the hooks see what autograd keeps
    return ["with activations:  # measures the tensors saved for backward"] + [
        "    " + line for line in lines
    ]
