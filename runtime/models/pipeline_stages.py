"""A pipeline rank's model chunks: the plain stages it holds, on the meta device.

Takes: a ``ModelConfig``, train.py's ``PIPELINE_STAGES`` table, the rank and the
placement. Gives: ``build_stages`` (``model.build_stages`` in train.py: model.py gives
it from here, so only a pipeline build ships this module, codegen/features.py's
pipeline entry) and ``Stage``, the ``Transformer`` of a stage, which ties an embedding
table across stages.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from ..layout.placement import chunk_stages
from ..layout.roles import assign
from .transformer import Transformer


class Stage(Transformer):
    """One pipeline stage: blocks ``layers = (start, stop)``, the embedding when ``first``,
    the final norm and head when ``last``.

    Note [tied embeddings across stages]: when the embedding is tied to the head and
    they sit on different stages, the last stage holds a copy of the embedding table
    as its head, initialized from ``embed.weight``; its parameter is tagged
    ``pipeline_duplicate`` (counted once in the gradient norm) and the two copies'
    gradients are summed over the embedding group after backward
    (``pipeline.allreduce_tied_grads``), so they stay equal, as Megatron does. Both
    copies are tagged ``tied_across_stages``: whoever reduces gradients during
    backward (ZeRO-2) must leave them until that sum is done.
    """

    def tag_tied(self):
        """Note [tied embeddings across stages]: the head's copy of a tied embedding table
        (generated as ``embed``, counted once) and both copies' ``tied_across_stages``;
        again by the tensor transform after it replaces the head."""
        if not self.config.tie_embeddings or self.first == self.last:
            return
        if self.first:
            assign(self.embed.weight, tied_across_stages=True)  # its grad is summed with the head copy's
        else:
            self.head.init_name = "embed"
            assign(self.head.weight, pipeline_duplicate=True, tied_across_stages=True)

    def tied_weight(self):
        """This stage's copy of the tied embedding table, or None (Note [tied embeddings across stages])."""
        if not self.config.tie_embeddings or self.first == self.last:
            return None
        return self.embed.weight if self.first else self.head.weight


def build_stages(config, *, stages, pp_rank, pp_size, placement="interleaved") -> nn.ModuleList:
    """This pipeline rank's model chunks, one plain ``Stage`` per chunk, on the meta
    device.

    ``stages`` is the literal ``PIPELINE_STAGES`` table of train.py: the layers
    ``(start, stop)`` of every virtual stage, in model order. With p pipeline ranks,
    chunk c of rank r is the virtual stage ``placement`` says (``placement.py``:
    Megatron's c·p + r, or ZB-V's V, or a placement of two pipelines holding each stage
    twice). Returns an ``nn.ModuleList`` of chunks, each with its ``stage_index``.

    Note [stage replicas]: under a placement that holds each stage twice (on ranks r and
    p-1-r: ``Placement.replica``), every stage is built twice, from the same (seed, name) draws, so the replicas start equal; their
    gradients are summed (``pipeline.allreduce_replica_grads``) after backward, which
    makes them ``pipeline_replica`` late gradients (dp.py, Note [late gradients]), and
    the up pipeline's copy is a ``pipeline_duplicate``: counted once in the gradient
    norm, loaded but never saved by checkpoints. ``init_weights`` tags them, once the
    transforms have made the parameters.
    """
    stages = tuple(tuple(s) for s in stages)
    if not stages or stages[0][0] != 0 or stages[-1][1] != config.layers or any(
        a[1] != b[0] for a, b in zip(stages, stages[1:])
    ):
        raise ValueError(f"pipeline stages {stages} must cover layers 0..{config.layers} in order")
    if len(stages) % pp_size or not 0 <= pp_rank < pp_size:
        raise ValueError(f"{len(stages)} pipeline stages do not split over {pp_size} pipeline ranks")
    place = chunk_stages(placement, pp_size, len(stages))
    chunks = nn.ModuleList()
    for chunk, v in enumerate(place.stages_of(pp_rank)):
        with torch.device("meta"):
            stage = Stage(config, layers=stages[v], first=v == 0, last=v == len(stages) - 1)
        stage.stage_index = v
        stage.replica = place.replica(chunk)  # Note [stage replicas]: None, or which copy of its stage
        chunks.append(stage)
    return chunks
