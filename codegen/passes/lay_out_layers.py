"""Pass 9: each layer's layout — the embedding, every block, the head.

Takes: a buildable ``Spec`` and a draft whose mesh, sequence-parallel and pipeline
sections are filled. Gives: ``draft.layers``, one ``LayerLayout`` per layer in model
order (Note [per-layer layout] in ``codegen/plan.py``): the virtual stage holding
it, its tp and dp degrees, sp, and — blocks only — its recompute mode and overlap
sub-batches, read per block from the spec (``ParallelSpec.layer_recompute``), each
keeping the span of the spec text behind it.

Before: ``split_pipeline``. After: ``settle_training``.
"""

from __future__ import annotations

from dataclasses import replace

from parc.dsl.spec import Spec

from ..plan import LayerKind, LayerLayout
from .draft import Draft


def run(spec: Spec, draft: Draft) -> Draft:
    layers = spec.model.layers
    tp, dp = draft.mesh.size("tp"), draft.mesh.size("dp")
    sp = draft.sequence_parallel.enabled
    recompute = spec.parallel.layer_recompute(layers)
    sub_batches = spec.parallel.layer_sub_batches(layers)
    stage_of = {}
    for stage, (start, stop) in enumerate(draft.pipeline.stage_layers):
        stage_of.update({i: stage for i in range(start, stop)})
    last = len(draft.pipeline.stage_layers) - 1

    def layer(name, kind, stage, mode="none", parts=1):
        return LayerLayout(
            name=name, kind=kind, stage=stage, tp=tp, dp=dp, sp=sp, recompute=mode, sub_batches=parts,
            recompute_span=spec.span("parallel.recompute") if kind is LayerKind.BLOCK else None,
            overlap_span=spec.span("parallel.overlap") if kind is LayerKind.BLOCK else None,
        )

    out = [layer("embed", LayerKind.EMBED, 0)]
    out += [
        layer(f"layers.{i}", LayerKind.BLOCK, stage_of[i], recompute[i].value, sub_batches[i])
        for i in range(layers)
    ]
    out.append(layer("head", LayerKind.HEAD, last))
    return replace(draft, layers=tuple(out))
