"""``train.py``'s constants: every module-level ``NAME = value  # spec line`` of the model,
the layout, the batch and the training, each citing where its value came from.

Takes: the Plan. Gives: ``config_lines`` (the constants block, in order), ``tp_plan_lines``
(``TP_PLAN``'s entries). Before: nothing. After: ``render.py`` places them
in ``templates/train.py.j2``; the features' own constants come from their modules
(``render_step``, ``render_checkpoint``, ``render_observe``, ``render_eval``, ``render_compress``).
"""

from __future__ import annotations

from parc.runtime.layout import axes

from . import (render_checkpoint, render_compress, render_context, render_eval, render_fsdp, render_moe, render_observe,
               render_pipeline, render_tensor)
from .plan import Plan, Setting
from .plan_text import cite, layer_value
from .render_step import zero_words
from .view import constant

DEVICE_FLOPS_NOTE = "dense peak FLOP/s of one device, for MFU"
KERNELS_WORDS = {
    "compiled": "fused ops from parc_runtime/kernels, residual adds inside the norms (eager if they cannot be built)",
    "eager": "fused ops in plain PyTorch",
}


def _comment(setting: Setting) -> str:
    where = cite(setting.span)
    return f"{where}: {setting.note}" if setting.note and setting.span is None else where


def config_lines(plan: Plan) -> list[str]:
    mesh, batch, train = plan.mesh, plan.batch, plan.train
    sp = plan.sequence_parallel
    lines = ["# model"]
    lines += [constant(s.name, s.value, _comment(s)) for s in plan.model.settings]
    lines += ["", "# layout"]
    if plan.predicted is not None:
        p = plan.predicted
        lines += [
            f"# chosen by the planner from {p.layouts_considered:,} layouts (`parc plan {plan.source}`);",
            "# the values it filled in for `auto` are cited `(planner)`. It predicts, per step:",
            constant("PREDICTED_STEP_TIME_S", round(p.step_time_s, 6), "plan.json: predicted.step_time_s"),
            constant("PREDICTED_TOKENS_PER_S", round(p.tokens_per_s, 1), "plan.json: predicted.tokens_per_s"),
            constant("PREDICTED_PEAK_MEM_BYTES", round(p.peak_mem_bytes), "plan.json: predicted.peak_mem_bytes"),
            constant("PREDICTED_EXPOSED_COMM_S", round(p.exposed_comm_s, 6), "plan.json: predicted.exposed_comm_s"),
        ]
    for axis in mesh.axes:
        if axes.axis(axis.axis).always or (axis.axis == "cp" and axis.size > 1):
            lines.append(constant(axis.axis.upper(), axis.size, f"{cite(axis.span)}: {axes.axis(axis.axis).ranks}"))
        if axis.axis == "tp":
            lines += render_tensor.grid_constants(plan)
        if axis.axis == "cp" and axis.size > 1:
            lines += render_context.constants(plan)
    for expert in (plan.model.expert_parallel, plan.model.expert_tensor_parallel):
        if expert is not None and render_moe.folds_experts(plan):  # the constants of expert_folding.expert_groups
            lines.append(constant(expert.name, expert.value, _comment(expert) + f": {expert.note}"
                                  if expert.span is not None else _comment(expert)))
    if sp.enabled:
        lines.append(constant("SEQUENCE_PARALLEL", True, cite(sp.span) + f": norms run on {render_tensor.sequence_words(plan)}"))
    lines += setting_lines(plan)
    zero = plan.train.zero
    if zero.value:
        lines.append(constant("ZERO", zero.value, f"{cite(zero.span)}: {zero_words(plan)}"))
    lines += render_fsdp.config_lines(plan)
    kernels = plan.train.kernels
    lines.append(constant("KERNELS", kernels.value, f"{cite(kernels.span)}: {KERNELS_WORDS[kernels.value]}"))
    lines += render_pipeline.config_lines(plan)
    lines.append("# mesh axes, outermost first: tp ranks are neighbours (one node)")
    lines.append(f"MESH_AXES = ({mesh_axes_text(plan)})")
    lines += ["", "# batch"]
    lines.append(constant("MICRO_BATCH", batch.micro_batch, cite(batch.micro_batch_span)))
    lines.append(
        constant(
            "GRAD_ACCUM",
            batch.grad_accum,
            f"global_batch {batch.global_batch} / (micro_batch {batch.micro_batch} · dp {batch.dp})",
        )
    )
    lines.append(
        constant(
            "TOKENS_PER_STEP",
            batch.tokens_per_step,
            f"{cite(batch.global_batch_span)}: global_batch {batch.global_batch} · seq_len {batch.seq_len}",
        )
    )
    lines += ["", "# training"]
    for s in (train.steps, train.seed, *train.optimizer, *train.lr_schedule, train.grad_clip, train.log_every):
        lines.append(constant(s.name, s.value, _comment(s)))
    lines += render_checkpoint.config_lines(plan)
    lines += render_observe.config_lines(plan)
    if train.data.kind == "tokens":
        lines.append(constant("DATA_PATH", train.data.path, cite(train.data.span) + ": from this file's folder"))
        lines.append(constant("DATA_DTYPE", train.data.dtype, cite(train.data.span)))
        if isinstance(train.data.path, tuple):  # a blend: each file's share (equal when not written)
            weights = train.data.weights or (1.0,) * len(train.data.path)
            lines.append(constant("DATA_WEIGHTS", weights, cite(train.data.span) + ": each file's share"))
    lines += render_eval.config_lines(plan)
    lines += render_compress.config_lines(plan)
    flops_note = DEVICE_FLOPS_NOTE if mesh.device_flops else "unknown for this device: no MFU"
    flops_span = mesh.device_span
    if mesh.device_flops_from_profile is not None:
        flops_span, flops_note = mesh.device_flops_from_profile, "the profile's best matmul rate, for MFU"
    lines.append(constant("DEVICE_FLOPS", mesh.device_flops, f"{cite(flops_span)}: {flops_note}"))
    return lines


LR_ARGS = {"LR_SCHEDULE": "kind", "WARMUP": "warmup", "MIN_LR_RATIO": "min_lr_ratio", "DECAY": "decay",
           "DECAY_SHAPE": "shape"}
"""``optim.lr_at``'s keyword for each constant of the plan's ``lr_schedule``."""


def lr_args(plan: Plan) -> tuple[tuple[str, str], ...]:
    """``optim.lr_at(step, ...)``'s keyword arguments, each the constant that holds it."""
    named = [(LR_ARGS[s.name], s.name) for s in plan.train.lr_schedule]
    return (named[0], ("peak_lr", "LR"), *named[1:2], ("total_steps", "STEPS"), *named[2:])


def mesh_axes_text(plan: Plan) -> str:
    """``MESH_AXES``' entries: the registry's axes in mesh order (``runtime/layout/axes.py``), each
    named by its constant; an axis that is not ``always`` shown appears only when used."""
    shown = [a.axis for a in plan.mesh.axes if axes.axis(a.axis).always or a.size > 1]
    return ", ".join(f'("{name}", {name.upper()})' for name in shown)


def setting_lines(plan: Plan) -> list[str]:
    """Each per-layer setting some block uses (Note [a per-layer setting is an entry]):
    its constant, one value or one per block (Note [per-layer layout]), with the
    setting's own comment under the spec line it came from."""
    lines = []
    facts = {"sp": plan.sequence_parallel.enabled, "block_tp": tuple(block.tp for block in plan.blocks)}
    for entry in plan.used_settings():
        where = cite(plan.blocks[0].span(entry.name))
        first, *rest = entry.comment(plan.per_block(entry.name), facts)
        value = layer_value(plan, entry.name)
        if plan.uniform(entry.name) is not None and not rest:
            lines.append(f"{entry.constant} = {value}  # {where}: {first}")
        else:
            lines += [f"# {where}: {first}", *(f"# {line}" for line in rest), f"{entry.constant} = {value}"]
    return lines


def tp_plan_lines(plan: Plan) -> list[str]:
    tp = plan.tensor_parallel
    if tp.size == 1:
        return []
    lines = []
    for rule in tp.sharded:  # under 2D the shard on one rank of the grid (partition_layers)
        shapes = f"{tuple(rule.full_shape)} -> {tuple(rule.local_shape)}"
        tied = f", tied to {rule.tied_to}" if rule.tied_to else ""
        lines.append(f"{rule.pattern!r}: {rule.style.value!r},  # {shapes}{tied}")
    return lines
