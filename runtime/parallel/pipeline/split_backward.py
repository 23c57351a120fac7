"""A stage's backward in two parts: B (input gradient) now, W (weight gradients) later.

Takes: a stage's output (or loss), the gradient received for it, its input and its
parameters. Gives: ``backward_input`` (B: the input's gradient, and what W needs) and
``backward_weight`` (W: the parameters' gradients, accumulated into ``.grad`` as
``loss.backward()`` would, so post-accumulate-grad hooks, and with them the dp buckets
of ``dp.py``, fire when a parameter's last W of the step finishes). Before: the
pipeline executor's B and W actions (schedule.py, Note [B and W]). After: nothing.

Note [splitting backward]: B walks the autograd graph from the output to the input
only (``torch.distributed.pipelining``'s ``stage_backward_input``, which keeps the
graph and, with pre-hooks, the gradients arriving at the nodes where the parameters'
branches join the input's path). W restarts autograd at those nodes with those
gradients and stops at the parameters, so no node on the input's path runs twice.
The first stage's input is token ids (no gradient): its B has nothing to send and its
W runs the whole backward.

Note [freeing a group]: a group dict holds its join nodes and the gradients B saved
there, so W clears every group once done with it, reached or not: the graph below the
joins, and the saved gradients, go with the W rather than with the ``OwedWeights``.
(The graph above the joins, kept by B's ``retain_graph``, is the memory meter's to
release on measured steps: Note [counting saved activations] in memory.py.)

Note [hooks of a split backward]: a chunk may carry ``split_backward_hooks`` (ZeRO-3's,
fsdp.py, Note [ZeRO-3 under a split backward]): ``inputs()``, a context the executor
runs B in, and ``weights(params, later)``, which ``backward_weight`` calls before each
group with the group's parameters and the later groups' (their parameters must be at
hand for the W; ``later`` is for prefetch). A first stage's W runs the whole backward,
whose own hooks see to its parameters.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.autograd.graph import GradientEdge, _engine_run_backward as _run_backward
from torch.distributed.pipelining._backward import stage_backward_input


@dataclass(slots=True)
class OwedWeights:
    """What a W needs: the saved gradients at the joins (``groups``), or, on the first
    stage, the output and its gradient for one whole backward."""

    params: list
    groups: list | None = None
    output: torch.Tensor | None = None
    output_grad: torch.Tensor | None = None


def backward_input(output, output_grad, stage_input, params) -> tuple[torch.Tensor | None, OwedWeights]:
    """B: the gradient of ``stage_input`` (None when it needs none) and what W owes.
    ``output_grad`` None: ``output`` is the loss."""
    params = [p for p in params if p.requires_grad]
    if not (isinstance(stage_input, torch.Tensor) and stage_input.requires_grad):
        return None, OwedWeights(params=params, output=output, output_grad=output_grad)
    grads = None if output_grad is None else [output_grad]
    (input_grad,), groups = stage_backward_input([output], grads, [stage_input], iter(params))
    return input_grad, OwedWeights(params=params, groups=groups)


def backward_weight(owed: OwedWeights, hooks=None) -> None:
    """W: accumulate every parameter's gradient from what B saved (Note [splitting backward]);
    ``hooks``: the chunk's ``split_backward_hooks`` or None (Note [hooks of a split backward])."""
    if owed.groups is None:
        torch.autograd.backward(owed.output, grad_tensors=owed.output_grad, inputs=owed.params)
        return
    for at, group in enumerate(owed.groups):
        if hooks is not None and group.get("grads") is not None:
            hooks.weights(_params(group), (_params(g) for g in owed.groups[at + 1 :] if g.get("grads") is not None))
        saved = group.get("grads")
        if saved is None:  # no gradient reached this join: its parameters get none
            group.clear()  # B's pre-hooks on its nodes hold this dict (Note [freeing a group])
            continue
        edges, grads = [], []
        for grads_at_node, node in zip(saved, group["intermediates"], strict=True):
            for index, grad in enumerate(grads_at_node):
                if grad is not None:
                    edges.append(GradientEdge(node, index))
                    grads.append(grad)
        # a join below another join of the same group would add the upper one's share
        # again: give every join exactly the gradient B saw there
        handles = [node.register_prehook(lambda _grads, seen=grads_at_node: seen)
                   for grads_at_node, node in zip(saved, group["intermediates"], strict=True)
                   if len(group["intermediates"]) > 1]
        try:
            if edges:
                _run_backward(tuple(edges), tuple(grads), False, False, tuple(_params(group)),
                              allow_unreachable=True, accumulate_grad=True)
        finally:
            for handle in handles:
                handle.remove()
        group.clear()  # Note [freeing a group]


def _params(group: dict) -> list:
    """The parameters of a group (its accumulate-grad nodes' variables)."""
    return [accumulate.variable for accumulate in group["params"]]
