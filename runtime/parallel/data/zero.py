"""ZeRO stages 1 and 2: AdamW with its state (and, at stage 2, the gradients) sharded over dp.

Takes: the model, the dp and tp groups, the stage and the AdamW hyper-parameters.
Gives: ``ShardedAdamW``, used in place of ``optim.build_optimizer`` + ``dp.GradientBuckets``
+ ``optim.clip_grad_norm_``: after the last micro-batch's backward call
``reduce_gradients_and_clip(max_norm)`` (returns the global gradient norm), then
``step()`` and ``zero_grad()``. ``optim.set_lr`` works on it (``param_groups``).

Note [one flat buffer]: every parameter of this rank becomes a view into one flat fp32
buffer, padded to a multiple of the dp size; dp rank r owns the r-th contiguous slice.
The Adam moments exist only for that slice. A step updates the slice in place, then an
all-gather over dp writes every rank's slice back into every rank's buffer, hence into
the parameters. All ranks of a dp group have the same tp index, so the same layout.

Stage 1 keeps whole gradients (ZeRO-1 shards only the optimizer state): dp.py's
``GradientBuckets`` all-reduces them bucket by bucket while backward goes on (Note
[gradient overlap]) and writes the means back; after backward the rank copies its
slice out of them and frees the parameters' ``.grad``.

Note [ZeRO-2 during backward]: stage 2 never holds the whole gradient after
backward. Every parameter gets a post-accumulate-grad hook counting its
accumulations this step (``accumulations`` = micro-batches per step, as in dp.py's
Note [gradient overlap]); on its last one the parameter is ready. The flat buffer
is cut into buckets of consecutive parameters, last layers first; once a bucket's
parameters are all ready their grads are packed, ``.grad`` is freed, and the
bucket is all-reduced asynchronously while backward goes on. Before the next
bucket is launched the previous one is waited, divided by the dp size, and the
part that falls in this rank's slice is added into the rank's gradient slice, so at
most two buckets are alive besides the slice. (All-reduce + our part rather than a
reduce-scatter: a bucket's range does not line up with the ranks' slices; on gloo it
costs the same.) ``reduce_gradients_and_clip`` launches what is left and waits.
Gradients that are still partial when backward ends (sequence-parallel replicated
parameters, a stage's copy of a tied embedding: dp.py, Note [late gradients]) sit
in buckets of their own, reduced then, after their sums over tp or stages. The AdamW update is
``flat_adamw_``: element for element ``optim.build_optimizer``'s, weight decay on
matrices only (adamw.py, Note [fused AdamW on shards]).

Note [compression under ZeRO]: with ``parallel.compress`` (``grad_sync``, compress.py) the
dp mean is the compressor's: after backward (and the late sums) it compresses each whole
gradient, all-reduces the low-rank factors (or all-gathers the top-k entries),
decompresses into every ``.grad``, and the rank keeps its slice as at stage 1. The factors
need whole gradient matrices, so stage 2 then holds them until backward ends, as stage 1
does: it still shards the Adam moments and keeps only the gradient slice between steps.

Note [experts under ZeRO]: with expert parallelism (ep > 1) the experts of a rank are not
those of every dp rank, so they cannot share the dense parameters' flat buffer. They get
a second ``ShardedAdamW`` (``self.experts``) over their own ``edp_group`` (the ranks
holding the same experts, expert_folding.py's Note [parallel folding]): their own flat buffer,
slices, moments and all-gather. Their gradients are summed over edp and divided by
``data_ranks`` (dp·cp: the mean loss is over those ranks' tokens; moe.py's
``reduce_expert_grads``) — at stage 1 after backward, at stage 2 bucket by bucket during
it. The global norm adds the experts' squares, summed over edp (slices) and ep, to the
dense ones before the pipeline sum, and both parts are clipped by the same factor.

Note [ZeRO with master weights]: under bf16/fp16 (``compute_dtype``) the flat buffer,
and so every parameter, is in the compute dtype; the rank's slice has an fp32 master
copy (``master``) that AdamW steps, and the rounded slice is what the all-gather
carries (half of fp32's bytes). Gradients arrive in the compute dtype and are summed
in fp32: stage 1's buckets (dp.py, ``reduce_dtype``), stage 2's packed buckets; the
gradient slice is fp32. With several backwards a step they sum the step's fp32 gradient
itself, never rounded to the compute dtype (master.py, Note [fp32 accumulation]). Checkpoints read and write the masters
(checkpoint_shards.py); master.py's Note [master weights] says what stays fp32.

Note [bf16 reduction under ZeRO]: with ``train.grad_reduce = bf16`` (``reduce_dtype``, as
Megatron's ``--grad-reduce-in-bf16`` with its distributed optimizer) what crosses the wire
is bf16 and everything a rank keeps is fp32: a gradient (its fp32 step sum where master.py
handed one over) is rounded to bf16 once, summed over the group in bf16 (stage 1's
buckets, stage 2's packed buckets, the experts' edp sum), converted back to fp32 and only
then divided; the rank's gradient slice, its norm and AdamW's step on the fp32 slice (or
its fp32 master) are as under fp32 sums. Half the bytes of the reduction; the slices'
all-gather is the parameters' dtype, unchanged. The two roundings (each rank's gradient, the
sum) make it inexact against one rank (tests/runtime/test_grad_reduce_zero.py bounds them).
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from ...distributed.comm import exposed, group_rank, group_size, on_gradient
from .dp import GradientBuckets, drop_gradient, gradient_buckets, gradient_of
from ...optimizers.master import Fp32Accumulation, mark_compute_dtype
from ...optimizers.adamw import fused_adamw_
from ...optimizers.optim import clip_to_norm_
from ...distributed.traffic import comm_bytes
from ...layout.roles import role


class ShardedAdamW:
    def __init__(
        self, model, *, dp_group, tp_group, stage, lr, betas, weight_decay, eps, pp_group=None,
        accumulations=1, bucket_bytes=25 * 2**20, ep_group=None, edp_group=None, data_ranks=None,
        params=None, etp_group=None, compute_dtype=None, reduced=False, grad_sync=None, reduce_dtype=None,
    ):
        """``ep_group``, ``edp_group``, ``etp_group``, ``data_ranks``: expert parallelism's groups and the
        ranks the loss is a mean over (Note [experts under ZeRO]). ``params``: the
        parameters this optimizer owns (default: all but the expert-parallel ones).
        ``compute_dtype`` (bf16/fp16, Note [ZeRO with master weights]): the flat buffer's
        and so the parameters' dtype; the fp32 master of the slice is ``self.master``.
        ``reduced`` (stage 1 with ``params``): their gradients arrive as means already,
        reduced by someone else (hetero.HeteroGradients: each layer over its own dp group).
        ``grad_sync`` (compress.PowerSGDGradients or TopKGradients): Note [compression under ZeRO].
        ``reduce_dtype`` (``train.grad_reduce = bf16``): Note [bf16 reduction under ZeRO]."""
        if stage not in (1, 2):
            raise ValueError(f"ZeRO stage must be 1 or 2, not {stage!r}")
        if reduced and (stage != 1 or params is None):
            raise ValueError("reduced gradients are for stage 1 with the parameters given")
        self.reduced = bool(reduced)
        self.stage, self.dp_group, self.tp_group, self.pp_group = stage, dp_group, tp_group, pp_group
        self.beta1, self.beta2 = (float(b) for b in betas)
        self.eps, self.weight_decay = float(eps), float(weight_decay)
        self.param_groups = [{"lr": float(lr)}]
        owned = params is not None
        if params is None:
            params = [p for p in model.parameters() if p.requires_grad and not role(p).expert_parallel]
        self.params = list(params)
        # the divisor of the summed gradients: dp for dense parameters, dp·cp for experts
        self.mean_over = group_size(dp_group) if data_ranks is None or not owned else int(data_ranks)
        self.ep_group, self.etp_group, self.experts = ep_group, etp_group, None
        self.reduce_dtype = reduce_dtype  # Note [bf16 reduction under ZeRO]
        experts = [] if owned else [p for p in model.parameters() if role(p).expert_parallel]
        if experts:  # Note [experts under ZeRO]
            if data_ranks is None:
                raise ValueError("expert-parallel parameters under ZeRO need data_ranks (and edp_group)")
            self.experts = ShardedAdamW(
                model, dp_group=edp_group, tp_group=None, stage=stage, lr=lr, betas=betas,
                weight_decay=weight_decay, eps=eps, accumulations=accumulations, bucket_bytes=bucket_bytes,
                data_ranks=data_ranks, params=experts, compute_dtype=compute_dtype, reduce_dtype=reduce_dtype,
            )
        dp_size, dp_rank = group_size(dp_group), group_rank(dp_group)
        total = sum(p.numel() for p in self.params)
        self.shard = -(-total // dp_size)  # elements per dp rank (the last one padded)
        self.numel = total
        device = self.params[0].device
        flat = torch.zeros(self.shard * dp_size, dtype=torch.float32, device=device)
        decay = torch.zeros(flat.numel(), dtype=torch.bool, device=device)
        tp_mask = torch.zeros(flat.numel(), dtype=torch.bool, device=device)
        counted = torch.zeros(flat.numel(), dtype=torch.bool, device=device)  # in the norm
        share = torch.ones(flat.numel(), dtype=torch.float32, device=device)  # 1 / tp ranks holding a value
        offset = 0
        with torch.no_grad():
            for p in self.params:
                if p.dtype != torch.float32:
                    raise ValueError("ZeRO keeps fp32 parameters; got " + str(p.dtype))
                n = p.numel()
                flat[offset : offset + n].copy_(p.reshape(-1))
                p.data = flat[offset : offset + n].view_as(p)  # Note [one flat buffer]
                decay[offset : offset + n] = p.dim() >= 2
                tp_mask[offset : offset + n] = bool(role(p).tensor_parallel)
                counted[offset : offset + n] = not role(p).pipeline_duplicate
                share[offset : offset + n] = 1.0 / int((role(p).tp_copies or 1))  # Note [2D tensor parallelism]
                offset += n
        self.lo, self.hi = dp_rank * self.shard, (dp_rank + 1) * self.shard
        self.master = None  # Note [ZeRO with master weights]
        if compute_dtype is not None:
            self.master = flat[self.lo : self.hi].clone()
            flat = flat.to(compute_dtype)
            offset = 0
            for p in self.params:
                p.data = flat[offset : offset + p.numel()].view_as(p)
                offset += p.numel()
            if not owned:
                mark_compute_dtype(model, compute_dtype)
        self.flat = flat
        self.decay_runs = decay_runs(decay[self.lo : self.hi])  # what flat_adamw_ updates with and without decay
        self.tp_mask = tp_mask[self.lo : self.hi].clone()
        self.counted = counted[self.lo : self.hi].clone()
        # a value held by k ranks of a 2D tp grid counts 1/k on each (layers2d.py); None: 1D
        self.tp_share = share[self.lo : self.hi].clone() if bool((share != 1.0).any()) else None
        # The optimizer state: this rank's slice only.
        self.state = {
            "step": 0,
            "exp_avg": torch.zeros(self.shard, dtype=torch.float32, device=device),
            "exp_avg_sq": torch.zeros(self.shard, dtype=torch.float32, device=device),
        }
        self.grad = None  # this rank's gradient slice, set by reduce_gradients_and_clip
        self._grad_sync = grad_sync  # Note [compression under ZeRO]
        # master.py, Note [fp32 accumulation]: before this optimizer's own gradient hooks
        self.accumulation = Fp32Accumulation(self.params, int(accumulations), hand_over=True)
        if stage == 2 and grad_sync is None:  # Note [ZeRO-2 during backward]
            self._prepare_buckets(int(accumulations), int(bucket_bytes))
        elif not owned and grad_sync is None:  # stage 1: whole gradients, all-reduced during backward
            self._grad_sync = GradientBuckets(
                model, dp_group, bucket_bytes=bucket_bytes, overlap=True, accumulations=accumulations,
                reduce_dtype=reduce_dtype or (None if compute_dtype is None else torch.float32),  # fp32 sums
            )

    # ---- stage 2: gradients reduced bucket by bucket during backward -------------

    def _prepare_buckets(self, accumulations: int, bucket_bytes: int) -> None:
        if accumulations < 1:
            raise ValueError(f"accumulations must be at least 1, not {accumulations!r}")
        self.accumulations = accumulations
        offset_of, offset = {}, 0
        for p in self.params:
            offset_of[id(p)] = offset
            offset += p.numel()
        buckets, early = gradient_buckets(self.params, bucket_bytes)  # dp.py, Note [late gradients]
        self.buckets = [[(p, offset_of[id(p)]) for p in bucket] for bucket in buckets]
        self._late = set(range(early, len(buckets)))  # reduced only after backward
        self._bucket_of = {id(p): i for i, bucket in enumerate(self.buckets) for p, _ in bucket}
        self._new_step()
        for p in self.params:
            on_gradient(p, self._accumulated)

    def _new_step(self) -> None:
        self._count = dict.fromkeys(self._bucket_of, 0)
        self._unready = [len(bucket) for bucket in self.buckets]
        self._launched, self._inflight = set(), None

    def _accumulated(self, param) -> None:
        key = id(param)
        self._count[key] += 1
        if self._count[key] == self.accumulations:
            index = self._bucket_of[key]
            self._unready[index] -= 1
            if self._unready[index] == 0 and index not in self._late:
                self._launch(index)

    @torch.no_grad()
    def _launch(self, index: int) -> None:
        self._drain()  # the previous bucket first: at most two alive
        if self.grad is None:  # this step's gradient slice: all the gradient a rank keeps
            self.grad = torch.zeros(self.shard, dtype=torch.float32, device=self.flat.device)
        bucket = self.buckets[index]
        grads = [gradient_of(p) for p, _ in bucket]  # fp32 sums where handed over (master.py)
        packed = torch.cat([  # fp32: low-precision gradients are summed in fp32 (train.grad_reduce)
            (g if g is not None else torch.zeros_like(p)).reshape(-1).to(torch.float32) for (p, _), g in zip(bucket, grads)
        ])
        for p, _ in bucket:
            drop_gradient(p)  # the packed copy replaces it
        work = None
        if group_size(self.dp_group) > 1:
            if self.reduce_dtype is not None:  # Note [bf16 reduction under ZeRO]
                packed = packed.to(self.reduce_dtype)
            comm_bytes.add("dp", packed)  # Note [comm bytes] (traffic.py)
            work = dist.all_reduce(packed, group=self.dp_group, async_op=True)
        if self.mean_over != 1 and work is None:
            packed.div_(self.mean_over)  # nothing to sum (edp of one): the mean only
        self._launched.add(index)
        self._inflight = (bucket, packed, work)

    @torch.no_grad()
    def _drain(self) -> None:
        if self._inflight is None:
            return
        bucket, packed, work = self._inflight
        self._inflight = None
        if work is not None:
            with exposed():
                work.wait()
            packed = packed.to(torch.float32)  # the sum back in fp32 (bf16 on the wire), then the mean
            packed.div_(self.mean_over)
        at = 0  # where each parameter sits in ``packed``
        for p, offset in bucket:
            lo, hi = max(offset, self.lo), min(offset + p.numel(), self.hi)
            if lo < hi:  # the part of this parameter in this rank's slice
                self.grad[lo - self.lo : hi - self.lo].copy_(packed[at + lo - offset : at + hi - offset])
            at += p.numel()

    @torch.no_grad()
    def _reduced_slice(self) -> torch.Tensor:
        for index in range(len(self.buckets)):
            if index not in self._launched:
                self._launch(index)  # parameters that got no gradient this step
        self._drain()
        grad = self.grad if self.grad is not None else torch.zeros(self.shard, device=self.flat.device)
        self._new_step()
        return grad

    @property
    def param_slice(self) -> torch.Tensor:
        """This rank's slice of the flat parameter buffer (a view)."""
        return self.flat[self.lo : self.hi]

    @property
    def master_slice(self) -> torch.Tensor:
        """The fp32 values AdamW steps: the slice itself, or its master copy (bf16/fp16)."""
        return self.param_slice if self.master is None else self.master

    @torch.no_grad()
    def _slice_grad(self) -> torch.Tensor:
        """This rank's slice of the flat gradient, copied from each parameter's overlap with
        [lo, hi) only: no full-size flat gradient is made and copied first
        (ZeRO-1 after backward; ``_drain`` does the same per bucket for ZeRO-2)."""
        grad = torch.zeros(self.shard, dtype=torch.float32, device=self.flat.device)
        offset = 0
        for p in self.params:
            n = p.numel()
            lo, hi = max(offset, self.lo), min(offset + n, self.hi)
            whole = gradient_of(p)  # the fp32 mean where the step's sum was handed over (master.py)
            if lo < hi and whole is not None:
                grad[lo - self.lo : hi - self.lo].copy_(whole.reshape(-1)[lo - offset : hi - offset])
            drop_gradient(p)  # the slice replaces it
            offset += n
        return grad

    @torch.no_grad()
    def reduce_gradients_and_clip(self, max_norm: float, grad_scale: float = 1.0) -> float:
        """Mean gradient over dp into this rank's slice, clipped to ``max_norm``; the norm.

        The norm is global: squares of tp shards summed over tp, replicated
        parameters counted once, then the dp slices summed. ``max_norm == 0`` only measures.
        """
        grad = self.mean_slice(grad_scale)
        if grad_scale != 1.0:
            grad.mul_(1.0 / grad_scale)
        slices = [grad]
        total_sq = global_squares(grad, counted=self.counted, tp_mask=self.tp_mask,
                                  tp_group=self.tp_group, dp_group=self.dp_group, tp_share=self.tp_share)
        if self.experts is not None:  # Note [experts under ZeRO]
            expert_grad = self.experts.mean_slice()
            if grad_scale != 1.0:
                expert_grad.mul_(1.0 / grad_scale)
            expert_sq = global_squares(expert_grad, counted=self.experts.counted, tp_mask=self.experts.tp_mask,
                                       tp_group=None, dp_group=self.experts.dp_group)
            if group_size(self.ep_group) > 1:
                with exposed():
                    dist.all_reduce(expert_sq, group=self.ep_group)  # each ep rank's own experts
            if group_size(self.etp_group) > 1:
                with exposed():
                    dist.all_reduce(expert_sq, group=self.etp_group)  # each expert-tensor rank's slices of them
            total_sq = total_sq + expert_sq
            self.experts.grad = expert_grad
            slices.append(expert_grad)
        if group_size(self.pp_group) > 1:
            with exposed():
                dist.all_reduce(total_sq, group=self.pp_group)  # every stage's squares
        norm = _clip(slices, total_sq, max_norm)
        self.grad = grad
        return norm

    @torch.no_grad()
    def mean_slice(self, grad_scale: float = 1.0) -> torch.Tensor:
        """This rank's slice of the gradient, summed over the group and divided by ``mean_over``
        (``reduced``: the gradients are the means already; only the slice is taken).
        ``grad_scale`` (fp16): for a compressing ``grad_sync`` (compress.py, Note [compression under fp16])."""
        if self.reduced:
            return self._slice_grad()
        if self.stage == 2 and self._grad_sync is None:
            return self._reduced_slice()  # Note [ZeRO-2 during backward]
        if isinstance(self._grad_sync, GradientBuckets):
            self._grad_sync.finish()  # the dp means, in place of each param.grad
        elif self._grad_sync is not None:  # Note [compression under ZeRO]
            self._grad_sync.finish(grad_scale)
        else:  # the experts' part at stage 1 (Note [experts under ZeRO])
            mean_of_group(self.params, self.dp_group, self.mean_over, reduce_dtype=self.reduce_dtype)
        return self._slice_grad()  # each rank keeps only its slice

    @torch.no_grad()
    def step(self) -> None:
        """AdamW on this rank's slice, then all-gather the parameters over dp."""
        if self.grad is None:
            raise RuntimeError("call reduce_gradients_and_clip() before step()")
        flat_adamw_(
            self.master_slice, self.grad, self.state, runs=self.decay_runs, lr=self.param_groups[0]["lr"],
            betas=(self.beta1, self.beta2), eps=self.eps, weight_decay=self.weight_decay,
        )
        self.copy_to_model(experts=False)
        if self.experts is not None:
            self.experts.param_groups[0]["lr"] = self.param_groups[0]["lr"]  # optim.set_lr sets ours
            self.experts.step()

    @torch.no_grad()
    def copy_to_model(self, experts: bool = True) -> None:
        """The slice (rounded from its master, bf16/fp16) all-gathered into every rank's
        parameters; after a step, or a checkpoint load into the slices."""
        if self.master is not None:
            self.param_slice.copy_(self.master)
        self._all_gather()
        if experts and self.experts is not None:
            self.experts.copy_to_model()

    def _all_gather(self) -> None:
        size = group_size(self.dp_group)
        if size == 1:
            return
        mine = self.param_slice.clone()
        comm_bytes.add("dp_params", mine)  # this rank's part (Note [comm bytes])
        with exposed():
            if dist.get_backend(self.dp_group) == "nccl":
                dist.all_gather_into_tensor(self.flat, mine, group=self.dp_group)
            else:
                dist.all_gather(list(self.flat.chunk(size)), mine, group=self.dp_group)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.grad = None
        for p in self.params:
            drop_gradient(p)
        if self.experts is not None:
            self.experts.zero_grad()

    def parts(self) -> list[ShardedAdamW]:
        """The flat buffers' owners: this one, and the experts' (Note [experts under ZeRO])."""
        return [self] + ([self.experts] if self.experts is not None else [])

    def held_grad_bytes(self) -> int:
        """Bytes of the gradient slices this optimizer keeps (``param.grad`` not included;
        nor a stage-2 bucket still in flight: a communication buffer)."""
        return sum(0 if part.grad is None else part.grad.numel() * part.grad.element_size() for part in self.parts())

    def state_bytes(self) -> int:
        """Bytes of optimizer state (moments) this rank holds."""
        return sum(t.numel() * t.element_size() for part in self.parts()
                   for t in [*part.state.values(), part.master] if torch.is_tensor(t))


@torch.no_grad()
def clip_global_norm_(grad, *, counted, tp_mask, max_norm, tp_group, dp_group, pp_group=None,
                      grad_scale: float = 1.0, tp_share=None) -> float:
    """The global norm of a gradient held as one slice per rank, and ``grad`` clipped to
    ``max_norm`` in place (``max_norm == 0`` only measures).

    Squares of tp shards (``tp_mask``) are summed over tp, replicated parameters counted
    once (``counted`` false on a tied copy and on padding), then the dp slices summed,
    then the pipeline stages. Shared by ZeRO 1/2 and ZeRO-3 (``fsdp.py``). ``grad``
    is first divided by ``grad_scale`` (fp16's loss scale, loss_scale.py). ``tp_share``:
    as ``global_squares``'s (2D tensor parallelism), or None."""
    if grad_scale != 1.0:
        grad.mul_(1.0 / grad_scale)
    total_sq = global_squares(grad, counted=counted, tp_mask=tp_mask, tp_group=tp_group, dp_group=dp_group,
                              tp_share=tp_share)
    if group_size(pp_group) > 1:
        with exposed():
            dist.all_reduce(total_sq, group=pp_group)  # every stage's squares
    return _clip([grad], total_sq, max_norm)


@torch.no_grad()
def global_squares(grad, *, counted, tp_mask, tp_group, dp_group, tp_share=None) -> torch.Tensor:
    """The sum of squares of a gradient held as one slice per rank of ``dp_group``: tp
    shards (``tp_mask``) summed over tp, replicated parameters counted once (``counted``
    false on a tied copy and on padding), then the slices summed over ``dp_group``.
    ``tp_share``: each element's 1/k where k tp ranks hold it (2D tensor parallelism), or None."""
    squares = grad.pow(2).masked_fill_(~counted, 0.0)  # a tied copy counts once
    if tp_share is not None:
        squares.mul_(tp_share)
    with exposed():  # small blocking collectives: nothing to hide them behind
        if group_size(tp_group) > 1:
            sharded_sq, replicated_sq = sums_apart(squares, tp_mask)
            dist.all_reduce(sharded_sq, group=tp_group)
            total_sq = sharded_sq + replicated_sq
        else:  # one tp rank: its shards are whole
            total_sq = squares.sum()
        if group_size(dp_group) > 1:
            dist.all_reduce(total_sq, group=dp_group)
    return total_sq


@torch.no_grad()
def _clip(grads, total_sq, max_norm) -> float:
    """The norm sqrt(``total_sq``); every slice in ``grads`` scaled to at most ``max_norm``."""
    return clip_to_norm_(grads, float(total_sq.sqrt()), max_norm)


@torch.no_grad()
def mean_of_group(params, group, divisor: int, reduce_dtype=None) -> None:
    """Each parameter's gradient summed over ``group`` (one flat all-reduce, in
    ``reduce_dtype`` when given: ``train.grad_reduce = bf16``, as dp.py's buckets) and
    divided by ``divisor``, in place; a parameter without a gradient is skipped."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return
    if group_size(group) > 1:
        flat = torch.cat([g.reshape(-1) for g in grads])
        if reduce_dtype is not None:
            flat = flat.to(reduce_dtype)
        comm_bytes.add("dp", flat)  # the experts' dp reduction (Note [comm bytes])
        with exposed():
            dist.all_reduce(flat, group=group)
        offset = 0
        for g in grads:
            g.copy_(flat[offset : offset + g.numel()].view_as(g))  # back in the gradient's dtype
            offset += g.numel()
    if divisor != 1:
        for g in grads:
            g.div_(divisor)


def sums_apart(values: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(the sum of ``values`` where ``mask``, the sum elsewhere), through the mask: boolean
    indexing compacts through ``nonzero`` first, 7.8 ms against 1.5 for 1.1M elements."""
    return values.where(mask, 0.0).sum(), values.where(~mask, 0.0).sum()


def decay_runs(decay: torch.Tensor) -> tuple[tuple[int, int, bool], ...]:
    """The runs ``(start, end, decays)`` of equal flags of a flat slice's weight-decay mask
    (true on the matrices' elements): what ``flat_adamw_`` updates, one list per flag."""
    flags = decay.to("cpu", torch.int8)
    cuts = (torch.nonzero(flags[1:] != flags[:-1]).flatten() + 1).tolist()
    bounds = [0, *cuts, flags.numel()]
    return tuple((a, b, bool(flags[a])) for a, b in zip(bounds, bounds[1:]) if b > a)


@torch.no_grad()
def flat_adamw_(param, grad, state, *, runs, lr, betas, eps, weight_decay) -> None:
    """One AdamW step on a flat slice in place, weight decay on the ``runs`` that decay
    (``decay_runs``): element for element the update ``optim.build_optimizer`` gives the whole
    parameters (adamw.py, Note [fused AdamW on shards]). ``state``: ``step`` (an int), the moments."""
    state["step"] += 1
    step = torch.full((), float(state["step"]), dtype=torch.float32, device=param.device)
    for decays in (True, False):
        spans = [(a, b) for a, b, flag in runs if flag == decays]
        if spans:
            fused_adamw_(
                [param[a:b] for a, b in spans], [grad[a:b] for a, b in spans],
                [state["exp_avg"][a:b] for a, b in spans], [state["exp_avg_sq"][a:b] for a, b in spans],
                [step] * len(spans), lr=lr, betas=betas, eps=eps, weight_decay=weight_decay if decays else 0.0,
            )
