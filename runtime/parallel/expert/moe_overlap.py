"""Sub-batch overlap of the expert all-to-alls with the experts' compute (MegaScale-MoE).

Takes: an ``moe.MoEMLP`` under expert parallelism and its micro-batch's routed rows split
into k sub-batches (each sorted by expert, with its per-expert counts). Gives:
``run_overlapped(layer, rows, counts)``, each sub-batch's expert outputs in its rows'
order, the same numbers as ``MoEMLP.dispatch_and_run`` on each sub-batch. Called by
``MoEMLP.forward`` for the ``overlap`` setting (k sub-batches) with ep > 1.

Note [expert all-to-all overlap]: forward issues sub-batch i+1's dispatch before
sub-batch i's experts run, and sub-batch i's combine before sub-batch i+1's experts, each
asynchronously (``_Launch``), waited (``_Wait``) only when its rows are needed, so each
all-to-all runs behind an expert computation (Megatron's batch-level EP overlap). In
backward the pair swaps roles: ``_Wait``'s backward launches the reverse all-to-all of
its gradient and ``_Launch``'s backward waits for it; autograd runs nodes in reverse
creation order, so the reverse combine of sub-batch i runs while sub-batch i+1's experts
do their backward, and the reverse dispatch of i+1 while i's do. What stays exposed is
what ``comm.exposed_clock`` counts: the waits, and the small blocking count exchange
(the counts every sub-batch's experts need from other ranks are gathered once, behind the
first dispatch: ``MoEMLP.sizes_in_flight`` in moe.py).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ...distributed.comm import _issued, exposed
from .routing import permuted


class _Box:
    """One all-to-all in flight between a ``_Launch`` and its ``_Wait`` (either direction)."""

    __slots__ = ("work", "result", "keep")

    def __init__(self):
        self.work = self.result = self.keep = None


def _start(box: _Box, x: torch.Tensor, group, send: list, receive: list) -> torch.Tensor:
    x = x.contiguous()
    out = x.new_empty((sum(receive), *x.shape[1:]))
    _issued()
    box.work = dist.all_to_all_single(out, x, output_split_sizes=receive, input_split_sizes=send,
                                      group=group, async_op=True)
    box.result, box.keep = out, x  # the source must live until the exchange is done
    return out


def _finish(box: _Box) -> torch.Tensor:
    with exposed():
        box.work.wait()
    result, box.work, box.result, box.keep = box.result, None, None, None
    return result


class _Launch(torch.autograd.Function):
    """Forward: start the exchange (rows ``send[r]`` to rank r). Backward: wait for the
    reverse exchange ``_Wait``'s backward started, and hand its rows back."""

    @staticmethod
    def forward(ctx, x, group, send, receive, box, back):
        ctx.back = back
        return _start(box, x, group, send, receive)

    @staticmethod
    def backward(ctx, grad):
        return _finish(ctx.back), None, None, None, None, None


class _Wait(torch.autograd.Function):
    """Forward: wait for the exchange. Backward: start the reverse exchange of the gradient
    (``_Launch``'s backward waits for it), passing ``grad`` along only as a dependency."""

    @staticmethod
    def forward(ctx, out, group, send, receive, box, back):
        ctx.group, ctx.splits, ctx.back = group, (send, receive), back
        return _finish(box).view_as(out)

    @staticmethod
    def backward(ctx, grad):
        send, receive = ctx.splits
        _start(ctx.back, grad, ctx.group, receive, send)
        return grad, None, None, None, None, None


class _Exchange:
    """One all-to-all as a launch and a wait: ``start(x)`` now, ``finish()`` later."""

    def __init__(self, group, send, receive):
        self.group, self.send, self.receive = group, list(send), list(receive)
        self.box, self.back, self.pending = _Box(), _Box(), None

    def start(self, x):
        self.pending = _Launch.apply(x, self.group, self.send, self.receive, self.box, self.back)

    def finish(self):
        return _Wait.apply(self.pending, self.group, self.send, self.receive, self.box, self.back)


def run_overlapped(layer, rows: list, counts: list) -> list:
    """Note [expert all-to-all overlap]: each sub-batch's rows (sorted by expert, ``counts``
    per expert) → its experts' outputs, in the same order."""
    plans = [layer.exchange_plan(c) for c in counts]  # the blocking count exchanges, first
    sizes = layer.sizes_in_flight([p.local_counts for p in plans])  # one gather, waited behind the first dispatch
    dispatch = [_Exchange(layer.ep_group, p.send, p.receive) for p in plans]
    combine = [_Exchange(layer.ep_group, p.receive, p.send) for p in plans]
    dispatch[0].start(rows[0])
    for i, plan in enumerate(plans):
        if i + 1 < len(plans):
            dispatch[i + 1].start(rows[i + 1])  # runs while sub-batch i's experts compute
        arrived = dispatch[i].finish()
        y = layer.run_local(permuted(arrived, plan.regroup, plan.back), plan.local_counts, sizes(i))
        combine[i].start(permuted(y, plan.back, plan.regroup))  # runs while sub-batch i+1's experts compute
    return [exchange.finish() for exchange in combine]
