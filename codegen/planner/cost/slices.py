"""What a sliced schedule's token slices (TeraPipe's) change in the other features' costs.

Takes: a layout's slices (``Layout.slices``, 1 unless ``schedule = terapipe``) and the
per-micro-batch figures ``cost/time.py`` and ``cost/memory.py`` compute. Gives:
``zero3_passes`` (ZeRO-3's passes a step and a pass's compute), ``per_slices`` (a MoE
block's cost run slice by slice) and ``kept_kv_elements`` (the keys and values every
slice keeps for the later ones, beyond what a full recompute keeps). Before: the
schedule's makespan (``bubble.py``, Note [closed forms]). After: nothing; ``REASONS``
goes to ``planner/why.py`` through ``bubble.REASONS``.

Note [ZeRO-3 per slice]: under terapipe a ZeRO-3 pass is a slice's, not a micro-batch's
(runtime/parallel/data/fsdp.py, Note [gradients of a unit]): a stage runs every slice of a
micro-batch through all its blocks before the next slice, so keeping a block gathered
from the first slice to the last would keep the whole stage gathered, what ZeRO-3 exists
to avoid. Each slice gathers each unit for its forward and again for its backward and
reduce-scatters the unit's gradient once its backward is done: M·S passes a step, each
under a slice's compute (F/S, B/S), S times the gathers and reduce-scatters of 1F1B for
the same memory (1 + prefetch units).

Note [experts per slice]: a MoE block routes, dispatches and combines each slice's tokens
on their own (runtime/parallel/pipeline/terapipe.py, Note [experts in a slice]): S
all-to-alls of 1/S the rows, one after another, each exposed as a micro-batch's would be,
and S expert GEMMs of 1/S the tokens; the micro-batch's expert part is S times a slice's
(more latency and less efficient GEMMs than one whole pass).

Note [kept keys under recompute]: every slice keeps each layer's keys and values until its
own backward, for the later slices of its sequence to attend to (terapipe.py, Note
[gradients through the kept keys and values]), whatever recompute says: without recompute
(and under selective, whose checkpointed core keeps its inputs) they are among a block's
saved tensors already; under full recompute a block keeps only its input, so the keys and
values, 2·kv_heads·head_dim/tp elements a token (each tp rank's heads of the slice's
tokens, all of them under sp), come on top.
"""

from __future__ import annotations

import dataclasses

REASONS = {"slices": "more token slices fill the pipeline sooner: terapipe idles (p-1)(F+B)/S"}
"""``planner/why.py``'s reason for a difference in the slices (a bubble term)."""


def zero3_passes(micro_batches: int, slices: int, forward: float, backward: float) -> tuple[int, float, float]:
    """ZeRO-3's passes a step and the forward and backward of a block in one pass: a
    micro-batch's, or under terapipe a slice's (Note [ZeRO-3 per slice])."""
    return micro_batches * slices, forward / slices, backward / slices


def per_slices(cost_of, tokens: float, slices: int):
    """``cost_of(tokens)`` (a dataclass of seconds for one micro-batch's tokens) for a
    micro-batch run in ``slices`` slices: S times one slice's (Note [experts per slice])."""
    if slices == 1:
        return cost_of(tokens)
    one = cost_of(tokens / slices)
    return dataclasses.replace(one, **{f.name: slices * getattr(one, f.name) for f in dataclasses.fields(one)})


def kept_kv_elements(model, tp: int, slices: int, modes: dict) -> float:
    """Elements a token keeps in the kept keys and values of a rank's fully recomputed
    blocks (``modes``: recompute mode → blocks); 0 without slices (Note [kept keys under recompute])."""
    if slices == 1:
        return 0.0
    return modes.get("full", 0) * 2.0 * max(1, model.kv_heads // tp) * model.head_dim
