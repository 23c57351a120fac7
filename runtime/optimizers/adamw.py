"""AdamW's update: torch's fused kernel, every element through its vector path.

Takes: parameters (whole, or slices of a flat buffer), their gradients and Adam
moments, the step counts and the hyper-parameters. Gives: ``AdamW`` (torch.optim.AdamW
with this update: what ``optim.build_optimizer`` builds, ``MasterAdamW``'s too),
``fused_adamw_`` (the update on lists of tensors), ``flat_adamw_`` and ``decay_runs``
(ZeRO 1/2's and ZeRO-3's: the update on a rank's slice of a flat buffer). Before it:
the gradients reduced, unscaled and clipped (optim.py, zero.py, fsdp.py); after it the
trainer zeroes the gradients (and ZeRO all-gathers or re-gathers the parameters).

Note [fused AdamW on shards]: ZeRO and FSDP update a slice of a flat buffer, starting
anywhere in a parameter and ending anywhere; the one-rank run updates each parameter
whole. Every element must come out the same bits in both (the parity rows compare
layouts with one rank; tests/runtime/test_zero.py compares updates). torch's fused CPU
kernel (``torch._fused_adamw_``: one pass over param, grad and moments instead of the
~9 of ``foreach=False``; 0.7 against 1.7 ms for a 590k-parameter pipeline stage)
updates a tensor in vectors of W elements (fp32: 8 here, AVX2 and AVX-512 dispatch
alike) and its last ``numel % W`` elements in scalar code that rounds differently: fed
the same numbers, the two paths differed after step 2 in 22% of the ``exp_avg_sq`` and
2.5% of the parameters, after step 5 in 41% and 7% (fp32; the DEFAULT build agrees). So where a
tensor ends decides an element's last bit, and a slice would not update as the whole.
The vector path is elementwise, each lane on its own, wherever the vector starts. So
``fused_adamw_`` hands the kernel only lengths that are multiples of ``ALIGN`` (64
elements: a multiple of any W, 16 fp32 or 32 bf16 in a 512-bit vector): each tensor's body in place,
and its remainder (< 64 elements) through a zero-padded 64-element scratch (zeros
update to zeros: the denominator is eps), copied back after. Every element then takes
the vector path in a whole parameter, a ZeRO slice or an FSDP shard alike: shown,
bit for bit, by tests/runtime/test_adamw.py (slices at offsets and lengths 1, 7, 15,
17, 33, 1003, weight decay on and off, several steps, a changing lr). The kernel's
threads cut at 64-byte units (16 fp32), a multiple of W: no tails between threads.
CUDA's fused kernel runs one per-element function for every element, so the scratch
changes no number there; it is kept for one code path (two small copies a step).
``foreach=True`` is no way out on CPU: the same arithmetic as ``foreach=False`` and no
faster (1.8 ms there; the foreach ops loop over tensors on CPU).

The lr is the group's float, set each step by ``optim.set_lr``. The kernel is given no
``grad_scale``/``found_inf``: fp16's loss scale is divided out once, by the clip
(loss_scale.py, Note [dynamic loss scaling]), and a step with non-finite gradients is
not taken at all (faults.py), so nothing here unscales or skips. State keys are torch's
(``step``, ``exp_avg``, ``exp_avg_sq``; ``step`` an fp32 scalar on the parameter's
device): checkpoints read and write them as before.
"""

from __future__ import annotations

import torch

ALIGN = 64
"""Every length the fused kernel is given is a multiple of this (Note [fused AdamW on shards])."""


@torch.no_grad()
def fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, steps, *, lr, betas, eps, weight_decay) -> None:
    """One AdamW update of each contiguous tensor of ``params`` in place (its moments too),
    at its ``steps`` count (already advanced; an fp32 scalar tensor on its device), every
    element through the kernel's vector path (Note [fused AdamW on shards])."""
    kinds = {(p.device, p.dtype) for p in params}
    if not kinds:
        return
    if len(kinds) > 1:  # the kernel takes one device and dtype a call
        for kind in sorted(kinds, key=str):
            pick = [i for i, p in enumerate(params) if (p.device, p.dtype) == kind]
            fused_adamw_(*([row[i] for i in pick] for row in (params, grads, exp_avgs, exp_avg_sqs, steps)),
                         lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
        return
    update = [list(params), list(grads), list(exp_avgs), list(exp_avg_sqs), list(steps)]
    tails = [i for i, p in enumerate(params) if p.numel() % ALIGN]
    if tails:  # each remainder through a zero-padded ALIGN-element row of a scratch
        scratch = torch.zeros(4, len(tails) * ALIGN, dtype=params[0].dtype, device=params[0].device)
        into, out = [], []  # (row part, remainder) pairs: copied in before, out after (not the gradient)
        for k, i in enumerate(tails):
            body = params[i].numel() - params[i].numel() % ALIGN
            for j in range(4):
                whole = update[j][i].reshape(-1)  # a view: contiguous (the gradient may be copied: only read)
                row = scratch[j, k * ALIGN : (k + 1) * ALIGN]
                into.append((row[: whole.numel() - body], whole[body:]))
                if j != 1:
                    out.append((whole[body:], row[: whole.numel() - body]))
                update[j][i] = whole[:body]
                update[j].append(row)
            update[4].append(update[4][i])
        torch._foreach_copy_([a for a, _ in into], [b for _, b in into])
    keep = [i for i, p in enumerate(update[0]) if p.numel()]
    torch._fused_adamw_(
        *([row[i] for i in keep] for row in update[:4]), [], [update[4][i] for i in keep], lr=lr, beta1=betas[0],
        beta2=betas[1], weight_decay=weight_decay, eps=eps, amsgrad=False, maximize=False,
    )
    if tails:
        torch._foreach_copy_([a for a, _ in out], [b for _, b in out])


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
    (``decay_runs``): element for element the update ``AdamW`` gives the whole parameters
    (Note [fused AdamW on shards]). ``state``: ``step`` (an int) and the slice's moments."""
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


class AdamW(torch.optim.AdamW):
    """torch.optim.AdamW (its groups, state keys and ``state_dict``) updating through
    ``fused_adamw_``; parameters without a gradient are left as they are, as torch's."""

    def __init__(self, params, *, lr, betas, eps, weight_decay):
        super().__init__(params, lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, fused=True)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            states = [self._state_of(p) for p in params]
            if params:
                torch._foreach_add_([s["step"] for s in states], 1)
                fused_adamw_(
                    params, [p.grad for p in params], [s["exp_avg"] for s in states],
                    [s["exp_avg_sq"] for s in states], [s["step"] for s in states], lr=group["lr"],
                    betas=group["betas"], eps=group["eps"], weight_decay=group["weight_decay"],
                )
        return loss

    def _state_of(self, param) -> dict:
        """``param``'s state, made at its first step (or its step count moved to its device:
        a checkpoint's, checkpoint_shards.prepare_state)."""
        state = self.state[param]
        if not state:
            state["step"] = torch.zeros((), dtype=torch.float32, device=param.device)
            state["exp_avg"] = torch.zeros_like(param, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(param, memory_format=torch.preserve_format)
        elif state["step"].device != param.device:
            state["step"] = state["step"].to(param.device, torch.float32)
        return state
