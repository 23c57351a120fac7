"""train.py's lines for sequence parallelism and 2D tensor parallelism (runtime/parallel/tensor/):
the sums of the norms' gradients over the ranks that split their tokens, and the 2D grid.

Takes: a ``Plan``. Gives: ``sequence_adds(plan)`` and ``grid_adds(plan)``, the entries'
sections (``features.Feature.adds``), and ``tensor_kwargs(plan)``, the tensor step's
arguments beyond the group and the plan. Before: ``passes/``. After: ``render.py`` gathers
the sections, ``render_model.py`` writes the tensor step.
"""

from __future__ import annotations

from . import render_hetero
from .plan import Plan


def sequence_adds(plan: Plan) -> dict:
    if render_hetero.enabled(plan):
        return {"after_backward": [render_hetero.sp_line()]}
    if plan.mesh.tp_shape is None:
        return {"after_backward": ["# norms saw only their sequence shard: sum their grads over tp",
                                   "model.allreduce_sequence_parallel_grads(net, tp_group)"]}
    return {"after_backward": [
        "# Note [2D sequence parallelism]: norms saw only their row's T/C tokens: sum their grads",
        "# over the row's C ranks",
        "model.allreduce_sequence_parallel_grads(net, tp_grid.row_group)",
    ]}


def grid_adds(plan: Plan) -> dict:
    return {"groups": [
        "# Note [2D tensor parallelism] (parc_runtime/parallel/tensor/layers2d.py): the tp ranks as a grid",
        "tp_grid = grid.tp_grid(TP_SHAPE)",
    ]}


def tensor_extra(plan: Plan) -> str:
    """The tensor step's further arguments: the 2D grid."""
    return ", grid=tp_grid" if plan.mesh.tp_shape is not None else ""
