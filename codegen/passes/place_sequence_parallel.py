"""Pass 6: where activations are split along the sequence (sequence parallelism).

Takes: a buildable ``Spec``, ``draft.tensor_parallel``. Gives:
``draft.sequence_parallel``. With ``sp = true`` (and tp > 1) the replicated work
between tensor-parallel blocks — norms, residual adds, dropout — runs on T/tp of the
sequence: the all-reduce after each row-parallel layer (and the embedding) becomes a
reduce-scatter along T, and the next column-parallel layer all-gathers T first
(Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models").
seq_len then divides by tp (``constraints.sequence_parallel``). On a 2D grid (R, C) the
sequence splits over a row's C ranks and the features over R: (B, T/C, hidden/R).

Before: ``partition_layers``. After: ``plan_batches``.
"""

from __future__ import annotations

from dataclasses import replace

from parc.dsl.spec import Arch, Spec

from ..plan import SequenceParallelPlan
from .draft import Draft


def run(spec: Spec, draft: Draft) -> Draft:
    tp = draft.tensor_parallel.size
    enabled = bool(spec.parallel.sp) and tp > 1
    span = spec.span("parallel.sp")
    if not enabled:
        plan = SequenceParallelPlan(enabled=False, local_shape=(), span=span)
        return replace(draft, sequence_parallel=plan)
    seq_len = spec.model.seq_len
    # Note [2D sequence parallelism] (runtime/parallel/tensor/layers2d.py): on an R × C grid the sequence is
    # split over a row's C ranks, the features over a column's R
    rows, cols = draft.mesh.tp_grid or (1, tp)
    plan = SequenceParallelPlan(
        enabled=True,
        local_shape=(spec.train.micro_batch, seq_len // cols, spec.model.hidden // rows),
        span=span,
    )
    return replace(draft, sequence_parallel=plan)
