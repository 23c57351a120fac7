"""train.py's lines for sequence parallelism and 2D tensor parallelism (runtime/parallel/tensor/):
the sums of the norms' gradients over the ranks that split their tokens, and the 2D grid.

Takes: a ``Plan``. Gives: ``sequence_adds(plan)`` and ``grid_adds(plan)``, the entries'
sections (``features.Feature.adds``); ``tensor_extra``, the tensor step's arguments beyond
the group and the plan; the grid's constant and the expressions of a rank's share of
the tokens and features. Before: ``passes/``. After: ``render.py`` gathers
the sections, ``render_model.py`` writes the tensor step.
"""

from __future__ import annotations

from . import render_hetero
from .plan import Plan
from .plan_text import cite
from .view import constant


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


def tensor_extra(plan: Plan) -> tuple[tuple[str, str], ...]:
    """The tensor step's further keyword arguments: the 2D grid."""
    return (("grid", "tp_grid"),) if plan.mesh.tp_shape is not None else ()


def grid_constants(plan: Plan) -> list[str]:
    """``TP_SHAPE``, after ``TP`` (render_constants.py), under 2D tensor parallelism."""
    shape = plan.mesh.tp_shape
    if shape is None:
        return []
    return [constant(shape.name, shape.value, f"{cite(shape.span)}: R × C grid of the tp ranks")]


def sequence_words(plan: Plan) -> str:
    """The tokens a norm runs on under sequence parallelism: ``SEQUENCE_PARALLEL``'s comment."""
    return "T/tp" if plan.mesh.tp_shape is None else "T/C of hidden/R (Note [2D sequence parallelism])"


def sequence_split(plan: Plan) -> str:
    """How a rank's tokens of a sequence divide under sequence parallelism (the pipeline's activations)."""
    if not plan.sequence_parallel.enabled:
        return ""
    return " // TP" if plan.mesh.tp_shape is None else " // TP_SHAPE[1]"


def hidden_split(plan: Plan) -> str:
    """A rank's hidden features between blocks: Note [2D tensor parallelism], hidden/R."""
    return "HIDDEN" if plan.mesh.tp_shape is None else "HIDDEN // TP_SHAPE[0]"
