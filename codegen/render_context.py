"""train.py's lines for context parallelism (runtime/parallel/context/): the cp group and the
group that averages gradients and the loss over dp × cp.

Takes: a ``Plan``. Gives: ``adds(plan)``, the context-parallel entry's sections
(``features.Feature.adds``). Before: ``passes/``. After: ``render.py`` gathers the sections.
"""

from __future__ import annotations

from .plan import Plan


def adds(plan: Plan) -> dict:
    return {"groups": [
        'cp_group = grid.group("cp")  # ranks that split each sequence',
        'grad_group = grid.group("dp", "cp")  # ranks that average gradients and the loss',
    ]}
