"""Heterogeneous layouts: each transformer block with its own tp × dp over a stage's ranks.

Takes: the mesh (``mesh.Mesh``; its dp × tp is the stage's *coarse* split, dp the
fewest data-parallel ranks of any layer) and ``LAYER_TP``, one tensor-parallel degree
per block. Gives: ``StageLayouts`` (every layer's tp and dp groups, and the groups a
reshard uses), ``reshard`` (activations from one layer's layout to the next's),
``HeteroGradients`` (each parameter's gradient reduced over its own layer's dp group),
``clip_grad_norm_`` and ``ShardedAdamW`` (ZeRO-1/2, Note [ZeRO over per-layer layouts]).

Note [heterogeneous layouts]: a stage's S ranks (in rank order, s = 0..S-1) run layer i
as dp_i × tp_i with dp_i · tp_i = S, tp innermost: layer i's tp group holds the ranks
with the same s // tp_i, its dp group those with the same s % tp_i. The trainer reads
its data in the *coarse* layout, the mesh's (tp = the largest tp of any layer): each
coarse replica c reads a micro-batch of ``MICRO_BATCH`` sequences. A layer with a
smaller tp_i = tp / k splits each coarse replica's batch into k pieces along the batch
dimension; rank s holds piece (s % tp) // tp_i. The degrees of a stage divide one
another (``constraints.hetero_ratio``), so every change of degree is such a split
(tp shrinks) or the gather of the pieces (tp grows), over the ``piece`` group: the
ranks of one larger-tp group with the same s % (smaller tp).

Gradients keep one invariant: every rank's gradient is that of its coarse replica's
loss L_c (the mean over the coarse micro-batch). A batch split's backward is then the
all-gather of the pieces' gradients, a gather's backward takes this rank's piece (both
``comm_scatter.scatter_to_group``/``gather_from_group`` over the piece group, dim 0); the
loss on a piece of 1/k of the batch enters L_c as (1/k)·Σ pieces, which the forward
sums over the piece group (``comm.reduce_from_group``, backward: identity). A
parameter of layer i is then summed over layer i's dp group and divided by the coarse
dp, the number of coarse replicas: the mean over the global batch, as one rank gets.

Under sequence parallelism a layer's activations are split along T over its tp group
between blocks; a reshard first gathers T over the old tp group, then moves the batch,
then splits T over the new one. The embedding takes block 0's layout; the head and the
final norm block L-1's, unless the head is tied to the embedding: one table has one
sharding, so the head then takes the embedding's layout and the activations are
resharded after the last block.

Note [reshard traffic] is in ``runtime/layout/reshard.py`` (the steps ``reshard`` runs).
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from ...distributed.comm import exposed, group_size, reduce_from_group
from ...distributed.comm_scatter import gather_from_group, scatter_to_group
from . import zero
from .dp import GradientBuckets
from ...optimizers.optim import clip_to_norm_
from ...layout.reshard import reshard_steps
from ...layout.roles import role


class StageLayouts:
    """This rank's groups for every tensor-parallel degree its stage's layers use."""

    def __init__(self, grid, layer_tp, *, pipeline_group=None):
        self.layer_tp = tuple(int(t) for t in layer_tp)
        self.tp, self.dp = grid.size("tp"), grid.size("dp")  # the coarse split of a stage
        self.stage_size = self.tp * self.dp
        if any(self.tp % t for t in self.layer_tp):
            raise ValueError(f"every layer's tp {self.layer_tp} must divide the stage's largest, {self.tp}")
        self.stage_ranks = grid.ranks("dp", "tp")  # this rank's stage, ascending
        self.s = self.stage_ranks.index(grid.rank)
        self.pipeline_group = pipeline_group
        world = dist.get_world_size() if dist.is_initialized() else 1
        stages = [tuple(range(p * self.stage_size, (p + 1) * self.stage_size)) for p in range(world // self.stage_size)]
        degrees = sorted(set(self.layer_tp) | {self.tp})
        # Every rank makes every group, stage by stage, in the same order (new_group is collective).
        self._tp, self._dp, self._piece = {}, {}, {}
        for t in degrees:
            self._tp[t] = self._make(stages, lambda s, t=t: s // t)
            self._dp[t] = self._make(stages, lambda s, t=t: s % t)
        for high in degrees:
            for low in degrees:
                if low < high and high % low == 0:
                    self._piece[(high, low)] = self._make(stages, lambda s, h=high, lo=low: (s // h, s % lo))

    def _make(self, stages, key):
        mine = None
        for stage in stages:
            groups: dict = {}
            for s, rank in enumerate(stage):
                groups.setdefault(key(s), []).append(rank)
            for ranks in groups.values():
                group = dist.new_group(ranks) if len(ranks) > 1 else None
                if dist.is_initialized() and dist.get_rank() in ranks:
                    mine = group
        return mine

    def tp_group(self, t: int):
        return self._tp[t]

    def dp_group(self, t: int):
        return self._dp[t]

    def piece_group(self, a: int, b: int):
        """The ranks that hold the pieces of one batch between degrees a and b (any order)."""
        high, low = max(a, b), min(a, b)
        return self._piece.get((high, low)) if high != low else None

    def reshard(self, x, a: int, b: int, *, sequence_parallel=False):
        """Activations of a layer at tp ``a`` → the layout of one at tp ``b``: the steps of
        ``reshard_steps`` (Note [reshard traffic]), in order."""
        for op, group, dim in reshard_steps(a, b, sequence_parallel=sequence_parallel):
            handle = self._tp[group[1]] if group[0] == "tp" else self.piece_group(group[1], group[2])
            x = (gather_from_group if op == "gather" else scatter_to_group)(x, handle, dim)
        return x

    def split_inputs(self, tokens, t: int):
        """A coarse replica's (B, T) token ids or targets → this rank's piece at tp ``t``."""
        if t == self.tp:
            return tokens
        k = self.tp // t
        piece = (self.s % self.tp) // t
        return tokens.chunk(k, dim=0)[piece]

    def coarse_loss(self, loss, t: int):
        """A piece's mean loss at tp ``t`` → its coarse replica's mean (backward: 1/k each)."""
        if t == self.tp:
            return loss
        return reduce_from_group(loss, self.piece_group(self.tp, t)) / (self.tp // t)


class _Params:
    """Some parameters of the model, for ``GradientBuckets``."""

    def __init__(self, params):
        self.params = list(params)

    def parameters(self):
        return iter(self.params)


class HeteroGradients:
    """Every parameter's gradient summed over its own layer's dp group and divided by the
    number of coarse replicas (Note [heterogeneous layouts]); one ``GradientBuckets``
    per layout, each overlapping backward as ``dp.GradientBuckets`` does."""

    def __init__(self, model, layouts: StageLayouts, *, overlap=True, accumulations=1, reduce_dtype=None):
        """``reduce_dtype`` (``train.grad_reduce = bf16``): as ``dp.GradientBuckets``'."""
        by_tp = _by_layer_tp(model)
        self.syncs = [
            GradientBuckets(_Params(params), layouts.dp_group(t), overlap=overlap, accumulations=accumulations,
                            divisor=layouts.dp, reduce_dtype=reduce_dtype)
            for t, params in sorted(by_tp.items())
        ]

    def finish(self) -> None:
        for sync in self.syncs:
            sync.finish()


def allreduce_sequence_parallel_grads(model, layouts: StageLayouts) -> None:
    """Sum the grads of replicated parameters that saw only a sequence shard over their layer's tp group."""
    by_tp: dict[int, list] = {}
    for p in model.parameters():
        if role(p).sequence_parallel and p.grad is not None:
            by_tp.setdefault(int(role(p).layer_tp), []).append(p.grad)
    for t, grads in sorted(by_tp.items()):
        if group_size(layouts.tp_group(t)) == 1:
            continue
        flat = torch.cat([g.reshape(-1) for g in grads])
        with exposed():
            dist.all_reduce(flat, group=layouts.tp_group(t))
        offset = 0
        for g in grads:
            g.copy_(flat[offset : offset + g.numel()].view_as(g))
            offset += g.numel()


def clip_grad_norm_(model, max_norm, *, layouts: StageLayouts, stage_group, pp_group=None,
                    grad_scale: float = 1.0) -> float:
    """``optim.clip_grad_norm_`` for a heterogeneous stage: each distinct gradient counted once.

    A tp shard of layer i is held by dp_i ranks, a replicated parameter by all S = dp_i·tp_i
    ranks of the stage: each rank adds its squares divided by that count, and the sum over
    the stage (and the pipeline) is the square of the one-rank norm. ``grad_scale`` (fp16,
    loss_scale.py): the gradients are of the loss times it; they are divided by it first."""
    grads, device = [], None
    total = None
    for p in model.parameters():
        if p.grad is None:
            continue
        if grad_scale != 1.0:
            p.grad.mul_(1.0 / grad_scale)
        device = p.grad.device
        copies = layouts.stage_size // int(role(p).layer_tp) if role(p).tensor_parallel else layouts.stage_size
        if role(p).pipeline_duplicate:
            copies = math.inf  # counted on the first stage
        grads.append(p.grad)
        sq = p.grad.float().pow(2).sum() / copies
        total = sq if total is None else total + sq
    return clip_to_norm_(grads, _stage_norm(total, device, stage_group, pp_group), max_norm)


def _stage_norm(total, device, stage_group, pp_group) -> float:
    """The global norm from this rank's share of the squares (each gradient element's square
    divided by the number of the stage's ranks holding it): summed over the stage and the
    pipeline."""
    if total is None:
        total = torch.zeros((), dtype=torch.float32, device=device or "cpu")
    for group in (stage_group, pp_group):
        if group_size(group) > 1:
            with exposed():
                dist.all_reduce(total, group=group)
    return float(total.sqrt())


def _by_layer_tp(model) -> dict[int, list]:
    """The trainable parameters by their layer's tp degree, in model order."""
    by_tp: dict[int, list] = {}
    for p in model.parameters():
        if p.requires_grad:
            by_tp.setdefault(int(role(p).layer_tp), []).append(p)
    return by_tp


class ShardedAdamW:
    """ZeRO-1/2 for a heterogeneous stage (Note [ZeRO over per-layer layouts]): the
    ``zero.ShardedAdamW`` interface (``reduce_gradients_and_clip``, ``step``,
    ``zero_grad``, ``param_groups``, ``parts``) over one ``zero.ShardedAdamW`` per
    distinct tp degree, each sharding its layers' parameters and moments over that
    layer's own dp group.

    Note [ZeRO over per-layer layouts]: a layer at tp t has its parameters in a flat
    buffer of their own, sliced over its dp group (S / t ranks with the same tp index,
    hence the same shapes; a layer at dp 1 keeps its whole buffer). At stage 1 the
    gradients are reduced by ``HeteroGradients`` as without ZeRO (each layer over its own
    dp group, during backward), so a part only takes its slice of them; at stage 2 each
    part's buckets are reduced over its dp group into its slice during backward (zero.py,
    Note [ZeRO-2 during backward]), divided by the coarse dp as ``HeteroGradients``
    divides. For the norm, an element of a slice is held once in the stage if it is a tp
    shard, and by the t dp groups (one per tp index) if its parameter is replicated: each
    rank adds its squares divided by that, and one sum over the stage (and the pipeline)
    gives the one-rank norm, as ``clip_grad_norm_`` does without ZeRO."""

    def __init__(self, model, layouts: StageLayouts, *, stage, lr, betas, weight_decay, eps, stage_group,
                 pp_group=None, accumulations=1, reduce_dtype=None):
        """``reduce_dtype`` (``train.grad_reduce = bf16``): stage 2's buckets, summed in it
        (zero.py, Note [bf16 reduction under ZeRO]); stage 1's are ``HeteroGradients``'."""
        if stage not in (1, 2):
            raise ValueError(f"per-layer layouts are built with ZeRO stage 1 or 2, not {stage!r}")
        self.stage, self.stage_group, self.pp_group = stage, stage_group, pp_group
        self.param_groups = [{"lr": float(lr)}]
        self.degrees, self._parts = [], []
        for t, params in sorted(_by_layer_tp(model).items()):
            self.degrees.append(t)
            # stage 1: HeteroGradients reduces; stage 2: the part's buckets, summed over the
            # layer's dp group and divided by the coarse dp (as HeteroGradients divides)
            self._parts.append(zero.ShardedAdamW(
                model, dp_group=layouts.dp_group(t), tp_group=layouts.tp_group(t), stage=stage, lr=lr, betas=betas,
                weight_decay=weight_decay, eps=eps, params=params, reduced=stage == 1, accumulations=accumulations,
                data_ranks=layouts.dp if stage == 2 else None, reduce_dtype=reduce_dtype if stage == 2 else None,
            ))

    def parts(self) -> list:
        return list(self._parts)

    @property
    def state(self) -> dict:
        """The step count (and the first part's moments): every part steps together."""
        return self._parts[0].state

    @torch.no_grad()
    def reduce_gradients_and_clip(self, max_norm: float, grad_scale: float = 1.0) -> float:
        """Each part's slice of its layers' mean gradients, clipped by the global norm; the norm."""
        total, slices = None, []
        for t, part in zip(self.degrees, self._parts):
            grad = part.mean_slice()
            if grad_scale != 1.0:
                grad.mul_(1.0 / grad_scale)
            squares = grad.pow(2).masked_fill(~part.counted, 0.0)
            sharded_sq, replicated_sq = zero.sums_apart(squares, part.tp_mask)
            sq = sharded_sq + replicated_sq / t
            total = sq if total is None else total + sq
            part.grad = grad
            slices.append(grad)
        norm = _stage_norm(total, None, self.stage_group, self.pp_group)
        return clip_to_norm_(slices, norm, max_norm)

    @torch.no_grad()
    def step(self) -> None:
        for part in self._parts:
            part.param_groups[0]["lr"] = self.param_groups[0]["lr"]  # optim.set_lr sets ours
            part.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for part in self._parts:
            part.zero_grad()

    def held_grad_bytes(self) -> int:
        return sum(part.held_grad_bytes() for part in self._parts)

    def state_bytes(self) -> int:
        return sum(part.state_bytes() for part in self._parts)
