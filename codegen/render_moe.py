"""Rendering of a mixture-of-experts model's lines of ``train.py`` (runtime/moe.py).

Takes: a ``Plan``. Gives: whether the model has experts (``has_experts``: its settings
hold ``EXPERTS``, which ``settle_training`` writes only for experts > 0, so a dense
model's ``train.py`` is unchanged), the docstring's parameter words (total and active),
the line that weighs each micro-batch's aux losses as its loss, and the step's MoE
metrics. Before: ``settle_training``. After: ``render.py`` places the lines.
"""

from __future__ import annotations

from parc.runtime.model_desc import ModelConfig, describe

from .plan import Plan


def has_experts(plan: Plan) -> bool:
    return any(s.name == "EXPERTS" and s.value for s in plan.model.settings)


def parameter_words(plan: Plan) -> str:
    """``1,234 parameters``, or ``1,234 parameters (567 active per token)`` with experts."""
    words = f"{plan.model.parameters:,} parameters"
    if has_experts(plan):  # the settings are ModelConfig's fields (settle_training)
        config = ModelConfig(**{s.name.lower(): s.value for s in plan.model.settings})
        words += f" ({describe(config).active_parameters:,} active per token)"
    return words


def setup_lines(plan: Plan) -> list[str]:
    if not has_experts(plan):
        return []
    return [
        "# Note [the aux loss enters the gradient, not the returned loss] (moe.py): each",
        "# micro-batch's aux losses weigh 1 / GRAD_ACCUM, as its loss does",
        "moe.set_loss_scale(net, GRAD_ACCUM)",
    ]


def metric_lines(plan: Plan) -> list[str]:
    """After the step: aux_loss, z_loss and expert_tokens summed over every rank (every rank calls it)."""
    if not has_experts(plan):
        return []
    return [
        "# the aux losses (mean over micro-batches and dp) and each expert's tokens, all ranks",
        "moe_metrics = moe.step_metrics(",
        "    net, config, micro_batches=GRAD_ACCUM, stage_ranks=DP * TP, replicas=TP, device=dist.device",
        ")",
    ]


def record_lines(plan: Plan) -> list[str]:
    return ["**moe_metrics,  # aux_loss, z_loss (when on), expert_tokens per MoE layer"] if has_experts(plan) else []
