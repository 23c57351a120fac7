"""Rendering of a mixture-of-experts model's lines of ``train.py`` (runtime/parallel/expert/moe.py).

Takes: a ``Plan``. Gives: whether the model has experts (``has_experts``: its settings
hold ``EXPERTS``, which ``settle_training`` writes only for experts > 0, so a dense
model's ``train.py`` is unchanged), the docstring's parameter words (total and active),
the line that weighs each micro-batch's aux losses as its loss, and the step's MoE
metrics. Before: ``settle_training``. After: ``render.py`` places the lines.
"""

from __future__ import annotations

from parc.runtime.layout import model_counts
from parc.runtime.layout.model_desc import ModelConfig, describe

from . import render_step
from .plan import Plan
from .plan_text import cite
from .view import Call


def has_experts(plan: Plan) -> bool:
    return any(s.name == "EXPERTS" and s.value for s in plan.model.settings)


def balances_by_bias(plan: Plan) -> bool:
    """``model.router_bias_update > 0``: the router biases move after each step (router_bias.py)."""
    return any(s.name == "ROUTER_BIAS_UPDATE" and s.value for s in plan.model.settings)


def parameter_words(plan: Plan) -> str:
    """``1,234 parameters``, or ``1,234 parameters (567 active per token)`` with experts."""
    words = f"{plan.model.parameters:,} parameters"
    if has_experts(plan):  # the settings are ModelConfig's fields (settle_training)
        config = ModelConfig(**{s.name.lower(): s.value for s in plan.model.settings})
        words += f" ({model_counts.active_parameters(describe(config)):,} active per token)"
    return words


def expert_parallel(plan: Plan) -> int:
    """EP: the ranks that split each MoE block's experts (1 for a dense model)."""
    ep = plan.model.expert_parallel
    return 1 if ep is None else ep.value


def expert_tensor_parallel(plan: Plan) -> int:
    """ETP: the ranks that split each expert's ffn (Note [expert tensor parallelism])."""
    etp = plan.model.expert_tensor_parallel
    return 1 if etp is None else etp.value


def folds_experts(plan: Plan) -> bool:
    """Whether expert layers refold the ranks (ep·etp > 1): their own groups and gradients."""
    return expert_parallel(plan) * expert_tensor_parallel(plan) > 1


def overlaps_experts(plan: Plan) -> bool:
    """Whether some MoE block's expert all-to-alls overlap its sub-batches (moe_overlap.py)."""
    return expert_parallel(plan) > 1 and any(k > 1 for k in plan.per_block("overlap"))


def data_ranks(plan: Plan) -> str:
    """The ranks whose mean loss a step takes (dp, × cp: Note [MoE under context parallelism])."""
    return "DP * CP" if plan.mesh.size("cp") > 1 else "DP"


def group_lines(plan: Plan) -> list[str]:
    if not folds_experts(plan):
        return []
    etp = plan.model.expert_tensor_parallel
    folded = "dp·cp·tp" if plan.mesh.size("cp") > 1 else "dp·tp"
    lines = [
        f"# Note [parallel folding] (expert_folding.py): expert layers re-read the {folded} ranks as",
        "# edp·ep·etp; tokens go to their experts' ranks over ep_group (all-to-all), and",
        "# the experts' gradients reduce over edp_group",
    ]
    if etp is None:
        return lines + [
            "ep_group, edp_group, _ = expert_folding.expert_groups(grid, EP)"
        ]
    return lines + [
        "# (Note [expert tensor parallelism], moe.py: etp_group splits each expert's ffn)",
        "ep_group, edp_group, etp_group = expert_folding.expert_groups(grid, EP, ETP)",
    ]


def group_kwargs(plan: Plan) -> tuple[tuple[str, str], ...]:
    """The expert groups a clip or an optimizer takes (none unless ep·etp > 1)."""
    if not folds_experts(plan):
        return ()
    return (("ep_group", "ep_group"),) + ((("etp_group", "etp_group"),) if expert_tensor_parallel(plan) > 1 else ())


def transform_lines(plan: Plan) -> list:
    """``parallelize.experts``: this rank's experts and its slice of each (ep·etp > 1)."""
    if not folds_experts(plan):
        return []
    groups = ("ep_group", *(("etp_group",) if expert_tensor_parallel(plan) > 1 else ()))
    return [Call(target="net", callee="parallelize.experts", args=("net", *groups),
                 note=cite(plan.model.expert_parallel.span))]


def zero_kwargs(plan: Plan, *, by_node: bool = False) -> tuple[tuple[str, str], ...]:
    """ZeRO 1/2 keep the experts in a flat buffer of their own over edp (zero.py,
    Note [experts under ZeRO]); ZeRO-3 in units of their own (fsdp.py, Note [experts as units]),
    under HSDP (``by_node``) over the node's edp ranks, replicated across nodes."""
    if not folds_experts(plan):
        return ()
    edp = (("edp_group", "edp_shard_group"), ("edp_replicate_group", "edp_replicate_group")) if by_node \
        else (("edp_group", "edp_group"),)
    return (*group_kwargs(plan), *edp, ("data_ranks", data_ranks(plan)))


def node_group_lines(plan: Plan) -> list:
    """HSDP with ep·etp > 1: the experts' shard and replicate groups (fsdp.py, Note [experts as units])."""
    if not folds_experts(plan):
        return []
    axes = f"({expert_parallel(plan)!r}, {expert_tensor_parallel(plan)!r})"
    return [Call(target="edp_shard_group, edp_replicate_group", callee="fsdp.expert_node_groups",
                 args=("grid", axes, "DEVICES_PER_NODE"),
                 comments=("the experts' units: over the edp ranks of one node, replicated over the other "
                           "nodes' edp ranks",))]


def after_backward_lines(plan: Plan) -> list:
    if not folds_experts(plan):
        return []
    over = "dp × cp" if plan.mesh.size("cp") > 1 else "dp"
    dtype = render_step.grad_reduce_dtype(plan)  # as the dense buckets (render.py)
    words = {"torch.bfloat16": f" in bf16 ({cite(plan.train.grad_reduce.span)})" if plan.train.grad_reduce else "",
             "torch.float32": " in fp32", None: ""}[dtype]
    return [Call(callee="moe.reduce_expert_grads", args=("net", "edp_group"), kwargs=(
        ("data_ranks", data_ranks(plan)), *((("reduce_dtype", dtype),) if dtype else ())),
        comments=(f"each expert's grad holds its ep group's tokens: sum over edp{words}, mean over {over}",))]


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
    # tp ranks route the same tokens, or under sp each its own shard (Note [MoE under sequence parallelism])
    replicas = "1" if plan.sequence_parallel.enabled else "TP"
    over = "dp × cp" if plan.mesh.size("cp") > 1 else "dp"
    return [
        f"# the aux losses (mean over micro-batches and {over}) and each expert's tokens, all ranks",
        "moe_metrics = moe.step_metrics(",
        f"    net, config, micro_batches=GRAD_ACCUM, stage_ranks={data_ranks(plan)} * TP, replicas={replicas},"
        " device=dist.device",
        ")",
    ] + ([
        "# Note [auxiliary-loss-free balancing] (router_bias.py): each expert's bias moves by",
        "# ROUTER_BIAS_UPDATE toward the mean load, from the step's tokens over every rank",
        'router_bias.update_router_bias(net, moe_metrics["expert_tokens"])',
    ] if balances_by_bias(plan) else [])


def record_lines(plan: Plan) -> list[str]:
    return ["**moe_metrics,  # aux_loss, z_loss (when on), expert_tokens per MoE layer"] if has_experts(plan) else []


def adds(plan: Plan) -> dict:
    """The experts' entry's sections (``features.Feature.adds``)."""
    return {"groups": group_lines(plan), "optimizer_extra": setup_lines(plan), "loss": metric_lines(plan),
            "record": record_lines(plan),
            # under ZeRO the optimizer reduces the experts' grads (Note [experts under ZeRO])
            "after_backward": [] if plan.train.zero.value else after_backward_lines(plan)}
