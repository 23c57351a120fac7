"""Pass 2: the spec asks only for what ``parc build`` can generate today.

Takes: a ``Spec`` whose values passed ``check_values``. Gives: the draft unchanged,
or ``Diagnostics`` naming every value still ``auto`` and every feature not supported
yet, each at its spec line with a hint. Each unsupported feature is one entry of
``UNSUPPORTED``: the issue that implements it deletes its entry (and adds its pass),
nothing else here changes.

Before: ``check_values``. After: ``resolve_mesh``.
"""

from __future__ import annotations

from typing import Callable

from parc.dsl.spec import Precision, Spec

from ..errors import AUTO, UNSUPPORTED, check, error
from .draft import Draft

# (key, the spec's value, example of a value to give it)
AUTO_KEYS: tuple[tuple[str, Callable[[Spec], object], str], ...] = (
    ("parallel.dp", lambda s: s.parallel.dp, "1"),
    ("parallel.tp", lambda s: s.parallel.tp, "2"),
    ("parallel.pp", lambda s: s.parallel.pp, "1"),
    ("parallel.sp", lambda s: s.parallel.sp, "false"),
    ("parallel.zero", lambda s: s.parallel.zero, "0"),
    ("parallel.schedule", lambda s: s.parallel.schedule, "1f1b"),
    ("parallel.recompute", lambda s: s.parallel.recompute, "none"),
    ("parallel.overlap", lambda s: s.parallel.overlap_sub_batches, "none"),
)

# (key, is the feature asked for?, what it is, what to write instead)
UNSUPPORTED_FEATURES: tuple[tuple[str, Callable[[Spec], bool], str, str], ...] = (
    (
        "parallel.zero",
        lambda s: s.parallel.zero is not None and s.parallel.zero > 2,
        "ZeRO stage 3 (parameters sharded over dp, zero = 3)",
        "use zero = 2 (optimizer state and gradients sharded) or zero = 1 (optimizer state only)",
    ),
    (
        "train.precision",
        lambda s: s.train.precision is Precision.FP16,
        "fp16 training (it needs loss scaling)",
        "use precision = bf16 or fp32",
    ),
)


def run(spec: Spec, draft: Draft) -> Draft:
    problems = []
    auto = [key for key, value, _ in AUTO_KEYS if value(spec) is None]
    all_auto = len(auto) == len(AUTO_KEYS)
    if all_auto:
        problems.append(
            error(
                spec,
                "parallel",
                AUTO,
                "parallel = auto leaves the whole layout to the planner, which parc build does not run yet",
                "write the layout out, e.g. parallel { dp = 1  tp = 2  pp = 1 }, "
                "or give it with --set parallel.dp=1 --set parallel.tp=2 --set parallel.pp=1",
            )
        )
    else:
        for key, _, example in AUTO_KEYS:
            if key in auto:
                problems.append(
                    error(
                        spec,
                        key,
                        AUTO,
                        f"{key} = auto: parc build needs every degree set (the planner that fills "
                        "auto values is not available yet)",
                        f"give it a value in the spec or on the command line: --set {key}={example}",
                    )
                )
    for key, asked, feature, instead in UNSUPPORTED_FEATURES:
        if asked(spec):
            problems.append(
                error(
                    spec,
                    key,
                    UNSUPPORTED,
                    f"{feature} is not supported yet by parc build",
                    f"{instead}; a later version of parc generates it",
                )
            )
    if spec.train.optimizer.name != "adamw":
        problems.append(
            error(
                spec,
                "train.optimizer",
                UNSUPPORTED,
                f"optimizer {spec.train.optimizer.name!r} is not supported yet by parc build",
                "use optimizer = adamw(...)",
            )
        )
    check(problems)
    return draft
