"""A transformer block as a list of regions (Note [blocks as regions]).

Takes: a ``ModelConfig`` and the block's index. Gives: ``Region`` and ``Block``, plain:
the transforms of ``parallelize`` swap its layers and set its layout.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.nn as nn
import torch.nn.functional as F

from .attention import Attention
from .mlp import MLP
from .norm import Norm
from .residual import settle


@dataclass(frozen=True, slots=True)
class Region:
    """The compute between two tensor-parallel collectives, and the residual add after.

    Note [blocks as regions]: a block is a list of regions. Each is ``x + dropout(row(
    body.inner(*columns(norm(x)))))``: a norm, the column-parallel projections that
    enter the tp region together, the body between them (attention, an activation),
    and the row-parallel projection whose reduction ends it. ``Block.forward`` walks
    the regions plainly; ``overlap.run_blocks`` walks the same regions of many blocks
    as a wavefront of sub-batches. A new kind of block (MoE: dispatch, experts,
    combine) adds regions, not another copy of the walk.
    """

    norm: nn.Module
    body: nn.Module
    """``Attention`` or ``MLP``: its ``columns`` open the region, ``inner`` is the middle."""
    row: nn.Module
    """The projection that closes the region (o_proj, down_proj)."""

    def run(self, h, delta, dropout: float, training: bool):
        """Note [pending residual]: the region on residual stream ``h`` whose previous
        region's output ``delta`` is not added yet (None: it is); gives the new stream and
        this region's output, not added either: the next norm adds it (``Norm.add_norm``)."""
        y, h = (self.norm(h), h) if delta is None else self.norm.add_norm(delta, h)
        return h, F.dropout(self.body(y), dropout, training)


class Block(nn.Module):
    """Block ``index`` of the plain model: attention, then the MLP (a MoE MLP where
    ``config.is_moe(index)``). Its own layout is set by the transforms: ``tp_group`` (the
    tensor transform: this block's degree's group), ``recompute`` and ``splits`` (the
    recompute and overlap transforms)."""

    def __init__(self, config, index):
        super().__init__()
        rms = config.arch == "llama"
        self.attn_norm = Norm(config.hidden, rms=rms, eps=config.norm_eps)
        self.attn = Attention(config)
        self.mlp_norm = Norm(config.hidden, rms=rms, eps=config.norm_eps)
        self.moe = config.is_moe(index)
        if self.moe:  # Note [deterministic dropless routing]
            from ..parallel.expert.moe import MoEMLP  # only a build with experts ships moe.py

            self.mlp = MoEMLP(config, MLP)
        else:
            self.mlp = MLP(config)
        self.dropout = config.dropout
        self.index = index
        self.tp_group = None  # parallelize.tensor
        self.recompute, self.splits = "none", 1  # parallelize.recompute, parallelize.overlap

    @property
    def regions(self) -> tuple[Region, ...]:
        """Note [blocks as regions]: attention, then the MLP (an MoE MLP is one region, its
        dispatch, experts and combine inside ``moe.MoEMLP``)."""
        return (Region(self.attn_norm, self.attn, self.attn.o_proj), Region(self.mlp_norm, self.mlp, getattr(self.mlp, "down_proj", None)))

    def forward(self, x, delta=None, pending=False):  # (B, T, C), or (B, T/tp, C) under SP
        """The block on the residual stream ``x`` plus a pending ``delta`` (Note [pending
        residual]); ``pending``: give the new stream and the MLP's output not added yet,
        else their sum. Called as a module either way, so block hooks (ZeRO-3) run."""
        for region in self.regions:
            x, delta = region.run(x, delta, self.dropout, self.training)
        return (x, delta) if pending else settle(x, delta)
