"""Rendering of what lets a user watch a run: banner, TensorBoard and profiler lines.

Takes: a ``Plan`` (``train.tensorboard_dir``, the data, the planner's prediction when
the build recorded one). Gives: the lines ``render.py`` places in train.py — the cited
``TENSORBOARD_DIR`` constant, the ``--tensorboard`` / ``--profile`` / ``--profile-dir``
flags and their docstring lines, the start-up banner and the profiler's set-up, and
the calls that bracket each step. The runtime side is ``runtime/train/observe.py`` (and
``runtime/train/metrics.py``, which writes the scalars).
Before: ``codegen/render.py`` builds the other lines. After: the template places these.
"""

from __future__ import annotations

from .plan import Plan
from .plan_text import cite
from .view import Arg, Call


MEMORY_EVERY = 10
"""The trainer's default ``--memory-every``: memory is measured on every 10th step."""


def config_lines(plan: Plan) -> list[str]:
    board = plan.train.tensorboard_dir
    note = "TensorBoard scalars of every step" if board.value else "None: no TensorBoard without --tensorboard"
    return [
        f"TENSORBOARD_DIR = {board.value!r}  # {cite(board.span)}: {note}",
        f"MEMORY_EVERY = {MEMORY_EVERY}  # steps between memory measurements (Note [memory on some steps])",
    ]


def flag_docs(plan: Plan) -> list[str]:
    board = plan.train.tensorboard_dir.value
    default = "none" if board is None else repr(board)
    return [
        f"--tensorboard DIR      rank 0 writes every step metric as TensorBoard scalars (default {default});",
        "                       needs the tensorboard package",
        "--profile STEPS        torch.profiler Chrome trace of steps N or A-B, one file per rank",
        "--profile-dir DIR      folder of the traces (default profile)",
        "--memory-every N       measure activation memory (hooks) and gather every rank's memory",
        "                       on steps 1-2, every N-th and the last (default MEMORY_EVERY; 1: all)",
    ]


def data_words(plan: Plan) -> str:
    """The banner's data line: an expression of train.py."""
    if plan.train.data.kind == "tokens" and isinstance(plan.train.data.path, tuple):  # a blend: its files, not a list
        return 'f"blend of {\', \'.join(args.data)} by {DATA_WEIGHTS} ({DATA_DTYPE})"'
    if plan.train.data.kind == "tokens":
        return 'f"token file {args.data} ({DATA_DTYPE})"'
    return 'f"synthetic tokens (seed {args.seed})"'


def setup_lines(plan: Plan, layout: str) -> list:
    predicted = plan.predicted is not None
    return [
        "",
        "# ---- what runs: a banner on rank 0, and the profiler of --profile -----------",
        Call(callee="observe.banner", exploded=True, args=("net",), kwargs=(
            ("rank", "dist.rank"), ("device", "dist.device"),
            Arg(key="title", value="__doc__.splitlines()[0]", note="this file's first line: model, size, layout"),
            ("layout", repr(layout)),
            Arg(key="parameters", value=str(plan.model.parameters), note="the whole model, tied weights once"),
            ("data", data_words(plan)), ("checkpoint_dir", "args.checkpoint_dir"), ("tensorboard", "args.tensorboard"),
            *((("predicted_step_time_s", "PREDICTED_STEP_TIME_S"), ("predicted_mem_bytes", "PREDICTED_PEAK_MEM_BYTES"))
              if predicted else ()),
        )),
        Call(target="profiler", callee="observe.StepProfiler", args=("args.profile", "args.profile_dir"),
             kwargs=(("rank", "dist.rank"), ("device", "dist.device"))),
    ]


def step_start_lines() -> list[str]:
    return ["profiler.begin(step)  # --profile: marks ProfilerStep#<step> in the trace"]


def step_end_lines() -> list[str]:
    return ["profiler.end(step)"]


def after_loop_lines() -> list[str]:
    return ["profiler.close()  # a run that stopped inside the --profile range still writes it"]
