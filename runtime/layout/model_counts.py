"""The planner's counts of a model description: parameters per rank, stage and block.

Takes: a ``ModelDesc`` (model_desc.py). Gives: ``parameters`` and ``active_parameters``
(the whole model; of each MoE block's experts only the top_k a token meets),
``block_params``, ``embed_params``, ``head_params`` and ``counted_stage`` (one tp rank of
a pipeline stage as parc's TP table splits it, from prefix sums memoized per (config,
tp): the planner asks thousands of times), ``grid_shape``/``grid_numel`` (one rank's
box under 2D tensor parallelism), ``sequence_parallel_params`` and ``typical_block``.

Pure Python, no torch. The compiler and the planner call ``parameters``,
``typical_block`` and ``sequence_parallel_params`` here, the rest through ``ModelDesc``'s
methods of the same names (each imports this module when called); a trainer checks
its model with ``ModelDesc.stage_params(sharded=...)``, which counts the modules it
built itself, so a build does not ship this module. It reads the description it is
given and imports only its parts (model_parts.py), never model_desc.py back.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .model_parts import GROUPED, NONE, ModuleDesc, ParamCount, ParamDesc

if TYPE_CHECKING:  # named in annotations only: model_desc.py imports this module, not the other way
    from .model_desc import BlockDesc, ModelDesc


def grid_shape(module: ModuleDesc, param: ParamDesc, grid) -> tuple[int, ...]:
    """``param``'s shard on one rank of an R × C tp grid (Note [2D tensor parallelism] in
    layers2d.py): colwise linears, the embedding and the head (out/C, in/R), their
    biases out/C; rowwise ones (out/R, in/C), biases out/R; norms and positions split
    their features over R."""
    rows, cols = grid
    if module.style in ("colwise", "vocab", "vocab_head"):
        split = (cols, rows)
    elif module.style == "rowwise":
        split = (rows, cols)
    else:
        return param.shape[:-1] + (param.shape[-1] // rows,)
    return tuple(n // parts for n, parts in zip(param.shape, split))


def grid_numel(module: ModuleDesc, grid) -> int:
    """Elements on one rank of an R × C tp grid (``grid_shape``)."""
    return sum(math.prod(grid_shape(module, p, grid)) for p in module.params)


def typical_block(desc: ModelDesc) -> BlockDesc:
    """The block the planner's per-block costs stand for: the first MoE block when there
    are experts (the dense blocks' MLPs, ``first_dense_layers`` and ``moe_every``, are
    priced apart: cost/experts.py), else block 0."""
    return next((b for b in desc.blocks if b.experts), desc.blocks[0])


def inactive_params(block: BlockDesc) -> int:
    """Expert elements a token does not meet: (experts − top_k) / experts of them."""
    grouped = sum(m.numel() for m in block.modules if m.layer == GROUPED)
    return grouped - grouped // block.experts * block.top_k if block.experts else 0


def parameters(desc: ModelDesc) -> int:
    """Parameters of the whole model, a tied embedding counted once."""
    return desc.stage_params().elements


def active_parameters(desc: ModelDesc) -> int:
    """Parameters one token meets: of each MoE block's experts only its top_k."""
    return parameters(desc) - sum(inactive_params(b) for b in desc.blocks)


def block_params(desc: ModelDesc, index: int, tp: int = 1) -> ParamCount:
    return _counts(desc, tp).blocks[index]


def embed_params(desc: ModelDesc, tp: int = 1) -> ParamCount:
    return _counts(desc, tp).embed


def head_params(desc: ModelDesc, tp: int = 1, *, weight: bool = True) -> ParamCount:
    """The final norm and, with ``weight``, a head matrix of its own (untied, or the
    tied copy a later pipeline stage holds)."""
    counts = _counts(desc, tp)
    return counts.norm + counts.head_weight if weight else counts.norm


def counted_stage(desc: ModelDesc, tp: int, start: int, stop: int, first: bool, last: bool, grid=None) -> ParamCount:
    """``ModelDesc.stage_params`` as parc's TP table splits the modules (every module with
    a style, when tp > 1), or on one rank of an R × C ``grid`` (which splits every module)."""
    if grid is not None:
        modules = desc._stage_modules(start, stop, first, last)
        return ParamCount(elements=sum(grid_numel(m, grid) for m in modules),
                          tensors=sum(len(m.params) for m in modules))
    counts = _counts(desc, tp)
    total = counts.prefix[stop] - counts.prefix[start]
    if first:
        total += counts.embed
    if last:
        total += head_params(desc, tp, weight=desc.has_head_weight(first=first))
    return total


def sequence_parallel_params(
    desc: ModelDesc, *, layers: tuple[int, int] | None = None, first: bool = True, last: bool = True, grid=None,
) -> int:
    """Elements of a stage whose gradients are partial under sp (norms, row-parallel
    biases, gpt's positions); the caller decides whether sp is on. ``grid``: (R, C)
    under 2D tensor parallelism, where a rank holds their h/R features."""
    start, stop = (0, len(desc.blocks)) if layers is None else layers
    if grid is not None:
        modules = (desc.embed if first else ()) + tuple(m for b in desc.blocks[start:stop] for m in b.modules)
        modules += desc.head if last else ()
        return sum(math.prod(grid_shape(m, p, grid)) for m in modules for p in m.params if p.sequence_parallel)
    counts = _counts(desc, 1)
    total = counts.sp_prefix[stop] - counts.sp_prefix[start]
    return total + (counts.sp_embed if first else 0) + (counts.sp_head if last else 0)


@dataclass(frozen=True, slots=True)
class _Counts:
    prefix: tuple[ParamCount, ...]
    """prefix[i]: blocks 0 .. i−1 together."""
    blocks: tuple[ParamCount, ...]
    embed: ParamCount
    norm: ParamCount
    head_weight: ParamCount
    sp_prefix: tuple[int, ...]
    sp_embed: int
    sp_head: int


def _count(modules, tp: int) -> ParamCount:
    """Parameters of ``modules`` on one rank, each module with a style split over ``tp``."""
    return ParamCount(elements=sum(m.numel(tp if m.style is not None else 1) for m in modules),
                      tensors=sum(len(m.params) for m in modules))


def _sp_elements(modules) -> int:
    return sum(p.numel() for m in modules for p in m.params if p.sequence_parallel)


_MEMO: dict[tuple, _Counts] = {}
"""``_counts`` by (config, tp); emptied past ``MEMO_SIZE`` entries."""
MEMO_SIZE = 1024


def _counts(desc: ModelDesc, tp: int) -> _Counts:
    """The prefix sums of ``desc``'s counts on one rank of tp, memoized per (config, tp):
    ``describe`` gives one description per config (the planner asks thousands of times)."""
    key = (desc.config, tp)
    if key not in _MEMO:
        if len(_MEMO) >= MEMO_SIZE:
            _MEMO.clear()
        _MEMO[key] = _summed(desc, tp)
    return _MEMO[key]


def _summed(desc: ModelDesc, tp: int) -> _Counts:
    blocks = tuple(_count(b.modules, tp) for b in desc.blocks)
    prefix, sp_prefix = [NONE], [0]
    for block, count in zip(desc.blocks, blocks):
        prefix.append(prefix[-1] + count)
        sp_prefix.append(sp_prefix[-1] + _sp_elements(block.modules))
    return _Counts(
        prefix=tuple(prefix), blocks=blocks, embed=_count(desc.embed, tp), norm=_count(desc.head[:-1], tp),
        head_weight=_count(desc.head[-1:], tp), sp_prefix=tuple(sp_prefix), sp_embed=_sp_elements(desc.embed),
        sp_head=_sp_elements(desc.head),
    )
