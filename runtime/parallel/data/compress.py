"""Compressed data-parallel gradient reduction: PowerSGD (low rank) and top-k, with error feedback.

Takes: the model, the dp group and ``parallel.compress`` (``powersgd(rank = r)`` or
``topk(ratio = x)``, ``parallel.error_feedback``). Gives: ``PowerSGDGradients`` and
``TopKGradients``, drop-in replacements of ``dp.GradientBuckets``: ``finish()`` after
the last micro-batch's backward replaces every gradient by an approximation of its
mean over the group. Before: backward. After: clipping and the optimizer step.
Every byte sent is counted in ``traffic.comm_bytes`` (Note [comm bytes]).

Note [compression changes numerics]: unlike every other layout choice, a compressed
reduction does not give the one-rank gradient: its tests are convergence tests
(final loss within a few percent of the uncompressed run), not parity.

Note [powersgd]: Vogels et al. 2019, Algorithm 2. Each gradient matrix M (a weight of
shape (n, ...) read as n × m) of rank i, plus its error e_i, is approximated by a
rank-r product P·Qᵀ: P_i = M_i·Q, all-reduce P (sum), orthonormalize its columns,
Q_i = M_iᵀ·P, all-reduce Q (mean); the mean gradient is P·Qᵀ and the new error
e_i = M_i − P·Qᵀ, added to the next step's gradient (error feedback), so what one
step leaves out is sent later. Q starts random (the same seed on every rank) and is
kept between steps (warm start): one power iteration per step then tracks the
gradient's top subspace. Vectors (biases, norms) and matrices too small to gain
(n·m ≤ r·(n + m)) are all-reduced whole. Bytes per matrix: r·(n + m) instead of n·m.

Note [compression under fp16]: with ``train.precision = fp16`` the gradients are of the
loss times the step's scale (loss_scale.py), which changes between steps. ``finish(grad_scale)``
divides them by it first, so what is compressed, and the error kept for the next step, is
in the loss's own units whatever the scale, and writes the mean back times the scale (the
clip divides by it, as without compression; a power of two: exact). A step whose scaled
gradients overflowed on any rank must leave no trace: each rank's count of non-finite
entries travels in the first collective (one number more: ``loss_scaled``), and on an
overflow every rank sets its gradients to inf (the global norm is then non-finite
everywhere and the scaler skips the step) and keeps its error feedback and warm-start Q
as they were.

Note [topk]: each step sends the k = ⌈ratio·N⌉ entries of largest magnitude of the
flat gradient (plus its error) as (value, int32 index) pairs, all-gathered; the mean is
their scattered sum over ranks / dp. The error keeps what this rank did not send.

Note [bf16 on the wire]: with ``train.grad_reduce = bf16`` (``reduce_dtype``) what crosses
the wire is rounded to bf16, as ``dp.GradientBuckets`` does with whole gradients: PowerSGD's
P and Q (and the whole vectors) are summed in bf16 and continue in fp32 (the QR, the error,
the mean); top-k's values are gathered in bf16 (the int32 indices as they are) and summed in
fp32. The error feedback stays what this rank computed in fp32; an fp16 overflow count
(``loss_scaled``) is a positive whole number, still positive in bf16.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from ...distributed.comm import _issued, exposed, group_size
from ...distributed.traffic import comm_bytes
from ...layout.roles import role

Q_SEED = 20191013
"""Seed of PowerSGD's first Q: the same on every rank, whatever ``train.seed`` is."""


def _reduced_params(model) -> list:
    # experts split over ep reduce over their own edp group (moe.reduce_expert_grads)
    return [p for p in model.parameters() if p.requires_grad and not role(p).expert_parallel]


def _grad(p) -> torch.Tensor:
    return p.grad if p.grad is not None else torch.zeros_like(p)


def _all_reduce(flat: torch.Tensor, group, axis: str, dtype=None) -> None:
    """Sum ``flat`` over ``group`` in place; in ``dtype`` on the wire when given (Note [bf16 on the wire])."""
    wire = flat if dtype is None or dtype == flat.dtype else flat.to(dtype)
    comm_bytes.add(axis, wire)
    _issued()
    with exposed():
        dist.all_reduce(wire, group=group)
    if wire is not flat:
        flat.copy_(wire)


def _nonfinite(tensors) -> torch.Tensor:
    """How many entries of ``tensors`` are inf or NaN (a 1-element float tensor)."""
    count = sum(int((~torch.isfinite(t)).sum()) for t in tensors)
    return torch.tensor([float(count)], device=tensors[0].device if tensors else None)


def _overflowed(params) -> None:
    """Note [compression under fp16]: every rank's norm becomes non-finite; the step is skipped."""
    for p in params:
        if p.grad is None:
            p.grad = torch.full_like(p, float("inf"))
        else:
            p.grad.fill_(float("inf"))


def _set_grad(p, value: torch.Tensor) -> None:
    if p.grad is None:
        p.grad = value.reshape(p.shape).clone()
    else:
        p.grad.copy_(value.reshape(p.shape))


def powersgd_pays(shape, rank: int) -> bool:
    """Does a rank-``rank`` factorization of a gradient of ``shape`` send fewer numbers?"""
    if len(shape) < 2:
        return False
    n = shape[0]
    m = math.prod(shape[1:])
    return rank * (n + m) < n * m


class PowerSGDGradients:
    def __init__(self, model, dp_group, *, rank: int, error_feedback: bool = True, axis: str = "dp",
                 loss_scaled: bool = False, reduce_dtype=None):
        """``loss_scaled`` (fp16): ``finish(grad_scale)``, Note [compression under fp16];
        ``reduce_dtype``: the sums' dtype on the wire, Note [bf16 on the wire]."""
        self.group, self.size, self.axis = dp_group, group_size(dp_group), axis
        self.reduce_dtype = reduce_dtype
        self.error_feedback, self.loss_scaled = bool(error_feedback), bool(loss_scaled)
        params = _reduced_params(model)
        self.low_rank = [p for p in params if powersgd_pays(p.shape, rank)]
        chosen = {id(p) for p in self.low_rank}
        self.whole = [p for p in params if id(p) not in chosen]
        generator = torch.Generator().manual_seed(Q_SEED)
        self.q = []  # per low-rank parameter: (m, r), kept between steps (warm start)
        for p in self.low_rank:
            m = p.numel() // p.shape[0]
            r = min(rank, p.shape[0], m)
            self.q.append(torch.randn(m, r, generator=generator).to(device=p.device, dtype=p.dtype))
        self.error = [torch.zeros(p.shape[0], p.numel() // p.shape[0], device=p.device, dtype=p.dtype)
                      for p in self.low_rank] if self.error_feedback else []

    @torch.no_grad()
    def finish(self, grad_scale: float = 1.0) -> None:
        """Replace every gradient by (an approximation of) its mean over the group (Note
        [powersgd]); ``grad_scale``: what the loss was multiplied by (Note [compression under fp16])."""
        if self.size == 1:
            return
        unscale = 1.0 / grad_scale
        if self.whole or self.loss_scaled:
            parts = [_grad(p).reshape(-1) * unscale for p in self.whole]
            if self.loss_scaled:  # the ranks' non-finite entries, summed with the vectors
                parts.append(_nonfinite([_grad(p) for p in self.whole + self.low_rank]))
            flat = torch.cat(parts)
            _all_reduce(flat, self.group, self.axis, self.reduce_dtype)
            if self.loss_scaled and flat[-1].item() > 0:
                return _overflowed(self.whole + self.low_rank)  # error and Q untouched
            flat.div_(self.size).mul_(grad_scale)
            offset = 0
            for p in self.whole:
                _set_grad(p, flat[offset : offset + p.numel()])
                offset += p.numel()
        if not self.low_rank:
            return
        matrices = [_grad(p).reshape(p.shape[0], -1) * unscale for p in self.low_rank]  # (n, m)
        if self.error_feedback:
            matrices = [m + e for m, e in zip(matrices, self.error)]
        ps = [m @ q for m, q in zip(matrices, self.q)]  # (n, r)
        ps = self._reduced(ps)  # sums
        ps = [torch.linalg.qr(p, mode="reduced").Q for p in ps]  # orthonormal columns, equal on every rank
        qs = self._reduced([m.t() @ p for m, p in zip(matrices, ps)])  # (m, r) sums
        for index, (param, m, p, q) in enumerate(zip(self.low_rank, matrices, ps, qs)):
            q.div_(self.size)
            mean = p @ q.t()  # (n, m): the approximated mean gradient
            if self.error_feedback:
                self.error[index] = m - mean
            self.q[index] = q  # warm start
            _set_grad(param, mean * grad_scale)

    def _reduced(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        """The sums over the group of ``tensors``, in one all-reduce."""
        flat = torch.cat([t.reshape(-1) for t in tensors])
        _all_reduce(flat, self.group, self.axis, self.reduce_dtype)
        out, offset = [], 0
        for t in tensors:
            out.append(flat[offset : offset + t.numel()].view_as(t))
            offset += t.numel()
        return out


class TopKGradients:
    def __init__(self, model, dp_group, *, ratio: float, error_feedback: bool = True, axis: str = "dp",
                 loss_scaled: bool = False, reduce_dtype=None):
        """``loss_scaled`` (fp16): ``finish(grad_scale)``, Note [compression under fp16];
        ``reduce_dtype``: the values' dtype on the wire, Note [bf16 on the wire]."""
        self.group, self.size, self.axis = dp_group, group_size(dp_group), axis
        self.reduce_dtype = reduce_dtype
        self.loss_scaled = bool(loss_scaled)
        self.params = _reduced_params(model)
        self.total = sum(p.numel() for p in self.params)
        self.k = max(1, math.ceil(ratio * self.total))
        self.error = None
        self.error_feedback = bool(error_feedback)

    @torch.no_grad()
    def finish(self, grad_scale: float = 1.0) -> None:
        """Replace every gradient by the mean of the ranks' top-k entries (Note [topk]);
        ``grad_scale``: what the loss was multiplied by (Note [compression under fp16])."""
        if self.size == 1:
            return
        flat = torch.cat([_grad(p).reshape(-1) for p in self.params]) * (1.0 / grad_scale)
        if self.error is not None:
            flat += self.error
        index = flat.abs().topk(self.k, sorted=False).indices
        values = flat[index]
        index = index.to(torch.int32)  # 4 bytes an entry on the wire, not 8
        if self.loss_scaled:  # the rank's non-finite entries travel as one value more
            values = torch.cat([values, _nonfinite([flat])])
        if self.reduce_dtype is not None:  # Note [bf16 on the wire]
            values = values.to(self.reduce_dtype)
        all_values = [torch.empty_like(values) for _ in range(self.size)]
        all_index = [torch.empty_like(index) for _ in range(self.size)]
        for mine, parts in ((values, all_values), (index, all_index)):
            comm_bytes.add(self.axis, mine)
            _issued()
            with exposed():
                dist.all_gather(parts, mine, group=self.group)
        if self.loss_scaled:
            if sum(float(part[-1]) for part in all_values) > 0:
                return _overflowed(self.params)  # the error untouched
            all_values = [part[:-1] for part in all_values]
        if self.error_feedback:
            flat[index.long()] = 0
            self.error = flat  # what this rank left out
        mean = torch.zeros(self.total, device=flat.device, dtype=flat.dtype)
        for part_values, part_index in zip(all_values, all_index):
            mean.index_add_(0, part_index, part_values.to(mean.dtype))
        mean.div_(self.size).mul_(grad_scale)
        offset = 0
        for p in self.params:
            _set_grad(p, mean[offset : offset + p.numel()])
            offset += p.numel()
