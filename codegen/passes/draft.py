"""The Plan under construction, handed from one lowering pass to the next.

Takes: nothing. Gives: ``Draft``, a frozen record whose sections start as ``None``
and are filled, one pass each, with ``dataclasses.replace`` (a pass never mutates).
``codegen/lower.py`` turns the finished draft into a ``Plan``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..plan import (
    BatchPlan,
    MeshPlan,
    ModelPlan,
    PipelinePlan,
    SequenceParallelPlan,
    TensorParallelPlan,
    TrainPlan,
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Draft:
    mesh: MeshPlan | None = None
    tensor_parallel: TensorParallelPlan | None = None
    sequence_parallel: SequenceParallelPlan | None = None
    batch: BatchPlan | None = None
    pipeline: PipelinePlan | None = None
    model: ModelPlan | None = None
    train: TrainPlan | None = None
