"""Pass 7: micro-batches, gradient accumulation and tokens per step.

Takes: a buildable ``Spec`` and ``draft.mesh``. Gives: ``draft.batch``. Each dp rank
runs ``grad_accum`` micro-batches of ``micro_batch`` sequences per optimizer step, so
global_batch = micro_batch · grad_accum · dp must hold exactly.

Before: ``place_sequence_parallel``. After: ``settle_training``.
"""

from __future__ import annotations

from dataclasses import replace

from parc.dsl.spec import Spec

from ..errors import BATCH_MISMATCH, check, error
from ..plan import BatchPlan
from .draft import Draft


def run(spec: Spec, draft: Draft) -> Draft:
    dp = draft.mesh.size("dp")
    global_batch, micro_batch = spec.train.global_batch, spec.train.micro_batch
    if global_batch % (micro_batch * dp):
        per_step = micro_batch * dp
        check(
            [
                error(
                    spec,
                    "train.global_batch",
                    BATCH_MISMATCH,
                    f"global_batch = {global_batch} is not a multiple of micro_batch · dp = "
                    f"{micro_batch} · {dp} = {per_step}",
                    f"use a global_batch that is a multiple of {per_step}, e.g. "
                    f"{max(1, round(global_batch / per_step)) * per_step}",
                )
            ]
        )
    plan = BatchPlan(
        micro_batch=micro_batch,
        grad_accum=global_batch // (micro_batch * dp),
        dp=dp,
        global_batch=global_batch,
        seq_len=spec.model.seq_len,
        micro_batch_span=spec.span("train.micro_batch"),
        global_batch_span=spec.span("train.global_batch"),
    )
    return replace(draft, batch=plan)
