"""The Plan under construction, handed from one lowering pass to the next.

Takes: nothing. Gives: ``Draft``, a frozen record whose sections start as ``None``
and are filled, one pass each, with ``dataclasses.replace`` (a pass never mutates).
``codegen/lower.py`` turns the finished draft into a ``Plan``.
"""

from __future__ import annotations

from dataclasses import dataclass

from parc.dsl.spec import Spec

from ..plan import (
    BatchPlan,
    LayerLayout,
    MeshPlan,
    ModelPlan,
    PipelinePlan,
    SequenceParallelPlan,
    PredictionPlan,
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
    layers: tuple[LayerLayout, ...] | None = None
    spec: Spec | None = None
    """The spec with the planner's layout in place of ``auto`` (``choose_layout``); the
    passes after it read this one. None: the spec as given."""
    predicted: PredictionPlan | None = None
    """The planner's prediction for that layout; None when the spec gave the layout."""

OPTIONAL = ("spec", "predicted")
"""Sections a finished draft may leave None."""
