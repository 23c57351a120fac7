"""Column linears that save their sequence-parallel input as a shard (Note [sp inputs saved
as shards]): ``layers.project`` and ``ColumnParallelLinear`` apply ``GatheredColumns`` under
sp; a build without sp does not ship this module (features.py's "sequence parallel").

Takes: a (B, T/tp, in) input, the tp group, the linears' weights and biases. Gives: their
(B, T, out/tp) outputs, and in backward the input's gradient reduce-scattered along T.
Also ``allreduce_sequence_parallel_grads``, the sum over tp of the gradients sp leaves
partial, which train.py calls as ``model.allreduce_sequence_parallel_grads`` (model.py
gives it by name).

Note [sequence-parallel gradients]: under sequence parallelism each rank runs the
norms, the row-parallel bias adds and (gpt) its rows of ``pos_embed`` on its own
sequence shard only, so those replicated parameters get partial gradients; they are
tagged ``sequence_parallel`` and ``allreduce_sequence_parallel_grads`` sums them.
Every other gradient is whole: column-parallel layers and the head all-gather their
input over T (backward: reduce-scatter), and a replicated embedding's output is
split over T (backward: all-gather).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ...distributed.comm import exposed, group_size
from ...distributed.comm_async import launch_all_gather, launch_reduce_scatter
from ...distributed.comm_scatter import _all_gather
from ...layout.roles import role
from .column_grads import input_grad, weight_grads


class GatheredColumns(torch.autograd.Function):
    """Note [sp inputs saved as shards]: column linears whose sequence-parallel input
    (B, T/tp, in) is all-gathered along T save that shard for backward, not the gathered
    (B, T, in), and gather it again there for the weight gradients, as Megatron does: under
    sp the norms' tensors are all /tp, and without this the gathered inputs (one for q, k,
    v, one for the MLP's up and gate) were a block's largest saved tensors. Backward
    launches the regather, computes the input gradient Σ g_j W_j meanwhile, launches its
    reduce-scatter along T and computes the weight gradients while that runs. The cost:
    one more all-gather of the input per region in backward (the planner prices it)."""

    @staticmethod
    def forward(ctx, x, group, count, *params):
        weights, biases = params[:count], params[count:]
        full = _all_gather(x, group, 1)  # (B, T, in)
        ctx.save_for_backward(x, *weights)
        ctx.group, ctx.input_dtype = group, x.dtype
        ctx.bias_dtypes = tuple(None if b is None else b.dtype for b in biases)
        return tuple(F.linear(full, w, b) for w, b in zip(weights, biases))  # autocast applies

    @staticmethod
    def backward(ctx, *grads):
        # outside autocast: compute in the gradients' dtype, as autocast's linear would
        x, *weights = ctx.saved_tensors
        gathering = launch_all_gather(x, ctx.group, dim=1)
        grad_full = input_grad(grads, weights)
        full = gathering.wait()
        scattering = launch_reduce_scatter(grad_full, ctx.group, dim=1)  # (B, T/tp, in)
        grad_weights, grad_biases = weight_grads(grads, weights, ctx.bias_dtypes, full)
        return (scattering.wait().to(ctx.input_dtype), None, None, *grad_weights, *grad_biases)


def allreduce_sequence_parallel_grads(model, tp_group) -> None:
    """Sum over tp the grads of replicated parameters that saw only a sequence shard."""
    if group_size(tp_group) == 1:
        return
    grads = [p.grad for p in model.parameters() if role(p).sequence_parallel and p.grad is not None]
    if not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    with exposed():
        dist.all_reduce(flat, group=tp_group)
    offset = 0
    for g in grads:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()
