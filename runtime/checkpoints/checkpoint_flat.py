"""ZeRO's flat buffers as logical checkpoint boxes (Note [logical checkpoint tensors] in
checkpoint_shards.py): split from ``checkpoint_shards.py`` so that a build ships it only
with ZeRO (``features``: zero, zero3 and per-layer layouts under ZeRO).

Takes: a ZeRO optimizer (``zero.ShardedAdamW``, ``hetero.ShardedAdamW``'s parts or
``fsdp.FullyShardedAdamW``) and this rank's ``LocalParameter`` list. Gives: the same
functions ``checkpoint_shards`` has for a plain optimizer (``model_pieces``,
``optimizer_pieces``, ``optimizer_step``, ``prepare_state``, ``loaded``): the
parameters' boxes under ZeRO-3 (``sharded_model_pieces``) and the fp32 master slices'
(``master_slice_pieces``); ``checkpoint.py`` picks the module by
``checkpoint_shards.is_zero``.
"""

from __future__ import annotations

import math

from ..distributed.comm import group_rank
from . import checkpoint_shards
from .checkpoint_shards import MOMENTS, LocalParameter, Piece


def is_fully_sharded(optimizer) -> bool:
    """ZeRO-3 (fsdp.py): the parameters too live only in the flat shards between uses."""
    return hasattr(optimizer, "units")


def has_master_slices(optimizer) -> bool:
    """ZeRO 1/2 with bf16/fp16 parameters: each slice's fp32 master (zero.py, Note [ZeRO
    with master weights]) is what a checkpoint holds of the parameters."""
    return getattr(optimizer, "master", None) is not None


def model_pieces(params: list[LocalParameter], *, saving: bool, optimizer) -> list[Piece]:
    """The parameters' boxes under ZeRO: views of ZeRO-3's shards (the parameters live
    there), the fp32 master slices under bf16/fp16, else the parameters' own."""
    if is_fully_sharded(optimizer):
        return sharded_model_pieces(params, optimizer, saving=saving)
    if has_master_slices(optimizer):
        return master_slice_pieces(params, optimizer, saving=saving)
    return checkpoint_shards.model_pieces(params, saving=saving, optimizer=optimizer)


def loaded(optimizer) -> None:
    """``checkpoint_shards.loaded`` under ZeRO: the master slices' rounded values into the
    compute weights, all-gathered over dp too (every rank loads)."""
    if getattr(optimizer, "master_of", None) is not None or has_master_slices(optimizer):
        optimizer.copy_to_model()


def _boxes(shape: tuple[int, ...], start: int, stop: int):
    """Boxes (offsets, sizes, first flat element) covering elements [start, stop) of ``shape``
    (row-major): a partial leading slice, whole leading slices, a partial one, each partial
    slice cut the same way one dimension down (a 3-d expert weight too)."""
    if start >= stop:
        return []
    if len(shape) == 1:
        return [((start,), (stop - start,), start)]
    inner = math.prod(shape[1:])

    def within(row, lo, hi):  # boxes of elements [lo, hi) of slice ``row``
        return [((row, *o), (1, *z), row * inner + f) for o, z, f in _boxes(shape[1:], lo, hi)]

    (r0, c0), (r1, c1) = divmod(start, inner), divmod(stop, inner)
    if r0 == r1:
        return within(r0, c0, c1)
    boxes = []
    if c0:
        boxes += within(r0, c0, inner)
        r0 += 1
    if r1 > r0:
        boxes.append(((r0,) + (0,) * (len(shape) - 1), (r1 - r0, *shape[1:]), r0 * inner))
    if c1:
        boxes += within(r1, 0, c1)
    return boxes


def _parts(optimizer) -> list:
    """ZeRO 1/2's flat buffers: the dense parameters', and under ep the experts' own
    (Note [experts under ZeRO] in zero.py), or one per layer layout (Note [ZeRO over
    per-layer layouts] in hetero.py); ZeRO-3's one optimizer."""
    parts = getattr(optimizer, "parts", None)
    return parts() if parts is not None else [optimizer]


def _flat_runs(optimizer):
    """(parameter, start, stop, at): elements [start, stop) of the parameter (row-major)
    that this rank's flat buffer holds, from index ``at`` of it. ZeRO 1/2: one buffer over
    all parameters, the rank's slice [lo, hi) (Note [one flat buffer] in zero.py); ZeRO-3:
    each unit's shard (Note [units] in fsdp.py)."""
    if is_fully_sharded(optimizer):
        spans = [(unit.params, group_rank(unit.group) * unit.shard_numel, unit.shard_numel, unit.offset)
                 for unit in optimizer.units]
    else:
        spans = [(optimizer.params, optimizer.lo, optimizer.hi - optimizer.lo, 0)]
    for params, lo, length, base in spans:
        offset = 0
        for param in params:
            n = param.numel()
            start, stop = max(offset, lo), min(offset + n, lo + length)
            if start < stop:
                yield param, start - offset, stop - offset, base + start - lo
            offset += n


def _flat_pieces(params: list[LocalParameter], optimizer, buffers, *, saving: bool) -> list[Piece]:
    """Logical boxes of the flat ``buffers`` ((suffix, tensor) pairs laid out as ZeRO's slices)."""
    by_id = {id(p.param): p for p in params}
    pieces = []
    for param, start, stop, at in _flat_runs(optimizer):
        info = by_id[id(param)]
        if saving and info.duplicate:
            continue
        for local, sizes, first in _boxes(tuple(param.shape), start, stop):
            index = at + first - start
            full_offsets = tuple(a + b for a, b in zip(info.offsets, local))
            for prefix, suffix, buffer in buffers:
                view = buffer[index : index + math.prod(sizes)].view(sizes)
                pieces.append(Piece(f"{prefix}.{info.name}{suffix}", info.full_shape, full_offsets, view))
    return pieces


def sharded_model_pieces(params: list[LocalParameter], optimizer, *, saving: bool) -> list[Piece]:
    """``model_pieces`` under ZeRO-3: the parameters' boxes are views of the rank's shards."""
    return _flat_pieces(params, optimizer, [("model", "", optimizer.flat)], saving=saving)


def master_slice_pieces(params: list[LocalParameter], optimizer, *, saving: bool) -> list[Piece]:
    """``model_pieces`` from the fp32 master slices (``has_master_slices``)."""
    return [piece for part in _parts(optimizer)
            for piece in _flat_pieces(params, part, [("model", "", part.master)], saving=saving)]


def optimizer_pieces(params: list[LocalParameter], optimizer, *, saving: bool) -> list[Piece]:
    """The AdamW moments of this rank's slices as logical boxes (``prepare_state`` first when loading)."""
    pieces = []
    for part in _parts(optimizer):
        moments = [("optim", f".{moment}", part.state[moment]) for moment in MOMENTS]
        pieces += _flat_pieces(params, part, moments, saving=saving)
    return pieces


def optimizer_step(optimizer) -> int:
    """AdamW's step count (every part counts the same steps)."""
    return int(_parts(optimizer)[0].state["step"])


def prepare_state(optimizer, step: int) -> None:
    """Give a fresh ZeRO optimizer the step a checkpoint's moments are read at (its moments exist)."""
    for part in _parts(optimizer):
        part.state["step"] = int(step)
