"""Sequence parallelism, overlap sub-batches, one entry per layer."""

from __future__ import annotations

import inspect
from typing import Callable
from ..axes import axis
from ..layer_settings import SETTINGS

from ..rule_engine import BUILD, Violation, _violation, divisors, entries, per_layer, rule, some
from ..rule_keys import KEYS



@rule("PAR0209")
def sequence_parallel(sp, tp, seq_len=None, tp_2d=None):
    """sp splits the sequence over tp, so tp must divide seq_len; on a 2D grid (``tp_2d``,
    Note [a derived value]) over a row's C ranks instead (``rules_mesh.sequence_parallel_2d``)."""
    if sp is not True:
        return None
    if tp < 2:
        return _violation("PAR0209", "parallel.sp", f"sp = true needs tp > 1, but tp = {tp}",
                          "sequence parallelism splits along the tp axis: set tp ≥ 2, or sp = false")
    if seq_len is not None and not tp_2d and seq_len % tp:
        return _violation("PAR0210", "model.seq_len",
                          f"seq_len = {seq_len} is not divisible by tp = {tp} (sp = true splits the sequence over tp)",
                          f"make seq_len a multiple of {tp}, or set sp = false")
    return None



@rule("PAR0211")
def sub_batches_divide(overlap, micro_batch):
    found = []
    for parts in dict.fromkeys(entries(overlap)):
        if parts is None or micro_batch % parts == 0:
            continue
        choices = [d for d in divisors(micro_batch) if d >= 2]
        hint = (f"sub_batches must divide micro_batch: one of {some(choices, parts)}" if choices
                else f"micro_batch = {micro_batch} cannot be split; use overlap = none or a larger micro_batch")
        found.append(_violation("PAR0211", ("parallel.overlap.sub_batches", "parallel.overlap"),
                                f"sub_batch({parts}) does not divide micro_batch = {micro_batch}", hint))
    return tuple(found)



@rule("PAR0215")
def overlap_needs_tp(overlap, tp, ep=None):
    """``overlap = sub_batch(K)`` splits tensor-parallel communication (or, with ep > 1, the
    expert all-to-alls): with tp = 1 and ep = 1 there is none."""
    parts = [k for k in entries(overlap) if k is not None and k > 1]
    if tp != 1 or (ep or 1) > 1 or not parts:
        return None
    return _violation(
        "PAR0215", "parallel.overlap", f"overlap = sub_batch({parts[0]}) has nothing to overlap: tp = 1",
        "overlap splits tensor-parallel communication; with tp = 1 there is none — remove it or raise tp",
    )



PER_LAYER = tuple(entry.name for entry in SETTINGS)
"""Settings that may be a list with one entry per layer (``layer_settings.SETTINGS``)."""



def _one_entry_per_layer(name: str) -> Callable:
    key = KEYS[name]

    def check(**values):
        value, layers = values[name], values["layers"]
        if isinstance(value, (tuple, list)) and len(value) != layers:
            return Violation(
                code="PAR0116", blame=(key,),
                message=f"`{key}` lists {len(value)} value{'s' if len(value) != 1 else ''} but the model has layers = {layers}",
                hint=f"give one value per layer ({layers}), or a single value for all of them",
            )
        return None

    check.__signature__ = inspect.Signature(
        [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY) for n in ("layers", name)]
    )
    return check



for _name in PER_LAYER:
    rule("PAR0116", name=f"{_name}_per_layer")(_one_entry_per_layer(_name))




@rule("PAR0256")
def hetero_overlap_needs_tp(layer_tp, overlap):
    """Sub-batches hide a layer's tensor-parallel collectives (overlap.py): under per-layer tp one
    ``overlap`` value applies to the layers at tp > 1 (those at tp 1 run unsplit), and a list
    that gives ``sub_batch(k)`` to a layer at tp 1 asks for what cannot be (as PAR0215)."""
    if not isinstance(overlap, (tuple, list)) or len(overlap) != len(layer_tp):
        return None  # one value, or the list's length is PAR0250's kind of error
    for i, (k, t) in enumerate(zip(overlap, layer_tp)):
        if k is not None and k > 1 and t == 1:
            return _violation("PAR0256", ("parallel.overlap", "parallel.tp"),
                              f"overlap[{i}] = sub_batch({k}) but layer {i} runs at tp[{i}] = 1: it has no "
                              "tensor-parallel communication to overlap",
                              f"write none for overlap[{i}] (one overlap value for all layers applies only to "
                              "the layers at tp > 1)")
    return None


@rule("PAR0257")
def hetero_sub_batches_divide(layer_tp, tp, micro_batch, overlap):
    """A layer at tp t < tp holds micro_batch · t / tp sequences (Note [heterogeneous layouts]):
    its sub-batches split that piece, not the coarse micro-batch."""
    if isinstance(overlap, (tuple, list)) and len(overlap) != len(layer_tp):
        return None
    for i, (k, t) in enumerate(zip(per_layer(overlap, len(layer_tp)), layer_tp)):
        if k is None or k < 2 or t < 2 or t >= tp or micro_batch % (tp // t):
            continue  # unsplit; at the coarse degree PAR0211; an uneven piece PAR0253
        piece = micro_batch * t // tp
        if piece % k:
            choices = [d for d in divisors(piece) if d >= 2]
            return _violation("PAR0257", ("parallel.overlap", "train.micro_batch"),
                              f"sub_batch({k}) does not divide layer {i}'s piece of the micro-batch: at tp[{i}] = "
                              f"{t} of tp = {tp} it holds micro_batch · {t} / {tp} = {piece} sequences",
                              (f"use sub_batch({choices[-1]}) there, or " if choices else "")
                              + f"a micro_batch that is a multiple of {k * tp // t}")
    return None
