"""Dynamic loss scaling for fp16 training (``train.precision = fp16``).

Takes: the step's global gradient norm, measured on gradients of the loss times
``scale`` (every rank sees the same norm: it is all-reduced over tp, dp and pp).
Gives: ``DynamicLossScale``: ``scale`` to multiply the loss by before backward, and
``update(step, grad_norm)``, whether the optimizer may take this step.

Note [dynamic loss scaling]: fp16's smallest normal is 6.1e-5, so small gradients of
the low-precision activations flush to zero; the loss is multiplied by ``scale``
(2^16 to start) before backward and the gradients (fp32, of the fp32 master weights)
divided by it before clipping (``grad_scale`` of the clip functions). A step whose
scaled gradients overflowed (non-finite norm) is skipped, logged, and the scale
halved (backoff); after ``growth_interval`` finite steps in a row it doubles (grow).
torch.amp.GradScaler's policy and defaults, for parc's sharded gradients.

Note [the scale of one rank's backward]: ``scale`` multiplies the *global* loss, the
mean over every micro-batch of every data-parallel rank. A rank's backward runs on its
micro-batch's loss divided by GRAD_ACCUM (the micro-batches it accumulates), and the dp
reduction then divides the sum by the ``data_ranks`` (dp, or dp·cp); so the rank's share
of the global loss is loss / (GRAD_ACCUM · data_ranks), and ``begin`` returns
``scale / data_ranks``: every layout's fp16 backward then sees the numbers the one-rank
run does (whose GRAD_ACCUM is data_ranks times larger). Multiplying by the whole
``scale`` instead made each rank's fp16 gradients data_ranks times those of one rank,
so at dp 4 a step overflowed (step 4 of the parity spec) that one rank takes. The
gradients after the dp mean are of the global loss times ``scale / data_ranks``, which
is what the clip divides by (``grad_scale = scaled_by``).
"""

from __future__ import annotations

import math

from ..train.faults import _env_step


class DynamicLossScale:
    def __init__(self, *, init: float = 2.0**16, growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 2000, rank: int = 0, data_ranks: int = 1):
        if not (init > 0 and growth_factor > 1 and 0 < backoff_factor < 1 and growth_interval >= 1):
            raise ValueError("loss scale: init > 0, growth_factor > 1, 0 < backoff_factor < 1, growth_interval >= 1")
        self.scale = float(init)
        self.growth_factor, self.backoff_factor = growth_factor, backoff_factor
        self.growth_interval, self.rank = growth_interval, rank
        self.data_ranks = int(data_ranks)  # the ranks the loss is a mean over (Note [the scale of one rank's backward])
        self.step_scale = self.scale  # what this step's loss was multiplied by
        self.good_steps = 0  # finite steps since the last backoff or growth
        self.skipped = 0  # overflow steps skipped so far

    def begin(self, step: int) -> float:
        """What this rank multiplies its loss by for ``step``'s backward: the scale over the
        data ranks (Note [the scale of one rank's backward]). ``PARC_OVERFLOW_AT_STEP=k``
        (tests only): step k's scale is 1e30, so its fp16 gradients overflow for real."""
        forced = _env_step("PARC_OVERFLOW_AT_STEP") == step
        self.step_scale = 1e30 if forced else self.scale
        return self.step_scale / self.data_ranks

    def update(self, step: int, grad_norm: float) -> bool:
        """Whether the optimizer takes ``step`` (Note [dynamic loss scaling])."""
        if math.isfinite(grad_norm):
            self.good_steps += 1
            if self.good_steps >= self.growth_interval:
                self.scale *= self.growth_factor
                self.good_steps = 0
            return True
        old, self.scale = self.step_scale, self.scale * self.backoff_factor
        self.good_steps = 0
        self.skipped += 1
        if self.rank == 0:
            print(f"step {step}: fp16 gradients overflowed at loss scale {old:g}: "
                  f"optimizer step skipped, scale backs off to {self.scale:g}", flush=True)
        return False

    def state_dict(self) -> dict:
        return {"scale": self.scale, "good_steps": self.good_steps, "skipped": self.skipped}

    def load_state_dict(self, state: dict) -> None:
        self.scale, self.good_steps, self.skipped = float(state["scale"]), int(state["good_steps"]), int(state["skipped"])
