"""The steps that move activations between two layers of different tensor-parallel degree.

Takes: the degrees a and b of two neighbouring layers of a heterogeneous stage
(``runtime/parallel/data/hetero.py``, Note [heterogeneous layouts]). Gives: ``reshard_steps`` (what
``StageLayouts.reshard`` runs, in order) and ``step_group`` (a step's group size and
stride). Imports nothing (no torch): the planner's cost model
(``codegen/planner/cost/per_layer.py``) prices the same steps.

Note [reshard traffic]: a change of degree a → b moves, per micro-batch, one all-gather
over the piece group (h/l ranks, h = max(a, b), l = min(a, b)) of the activations at
the larger degree's batch piece — in forward when tp grows (the pieces are gathered),
in backward when it shrinks (the pieces' gradients are gathered); under sp one more
all-gather each way (T over the old tp group forward, over the new one in backward).
``reshard_steps`` lists these steps; the runtime runs them and the planner prices them
from the same list.
"""

from __future__ import annotations


def reshard_steps(a: int, b: int, *, sequence_parallel: bool = False) -> tuple:
    """Note [reshard traffic]: what ``StageLayouts.reshard`` runs to move activations from a
    layer at tp ``a`` to one at tp ``b``, in order, as ``(op, group, dim)``: ``op`` is
    ``gather`` (forward: all-gather along ``dim``; backward: this rank's chunk) or
    ``scatter`` (forward: this rank's chunk; backward: all-gather); ``group`` is ``("tp",
    t)``, a layer's tp group, or ``("piece", high, low)``, the ranks holding the pieces of
    one batch between those degrees (``piece_group``). Dim 0 is the batch, dim 1 the
    sequence. The cost model (``codegen/planner/cost/per_layer.py``) prices these steps."""
    if a == b:
        return ()
    steps = []
    if sequence_parallel and a > 1:
        steps.append(("gather", ("tp", a), 1))
    steps.append(("scatter" if a > b else "gather", ("piece", max(a, b), min(a, b)), 0))
    if sequence_parallel and b > 1:
        steps.append(("scatter", ("tp", b), 1))
    return tuple(steps)


def step_group(group: tuple) -> tuple[int, int]:
    """(ranks, stride) of a ``reshard_steps`` group within a stage (tp innermost): a tp group
    is ``t`` consecutive ranks; a piece group ``high // low`` ranks ``low`` apart."""
    if group[0] == "tp":
        return group[1], 1
    return group[1] // group[2], group[2]
