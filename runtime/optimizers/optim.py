"""AdamW, the learning-rate schedule and global gradient-norm clipping.

Takes: the (possibly sharded) model. Gives: the optimizer, ``lr_at`` and
``clip_grad_norm_``. AdamW is elementwise, so running it on shards is exactly
running it on the full tensors; only the gradient norm needs communication.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from ..distributed.comm import exposed, group_size
from ..layout.roles import role
from .adamw import AdamW


def build_optimizer(model, *, lr, betas, weight_decay, eps):
    """AdamW with weight decay on matrices only (not on norms and biases); its update is
    torch's fused kernel (adamw.py, Note [fused AdamW on shards])."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return AdamW(groups, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)


LR_SCHEDULES = ("constant", "cosine", "linear", "wsd")
DECAY_SHAPES = ("linear", "cosine", "sqrt")


def lr_at(step, *, kind, peak_lr, warmup, total_steps, min_lr_ratio, decay=0, shape="linear"):
    """The learning rate of 1-based ``step``: linear warmup, then constant/cosine/linear/wsd.

    Step s <= warmup gets peak_lr·s/warmup; then the decay runs from peak_lr after the
    warmup to min_lr_ratio·peak_lr at ``total_steps`` (and stays there). ``wsd``
    (warmup-stable-decay) holds peak_lr until the last ``decay`` steps and decays over
    them in ``shape``: ``linear``, ``cosine`` (half a cosine) or ``sqrt`` (1 − √progress).
    A pure function of the step, so a run resumed mid-decay continues it exactly.
    """
    if kind not in LR_SCHEDULES:
        raise ValueError(f"unknown lr schedule {kind!r}: {', '.join(LR_SCHEDULES)}")
    if warmup > 0 and step <= warmup:
        return peak_lr * step / warmup
    if kind == "constant":
        return peak_lr
    floor = peak_lr * min_lr_ratio
    if kind == "wsd":
        if shape not in DECAY_SHAPES:
            raise ValueError(f"unknown wsd decay shape {shape!r}: {', '.join(DECAY_SHAPES)}")
        start = total_steps - decay  # the last stable step
        progress = min(1.0, max(0.0, (step - start) / max(1, decay)))
        if shape == "sqrt":
            return peak_lr - (peak_lr - floor) * math.sqrt(progress)
        kind = shape  # linear or cosine over the decay's own span
    else:
        span = max(1, total_steps - warmup)
        progress = min(1.0, max(0.0, (step - warmup) / span))
    if kind == "cosine":
        return floor + (peak_lr - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))
    return peak_lr - (peak_lr - floor) * progress  # linear


def set_lr(optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


def clip_grad_norm_(
    model, max_norm, *, tp_group, pp_group=None, ep_group=None, etp_group=None, grad_scale: float = 1.0, summed=None
) -> float:
    """Scale gradients so their global norm is at most ``max_norm``; return the norm.

    Tensor-parallel shards (``role(param).tensor_parallel``) contribute their squares summed
    over the tp group; replicated parameters, identical on every tp rank, count once;
    pipeline stages' squares are summed over ``pp_group``, and a stage's copy of a
    tied embedding (``role(param).pipeline_duplicate``) is not counted again. Experts split
    over expert-parallel ranks (``role(param).expert_parallel``) sum their squares over ``ep_group``
    and ``etp_group`` (each rank's slices of its experts, Note [expert tensor parallelism]).
    ``max_norm == 0`` only measures. ``grad_scale``: the gradients are of the loss times
    it (fp16, loss_scale.py); they are divided by it first. ``summed``: float64 values summed
    in place in the same all-reduce (Note [one all-reduce after backward] in faults.py).
    """
    sharded, replicated, duplicates, experts, copies = [], [], [], [], []
    for p in model.parameters():
        if p.grad is None:
            continue
        if role(p).expert_parallel:
            experts.append(p.grad)
        elif role(p).pipeline_duplicate:
            duplicates.append(p.grad)  # clipped, but counted on the first stage
        else:
            (sharded if role(p).tensor_parallel else replicated).append(p.grad)
            if role(p).tensor_parallel:
                copies.append(int((role(p).tp_copies or 1)))
    if grad_scale != 1.0:
        for g in sharded + replicated + duplicates + experts:
            g.mul_(1.0 / grad_scale)
    device = next(model.parameters()).device
    zero = torch.zeros((), dtype=torch.float32, device=device)
    # a value held by k tp ranks (2D: ``tp_copies``, Note [2D tensor parallelism]) counts 1/k on each
    sharded_sq = sum((g.float().pow(2).sum() / k if k > 1 else g.float().pow(2).sum()
                      for g, k in zip(sharded, copies)), zero)
    if group_size(tp_group) > 1:
        with exposed():
            dist.all_reduce(sharded_sq, group=tp_group)
    total_sq = sharded_sq + sum((g.float().pow(2).sum() for g in replicated), zero)
    if experts:
        expert_sq = sum((g.float().pow(2).sum() for g in experts), zero)
        if group_size(ep_group) > 1:
            with exposed():
                dist.all_reduce(expert_sq, group=ep_group)
        if group_size(etp_group) > 1:
            with exposed():
                dist.all_reduce(expert_sq, group=etp_group)
        total_sq = total_sq + expert_sq
    if group_size(pp_group) > 1:  # in fp64 with ``summed``: two stages' fp32 squares sum as in fp32
        both = total_sq if summed is None else torch.cat([total_sq.double().reshape(1), summed.to(device)])
        with exposed():
            dist.all_reduce(both, group=pp_group)
        if summed is not None:
            summed.copy_(both[1:])
            total_sq = both[0].float()
    return clip_to_norm_(sharded + replicated + duplicates + experts, float(total_sq.sqrt()), max_norm)


def clip_to_norm_(grads, norm: float, max_norm: float) -> float:
    """Scale ``grads`` in place so their global ``norm`` is at most ``max_norm`` (0: only
    measure; a non-finite norm is left for the step guard). The one clip rule: every
    optimizer's gradient norm (dense, ZeRO, heterogeneous layouts) ends here."""
    if max_norm > 0 and math.isfinite(norm):
        scale = max_norm / (norm + 1e-6)
        if scale < 1.0:
            for g in grads:
                g.mul_(scale)
    return norm
