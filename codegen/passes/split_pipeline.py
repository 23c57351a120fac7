"""Pass 8: pipeline stages — which layers each (virtual) stage holds, and the schedule.

Takes: a buildable ``Spec``, ``draft.mesh`` and ``draft.batch``. Gives:
``draft.pipeline``: the layers ``(start, stop)`` of each virtual stage (the spec's
``stage_layers`` counts, or an even split over pp · chunks), the schedule, the
micro-batches per step (= grad_accum) and the bubble fraction of the schedule's own
timeline (``runtime/schedules/schedule_sim.py``, forward 1 and backward 2 time units). The
embedding sits on the first stage and the final norm and head on the last, so the
runtime builds stage v from ``stage_layers[v]`` alone.

Before: ``plan_batches``. After: ``lay_out_layers``.
"""

from __future__ import annotations

from dataclasses import replace

from parc.dsl.spec import PipelineSchedule, Spec
from parc.runtime.layout.placement import placement_for
from parc.runtime.schedules.schedule import SLICED, STAGE_COSTS, build_schedule, chunks_for
from parc.runtime.schedules.schedule_sim import bubble_fraction, simulate
from parc.runtime.schedules.schedule_terapipe import slice_scale

from ..plan import PipelinePlan
from ..planner.cost.fit import hardware_for
from ..planner.cost.time import pipeline_stage_costs
from ..planner.search import fixed_layout
from .draft import Draft


def layer_counts(spec: Spec, pp: int, chunks: int, kind: str = "1f1b") -> list[int]:
    """Layers per virtual stage: the spec's ``stage_layers``, or an even split (the rules
    ``stage_layers_fit`` and ``layers_split_evenly`` of ``runtime/layout/constraints/`` hold)
    over the placement's virtual stages (``placement_for``: pp · chunks, or pp for a schedule
    of two pipelines over the same ranks)."""
    if spec.parallel.stage_layers is not None:
        return list(spec.parallel.stage_layers)
    stages = placement_for(kind, pp, chunks).virtual_stages
    return [spec.model.layers // stages] * stages


def stage_costs(spec: Spec, kind: str) -> tuple[tuple[int, int, int], ...] | None:
    """Each virtual stage's (F, B, W) from the planner's cost model, for a kind ordered by them
    (``schedule.STAGE_COSTS``; codegen/planner/cost/bubble.py, Note [stage costs]): train.py
    builds its lists with them, as the planner's exact makespan does. None for other kinds."""
    layout = fixed_layout(spec) if kind in STAGE_COSTS else None  # choose_layout wrote the whole layout
    if layout is None:
        return None
    costs = pipeline_stage_costs(spec, layout, hardware_for(spec))
    return costs[1] if costs else None


def run(spec: Spec, draft: Draft) -> Draft:
    pp = draft.mesh.size("pp")
    schedule = spec.parallel.schedule or PipelineSchedule.ONE_F_ONE_B
    chunks = chunks_for(schedule.value, spec.parallel.chunks) if pp > 1 else 1
    micro_batches = draft.batch.grad_accum
    kind = schedule.value if pp > 1 else "1f1b"
    sliced = kind in SLICED  # a schedule over token slices of each sequence
    slices = spec.parallel.slices if sliced else 1
    counts = layer_counts(spec, pp, chunks, kind)  # enough micro-batches: constraints.batch_divides
    bounds, start = [], 0
    for n in counts:
        bounds.append((start, start + n))
        start += n
    lengths = spec.parallel.slice_lengths if sliced else None  # uneven: each as long as its tokens
    costs = stage_costs(spec, kind)
    timeline = simulate(build_schedule(kind, stages=pp, micro_batches=micro_batches, chunks=chunks, slices=slices,
                                       costs=costs),
                        slice_scale=slice_scale(lengths) if lengths else ())
    plan = PipelinePlan(
        size=pp,
        schedule=schedule.value,
        chunks=chunks,
        slices=slices,
        slice_lengths=lengths,
        micro_batches=micro_batches,
        stage_layers=tuple(bounds),
        bubble_fraction=round(bubble_fraction(timeline), 6),
        span=draft.mesh.axis("pp").span,
        schedule_span=spec.span("parallel.schedule"),
        stage_layers_span=spec.span("parallel.stage_layers"),
        stage_costs=costs,
    )
    return replace(draft, pipeline=plan)
