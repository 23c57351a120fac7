"""train.py's lines for data parallelism (runtime/parallel/data/dp.py): the dp group, and the
gradient buckets that average the gradients over the ranks that saw different tokens.

Takes: a ``Plan``. Gives: ``adds(plan)``, the data-parallel entry's sections
(``features.Feature.adds``). Before: ``passes/``. After: ``render.py`` gathers the sections.
"""

from __future__ import annotations

from .plan import Plan


def adds(plan: Plan) -> dict:
    mesh = plan.mesh
    groups = ['dp_group = grid.group("dp")  # ranks that split the batch'] \
        if mesh.size("cp") == 1 and mesh.size("dp") > 1 else []
    return {"groups": groups}
