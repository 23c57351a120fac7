"""Rendering of evaluation (``train.eval = every(N, batches = B)``) in train.py.

Takes: a ``Plan`` (``train.eval_every``, ``eval_batches``, the data and the layout).
Gives: the lines ``render.py`` places when the spec evaluates — nothing otherwise,
so a trainer without ``eval`` is unchanged: the cited constants, the validation
data (the ``val`` file with its ``--val-data`` flag, the token file's held-out tail,
or synthetic data's own stream), the ``evaluate.Evaluator`` set-up and the step's
``val_loss``. The runtime side is ``runtime/train/evaluate.py`` (Note [one meaning of
val_loss]) and ``PipelineExecutor.evaluate``.
Before: ``codegen/render.py`` builds the other lines. After: the template places these.
"""

from __future__ import annotations

from . import render_context, render_step
from .plan import Plan
from .plan_text import cite
from .view import Call

def documents_kwargs(plan: Plan) -> tuple[tuple[str, str], ...]:
    """A dataset's extra argument under documents = separate (Note [documents of a sample])."""
    return (("documents", "DOCUMENTS"),) if render_step.separate(plan) else ()


def token_data(blended: bool, path: str, part: tuple[tuple[str, str], ...], plan: Plan, **call) -> Call:
    """The dataset of one token file, or of a blend's (``runtime/train/data.py``'s ``blend``);
    ``call``: the Call's target and note."""
    callee, args = ("data.blend", (path, "DATA_WEIGHTS")) if blended else ("data.TokenFile", (path,))
    return Call(callee=callee, args=(*args, "SEQ_LEN", "DATA_DTYPE"), kwargs=(
        ("seed", "args.seed"), ("vocab", "VOCAB"), ("rank", "dist.rank"), *part, *documents_kwargs(plan)), **call)


def enabled(plan: Plan) -> bool:
    return bool(plan.train.eval_every.value)


def held_out(plan: Plan) -> bool:
    """A token file without a ``val`` file: its last tenth is held out (Note [held-out tail])."""
    return enabled(plan) and plan.train.data.kind == "tokens" and not plan.train.data.val_path


def config_lines(plan: Plan) -> list[str]:
    if not enabled(plan):
        return []
    every, batches = plan.train.eval_every, plan.train.eval_batches
    lines = [
        f"EVAL_EVERY = {every.value!r}  # {cite(every.span)}: steps between evaluations (and after the last)",
        f"EVAL_BATCHES = {batches.value!r}  # {cite(every.span)}: global batches of validation sequences each",
    ]
    val = plan.train.data.val_path
    if val:
        lines.append(f"VAL_DATA_PATH = {val!r}  # {cite(plan.train.data.span)}: from this file's folder")
    return lines


def flag_docs(plan: Plan) -> list[str]:
    if not enabled(plan):
        return []
    lines = ["--eval-only            with --resume: print the checkpoint's val_loss and exit"]
    if not plan.train.data.val_path:
        return lines
    if isinstance(plan.train.data.val_path, tuple):
        return lines + ["--val-data PATH ...    validation token files, one per file of the blend (default VAL_DATA_PATH)"]
    return lines + ["--val-data PATH        validation token file (default VAL_DATA_PATH, from this file's folder)"]


def dataset_part(plan: Plan) -> tuple[tuple[str, str], ...]:
    """The training TokenFile's extra argument: the file less its held-out tail."""
    return (("part", "data.TRAIN_PART"),) if held_out(plan) else ()


def adds(plan: Plan) -> dict:
    """The evaluation entry's sections (``features.Feature.adds``)."""
    return {"pipeline": setup_lines(plan), "eval_only": eval_only_lines(plan), "eval": step_lines(plan),
            "record": record_lines(plan)}


def setup_lines(plan: Plan) -> list:
    if not enabled(plan):
        return []
    reduce_group = render_step.reduce_group(plan)[0] if render_step.reducing(plan) else None
    pipelined = render_step.has_pipeline(plan)
    data = plan.train.data
    if data.kind != "tokens":
        val = Call(target="val_dataset", callee="data.ValidationStream", args=("dataset",),
                   note="the same chain, at samples training never reads")
    elif data.val_path:
        val = token_data(isinstance(data.val_path, tuple), "args.val_data", (), plan, target="val_dataset")
    else:
        val = token_data(isinstance(data.path, tuple), "args.data", (("part", "data.VAL_PART"),), plan,
                         target="val_dataset", note="the held-out tail")
    cp = plan.mesh.size("cp") > 1
    low = render_step.autocast_dtype(plan)  # else fp32, or bf16/fp16 parameters used as they are
    return [
        "",
        f"# ---- evaluation ({cite(plan.train.eval_every.span)}): val_loss, the same mean in every layout --",
        val,
        Call(target="evaluator", callee="evaluate.Evaluator", exploded=True, args=("val_dataset",), kwargs=(
            ("every", "EVAL_EVERY"), ("batches", "EVAL_BATCHES"), ("micro_batch", "MICRO_BATCH"),
            ("grad_accum", "GRAD_ACCUM"), ("dp_rank", 'grid.index("dp")' if plan.mesh.size("dp") > 1 else "0"),
            ("dp_size", "DP"), ("device", "dist.device"), ("reduce_group", reduce_group or "None"),
            *(render_context.CHUNK_ARGS if cp else ()),
            *((("runner", "runner"), ("pp_group", "pp_group")) if pipelined else ()),
            *((("autocast_dtype", low),) if low is not None and not pipelined else ()),
        )),
    ]


def eval_only_lines(plan: Plan) -> list[str]:
    """``--eval-only``: the checkpoint's val_loss, then exit (before the loop)."""
    if not enabled(plan):
        return []
    return [
        "if args.eval_only:  # the --resume checkpoint's val_loss, printed; no training",
        "    evaluate.eval_only(evaluator, net, resume=args.resume, done=done, rank=dist.rank)",
        "    logger.close()",
        "    return",
    ]


def step_lines(plan: Plan) -> list[str]:
    if not enabled(plan):
        return []
    return [
        "last = step == args.steps or guard.stopping",
        "# collective; its time and bytes are not the step's (step_time_s leaves it out too)",
        "with comm.exposed_clock.excluded(), traffic.comm_bytes.excluded():",
        "    val_loss = evaluator.run(net) if evaluator.due(step, last) else None",
    ]


def record_lines(plan: Plan) -> list[str]:
    return ['"val_loss": val_loss,'] if enabled(plan) else []


def log_condition(plan: Plan) -> str:
    base = "step % LOG_EVERY == 0 or step == args.steps"
    return base + " or val_loss is not None" if enabled(plan) else base
