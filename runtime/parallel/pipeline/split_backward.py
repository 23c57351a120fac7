"""A stage's backward in two parts: B (input gradient) now, W (weight gradients) later.

Takes: a stage's output (or loss), the gradient received for it, its input and its
parameters. Gives: ``backward_input`` (B: the input's gradient, and what W needs) and
``backward_weight`` (W: the parameters' gradients, accumulated into ``.grad`` as
``loss.backward()`` would, so post-accumulate-grad hooks, and with them the dp buckets
of ``dp.py``, fire when a parameter's last W of the step finishes), and
``defer_linear_weights`` (the executor's, on a zero-bubble build's chunks: Note [deferred
linear weights]). Before: the
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

Note [deferred linear weights]: restarting autograd at the joins runs every linear's
matmul node twice, in B for the input gradient and again in W for the weight's
(bench/zb_linear.py's profile: 7 MmBackward0 in each pass of a llama layer). Measured,
that second run is a small part of what B + W adds to a plain backward (bench/
peer_notes.md, 2026-12-06: ~0.1 of ~0.7 ms a layer; the rest is torch's join analysis
and hooks in B, the norms' backward again in W, W's restarts). ``defer_linear_weights``,
which the executor applies to a zero-bubble build's chunks (only such a build ships this
module), removes it: each bias-free ``nn.Linear`` becomes a ``DeferredLinear``, whose
backward in B computes the input gradient only and leaves (weight, input, output
gradient) with the B that runs it (``_collecting``); W computes each weight's gradient
directly, ``grad.t() @ input`` over the flattened tokens (the GEMM autograd's
``MmBackward0`` runs for ``F.linear``'s weight: bit-identical gradients), and
accumulates it through the parameter's own accumulate-grad node, so tensor hooks and
post-accumulate-grad hooks fire once per parameter per W as before. The weights are no
edge of the graph (the function takes a detached copy), so B's join analysis never
reaches them and W's restarts skip them. Left on the join path: every other parameter
(norms and an untied head, but for Note [bare B]; embeddings), linears with a bias
(``F.linear`` gives their 3D output as a view, which a function's output may not be),
tensor-parallel linears (other classes, layers.py), linears under autocast (the casts
are autograd's nodes), linears whose input needs no gradient, chunks under ZeRO-3
(``split_backward_hooks``: its gathers for B and W are the hooks'), and the first stage's
chunk: its B is empty (token input) and its W one whole backward, in which a deferred
linear only adds its Python function to F and B and a second engine call for the GEMMs
to W (0.4 ms, 9%, of its F+B+W at bench/peer.py's shapes, on ZB-V's busier rank 0:
bench/peer_notes.md, "ZB-V against 1F1B"). A backward outside a B or a whole-backward W
(none in the trainer) accumulates the weight gradients at once.

Note [bare B]: with the linears deferred, a middle chunk of a llama (or of a model whose
linears have no bias) has no parameter left on the join path but its norms' weights (and
LayerNorm's biases), and a norm's backward, on the input's path, computes their
gradients in B anyway. Such a chunk's B is one ``torch.autograd.grad`` of the input and
of those norm parameters (``_bare``): no join analysis, no pre-hooks, no graph kept for
W; W then hands the norms' gradients, with the deferred GEMMs, to the parameters'
accumulate-grad nodes in one engine call (``_weight_gemms``), so their hooks fire in W
as before. ``defer_linear_weights`` marks the parameters (``_MARKS``: "deferred"
on a ``DeferredLinear``'s weight, "from_b" on a ``Norm``'s and an untied head's, a
parameter no other module holds; a ``DeferredLinear`` marks its weight on its first
forward, so a weight used only elsewhere is never marked); a B takes this path when every
parameter it owes is marked so and no norm parameter has a tensor hook (autograd.grad
would run it in B and W again). The last chunk takes it too: its head's weight, used
only by the loss's ``F.linear``, is marked "from_b" when untied and not tensor-parallel
(``_head``), so B computes the head's weight GEMM (bench/zb_linear.py --last: B+W 1.16x
a plain backward against 1.27x on the join path; deferring that GEMM to W instead costs
the same but would keep the logits' gradient, tokens × vocab, until W); a tied copy
(Note [tied embeddings across stages] in models/pipeline_stages.py) keeps the join path.
A linear that takes the join path (autocast) marks its weight "joined" for good, so its
chunk keeps the join path, as do the first stage (token input) and every other chunk
(biased, tensor-parallel or expert layers, ZeRO-3): the path of Note [splitting
backward]. A module's parameters must be used by that module alone (true of
runtime/models). Gradients are the same floats: the same nodes run once, and each
parameter's accumulate-grad node gets the same sum (tests/runtime/test_deferred_linear.py).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch.autograd.graph import GradientEdge, _engine_run_backward as _run_backward
from torch.distributed.pipelining._backward import stage_backward_input
from torch.utils.weak import WeakIdKeyDictionary

from ...models.norm import Norm

_MARKS = WeakIdKeyDictionary()
"""Parameter -> how its gradient is split (Note [bare B]): "deferred", "from_b" or "joined";
the executor's own state, kept here rather than on the parameter (its role is roles.py's)."""


@dataclass(slots=True)
class OwedWeights:
    """What a W needs: the saved gradients at the joins (``groups``), or, on the first
    stage, the output and its gradient for one whole backward."""

    params: list
    groups: list | None = None
    output: torch.Tensor | None = None
    output_grad: torch.Tensor | None = None
    linears: list = field(default_factory=list)  # (weight, input, grad): Note [deferred linear weights]
    kept: list = field(default_factory=list)  # (norm parameter, gradient from B): Note [bare B]


def backward_input(output, output_grad, stage_input, params) -> tuple[torch.Tensor | None, OwedWeights]:
    """B: the gradient of ``stage_input`` (None when it needs none) and what W owes.
    ``output_grad`` None: ``output`` is the loss."""
    params = [p for p in params if p.requires_grad]
    if not (isinstance(stage_input, torch.Tensor) and stage_input.requires_grad):
        return None, OwedWeights(params=params, output=output, output_grad=output_grad)
    grads = None if output_grad is None else [output_grad]
    if _bare(params):  # Note [bare B]
        norms = [p for p in params if _MARKS.get(p) == "from_b"]
        with _collecting() as linears:
            input_grad, *norm_grads = torch.autograd.grad([output], [stage_input, *norms], grads, allow_unused=True)
        kept = [(p, grad) for p, grad in zip(norms, norm_grads, strict=True) if grad is not None]
        return input_grad, OwedWeights(params=params, groups=[], linears=linears, kept=kept)
    with _collecting() as linears:
        (input_grad,), groups = stage_backward_input([output], grads, [stage_input], iter(params))
    return input_grad, OwedWeights(params=params, groups=groups, linears=linears)


def backward_weight(owed: OwedWeights, hooks=None) -> None:
    """W: accumulate every parameter's gradient from what B saved (Note [splitting backward]);
    ``hooks``: the chunk's ``split_backward_hooks`` or None (Note [hooks of a split backward])."""
    if owed.groups is None:
        with _collecting() as linears:
            torch.autograd.backward(owed.output, grad_tensors=owed.output_grad, inputs=owed.params)
        _weight_gemms(linears)
        return
    _weight_gemms(owed.linears, owed.kept)
    owed.linears, owed.kept = [], []
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


def _bare(params) -> bool:
    """Whether a B owing ``params`` is a bare ``autograd.grad`` (Note [bare B])."""
    for p in params:
        kind = _MARKS.get(p)
        if kind != "deferred" and (kind != "from_b" or p._backward_hooks):
            return False
    return True


def _params(group: dict) -> list:
    """The parameters of a group (its accumulate-grad nodes' variables)."""
    return [accumulate.variable for accumulate in group["params"]]


def defer_linear_weights(chunks):
    """Each chunk's bias-free ``nn.Linear`` layers as ``DeferredLinear`` (Note [deferred linear
    weights]), their weights and the ``Norm``s' parameters marked for a bare B (Note [bare
    B]), but none of a chunk under ZeRO-3 or of the first stage's (token input: its W is
    one whole backward); gives ``chunks``."""
    for chunk in chunks:
        if getattr(chunk, "split_backward_hooks", None) is not None or getattr(chunk, "first", False):
            continue
        holders: dict = {}  # parameter -> the modules holding it
        for module in chunk.modules():
            if type(module) is torch.nn.Linear and module.bias is None:
                module.__class__ = DeferredLinear  # same parameters, names and state dict
            for p in module.parameters(recurse=False):
                holders.setdefault(p, []).append(module)
        head = _head(chunk)
        for p, modules in holders.items():  # a linear's weight: marked by its forward
            if len(modules) > 1:
                _MARKS[p] = "joined"
            elif isinstance(modules[0], Norm) or modules[0] is head:
                _MARKS[p] = "from_b"
    return chunks


def _head(chunk):
    """A last chunk's head whose weight only the loss's ``F.linear`` uses, untied: its gradient
    comes from B (Note [bare B]); else None (a tied copy keeps the join path)."""
    head = getattr(chunk, "head", None) if getattr(chunk, "last", False) else None
    untied = type(head) is DeferredLinear and not chunk.config.tie_embeddings and chunk.tp_group is None
    return head if untied and chunk.head_weight() is head.weight else None


class DeferredLinear(torch.nn.Linear):
    """A bias-free ``nn.Linear`` whose backward leaves its weight's gradient to W."""

    def forward(self, x):
        if not torch.is_grad_enabled():
            return F.linear(x, self.weight)
        if torch.is_autocast_enabled(x.device.type) or not x.requires_grad:
            _MARKS[self.weight] = "joined"  # Note [bare B]: for good once a use is on the join path
            return F.linear(x, self.weight)  # the join path
        _MARKS.setdefault(self.weight, "deferred")
        return _Deferred.apply(x, self.weight.detach(), self)


_pending: list | None = None  # the deferred linears of the B (or whole W) running now


@contextlib.contextmanager
def _collecting():
    """Collect the deferred linears of the backward run inside (Note [deferred linear weights])."""
    global _pending
    outer, _pending = _pending, []
    try:
        yield _pending
    finally:
        _pending = outer


class _Deferred(torch.autograd.Function):
    """``F.linear(x, weight)``; backward: the input gradient as autograd's
    ``MmBackward0`` computes it (``grad @ weight``), the weight's left to W."""

    @staticmethod
    def forward(ctx, x, weight, module):
        ctx.save_for_backward(x, weight)
        ctx.module = module
        return F.linear(x, weight)

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        grad = grad.reshape(-1, grad.shape[-1])
        entry = (ctx.module.weight, x.reshape(-1, x.shape[-1]), grad)
        x_grad = grad.mm(weight).view(x.shape)
        if _pending is None:  # not inside a B: accumulate now
            _weight_gemms([entry])
        else:
            _pending.append(entry)
        return x_grad, None, None


def _weight_gemms(linears, kept=()) -> None:
    """W of the deferred linears (and of the norm gradients ``kept`` from a bare B: Note [bare
    B]): one engine call through ``_WeightGrads``, whose node computes the GEMMs, so each
    parameter's accumulate-grad node takes its gradient as it would from autograd's own
    node (without a copy) and runs the parameter's hooks."""
    params = list(dict.fromkeys([weight for weight, _, _ in linears if weight.requires_grad] + [p for p, _ in kept]))
    if not params:  # frozen weights: nothing to accumulate
        return
    with torch.enable_grad():
        root = _WeightGrads.apply(linears, kept, *params)
    _run_backward((root,), (torch.ones_like(root),), False, False, tuple(params),
                  allow_unreachable=True, accumulate_grad=True)


class _WeightGrads(torch.autograd.Function):
    """A root whose backward is the deferred linears' weight gradients:
    ``grad.t() @ input`` over the tokens, as ``MmBackward0`` computes ``F.linear``'s."""

    @staticmethod
    def forward(ctx, linears, kept, *params):
        ctx.linears, ctx.kept, ctx.params = linears, kept, params
        return torch.zeros((), device=params[0].device)

    @staticmethod
    def backward(ctx, _):
        grads: dict = dict(ctx.kept)  # a norm's parameter: autograd.grad summed its uses in B
        for weight, x, grad in ctx.linears:  # a weight used twice (sub-batches) sums its uses
            if weight.requires_grad:
                gemm = grad.t().mm(x)
                grads[weight] = gemm if weight not in grads else grads[weight] + gemm
        ctx.linears = ctx.kept = None
        return (None, None, *(grads.pop(p) for p in ctx.params))
