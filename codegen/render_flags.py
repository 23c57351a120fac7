"""``train.py``'s command-line flags: every ``parser.add_argument`` line, in one place.

Takes: the Plan. Gives: ``flag_lines`` (the body of ``parse_args`` after the parser is
made), each flag with a ``type=`` of ``runtime/train/flags.py`` that checks its range or form
as argparse reads it (``--steps -3``, ``--checkpoint-every -2``, ``--seed`` past the
spec's range, an empty path: a usage error naming the flag, exit 2). The ranges are the
spec keys' where a flag overrides one (dsl/keys/: ``train.steps``, ``train.seed``).
Before: nothing. After: ``render.py`` puts the lines in ``templates/train.py.j2``.
"""

from __future__ import annotations

from parc.dsl.keys import BLOCKS

from . import render_eval
from .plan import Plan

_TRAIN = BLOCKS["train"]


def _range(key: str) -> str:
    """``low`` or ``low, high`` of an integer key of ``train``, as ``flags.whole``'s arguments."""
    param = _TRAIN.key(key)
    low, high = int(param.minimum), int(param.maximum)
    return f"{low}" if high == 2**31 - 1 else f"{low}, {high}"


def flag_lines(plan: Plan) -> list[str]:
    lines = [
        "parser.add_argument(",
        '    "--steps",',
        f"    type=flags.whole({_range('steps')}),",
        "    default=STEPS,",
        '    help="optimizer steps to run (default %(default)s); the LR schedule keeps the "',
        '    "spec\'s length, STEPS: steps past it run at the minimum LR",',
        ")",
        f'parser.add_argument("--seed", type=flags.whole({_range("seed")}), default=SEED)',
        'parser.add_argument("--metrics-jsonl", type=flags.path, default=None, metavar="PATH")',
        # checkpoints (runtime/checkpoints/checkpoint.py): 0 means after the last step only / keep all
        'parser.add_argument("--checkpoint-dir", type=flags.path, default=CHECKPOINT_DIR, metavar="DIR")',
        'parser.add_argument("--checkpoint-every", type=flags.whole(0), default=CHECKPOINT_EVERY, metavar="N")',
        'parser.add_argument("--checkpoint-keep", type=flags.whole(0), default=0, metavar="K")',
        'parser.add_argument("--resume", type=flags.path, default=None, metavar="DIR")',
        *_init_from(plan),
        # what runs (runtime/train/observe.py, memory.py): 0 measures only the first steps and the last
        'parser.add_argument("--tensorboard", type=flags.path, default=TENSORBOARD_DIR, metavar="DIR")',
        'parser.add_argument("--profile", type=flags.step_range, default=None, metavar="STEPS")',
        'parser.add_argument("--profile-dir", type=flags.path, default="profile", metavar="DIR")',
        'parser.add_argument("--memory-every", type=flags.whole(0), default=MEMORY_EVERY, metavar="N")',
    ]
    if plan.train.data.kind == "tokens":
        lines += [
            "# DATA_PATH is from this file's folder, so the run works from any cwd",
            *_path_flag("--data", "data_path", "DATA_PATH", isinstance(plan.train.data.path, tuple)),
        ]
    if render_eval.enabled(plan):  # runtime/train/evaluate.py's eval_only
        lines.append('parser.add_argument("--eval-only", action="store_true")')
    if plan.train.data.kind == "tokens":
        if render_eval.enabled(plan) and plan.train.data.val_path:
            lines += _path_flag("--val-data", "val_path", "VAL_DATA_PATH", isinstance(plan.train.data.val_path, tuple))
    return lines


def _path_flag(flag: str, name: str, constant: str, blended: bool) -> list[str]:
    """``flag`` for a token file (a blend's files: one or more) from this file's folder."""
    if not blended:
        return [
            f"{name} = os.path.join(os.path.dirname(os.path.abspath(__file__)), {constant})",
            f'parser.add_argument("{flag}", type=flags.path, default={name}, metavar="PATH")',
        ]
    return [
        f"{name} = [os.path.join(os.path.dirname(os.path.abspath(__file__)), p) for p in {constant}]",
        f'parser.add_argument("{flag}", type=flags.path, nargs="+", default={name}, metavar="PATH")',
    ]


def _init_from(plan: Plan) -> list[str]:
    """``--init-from DIR`` (runtime/checkpoints/checkpoint_init.py): train.init's checkpoint,
    from this file's folder like DATA_PATH, or none."""
    if not plan.train.init_from.value:
        return ['parser.add_argument("--init-from", type=flags.path, default=INIT_FROM, metavar="DIR")']
    return [
        "# INIT_FROM is from this file's folder, so the run works from any cwd",
        "init_from = os.path.join(os.path.dirname(os.path.abspath(__file__)), INIT_FROM)",
        'parser.add_argument("--init-from", type=flags.path, default=init_from, metavar="DIR")',
    ]
