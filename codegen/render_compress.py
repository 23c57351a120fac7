"""train.py's lines for ``parallel.compress`` (runtime/compress.py).

Takes: a ``Plan`` whose ``train.compress`` holds COMPRESS, COMPRESS_RANK or
COMPRESS_RATIO and ERROR_FEEDBACK (empty: no compression). Gives: the constants
(``config_lines``) and the construction of the gradient reduction that replaces
``dp.GradientBuckets`` (``grad_sync_lines``). Before: ``passes/settle_training.py``.
After: ``render.py`` places the lines.
"""

from __future__ import annotations

from .plan import Plan
from .plan_text import cite

CLASSES = {"powersgd": "PowerSGDGradients", "topk": "TopKGradients"}
"""``parallel.compress``'s call → the runtime class that reduces the gradients."""


def enabled(plan: Plan) -> bool:
    return bool(plan.train.compress)


def config_lines(plan: Plan) -> list[str]:
    from .render import constant  # one way to write a constant

    return [constant(s.name, s.value, cite(s.span) + (f": {s.note}" if s.note else "")) for s in plan.train.compress]


def grad_sync_lines(plan: Plan, reduce_group: str, over: str) -> list[str]:
    """``grad_sync = compress.…(net, group, …)``: the same ``finish()`` as GradientBuckets."""
    kind, argument, _feedback = plan.train.compress
    keyword = "rank" if argument.name == "COMPRESS_RANK" else "ratio"
    words = (f"rank-{argument.value} PowerSGD (P·Qᵀ, Q warm-started)" if kind.value == "powersgd"
             else f"the top {argument.value:g} of the entries")
    return [
        f"# {cite(kind.span)}: gradients averaged over {over} as {words}, with error feedback if",
        "# ERROR_FEEDBACK; not the exact mean (Note [compression changes numerics] in compress.py)",
        f"grad_sync = compress.{CLASSES[kind.value]}(net, {reduce_group}, {keyword}=COMPRESS_{keyword.upper()}, "
        "error_feedback=ERROR_FEEDBACK)",
    ]
