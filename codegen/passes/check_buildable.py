"""Pass 2: the spec asks only for what ``parc build`` can generate today.

Takes: a ``Spec`` whose values passed ``check_values`` and whose ``auto`` values the
planner filled (``choose_layout``). Gives: the draft unchanged, or ``Diagnostics``
naming every feature not supported yet, each at its spec line with a hint. Each unsupported feature is one entry of
``UNSUPPORTED``: the issue that implements it deletes its entry (and adds its pass),
nothing else here changes.

Before: ``choose_layout``. After: ``resolve_mesh``.
"""

from __future__ import annotations

from typing import Callable

from parc.dsl.spec import Precision, Spec

from ..errors import UNSUPPORTED, check, error
from .draft import Draft

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
    # Values left auto were filled by choose_layout (the planner) before this pass.
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
