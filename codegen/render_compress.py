"""train.py's lines for ``parallel.compress`` and ``compress_pp`` (runtime/parallel/data/compress.py, compress_pp.py).

Takes: a ``Plan`` whose ``train.compress`` holds the settings of what is compressed
(COMPRESS, COMPRESS_RANK or COMPRESS_RATIO, ERROR_FEEDBACK; COMPRESS_PP_RANK,
COMPRESS_STAGES, LAZY_ERROR), empty when nothing is. Gives: the constants (``config_lines``), the
gradient reduction that replaces ``dp.GradientBuckets`` (``grad_sync_items``) and the
pipeline executor's codec argument (``executor_args``). Before:
``passes/settle_training.py``. After: ``render.py`` and ``render_step.py`` place the lines.
"""

from __future__ import annotations

from .plan import Plan, Setting
from .plan_text import cite
from .view import Arg, Call

CLASSES = {"powersgd": "PowerSGDGradients", "topk": "TopKGradients"}
"""``parallel.compress``'s call → the runtime class that reduces the gradients."""


def _setting(plan: Plan, name: str) -> Setting | None:
    return next((s for s in plan.train.compress if s.name == name), None)


def enabled(plan: Plan) -> bool:
    """Are the dp gradients compressed?"""
    return _setting(plan, "COMPRESS") is not None


def kind(plan: Plan) -> str:
    """``parallel.compress``'s kind (``none`` when the dp gradients are not compressed)."""
    setting = _setting(plan, "COMPRESS")
    return "none" if setting is None else setting.value


def pipeline_enabled(plan: Plan) -> bool:
    """Are the pipeline's backward gradients compressed?"""
    return _setting(plan, "COMPRESS_PP_RANK") is not None


def config_lines(plan: Plan) -> list[str]:
    return [f"{s.name} = {s.value!r}  # {cite(s.span)}" + (f": {s.note}" if s.note else "") for s in plan.train.compress]


def grad_sync_items(plan: Plan, reduce_group: str, over: str) -> list:
    """``grad_sync = compress.…(net, group, …)``: the same ``finish()`` as GradientBuckets."""
    kind = _setting(plan, "COMPRESS")
    argument = _setting(plan, "COMPRESS_RANK") or _setting(plan, "COMPRESS_RATIO")
    keyword = "rank" if argument.name == "COMPRESS_RANK" else "ratio"
    words = (f"rank-{argument.value} PowerSGD (P·Qᵀ, Q warm-started)" if kind.value == "powersgd"
             else f"the top {argument.value:g} of the entries")
    fp16 = plan.train.precision.value == "fp16"
    return [Call(
        target="grad_sync", callee=f"compress.{CLASSES[kind.value]}", args=("net", reduce_group),
        kwargs=((keyword, f"COMPRESS_{keyword.upper()}"), ("error_feedback", "ERROR_FEEDBACK"),
                *((("loss_scaled", "True"),) if fp16 else ())),
        comments=(f"{cite(kind.span)}: gradients averaged over {over} as {words}, with error feedback if",
                  "ERROR_FEEDBACK; not the exact mean (Note [compression changes numerics] in compress.py)",
                  *(("fp16: compressed unscaled, an overflow skips the step and leaves the error as it was",
                     "(Note [compression under fp16])") if fp16 else ())),
    )]


def bf16_words(plan: Plan) -> str | None:
    """What ``train.grad_reduce = bf16`` does to the compressed reduction (Note [bf16 on the
    wire] in compress.py); None without compression."""
    kind = _setting(plan, "COMPRESS")
    if kind is None:
        return None
    if kind.value == "powersgd":
        return "P and Q summed in bf16, continued in fp32"
    return "the top-k values gathered in bf16, summed in fp32"


def executor_args(plan: Plan, activation_shape: str) -> tuple[Arg, ...]:
    """``grad_codec=...`` of ``pipeline.PipelineExecutor`` under ``compress_pp``."""
    if not pipeline_enabled(plan):
        return ()
    rank = _setting(plan, "COMPRESS_PP_RANK")
    codec = Call(callee="compress_pp.LowRankBackprop", exploded=True, args=(activation_shape,), kwargs=(
        ("rank", "COMPRESS_PP_RANK"), ("stages", "COMPRESS_STAGES"), ("lazy_error", "LAZY_ERROR")))
    return (Arg(key="grad_codec", value=codec, comments=(
        f"{cite(rank.span)}: stages in COMPRESS_STAGES send their input gradient back as a",
        "low-rank P·Qᵀ; with LAZY_ERROR, the error goes with the next micro-batch's",
        "(Note [compressed backpropagation] in compress_pp.py)")),)
