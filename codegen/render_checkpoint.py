"""Rendering of checkpoints, resume, SIGTERM and bad numbers in train.py.

Takes: a ``Plan`` (``train.checkpoint_every``, ``checkpoint_dir``, ``on_nonfinite`` and
the layout). Gives: the lines ``render.py`` places in train.py — the cited constants,
the ``--checkpoint-dir`` / ``--checkpoint-every`` / ``--resume`` / ``--init-from`` flags and their
docstring lines, the set-up of ``faults.StepGuard`` and ``checkpoint.Checkpoints``
with the resume (``done``: the last step already trained), the optimizer step guarded against non-finite numbers,
and the end of a step (save when due or on SIGTERM). The runtime side is
``runtime/checkpoints/checkpoint.py`` and ``runtime/train/faults.py``.
Before: ``codegen/render.py`` builds the other lines. After: the template places these.
"""

from __future__ import annotations

from .plan import Plan
from .plan_text import cite
from .view import Arg, Call

RANK_ARGS = (("rank", "dist.rank"), ("world_size", "dist.world_size"))


def config_lines(plan: Plan) -> list[str]:
    t = plan.train
    every, directory, policy, init = t.checkpoint_every, t.checkpoint_dir, t.on_nonfinite, t.init_from
    where = cite(every.span)
    return [
        f"CHECKPOINT_EVERY = {every.value!r}  # {where}: steps between checkpoints (0: after the last step only)",
        f"CHECKPOINT_DIR = {directory.value!r}  # {where}: None: no checkpoints without --checkpoint-dir",
        f"ON_NONFINITE = {policy.value!r}  # {cite(policy.span)}: a NaN/inf loss or grad norm skips the step or stops",
        f"INIT_FROM = {init.value!r}  # {cite(init.span)}: "
        + ("the starting weights, from this file's folder" if init.value else "None: parc's own initialization"),
    ]


def flag_docs(plan: Plan) -> list[str]:
    t = plan.train
    directory = "none" if t.checkpoint_dir.value is None else repr(t.checkpoint_dir.value)
    return [
        f"--checkpoint-dir DIR   save sharded checkpoints into DIR (default {directory})",
        f"--checkpoint-every N   steps between checkpoints, 0: after the last only (default {t.checkpoint_every.value})",
        "--checkpoint-keep K    keep the newest K checkpoints, 0: all (default 0)",
        "--resume DIR           continue from a checkpoint, or a folder's latest one",
        "--init-from DIR        start from a checkpoint's weights (parc import writes one) in this",
        "                       layout, fresh optimizer, step 1 (default "
        + ("INIT_FROM, from this file)" if t.init_from.value else "none)"),
        "SIGTERM finishes the step, saves a checkpoint and exits 0; under torchrun's",
        "--max-restarts a restarted trainer resumes from the latest checkpoint itself.",
    ]


def setup_lines(plan: Plan, layout: str) -> list:
    dp, tp = plan.mesh.size("dp"), plan.mesh.size("tp")
    policy = plan.train.on_nonfinite
    where = f" at {cite(policy.span)}" if policy.span else ""
    scale = (Arg(key="loss_scale", value="scaler", note="fp16: the scale and its counters resume too"),) \
        if plan.train.precision.value == "fp16" else ()
    checkpoints = Call(target="checkpoints", callee="checkpoint.Checkpoints", exploded=True,
                       args=("args.checkpoint_dir",), kwargs=(
        ("every", "args.checkpoint_every"), ("keep", "args.checkpoint_keep"), ("model", "net"),
        ("optimizer", "optimizer"), ("tp_group", "tp_group" if tp > 1 else "None"), ("config", "config"),
        ("layout", repr(layout)), ("samples_per_step", f"MICRO_BATCH * GRAD_ACCUM * {'DP' if dp > 1 else '1'}"),
        *RANK_ARGS, ("device", "dist.device"), *scale))
    return [
        "",
        "# ---- checkpoints, SIGTERM and bad numbers ------------------------------------",
        "# Checkpoints hold every tensor under its logical name and full shape (DCP), so",
        "# any layout of this model resumes from them (runtime/checkpoints/checkpoint.py).",
        Call(target="guard", callee="faults.StepGuard", args=("ON_NONFINITE",), kwargs=(
            *RANK_ARGS, ("device", "dist.device"), *((("where", repr(where)),) if where else ()))),
        checkpoints,
        "# the last step already trained: 0, or the checkpoint's (after a restart by",
        "# torchrun, the latest one in --checkpoint-dir)",
        "done = checkpoints.restore(args.resume, restarted=faults.restart_count() > 0)",
        "# --init-from: a checkpoint's weights only, read into this layout; the optimizer",
        "# fresh, the step 1 (runtime/checkpoints/checkpoint_init.py; not when resumed)",
        "checkpoint_init.init_from(checkpoints, args.init_from, done=done)",
    ]


def guarded_step(step, fp16: bool = False, summed: bool = False, flags: bool = False) -> list:
    """The step's items (``view.Step``) with the update taken only when every rank's numbers are
    finite. fp16: an overflow of the scaled gradients is the loss scaler's to skip, not the guard's.
    ``summed``: the loss travels in the clip's all-reduce over pp, and with ``flags`` the guard's
    SIGTERM flags too, which then need no collective of their own (``render_pipeline.loss_with_clip``,
    ``flags_with_clip``; Note [one all-reduce after backward] in runtime/train/faults.py)."""
    if summed:
        *before, clip = step.clip
        if not (isinstance(clip, Call) and clip.callee == "optim.clip_grad_norm_"):
            raise TypeError(f"internal error in parc: the loss rides on optim.clip_grad_norm_, not {clip!r}")
        return [*before, *(
            "# this rank's loss (the last stage's, 0 elsewhere) and SIGTERM flag, summed over pp",
            f"# {'(every rank) ' if flags else ''}in the clip's all-reduce (Note [one all-reduce after backward], "
            "faults.py)",
            "summed = guard.summands(loss_sum)",
        ), clip.given(("summed", "summed")), *((
            "loss_sum, signalled = summed.tolist()",
            "# any rank's non-finite loss or grad norm: every rank skips the step (or stops)",
            "if guard.check(step, loss_sum, grad_norm, signalled=signalled):",
        ) if flags else (
            "loss_sum = float(summed[0])  # the last stage's loss, on every pipeline rank",
            "# any rank's non-finite loss or grad norm or SIGTERM (its flags over every rank):",
            "# every rank skips the step (or stops)",
            "if guard.check(step, loss_sum, grad_norm):",
        )), "    " + step.update, step.clear]
    return [*step.clip, *([
        "# fp16 overflow (the norm is global, so every rank agrees): skipped, the scale backs off",
        "stepping = scaler.update(step, grad_norm)",
        "# any rank's non-finite loss or grad norm: every rank skips the step (or stops)",
        "if guard.check(step, loss_sum, grad_norm if stepping else 0.0) and stepping:",
    ] if fp16 else [
        "# any rank's non-finite loss or grad norm: every rank skips the step (or stops)",
        "if guard.check(step, loss_sum, grad_norm):",
    ]), "    " + step.update, step.clear]


def end_of_step_lines() -> list[str]:
    return [
        "if checkpoints.due(step, last=step == args.steps or guard.stopping):",
        "    checkpoints.save(step)",
        "if guard.stopping:  # SIGTERM: every rank finished this step (and saved it)",
        "    break",
    ]
