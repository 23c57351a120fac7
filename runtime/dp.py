"""Data parallelism: average gradients over the dp group, in buckets.

Takes: the model and the dp group. Gives: ``GradientBuckets.all_reduce()`` (call
after the last micro-batch's backward, before clipping) and ``all_reduce_mean`` for
logged scalars. Buckets are filled in a fixed parameter order so every rank sends
the same tensors; overlap with backward is a later step.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from .comm import group_size


class GradientBuckets:
    def __init__(self, model, dp_group, *, bucket_bytes=25 * 2**20):
        self.group, self.size = dp_group, group_size(dp_group)
        params = [p for p in model.parameters() if p.requires_grad]
        self.buckets, current, used = [], [], 0
        for p in reversed(params):  # backward produces the last layers' grads first
            current.append(p)
            used += p.numel() * p.element_size()
            if used >= bucket_bytes:
                self.buckets.append(current)
                current, used = [], 0
        if current:
            self.buckets.append(current)

    @torch.no_grad()
    def all_reduce(self) -> None:
        """Replace every gradient by its mean over the dp group."""
        if self.size == 1:
            return
        for bucket in self.buckets:
            grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in bucket]
            flat = torch.cat([g.reshape(-1) for g in grads])
            dist.all_reduce(flat, group=self.group)
            flat.div_(self.size)
            offset = 0
            for p, g in zip(bucket, grads):
                view = flat[offset : offset + g.numel()].view_as(g)
                if p.grad is None:
                    p.grad = view.clone()
                else:
                    p.grad.copy_(view)
                offset += g.numel()


def all_reduce_mean(value: float, group) -> float:
    """The mean of a Python float over ``group``."""
    if group_size(group) == 1:
        return float(value)
    t = torch.tensor([float(value)], dtype=torch.float64)
    dist.all_reduce(t, group=group)
    return float(t.item()) / group_size(group)
