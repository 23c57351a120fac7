"""Data parallelism: average gradients over the dp group, in buckets, overlapping backward.

Takes: the model and the dp group. Gives: ``GradientBuckets`` (``finish()`` after the
last micro-batch's backward, before clipping) and ``all_reduce_mean`` for logged
scalars. Buckets are filled in a fixed parameter order (last layers first, the order
backward produces them) so every rank sends the same tensors in the same order.

Note [gradient overlap]: with ``overlap=True`` every parameter gets a
post-accumulate-grad hook counting its accumulations in this step. A parameter is
*ready* once it has had ``accumulations`` of them (the last micro-batch; with
pipelining each micro-batch's backward accumulates once, so the same count holds),
and a bucket whose parameters are all ready is copied into one flat buffer and
all-reduced asynchronously at once, while backward goes on with earlier layers.
``finish()`` launches any bucket still waiting (parameters that got no gradient),
waits them all in bucket order (only the wait is exposed communication), divides
by the dp size and writes the means back into ``.grad``. Every rank's backward is
the same graph, so buckets become ready, and are launched, in the same order.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ...distributed.comm import Pending, _issued, exposed, group_size, on_gradient, scalar_device
from ...distributed.traffic import comm_bytes
from ...layout.roles import role


def finished_after_backward(param, *, replicas: bool = True) -> bool:
    """Is this gradient partial after backward (Note [late gradients]), ``replicas`` counting?"""
    late = role(param)
    return bool(late.sequence_parallel or late.tied_across_stages or (replicas and late.pipeline_replica))


def gradient_of(param):
    """What a reducer sums: the step's fp32 gradient sum that ``master.Fp32Accumulation``
    hands over (``param.main_grad``: Note [fp32 accumulation]), else ``param.grad``."""
    main = getattr(param, "main_grad", None)
    return param.grad if main is None else main


def drop_gradient(param) -> None:
    """Free ``param``'s gradient, ``.grad`` and a handed-over fp32 sum alike."""
    param.grad = None
    if getattr(param, "main_grad", None) is not None:
        param.main_grad = None


def gradient_buckets(params, bucket_bytes: int) -> tuple[list[list], int]:
    """Buckets of ``params`` in the order backward produces them, and how many come first.

    Note [late gradients]: two kinds of gradient are not final when backward ends:
    a replicated parameter that saw only a sequence shard (summed over tp by
    ``model.allreduce_sequence_parallel_grads``) and a pipeline stage's copy of a tied
    embedding (summed over the two stages by ``pipeline.allreduce_tied_grads``), and
    under a two-pipeline schedule every stage's replica (``pipeline.allreduce_replica_grads``).
    Whoever reduces gradients over dp *during* backward and keeps the result apart
    from ``param.grad`` (ZeRO) must leave them for after those sums, so they go into
    buckets of their own, at the end, launched only by the final wait. Returns
    (buckets, number of early buckets).
    """
    early = [p for p in reversed(params) if not finished_after_backward(p)]  # last layers first
    late = [p for p in reversed(params) if finished_after_backward(p)]
    buckets = []
    for group in (early, late):
        current, used = [], 0
        for p in group:
            current.append(p)
            used += p.numel() * p.element_size()
            if used >= bucket_bytes:
                buckets.append(current)
                current, used = [], 0
        if current:
            buckets.append(current)
        if group is early:
            count = len(buckets)
    return buckets, count


class GradientBuckets:
    def __init__(self, model, dp_group, *, bucket_bytes=25 * 2**20, overlap=False, accumulations=1,
                 reduce_dtype=None, divisor=None, tied_group=None):
        """``divisor``: what the summed gradients are divided by (default the dp size; a
        heterogeneous layout's layers divide by the coarse dp, Note [heterogeneous layouts]).
        ``tied_group`` (``pipeline.embedding_group``): the tied embedding's stage copies
        (``tied_across_stages``) are summed over it, dp and both copies in one all-reduce,
        after the buckets (Note [fused embedding synchronization] in pipeline.py); the
        trainer then calls no ``pipeline.allreduce_tied_grads``.
        ``reduce_dtype`` (``train.grad_reduce = bf16``): each bucket is summed over dp in
        that dtype (half the bytes of fp32 on the wire) and divided back in fp32; fp32 with
        bf16/fp16 parameters (master.py): summed in fp32, the mean rounded once into ``.grad``, or
        kept fp32 in ``main_grad`` where the step's fp32 sum was handed over."""
        if accumulations < 1:
            raise ValueError(f"accumulations must be at least 1, not {accumulations!r}")
        self.group, self.size = dp_group, group_size(dp_group)
        self.divisor = self.size if divisor is None else int(divisor)
        self.reduce_dtype = reduce_dtype
        self.overlap, self.accumulations = bool(overlap) and self.size > 1, int(accumulations)
        # experts split over ep reduce over their own edp group (moe.reduce_expert_grads)
        params = [p for p in model.parameters() if p.requires_grad and not role(p).expert_parallel]
        self.tied_group = tied_group
        self.tied = [p for p in params if role(p).tied_across_stages] if tied_group is not None else []
        params = [p for p in params if not any(p is t for t in self.tied)]
        self.buckets, early = gradient_buckets(params, bucket_bytes)
        self._inflight = {}  # bucket index → (flat grads, Pending)
        if self.overlap:  # Note [gradient overlap]
            self._bucket_of = {id(p): i for i, bucket in enumerate(self.buckets) for p in bucket}
            self._late = set(range(early, len(self.buckets)))  # Note [late gradients]
            self._reset_counts()
            for p in params:
                on_gradient(p, self._accumulated)

    def _reset_counts(self) -> None:
        self._accumulated_count = {id(p): 0 for bucket in self.buckets for p in bucket}
        self._unready = [len(bucket) for bucket in self.buckets]

    def _accumulated(self, param) -> None:
        key = id(param)
        self._accumulated_count[key] += 1
        if self._accumulated_count[key] != self.accumulations:
            return
        index = self._bucket_of[key]
        self._unready[index] -= 1
        if self._unready[index] == 0 and index not in self._late:
            self._launch(index)  # runs while backward computes the earlier layers' grads

    @torch.no_grad()
    def _launch(self, index: int) -> None:
        bucket = self.buckets[index]
        flat = self._flat(bucket)
        comm_bytes.add("dp", flat)  # Note [comm bytes] (traffic.py)
        _issued()
        self._inflight[index] = (flat, Pending(dist.all_reduce(flat, group=self.group, async_op=True), flat))

    @torch.no_grad()
    def finish(self) -> None:
        """Replace every gradient by its mean over the dp group (waits the overlapped buckets)."""
        if self.size == 1:
            return  # one rank: the divisor is 1 too (the coarse dp is the fewest)
        if not self.overlap:
            return self.all_reduce()
        for index in range(len(self.buckets)):
            if index not in self._inflight:
                self._launch(index)  # some parameter got no gradient this step
        for index, bucket in enumerate(self.buckets):
            flat, pending = self._inflight.pop(index)
            self._write_back(bucket, pending.wait())
        self._reset_counts()
        self._reduce_tied()

    @torch.no_grad()
    def all_reduce(self) -> None:
        """Replace every gradient by its mean over the dp group, bucket by bucket (blocking)."""
        if self.size == 1:
            return
        for bucket in self.buckets:
            flat = self._flat(bucket)
            comm_bytes.add("dp", flat)
            _issued()
            with exposed():
                dist.all_reduce(flat, group=self.group)
            self._write_back(bucket, flat)
        self._reduce_tied()

    def _reduce_tied(self) -> None:
        """The tied table's copies: summed over dp and the two stages at once, / the dp size."""
        if not self.tied:
            return
        flat = self._flat(self.tied)
        comm_bytes.add("dp", flat)  # the dp all-reduce's: no pp_embedding bytes (traffic.py)
        _issued()
        with exposed():
            dist.all_reduce(flat, group=self.tied_group)
        self._write_back(self.tied, flat)

    def _flat(self, bucket) -> torch.Tensor:
        grads = [gradient_of(p) for p in bucket]  # an fp32 sum where master.py handed one over
        flat = torch.cat([(g if g is not None else torch.zeros_like(p)).reshape(-1) for p, g in zip(bucket, grads)])
        return flat if self.reduce_dtype is None else flat.to(self.reduce_dtype)

    def _write_back(self, bucket, flat) -> None:
        # the sum divided in fp32, then (bf16/fp16 parameters, master.py) rounded once into
        # .grad, or kept fp32 where the step's fp32 sum was handed over (Note [fp32 accumulation])
        flat = flat.to(torch.float32) if flat.dtype != torch.float32 else flat
        flat.div_(self.divisor)
        offset = 0
        for p in bucket:
            view = flat[offset : offset + p.numel()].view_as(p)
            main = getattr(p, "main_grad", None)
            if main is not None:
                main.copy_(view)
            elif p.grad is None:
                p.grad = view.to(p.dtype, copy=True)
            else:
                p.grad.copy_(view)
            offset += p.numel()


def all_reduce_mean(value: float, group) -> float:
    """The mean of a Python float over ``group``."""
    if group_size(group) == 1:
        return float(value)
    t = torch.tensor([float(value)], dtype=torch.float64, device=scalar_device(group))
    _issued()
    with exposed():
        dist.all_reduce(t, group=group)
    return float(t.item()) / group_size(group)
