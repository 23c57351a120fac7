"""AdamW's update: torch's fused kernel, every element through its vector path.

Takes: parameters (whole, or slices of a flat buffer), their gradients, Adam moments and
step counts, and the hyper-parameters. Gives: ``fused_adamw_`` (the update on lists of
tensors: zero.flat_adamw_'s and fsdp.py's on a rank's slice) and ``AdamW``
(torch.optim.AdamW with this update: ``optim.build_optimizer``'s, ``MasterAdamW``'s).
Before it: the gradients reduced, unscaled and clipped; after it, zero_grad.

Note [fused AdamW on shards]: ZeRO and FSDP update a slice of a flat buffer that starts
and ends anywhere in a parameter; one rank updates each parameter whole; every element
must come out the same bits in both (the parity rows; tests/runtime/test_zero.py).
torch's fused CPU kernel (one pass over param, grad and moments, not ``foreach=False``'s
~9: 0.65 against 1.7 ms for a 590k-parameter pipeline stage) updates a tensor in vectors
of W elements (fp32: 8 here, AVX2 and AVX-512 dispatch alike) and its last
``numel % W`` in scalar code that rounds differently: fed the same numbers, 22% of
``exp_avg_sq`` and 2.5% of the parameters differed after step 2, 41% and 7% after step 5.
So where a tensor ends would decide an element's last bit. The vector path is
elementwise, whatever a vector's start: ``fused_adamw_`` hands the kernel only lengths
that are multiples of ``ALIGN`` (a multiple of any W: 16 fp32 or 32 bf16 in 512 bits),
each tensor's body in place and its remainder (< ALIGN) in a zero-padded scratch row
(zeros update to zeros), copied back after. Then a whole parameter, a ZeRO slice and an
FSDP shard update alike, bit for bit: tests/runtime/test_adamw.py (slices of lengths 1,
7, 15, 17, 33, 1003 and 31s; weight decay on and off; 5 steps of changing lr). The
kernel's threads cut at 64 bytes, a multiple of W. CUDA's fused kernel applies one
per-element function to every element (fused_adam_utils.cuh; not run here): the scratch
changes no number there.
``foreach=True`` gains nothing on CPU (``foreach=False``'s arithmetic, 1.8 ms).
The kernel gets no ``grad_scale``/``found_inf``: fp16's scale is divided out once, by the
clip (loss_scale.py), and a non-finite step is not taken at all (faults.py). State keys
are torch's (``step``, an fp32 scalar on the parameter's device, ``exp_avg``,
``exp_avg_sq``): checkpoints read and write them as before.
"""

from __future__ import annotations

import torch

ALIGN = 64
"""Every length the fused kernel is given is a multiple of this (Note [fused AdamW on shards])."""


@torch.no_grad()
def fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, steps, *, lr, betas, eps, weight_decay) -> None:
    """One AdamW update of each contiguous tensor of ``params`` (one device and dtype) and its
    moments in place, at its ``steps`` count (advanced already: an fp32 scalar on the device),
    every element through the kernel's vector path (Note [fused AdamW on shards])."""
    update = [list(params), list(grads), list(exp_avgs), list(exp_avg_sqs), list(steps)]
    tails = [i for i, p in enumerate(params) if p.numel() % ALIGN]
    scratch = torch.zeros(4 * len(tails), ALIGN, dtype=params[0].dtype, device=params[0].device).unbind(0)
    pairs = []  # (scratch part, remainder) of every tail's param, grad, exp_avg, exp_avg_sq
    for k, i in enumerate(tails):
        body = params[i].numel() // ALIGN * ALIGN
        for j in range(4):
            row, whole = scratch[4 * k + j], update[j][i]
            whole = whole.reshape(-1) if j == 1 else whole.view(-1)  # a gradient may be copied: only read
            update[j][i], tail = whole.split([body, whole.numel() - body])
            pairs.append((row[: tail.numel()], tail))
            update[j].append(row)
        update[4].append(update[4][i])
    if pairs:
        torch._foreach_copy_([part for part, _ in pairs], [tail for _, tail in pairs])
    keep = [i for i, p in enumerate(update[0]) if p.numel()]
    torch._fused_adamw_(
        *([row[i] for i in keep] for row in update[:4]), [], [update[4][i] for i in keep], lr=lr, beta1=betas[0],
        beta2=betas[1], weight_decay=weight_decay, eps=eps, amsgrad=False, maximize=False,
    )
    if pairs:  # the params and moments back (not the gradients)
        back = [pair for n, pair in enumerate(pairs) if n % 4 != 1]
        torch._foreach_copy_([tail for _, tail in back], [part for part, _ in back])


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
        """``param``'s state, made at its first step (a checkpoint's step count, made on the
        CPU by checkpoint_shards.prepare_state, moved to the parameter's device)."""
        state = self.state[param]
        if not state:
            state["step"] = torch.zeros((), dtype=torch.float32, device=param.device)
            state["exp_avg"] = torch.zeros_like(param, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(param, memory_format=torch.preserve_format)
        elif state["step"].device != param.device:
            state["step"] = state["step"].to(param.device, torch.float32)
        return state
