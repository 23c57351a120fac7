"""Pass 9: each layer's layout — the embedding, every block, the head.

Takes: a buildable ``Spec`` and a draft whose mesh, sequence-parallel and pipeline
sections are filled. Gives: ``draft.layers``, one ``LayerLayout`` per layer in model
order (Note [per-layer layout] in ``codegen/plan.py``): the virtual stage holding
it, its tp and dp degrees, sp, and — blocks only — each per-layer setting of ``layer_settings.SETTINGS`` (recompute, overlap), read per
block from the spec (``ParallelSpec.layer_values``), with the spans of the spec text
behind them.

Before: ``split_pipeline``. After: ``settle_training``.
"""

from __future__ import annotations

from dataclasses import replace

from parc.dsl.spec import Spec
from parc.runtime.layout.layer_settings import SETTINGS

from ..plan import LayerKind, LayerLayout
from .draft import Draft


def run(spec: Spec, draft: Draft) -> Draft:
    layers = spec.model.layers
    # each block's degrees (Note [heterogeneous layouts]); the embedding follows block 0, the
    # head the last block, or the embedding when tied to it (one table, one sharding)
    tps, dps = spec.parallel.degrees(layers)
    head = 0 if spec.model.tie_embeddings and len(draft.pipeline.stage_layers) == 1 else layers - 1
    sp = draft.sequence_parallel.enabled
    per_block = {entry.name: spec.parallel.layer_values(entry.name, layers) for entry in SETTINGS}
    spans = tuple((entry.name, spec.span(entry.key)) for entry in SETTINGS)
    stage_of = {}
    for stage, (start, stop) in enumerate(draft.pipeline.stage_layers):
        stage_of.update({i: stage for i in range(start, stop)})
    last = len(draft.pipeline.stage_layers) - 1

    def layer(name, kind, stage, index=None, degrees=None):
        settings = {entry.name: entry.off if index is None else per_block[entry.name][index] for entry in SETTINGS}
        at = index if degrees is None else degrees
        return LayerLayout(
            name=name, kind=kind, stage=stage, tp=tps[at], dp=dps[at], sp=sp, **settings,
            spans=spans if kind is LayerKind.BLOCK else tuple((name, None) for name, _ in spans),
        )

    out = [layer("embed", LayerKind.EMBED, 0, degrees=0)]
    out += [layer(f"layers.{i}", LayerKind.BLOCK, stage_of[i], i) for i in range(layers)]
    out.append(layer("head", LayerKind.HEAD, last, degrees=head))
    return replace(draft, layers=tuple(out))
