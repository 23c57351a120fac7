"""Pass 7: micro-batches, gradient accumulation and tokens per step.

Takes: a buildable ``Spec`` and ``draft.mesh``. Gives: ``draft.batch``. Each dp rank
runs ``grad_accum`` micro-batches of ``micro_batch`` sequences per optimizer step, so
global_batch = micro_batch · grad_accum · dp holds exactly (``constraints.batch_divides``).

Before: ``place_sequence_parallel``. After: ``settle_training``.
"""

from __future__ import annotations

from dataclasses import replace

from parc.dsl.spec import Spec

from ..plan import BatchPlan
from .draft import Draft


def run(spec: Spec, draft: Draft) -> Draft:
    dp = draft.mesh.size("dp")
    global_batch, micro_batch = spec.train.global_batch, spec.train.micro_batch
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
