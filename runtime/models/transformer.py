"""GPT and Llama decoders, plain: the whole model (or one pipeline stage) on one device.

Takes: a ``ModelConfig`` and which blocks (a pipeline stage's ``layers = (start, stop)``).
Gives: ``Transformer``, whose forward takes tokens and targets (B, T) and returns the
mean loss; ``check_parameter_count``. Module and parameter names are the same in every
layout (``layers.0.attn.q_proj.weight`` …). Every layout is this model transformed by
``parallelize`` (tensor, context, experts, recompute, overlap, in that order): a
transform swaps layers and sets the layout attributes this file reads (``tp_group``,
``sp``, ``block_tp``, ``context`` …), which are the one-rank values until then.

Choices: GPT is GPT-2 (LayerNorm with bias, GeLU with the tanh approximation as in
GPT-2, biases everywhere, learned positions); Llama has RMSNorm, SwiGLU and rotary
positions with no biases. Attention is ``scaled_dot_product_attention(is_causal=True)``
over separate q/k/v projections, so column sharding splits whole heads.

Note [pending residual]: a region's output (after the row-parallel reduction, or its
reduce-scatter under SP) is not added to the residual stream at once: it travels as
``delta`` beside the stream ``h`` to the next norm, which adds it and normalizes in
one kernel (``Norm.add_norm``; Note [fused residual norm] in kernels/add_norm.py):
the block's MLP norm, the next block's attention norm, the final norm. The add is
elementwise per row, so a sequence shard (SP) fuses the same way. The stream is
settled (``settle``: the add alone) where it leaves the plain walk: the output of a
pipeline stage, the input of a block under ``recompute = full`` (it keeps one tensor),
a reshard between tp degrees (hetero.py). The sub-batch wavefront (overlap.py) carries
one pending delta per sub-batch the same way. Fused or not, the floats are the same
(tested).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from ..distributed.comm import copy_to_group, group_rank, group_size
from ..layout.model_desc import describe
from ..parallel.tensor.layers import vocab_parallel_cross_entropy
from .block import Block
from .norm import Norm
from .residual import settle


class Transformer(nn.Module):
    """The model, or one pipeline stage of it: blocks ``layers = (start, stop)``.

    The first stage (``first``) embeds tokens; the last (``last``) applies the final
    norm and the head and returns the mean loss; a stage in between maps hidden
    states to hidden states. Names stay global (``layers.5.attn.q_proj.weight``) in
    every stage, so initialization and checkpoints see one model. A pipeline's stages are
    ``pipeline_stages.Stage``s, which tie an embedding table across stages (Note [tied
    embeddings across stages] there).
    """

    fused = None  # see Norm: the loss's cross-entropy kernels
    compute_dtype = None  # bf16/fp16 parameters (master.py, Note [master weights]); None: fp32

    def __init__(self, config, *, layers=None, first=True, last=True):
        super().__init__()
        start, stop = (0, config.layers) if layers is None else layers
        if not 0 <= start <= stop <= config.layers:
            raise ValueError(f"stage layers [{start}, {stop}) are outside 0..{config.layers}")
        self.config, self.first, self.last, self.span = config, bool(first), bool(last), (start, stop)
        self.transforms = ()  # the transforms applied, in parallelize's order
        # the tensor transform's (parallelize.tensor): one rank, nothing split
        self.tp_group = self.head_group = self.tp_grid = self.layouts = None
        self.sp = self.vocab_parallel_embed = self.vocab_parallel = False
        self.block_tp, self.embed_tp, self.head_tp = {i: 1 for i in range(start, stop)}, 1, 1
        self.sharded, self._styles = {}, {1: {}}  # check_parameter_count's: split modules, by degree
        self.context = None  # Note [context-parallel attention]: this rank's T/cp tokens (parallelize.context)
        self.expert_split = 1  # how many ranks split the experts (parallelize.experts)
        self.slices = None  # a sliced pipeline's SliceState, set by its executor
        V, C = config.padded_vocab, config.hidden
        if self.first:
            self.embed = nn.Embedding(V, C)
            if config.arch == "gpt":
                self.pos_embed = nn.Embedding(config.seq_len, C)
        self.layers = nn.ModuleDict({str(i): Block(config, i) for i in range(start, stop)})
        if self.last:
            self.final_norm = Norm(C, rms=config.arch == "llama", eps=config.norm_eps)
            if not config.tie_embeddings or not self.first:
                self.head = nn.Linear(C, V, bias=False)
                self.head.full_shape = (V, C)
        self.tag_tied()
        self.documents = None  # documents.Documents under documents = separate (documents.attach)
        if config.documents == "separate":  # only such a build ships documents.py
            from .documents import attach as attach_documents

            attach_documents(self)

    def tag_tied(self):
        """The tags of an embedding table tied across pipeline stages, again after the tensor
        transform replaces the head: none on one stage (``pipeline_stages.Stage``'s)."""

    def walk_blocks(self, x):
        """The transformer blocks of this model (or pipeline stage), in order, each with its
        own layout: runs of neighbouring blocks with the same sub-batches k > 1 go through
        ``overlap.run_blocks`` together (Note [the sub-batch schedule]); the others one by one.
        Gives (stream, pending delta), Note [pending residual]: the last block's MLP output is
        left for the final norm to add."""
        blocks = list(self.layers.values())
        delta = None
        # each block's tp degree: a block at tp 1 has no tp collective to hide and runs unsplit
        # (Note [heterogeneous layouts]: its own degree under per-layer layouts)
        degrees = [self.block_tp[int(block.index)] for block in blocks]
        # a MoE block splits its own sub-batches, for the expert all-to-alls (moe_overlap.py)
        walked = [(block.splits if t > 1 and not block.moe else 1, t) for block, t in zip(blocks, degrees)]
        start = 0
        while start < len(blocks):
            k, t = walked[start]
            stop = start + 1
            while stop < len(blocks) and walked[stop] == (k, t):
                stop += 1
            if k > 1:
                from ..parallel.tensor import overlap  # only a build that overlaps ships overlap.py

                group = self.tp_group if self.layouts is None else self.layouts.tp_group(t)
                x, delta = self.enter(x, delta, blocks[start])  # into the run's layout
                x, delta = overlap.run_blocks(self, x, k, blocks[start:stop], delta, group=group)
            else:
                for layer in blocks[start:stop]:
                    if layer.recompute == "full" and torch.is_grad_enabled():
                        # Keep only the block's input; rerun the block (its collectives too) in backward.
                        x, delta = checkpoint(layer, settle(*self.enter(x, delta, layer)), use_reentrant=False), None
                    else:
                        x, delta = layer(*self.enter(x, delta, layer), pending=True)
            start = stop
        return x, delta

    def enter(self, x, delta, layer):
        """The stream and its pending delta as block ``layer`` takes them: as they are in one
        layout (per-layer layouts reshard the stream whole: sharding_layouts.Layered)."""
        return x, delta

    def sequence_rank(self) -> int:
        """Which T/tp shard of the sequence this rank holds under sp: its tp rank, or on a
        2D grid its column c (Note [2D sequence parallelism] in layers2d.py)."""
        return group_rank(self.tp_group) if self.tp_grid is None else self.tp_grid.col

    def head_weight(self):
        return self.embed.weight if self.config.tie_embeddings and self.first else self.head.weight

    def embed_tokens(self, tokens):
        if tokens.shape[1] > self.config.seq_len:
            raise ValueError(f"sequence of {tokens.shape[1]} tokens is longer than seq_len = {self.config.seq_len}")
        x = self.embed(tokens)  # (B, T, C), or (B, T/tp, C) under SP
        if self.sp and not self.vocab_parallel_embed:  # only a build under sp ships comm_scatter.py
            from ..distributed.comm_scatter import scatter_to_group

            x = scatter_to_group(x, self.tp_group, 1)  # replicated table: keep our shard of T
        if self.config.arch == "gpt":
            T = x.shape[1]
            offset = self.sequence_rank() * T if self.sp else 0  # this shard's positions
            if self.slices is not None:
                offset += self.slices.start  # a token slice of a sliced pipeline
            if self.context is None and self.documents is None:
                x = x + self.pos_embed.weight[offset : offset + T]
            else:  # this cp rank's tokens (its spans of seq_len), this tp shard of them under SP
                positions = (torch.arange(offset, offset + T, device=x.device) if self.context is None
                             else self.context.positions(tokens.shape[1], x.device)[offset : offset + T])
                if self.documents is not None:  # each token at its position within its document
                    positions = self.documents.positions(positions)
                x = x + self.pos_embed.weight[positions]
        return F.dropout(x, self.config.dropout, self.training)

    def loss(self, x, targets, delta=None):
        """Mean loss of the stream ``x`` plus the last block's pending ``delta`` (Note [pending residual])."""
        x = self.final_norm(x) if delta is None else self.final_norm.add_norm(delta, x)[0]
        if self.tp_grid is not None:  # Note [2D tensor parallelism]: a colwise head, the loss over a row
            from ..parallel.tensor.layers2d import grid_loss  # only a 2D build ships layers2d.py

            loss = grid_loss(self, x, targets)
        elif self.vocab_parallel:
            if self.sp:  # only a build under sp ships comm_scatter.py
                from ..distributed.comm_scatter import all_gather_from_group

                x = all_gather_from_group(x, self.head_group, 1)
            else:
                x = copy_to_group(x, self.head_group)
            logits = F.linear(x, self.head_weight())  # (B, T, V/tp)
            loss = vocab_parallel_cross_entropy(
                logits, targets, tp_group=self.head_group, vocab_size=self.config.vocab, kernels=self.fused
            )
        else:
            if self.sp:
                from ..distributed.comm_scatter import gather_from_group

                x = gather_from_group(x, self.head_group, 1)
            logits = F.linear(x, self.head_weight())  # (B, T, V)
            loss = vocab_parallel_cross_entropy(
                logits, targets, tp_group=None, vocab_size=self.config.vocab, kernels=self.fused
            )
        return loss.mean()

    def forward(self, x, targets=None, documents=None):
        """Tokens (first stage) or hidden states → hidden states, or the mean loss (last
        stage); ``documents``: the (B, T) document ids under documents = separate."""
        if documents is not None:  # for every block (Note [documents under recompute] in documents.py)
            self.documents.use(documents, x.device)
        if self.first:
            x = self.embed_tokens(x)
        elif self.compute_dtype is not None:
            x = x.to(self.compute_dtype)  # a stage's input arrives in fp32 (pipeline.py)
        x, delta = self.walk_blocks(x)
        if not self.last:
            return settle(x, delta)
        return self.loss(x, targets, delta)


def check_parameter_count(model: Transformer) -> None:
    """Raise unless this stage holds exactly the parameters model_desc.py describes for it
    (``sharded``: the modules split over tp), so the model and its description cannot drift."""
    sharded, layers = model.sharded, model.span
    tp = group_size(model.tp_group)
    desc, ep = describe(model.config), model.expert_split
    if model.tp_grid is not None:  # Note [2D tensor parallelism]: each value counted once over the grid
        from ..parallel.tensor.layers2d import check_grid_count

        return check_grid_count(model, desc.stage_params(1, layers=layers, first=model.first, last=model.last,
                                                         sharded={}, ep=ep))
    if model.layouts is None:
        expected = desc.stage_params(tp, layers=layers, first=model.first, last=model.last, sharded=sharded, ep=ep)
    else:  # Note [heterogeneous layouts]: each block, the embedding and the head at their own degree
        expected, tp = model.expected_params(desc, ep), model.block_tp  # sharding_layouts.Layered's
    params = list(model.parameters())
    built = sum(p.numel() for p in params)
    if (built, len(params)) != (expected.elements, expected.tensors):
        raise RuntimeError(
            f"internal error in parc (runtime model): this rank built {built:,} parameters in "
            f"{len(params)} tensors, but model_desc.py describes {expected.elements:,} in "
            f"{expected.tensors} for layers {layers[0]}..{layers[1]} (first={model.first}, "
            f"last={model.last}, tp={tp}): runtime/models/ and runtime/layout/model_desc.py disagree"
        )
