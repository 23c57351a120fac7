"""Sub-batch overlap of tensor-parallel communication with compute (Oases).

Takes: a ``Transformer`` (or pipeline stage) whose blocks use column-/row-parallel
linears, a micro-batch's hidden states (B, T, C) (or (B, T/tp, C) under sequence
parallelism) and ``sub_batches`` k dividing B. Gives: ``run_blocks(model, x, k)``,
the same numbers as ``Transformer.walk_blocks`` but with every tensor-parallel
collective of the blocks issued asynchronously and waited only when its result is
needed. Called by ``Transformer.walk_blocks`` when ``sub_batches > 1``; uses the
asynchronous launches of ``comm.py``.

Note [the sub-batch schedule]: the micro-batch is split along B into k sub-batches.
Each block is two *regions* (attention, MLP); a region computes up to its
row-parallel matmul, whose partial sums are all-reduced (under SP: reduce-scattered
along T, and the region starts with an all-gather along T). The regions of all
blocks form one chain of stages separated by collectives, and the stages run as a
wavefront: stage s of sub-batch 0, stage s of sub-batch 1, ..., then stage s+1 of
sub-batch 0. So sub-batch i's collective of stage s runs while sub-batch i+1
computes stage s, and the last sub-batch's runs while sub-batch 0 computes stage
s+1 (Li et al., Oases, §3). Tokens of different sequences never meet in a block, so
the numbers equal the unsplit run's (up to the order of float sums).

Note [overlap in backward]: torch's autograd engine runs the backward nodes of one
device in reverse creation order, so it replays the wavefront backwards: stage s of
sub-batch k-1, of k-2, ..., then stage s-1. The row-parallel all-reduce needs no
communication in backward (its gradient is the identity; under SP an all-gather,
which the next matmul needs at once, so it blocks). The column-parallel linears use
Megatron's trick (``_ColumnLinears``): the all-reduce (SP: reduce-scatter) of the
input gradient is launched as soon as that gradient exists, the weight gradients are
computed while it runs, and it is waited last. What does *not* overlap in backward:
a gradient collective of sub-batch i with the backward of sub-batch i-1, because the
engine hands the gradient to the norm below at once (its node was created right
before); doing that needs a scheduler that owns the backward order (Oases has one),
which this engine does not give us. The q/k/v (and gate/up) projections share one
gradient collective instead of one each.

Note [module hooks in the wavefront]: the wavefront runs a block's regions itself, never
calling the block, so it runs the block's forward hooks itself (ZeRO-3's, fsdp.py, are the
only ones: gather the block's unit before, free it after and gather it again when backward
reaches it): the pre-hooks before the block's first region, the post hooks once the block's
last region's deltas are added to the streams (at the next block's first region, or after
the last block), with that region's results as the output whose gradient starts the
block's backward. Freeing it earlier would free the row bias the delayed add still reads.

Note [fine-grained recompute]: with ``recompute = full`` each region's compute
(the part between two collectives) runs under ``torch.utils.checkpoint``. The
residual add that consumes the previous collective's result runs outside it, so a
region keeps only its input — the residual stream with that result already in it —
and, under SP, the all-gathered (b, T, C) input of its matmuls (the collective's
output itself). The recompute in backward therefore reruns norms, matmuls and
attention but no collective: a step issues as many collectives as without
recompute (tested). It keeps two (b, T, C) activations per block where the unsplit
``full`` keeps one (more under SP): Oases' trade of memory for communication.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from ...distributed.comm_scatter import _all_gather
from ...distributed.comm_async import launch_all_gather, launch_all_reduce, launch_reduce_scatter
from .column_grads import input_grad, weight_grads
from .layers import ColumnParallelLinear, RowParallelLinear
from ...models.residual import settle


class _ColumnLinears(torch.autograd.Function):
    """Column-parallel linears sharing one input; Megatron's overlap in backward.

    Forward: ``F.linear(full, w_j, b_j)`` for each j, where ``full`` is ``x`` itself
    (replicated input) or its all-gather along T (sequence parallel, gathered by
    the caller). Backward: the input gradient Σ_j g_j W_j is all-reduced over tp
    (SP: reduce-scattered along T) *asynchronously*; the weight and bias gradients
    are computed meanwhile; then it is waited.
    """

    @staticmethod
    def forward(ctx, x, full, group, sequence_parallel, count, *params):
        weights, biases = params[:count], params[count:]
        source = x if full is None else full
        ctx.save_for_backward(source, *weights)
        ctx.group, ctx.sp, ctx.count, ctx.input_dtype = group, sequence_parallel, count, x.dtype
        ctx.bias_dtypes = tuple(None if b is None else b.dtype for b in biases)
        return tuple(F.linear(source, w, b) for w, b in zip(weights, biases))  # autocast applies

    @staticmethod
    def backward(ctx, *grads):
        # Backward runs outside autocast: compute in the gradients' dtype (bf16 under
        # autocast, as autocast's own linear would) and return each input's dtype.
        source, *weights = ctx.saved_tensors
        grad_source = input_grad(grads, weights)
        # the input gradient's collective runs while the weight gradients compute
        if ctx.sp:
            pending = launch_reduce_scatter(grad_source, ctx.group, dim=1)  # (b, T/tp, in)
        else:
            pending = launch_all_reduce(grad_source, ctx.group)  # (b, T, in)
        grad_weights, grad_biases = weight_grads(grads, weights, ctx.bias_dtypes, source)
        grad_x = pending.wait().to(ctx.input_dtype)
        return (grad_x, None, None, None, None, *grad_weights, *grad_biases)


class _LaunchReduce(torch.autograd.Function):
    """Forward: launch the all-reduce (SP: reduce-scatter along T) of a row-parallel
    matmul's partial sums, returning the result's buffer at once (read it only after
    the ``Pending`` put in ``box`` is waited; under SP the buffer is (T/tp, b, C),
    T in front). Backward: identity (SP: all-gather along T, back to (b, T, C))."""

    @staticmethod
    def forward(ctx, partial, group, sequence_parallel, box):
        ctx.group, ctx.sp = group, sequence_parallel
        if sequence_parallel:
            pending = launch_reduce_scatter(partial, group, dim=1)
        else:
            pending = launch_all_reduce(partial, group)
        box.append(pending)
        return pending.buffer

    @staticmethod
    def backward(ctx, grad):
        if ctx.sp:
            return _all_gather(grad, ctx.group, 0).movedim(0, 1), None, None, None
        return grad, None, None, None


class _Inflight:
    """A region's collective in flight and the row-parallel bias to add after it."""

    def __init__(self, result, pending, bias, sequence_parallel):
        self.result, self.pending, self.bias, self.sp = result, pending, bias, sequence_parallel

    def wait(self):
        self.pending.wait()
        return self.result.movedim(0, 1) if self.sp else self.result  # (b, T[/tp], C)


def _launch_reduce(partial, group, sequence_parallel):
    box = []
    result = _LaunchReduce.apply(partial, group, sequence_parallel, box)
    return result, box[0]


def overlappable(block) -> bool:
    """Whether a block's regions open with column- and close with row-parallel linears
    (else it runs unsplit); Note [blocks as regions] in model.py."""
    return all(
        all(type(m) is ColumnParallelLinear for m in region.body.columns) and type(region.row) is RowParallelLinear
        for region in block.regions
    )


# ---- the compute of one region, between its collectives ---------------------------


def _delta(inflight, dropout, training):
    """Close a sub-batch's previous region: wait its collective and give its output, not
    yet added to the residual stream (Note [pending residual] in model.py): the next
    region's norm adds it in one kernel with its own normalization (``Norm.add_norm``).
    None when no region is open."""
    if inflight is None:
        return None
    reduced = inflight.wait()
    if inflight.bias is not None:
        reduced = reduced + inflight.bias
    return F.dropout(reduced, dropout, training)


def _add_norm(norm, x, delta):
    """(norm(x + delta), x + delta): the fused residual add and norm, as ``Region.run``."""
    return (norm(x), x) if delta is None else norm.add_norm(delta, x)


def _partial(region, h, full):
    """The region from its norm's output to the row-parallel partial sums (b, T, C): the
    column projections (entered once, Megatron-style backward), the body, the row
    matmul without its reduction (``model.Region``; attention or MLP, kernels included)."""
    linears = region.body.columns
    group, sp = linears[0].tp_group, linears[0].sequence_parallel
    weights = [m.weight for m in linears]
    biases = [m.bias for m in linears]
    projected = _ColumnLinears.apply(h, full, group, sp, len(linears), *weights, *biases)
    return F.linear(region.body.inner(*projected), region.row.weight)


def _norm_and_body(region):
    def run(x):  # without SP nothing separates the norm from the matmuls
        return _partial(region, region.norm(x), None)

    return run


def _body(region):
    def run(h, full):
        return _partial(region, h, full)

    return run


# ---- the wavefront ----------------------------------------------------------------


def _before(block) -> None:
    """Run ``block``'s forward pre-hooks, as calling it would (Note [module hooks in the wavefront])."""
    for hook in list(block._forward_pre_hooks.values()):
        hook(block, ())


def _after(ran):
    """Run the forward hooks of the block ``ran`` names with its last region's results as the
    output (Note [module hooks in the wavefront]); None: nothing to run. Gives None."""
    if ran is not None:
        block, outputs = ran
        for hook in list(block._forward_hooks.values()):
            hook(block, (), tuple(outputs))
    return None


def run_blocks(model, x, sub_batches: int, blocks=None, delta=None, *, group=None):
    """``blocks`` (default: all of ``model``'s) on the residual stream ``x`` plus its pending
    ``delta`` (None: none) with k = ``sub_batches``; Note [the sub-batch schedule]. Each
    block's own ``recompute`` applies to its regions. ``group``: the blocks' tp group
    (default the model's; under per-layer layouts the run's degree's). Gives (stream,
    pending delta) as ``Transformer.walk_blocks`` does (Note [pending residual] in
    model.py): each residual add of the wavefront runs inside the norm after it, the last
    one is left to the caller."""
    if x.shape[0] % sub_batches:
        raise ValueError(f"sub_batch({sub_batches}) does not divide the micro-batch of {x.shape[0]}")
    group, sp, training = model.tp_group if group is None else group, model.sp, model.training
    dropout = model.config.dropout
    blocks = list(model.layers.values()) if blocks is None else list(blocks)

    def compute(recompute, fn, *args):  # Note [fine-grained recompute]: no collective inside
        return checkpoint(fn, *args, use_reentrant=False) if recompute else fn(*args)

    xs = list(x.chunk(sub_batches, dim=0))  # the residual stream of each sub-batch
    deltas = [None] * sub_batches if delta is None else list(delta.chunk(sub_batches, dim=0))
    inflight = [None] * sub_batches  # each sub-batch's last collective, not yet waited

    def pending(i):  # sub-batch i's output not yet added to its stream (waits its collective)
        if inflight[i] is not None:
            deltas[i], inflight[i] = _delta(inflight[i], dropout, training), None
        return deltas[i]

    ran = None  # the last block run and its last region's results (Note [module hooks in the wavefront])
    for block in blocks:
        recompute = block.recompute == "full" and torch.is_grad_enabled()
        if not overlappable(block):
            for i in range(sub_batches):  # a replicated projection: run the block unsplit
                if recompute:
                    xs[i], deltas[i] = checkpoint(block, settle(xs[i], pending(i)), use_reentrant=False), None
                else:
                    xs[i], deltas[i] = block(xs[i], pending(i), pending=True)
            ran = _after(ran)  # its deltas were added above
            continue
        _before(block)
        for index, region in enumerate(block.regions):
            if not sp:
                for i in range(sub_batches):
                    # Sub-batch i's previous all-reduce ran behind sub-batch i+1's work
                    # (the last sub-batch's behind sub-batch 0's next region): wait it,
                    # add it, then compute this region up to the row-parallel partial sums.
                    if recompute:  # the add outside the checkpoint: it keeps the stream alone
                        xs[i], deltas[i] = settle(xs[i], pending(i)), None
                        partial = compute(True, _norm_and_body(region), xs[i])
                    else:  # the add fused into the norm (b, T, C)
                        h, xs[i] = _add_norm(region.norm, xs[i], pending(i))
                        deltas[i] = None
                        partial = _partial(region, h, None)
                    # Launch sub-batch i's all-reduce; it runs while sub-batch i+1 computes.
                    result, launched = _launch_reduce(partial, group, False)
                    inflight[i] = _Inflight(result, launched, region.row.bias, False)
            else:
                shards, gathers = [None] * sub_batches, [None] * sub_batches
                for i in range(sub_batches):
                    # Residual add and norm in one kernel on sub-batch i's sequence shard
                    # (b, T/tp, C), then launch its all-gather along T; it runs while
                    # sub-batch i+1's norm and sub-batch 0's matmuls compute.
                    shards[i], xs[i] = _add_norm(region.norm, xs[i], pending(i))
                    deltas[i] = None
                    gathers[i] = launch_all_gather(shards[i].detach(), group, dim=1)
                for i in range(sub_batches):
                    # Sub-batch i computes on the whole sequence (its gather is waited
                    # here); its reduce-scatter runs while sub-batch i+1 computes.
                    full = gathers[i].wait()  # (b, T, C), kept: recompute reuses it
                    partial = compute(recompute, _body(region), shards[i], full)
                    result, launched = _launch_reduce(partial, group, True)
                    inflight[i] = _Inflight(result, launched, region.row.bias, True)
            if index == 0:  # the previous block's deltas are all added now
                ran = _after(ran)
        ran = (block, [f.result for f in inflight if f is not None])
    rest = [pending(i) for i in range(sub_batches)]
    _after(ran)
    if any(d is None for d in rest):  # no region ran for some sub-batch: nothing pending
        return torch.cat([settle(x, d) for x, d in zip(xs, rest)], dim=0), None
    return torch.cat(xs, dim=0), torch.cat(rest, dim=0)
