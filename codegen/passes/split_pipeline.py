"""Pass 8: pipeline stages — which layers each (virtual) stage holds, and the schedule.

Takes: a buildable ``Spec``, ``draft.mesh`` and ``draft.batch``. Gives:
``draft.pipeline``: the layers ``(start, stop)`` of each virtual stage (the spec's
``stage_layers`` counts, or an even split over pp · chunks), the schedule, the
micro-batches per step (= grad_accum) and the bubble fraction of the schedule's own
timeline (``runtime/schedule_sim.py``, forward 1 and backward 2 time units). The
embedding sits on the first stage and the final norm and head on the last, so the
runtime builds stage v from ``stage_layers[v]`` alone.

Before: ``plan_batches``. After: ``lay_out_layers``.
"""

from __future__ import annotations

from dataclasses import replace

from parc.dsl.spec import PipelineSchedule, Spec
from parc.runtime.schedule import build_schedule
from parc.runtime.schedule_sim import bubble_fraction, simulate

from ..errors import BATCH_MISMATCH, NOT_DIVISIBLE, check, error
from ..plan import PipelinePlan
from .draft import Draft


def layer_counts(spec: Spec, pp: int, chunks: int) -> tuple[list[int], list]:
    """Layers per virtual stage, and the problems with the spec's choice."""
    layers, given = spec.model.layers, spec.parallel.stage_layers
    if given is not None:
        problems = []
        if len(given) != pp * chunks or sum(given) != layers or min(given) < 1:
            problems.append(
                error(
                    spec,
                    "parallel.stage_layers",
                    NOT_DIVISIBLE,
                    f"stage_layers = {list(given)} must give each of the pp = {pp} stages at least "
                    f"one layer and sum to layers = {layers}",
                    f"e.g. stage_layers = {[layers // pp] * (pp - 1) + [layers - layers // pp * (pp - 1)]}",
                )
            )
        return list(given), problems
    stages = pp * chunks
    if layers % stages:
        return [], [
            error(
                spec,
                "parallel.pp",
                NOT_DIVISIBLE,
                f"layers = {layers} do not split evenly into pp · chunks = {pp} · {chunks} stages",
                "choose pp (and chunks) dividing the layers, or give stage_layers",
            )
        ]
    return [layers // stages] * stages, []


def run(spec: Spec, draft: Draft) -> Draft:
    pp = draft.mesh.size("pp")
    schedule = spec.parallel.schedule or PipelineSchedule.ONE_F_ONE_B
    chunks = spec.parallel.chunks if schedule is PipelineSchedule.INTERLEAVED else 1
    micro_batches = draft.batch.grad_accum
    counts, problems = layer_counts(spec, pp, chunks)
    if pp > 1 and micro_batches < pp:
        problems.append(
            error(
                spec,
                "parallel.pp",
                BATCH_MISMATCH,
                f"{micro_batches} micro-batch(es) per step cannot fill pp = {pp} stages",
                f"raise global_batch to at least micro_batch · dp · pp = "
                f"{draft.batch.micro_batch * draft.batch.dp * pp}",
            )
        )
    if chunks > 1 and micro_batches % pp:
        problems.append(
            error(
                spec,
                "parallel.schedule",
                BATCH_MISMATCH,
                f"interleaved needs micro-batches per step ({micro_batches}) divisible by pp = {pp}",
                f"make global_batch a multiple of micro_batch · dp · pp = "
                f"{draft.batch.micro_batch * draft.batch.dp * pp}",
            )
        )
    check(problems)
    bounds, start = [], 0
    for n in counts:
        bounds.append((start, start + n))
        start += n
    kind = schedule.value if pp > 1 else "1f1b"
    timeline = simulate(build_schedule(kind, stages=pp, micro_batches=micro_batches, chunks=chunks))
    plan = PipelinePlan(
        size=pp,
        schedule=schedule.value,
        chunks=chunks,
        micro_batches=micro_batches,
        stage_layers=tuple(bounds),
        bubble_fraction=round(bubble_fraction(timeline), 6),
        span=draft.mesh.axis("pp").span,
        schedule_span=spec.span("parallel.schedule"),
        stage_layers_span=spec.span("parallel.stage_layers"),
    )
    return replace(draft, pipeline=plan)
