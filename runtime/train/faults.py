"""What a long run meets: SIGTERM, non-finite numbers, and (in tests) injected faults.

Takes: the spec's ``on_nonfinite`` policy and this process's rank and world size.
Gives: ``StepGuard`` — installed before the loop, it catches SIGTERM (the step in
flight finishes, the trainer saves and exits 0) and, once per step, decides with
every rank whether the optimizer step is taken (``check``); ``at_step_start`` and
``poison_loss``, the test-only faults (Note [injected faults]).

Note [every rank agrees]: SIGTERM reaches ranks at different moments, and a NaN may
show on one rank only (a pipeline stage's loss, one dp rank's batch). ``check``
all-reduces (MAX over the world) two flags — "a number is not finite here" and
"SIGTERM arrived here" — so every rank skips, stops or saves at the same step.
The gradient norm is already global; the loss is this rank's part of it.

Note [one all-reduce after backward]: in a pipeline, this rank's loss (the last stage's,
0 elsewhere) and SIGTERM flag (``summands``) ride in the clip's all-reduce over pp
(``clip_grad_norm_(summed=)``); where pp is every rank, ``check(signalled=)`` then needs
no collective of its own (a non-finite loss anywhere makes the sum non-finite).

Note [injected faults]: the tests make a rank die or a loss turn NaN by environment
variables, and train.py holds no line for them: ``observe.StepProfiler.begin`` (the
first call of every step) hands the step to ``at_step_start`` and ``observe.banner``
hands the model to ``poison_loss``, both of which return at once unless a variable is
set. ``PARC_FAULT_AT_STEP=k`` — the last rank dies (``os._exit(1)``) at the start of
step k, on the first attempt only (``TORCHELASTIC_RESTART_COUNT`` unset or 0), so
torchrun's restart path runs; ``PARC_NAN_AT_STEP=k`` — the last rank's loss of step k
is NaN (a forward hook multiplies the model's loss by NaN, so its gradients are NaN
too); ``PARC_FAULT_IN_SAVE=k`` — rank 0 dies saving step k, after every file is
written and before the rename that completes it (``checkpoint.py``).
"""

from __future__ import annotations

import math
import os
import signal
import sys

import torch
import torch.distributed as dist

POLICIES = ("skip", "stop")


def restart_count() -> int:
    """How many times torchrun has restarted this job (0 on the first attempt)."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)


def _env_step(name: str) -> int | None:
    value = os.environ.get(name)
    return int(value) if value else None


_step = 0
"""The step in flight (``at_step_start``), for ``poison_loss``'s hook."""


def _last_rank() -> bool:
    return int(os.environ.get("RANK", "0")) == int(os.environ.get("WORLD_SIZE", "1")) - 1


def at_step_start(step: int) -> None:
    """``PARC_FAULT_AT_STEP=k``: the last rank dies at step k on the first attempt."""
    global _step
    _step = step
    if _env_step("PARC_FAULT_AT_STEP") == step and restart_count() == 0 and _last_rank():
        rank = os.environ.get("RANK", "0")
        print(f"rank {rank}: injected fault at step {step} (PARC_FAULT_AT_STEP)", file=sys.stderr, flush=True)
        os._exit(1)


def die_in_save_if_injected(step: int) -> None:
    """``PARC_FAULT_IN_SAVE=k``: rank 0 dies saving step k, every file written, before the rename."""
    if _env_step("PARC_FAULT_IN_SAVE") == step and restart_count() == 0:
        print(f"rank 0: injected fault while saving step {step} (PARC_FAULT_IN_SAVE)", file=sys.stderr, flush=True)
        os._exit(1)


def poison_loss(model) -> None:
    """``PARC_NAN_AT_STEP=k``: the last rank's loss of step k is NaN (Note [injected faults]).
    The hook sits on each ``Transformer`` of ``model`` (a pipeline rank's chunks) and
    changes only a loss, the 0-d output of the last stage."""
    nan_step = _env_step("PARC_NAN_AT_STEP")
    if nan_step is None or not _last_rank():
        return

    def hook(module, args, output):
        if _step == nan_step and isinstance(output, torch.Tensor) and output.dim() == 0:
            return output * float("nan")
        return None

    for module in model.modules():
        if type(module).__name__ == "Transformer":
            module.register_forward_hook(hook)


class StepGuard:
    def __init__(self, policy: str, *, rank: int, world_size: int, device, where: str = ""):
        if policy not in POLICIES:
            raise ValueError(f"on_nonfinite must be one of {POLICIES}, not {policy!r}")
        self.policy, self.rank, self.world_size, self.device = policy, rank, world_size, device
        self.where = where  # the spec line of on_nonfinite, for messages
        self.signalled = False
        self.stopping = False
        """Every rank saw the SIGTERM flag: save after this step and exit 0."""
        self.skipped = 0
        signal.signal(signal.SIGTERM, self._on_sigterm)

    def _on_sigterm(self, signum, frame) -> None:
        self.signalled = True

    def summands(self, loss: float) -> torch.Tensor:
        """This rank's loss and SIGTERM flag (Note [one all-reduce after backward])."""
        return torch.tensor([float(loss), float(self.signalled)], dtype=torch.float64, device=self.device)

    def check(self, step: int, loss: float, grad_norm: float, *, signalled: float | None = None) -> bool:
        """Whether the optimizer takes this step; ``stop`` exits here (Note [every rank agrees]).
        ``signalled``: the flags summed with ``loss`` (Note [one all-reduce after backward])."""
        bad, stopping = not (math.isfinite(loss) and math.isfinite(grad_norm)), (signalled or 0) > 0
        if signalled is None:
            flags = torch.tensor([float(bad), float(self.signalled)], device=self.device)
            if self.world_size > 1:
                dist.all_reduce(flags, op=dist.ReduceOp.MAX)
            bad, stopping = bool(flags[0] > 0), bool(flags[1] > 0)
        if stopping and not self.stopping and self.rank == 0:
            print(f"SIGTERM: step {step} finishes, then the run saves (with --checkpoint-dir) and exits", flush=True)
        self.stopping = stopping
        if not bad:
            return True
        what = f"step {step}: non-finite loss or gradient norm (grad_norm {grad_norm} on rank {self.rank})"
        if self.policy == "stop":
            raise SystemExit(
                f"train.py: {what}; stopping (on_nonfinite = stop{self.where}). "
                "The last checkpoint is untouched; resume from it with a lower learning rate, "
                "or set on_nonfinite = skip"
            )
        self.skipped += 1
        if self.rank == 0:
            print(f"{what}: optimizer step skipped (on_nonfinite = skip{self.where})", flush=True)
        return False
