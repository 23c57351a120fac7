"""GPT and Llama decoders, built sharded from a literal tensor-parallel plan.

Takes: a ``ModelConfig``, the tp group, whether sequence parallelism is on, and the
plan table of train.py (module-name pattern → style). Gives: the model; calling it
with tokens and targets (B, T) returns the mean loss. Module and parameter names are
the same in every layout (``layers.0.attn.q_proj.weight`` …).

Parameters are initialized per Note [counter-based init] (param_init.py): each rank
generates only its shard from (seed, name, element index), so every layout equals one rank. Each
built stage is checked against the model description (``model_desc.py``: modules,
shapes, per-rank counts; ``check_parameter_count``).

Choices: GPT is GPT-2 (LayerNorm with bias, GeLU with the tanh approximation as in
GPT-2, biases everywhere, learned positions); Llama has RMSNorm, SwiGLU and rotary
positions with no biases. Attention is ``scaled_dot_product_attention(is_causal=True)``
over separate q/k/v projections, so column sharding splits whole heads.

Note [sequence-parallel gradients]: under sequence parallelism each rank runs the
norms, the row-parallel bias adds and (gpt) its rows of ``pos_embed`` on its own
sequence shard only, so those replicated parameters get partial gradients; they are
tagged ``sequence_parallel`` and ``allreduce_sequence_parallel_grads`` sums them.
Every other gradient is whole: column-parallel layers and the head all-gather their
input over T (backward: reduce-scatter), and a replicated embedding's output is
split over T (backward: all-gather).

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

import contextlib
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from torch.utils.checkpoint import checkpoint

from ..distributed.comm import (
    all_gather_from_group,
    exposed,
    copy_to_group,
    gather_from_group,
    reduce_from_group,
    group_rank,
    group_size,
    scatter_to_group,
)
from ..parallel.tensor.layers import (
    ColumnParallelLinear,
    RowParallelLinear,
    VocabParallelEmbedding,
    project,
    vocab_parallel_cross_entropy,
)
from ..layout.rule_engine import per_layer
from ..kernels import select as select_kernels
from ..layout.kernel_sizes import kinds_that_pay
from ..kernels.dispatch import compiled_pays
from ..layout.model_desc import ModelConfig, describe  # noqa: F401  (ModelConfig: re-exported for train.py)
from .param_init import initialize, materialize_on
from .residual import settle
from ..layout.placement import chunk_stages
from ..parallel.tensor.tp_plan import TensorParallelPlan

RECOMPUTE = ("none", "selective", "full")


class _Builder:
    """Hands out the layer for each module name, as the checked plan says; under 2D
    tensor parallelism (``grid``) the layers of ``layers2d.py``."""

    def __init__(self, plan: TensorParallelPlan, tp_group, sequence_parallel, grid=None):
        self.plan, self.group, self.sp, self.grid = plan, tp_group, sequence_parallel, grid

    def norm(self, hidden, *, rms, eps):
        if self.grid is not None:
            from ..parallel.tensor.layers2d import Norm2D  # only a 2D build ships layers2d.py

            return Norm2D(hidden, rms=rms, eps=eps, grid=self.grid, sequence_parallel=self.sp)
        return Norm(hidden, rms=rms, eps=eps, sequence_parallel=self.sp)

    def style(self, name):
        return self.plan.style(name)

    def linear(self, name, in_features, out_features, bias, head_rows=None):
        """``head_rows``: a head's rows (k_proj, v_proj), so tp > kv_heads replicates heads (Note [KV replication])."""
        style = self.plan.style(name)
        if self.grid is not None and style in ("colwise", "rowwise"):
            from ..parallel.tensor.layers2d import Linear2D

            return Linear2D(in_features, out_features, bias=bias, grid=self.grid, style=style,
                            sequence_parallel=self.sp)
        if style == "colwise":
            return ColumnParallelLinear(in_features, out_features, bias=bias, tp_group=self.group,
                                        sequence_parallel=self.sp, head_rows=head_rows)
        if style == "rowwise":
            return RowParallelLinear(in_features, out_features, bias=bias, tp_group=self.group, sequence_parallel=self.sp)
        return nn.Linear(in_features, out_features, bias=bias)


class Norm(nn.Module):
    """LayerNorm (gpt, with bias) or RMSNorm (llama); replicated over tp."""

    fused = None  # the compiled ops (kernels.select), set by use_kernels; None: plain PyTorch
    fused_add = None  # the same for the residual add before the norm in one kernel (add_norm)

    def __init__(self, hidden, *, rms, eps, sequence_parallel):
        super().__init__()
        self.rms, self.eps = rms, eps
        self.weight = nn.Parameter(torch.ones(hidden))
        self.bias = None if rms else nn.Parameter(torch.zeros(hidden))
        for p in self.parameters():
            p.sequence_parallel = sequence_parallel  # sees only a sequence shard under SP

    def forward(self, x):
        if self.fused is not None:
            if self.rms:
                return self.fused.rms_norm(x, self.weight, self.eps)
            return self.fused.layer_norm(x, self.weight, self.bias, self.eps)
        if self.rms:
            return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)
        return F.layer_norm(x, (x.shape[-1],), self.weight, self.bias, self.eps)

    def add_norm(self, x, residual):
        """(norm(h), h) with h = residual + x, the new residual stream: one kernel with the
        compiled ops (Note [fused residual norm] in kernels/add_norm.py), else the add and
        the norm. Elementwise per row, so it runs as well on a sequence shard (SP)."""
        if self.fused_add is not None:
            if self.rms:
                return self.fused_add.add_rms_norm(x, residual, self.weight, self.eps)
            return self.fused_add.add_layer_norm(x, residual, self.weight, self.bias, self.eps)
        h = residual + x
        return self(h), h


def rotary(x, theta, start=0):
    """Rotate (B, heads, T, D) by position start .. start + T - 1 (pairs of halves, as in Llama)."""
    T, D = x.shape[-2], x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, D, 2, dtype=torch.float32, device=x.device) / D))
    angles = torch.outer(torch.arange(start, start + T, dtype=torch.float32, device=x.device), inv)
    cos, sin = angles.cos().repeat(1, 2), angles.sin().repeat(1, 2)  # (T, D)
    first, second = x.chunk(2, dim=-1)
    rotated = x * cos + torch.cat((-second, first), dim=-1) * sin  # fp32 (cos, sin are)
    return rotated.to(x.dtype)  # bf16/fp16 parameters: back to the compute dtype


class Attention(nn.Module):
    fused = None  # see Norm

    def __init__(self, config, prefix, build):
        super().__init__()
        bias = config.arch == "gpt"
        C, D = config.hidden, config.hidden // config.heads
        self.head_dim, self.llama, self.theta = D, config.arch == "llama", config.rope_theta
        self.q_proj = build.linear(f"{prefix}.q_proj", C, config.heads * D, bias)
        self.k_proj = build.linear(f"{prefix}.k_proj", C, config.kv_heads * D, bias, head_rows=D)
        self.v_proj = build.linear(f"{prefix}.v_proj", C, config.kv_heads * D, bias, head_rows=D)
        self.o_proj = build.linear(f"{prefix}.o_proj", config.heads * D, C, bias)
        self.dropout = config.dropout
        self.selective = False  # set by Transformer for recompute = "selective"
        self.context = None  # context.ContextParallel under cp > 1, set by Transformer
        self.slices = None  # terapipe.SliceState under schedule = terapipe, set by the executor

    def core(self, q, k, v):
        """softmax(q kᵀ / √D) v: the part selective recompute drops and redoes.

        Under cp = ring or allgather, q, k, v hold this rank's T/cp tokens: they are
        rotated at their global positions (``context.spans``), then ring attention runs or
        k and v are gathered (Note [context-parallel attention])."""
        if self.slices is not None and self.slices.current is not None:
            return self.slices.attend(self, q, k, v)  # a token slice (terapipe.py)
        kind = None if self.context is None else self.context.kind
        spans = self.context.spans(q.shape[-2]) if kind in ("ring", "allgather") else ((0, q.shape[-2]),)
        if self.llama:
            q, k = self.rotate(q, k, spans)
        if kind == "ring":
            if self.dropout and self.training:  # constraints.ring_dropout refuses this spec
                raise ValueError("cp_kind = ring computes attention without dropout; set model.dropout = 0")
            return self.context.ring(q, k, v, self.fused)  # the compiled block attention, or eager
        mask = None
        if kind == "allgather":
            k, v = self.context.gather(k), self.context.gather(v)  # (B, kv_heads/tp, T, D)
            mask = self.context.causal_mask(q.shape[-2], q.device)  # global positions
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=mask is None, enable_gqa=q.shape[1] != k.shape[1],
            dropout_p=self.dropout if self.training else 0.0,
        )

    def rotate(self, q, k, spans):
        """Rotary positions for (B, heads, T, D) q and k whose tokens are the runs ``spans``
        of global positions, each run rotated at its own start."""
        def one_run(q, k, start):
            if self.fused is not None:
                return self.fused.rotary(q, k, self.theta, start)
            return rotary(q, self.theta, start), rotary(k, self.theta, start)

        if len(spans) == 1:
            return one_run(q, k, spans[0][0])
        sizes = [stop - start for start, stop in spans]
        runs = [one_run(qs, ks, start) for qs, ks, (start, _) in
                zip(q.split(sizes, dim=2), k.split(sizes, dim=2), spans)]
        return torch.cat([r[0] for r in runs], dim=2), torch.cat([r[1] for r in runs], dim=2)

    def mix(self, q, k, v):
        """Projections (B, T, heads/tp · D) → attention output (B, T, heads/tp · D), before o_proj.

        Splits the heads, runs the core (checkpointed under selective recompute) and
        joins them again; overlap.py calls it for each sub-batch too.
        """
        B, T = q.shape[:2]
        q, k, v = (t.view(B, T, -1, self.head_dim).transpose(1, 2) for t in (q, k, v))
        ulysses = self.context is not None and self.context.kind == "ulysses"
        if ulysses:  # (B, heads/tp, T/cp, D) → (B, heads/(tp·cp), T, D)
            q, k, v = (self.context.to_heads(t) for t in (q, k, v))
        if self.selective and torch.is_grad_enabled():
            y = checkpoint(self.core, q, k, v, use_reentrant=False)
        else:
            y = self.core(q, k, v)
        if ulysses:  # back to this rank's tokens, all of its tp heads
            y = self.context.to_sequence(y)
        return y.transpose(1, 2).reshape(B, T, -1)

    @property
    def columns(self):
        """The projections that open the region, in the order ``inner`` takes their outputs."""
        return (self.q_proj, self.k_proj, self.v_proj)

    def inner(self, q, k, v):
        """Between the column projections and o_proj: the attention itself."""
        return self.mix(q, k, v)

    def forward(self, x):
        # q: (B, T, heads/tp · D); k, v: (B, T, kv_heads/tp · D); x enters the tp region once
        return self.o_proj(self.inner(*project(x, self.columns)))


class MLP(nn.Module):
    fused = None  # see Norm

    def __init__(self, config, prefix, build, ffn=None):
        super().__init__()
        self.llama = config.arch == "llama"
        bias, ffn = not self.llama, ffn or config.ffn  # ffn: the shared experts' (moe.py)
        self.width = ffn  # global (unsharded): use_kernels decides by it
        if self.llama:
            self.gate_proj = build.linear(f"{prefix}.gate_proj", config.hidden, ffn, bias)
        self.up_proj = build.linear(f"{prefix}.up_proj", config.hidden, ffn, bias)
        self.down_proj = build.linear(f"{prefix}.down_proj", ffn, config.hidden, bias)

    def activation(self, up, gate=None):
        """SwiGLU silu(gate) · up (llama) or GeLU(up) (gpt, tanh approximation; up_proj added the bias)."""
        if self.fused is not None:
            return self.fused.swiglu(gate, up) if self.llama else self.fused.bias_gelu(up)
        if self.llama:
            return F.silu(gate) * up
        return F.gelu(up, approximate="tanh")

    @property
    def columns(self):
        """The projections that open the region, in the order ``inner`` takes their outputs."""
        return (self.gate_proj, self.up_proj) if self.llama else (self.up_proj,)

    def inner(self, *projected):
        """Between the column projections and down_proj: SwiGLU(gate, up) or GeLU(up)."""
        if self.llama:
            gate, up = projected
            return self.activation(up, gate)
        return self.activation(*projected)

    def forward(self, x):
        return self.down_proj(self.inner(*project(x, self.columns)))


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

    def forward(self, x, dropout: float, training: bool):
        return x + F.dropout(self.body(self.norm(x)), dropout, training)

    def run(self, h, delta, dropout: float, training: bool):
        """Note [pending residual]: the region on residual stream ``h`` whose previous
        region's output ``delta`` is not added yet (None: it is); gives the new stream and
        this region's output, not added either: the next norm adds it (``Norm.add_norm``)."""
        y, h = (self.norm(h), h) if delta is None else self.norm.add_norm(delta, h)
        return h, F.dropout(self.body(y), dropout, training)


class Block(nn.Module):
    def __init__(self, config, index, build, sp, recompute="none", sub_batches=1, ep_group=None, etp_group=None):
        super().__init__()
        prefix, rms = f"layers.{index}", config.arch == "llama"
        self.attn_norm = build.norm(config.hidden, rms=rms, eps=config.norm_eps)
        self.attn = Attention(config, f"{prefix}.attn", build)
        self.mlp_norm = build.norm(config.hidden, rms=rms, eps=config.norm_eps)
        self.moe = config.is_moe(index)
        if self.moe:  # Note [deterministic dropless routing]
            from ..parallel.expert.moe import MoEMLP  # only a build with experts ships moe.py

            self.mlp = MoEMLP(config, f"{prefix}.mlp", build, MLP, ep_group=ep_group, etp_group=etp_group)
            self.mlp.splits = sub_batches  # the expert all-to-alls overlap per sub-batch
        else:
            self.mlp = MLP(config, f"{prefix}.mlp", build)
        self.dropout = config.dropout
        self.recompute, self.sub_batches = recompute, sub_batches  # this block's own layout
        self.index = index
        self.attn.selective = recompute == "selective"

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


class Transformer(nn.Module):
    """The model, or one pipeline stage of it: blocks ``layers = (start, stop)``.

    The first stage (``first``) embeds tokens; the last (``last``) applies the final
    norm and the head and returns the mean loss; a stage in between maps hidden
    states to hidden states. Names stay global (``layers.5.attn.q_proj.weight``) in
    every stage, so initialization and checkpoints see one model.

    Note [tied embeddings across stages]: when the embedding is tied to the head and
    they sit on different stages, the last stage holds a copy of the embedding table
    as its head, initialized from ``embed.weight``; its parameter is tagged
    ``pipeline_duplicate`` (counted once in the gradient norm) and the two copies'
    gradients are summed over the embedding group after backward
    (``pipeline.allreduce_tied_grads``), so they stay equal, as Megatron does. Both
    copies are tagged ``tied_across_stages``: whoever reduces gradients during
    backward (ZeRO-2) must leave them until that sum is done.
    """

    fused = None  # see Norm: the loss's cross-entropy kernels
    compute_dtype = None  # bf16/fp16 parameters (master.py, Note [master weights]); None: fp32

    def __init__(
        self, config, *, tp_group, sequence_parallel, tp_plan, recompute="none",
        layers=None, first=True, last=True, sub_batches=1, cp_group=None, cp_kind=None, ep_group=None, etp_group=None,
        layouts=None, tp_grid=None,
    ):
        super().__init__()
        recompute = per_layer(recompute, config.layers, "recompute")
        sub_batches = per_layer(sub_batches, config.layers, "sub_batches")
        if any(mode not in RECOMPUTE for mode in recompute):
            raise ValueError(f"recompute must be one of {RECOMPUTE} (or one per layer), not {recompute!r}")
        if any(int(k) < 1 for k in sub_batches):
            raise ValueError(f"sub_batches must be at least 1, not {sub_batches!r}")
        start, stop = (0, config.layers) if layers is None else layers
        if not 0 <= start <= stop <= config.layers:
            raise ValueError(f"stage layers [{start}, {stop}) are outside 0..{config.layers}")
        self.config, self.tp_group, self.sp = config, tp_group, bool(sequence_parallel)
        self.context = None  # Note [context-parallel attention]: this rank's T/cp tokens
        self.slices = None  # terapipe.SliceState under schedule = terapipe, set by the executor
        if group_size(cp_group) > 1:
            from ..parallel.context.context import ContextParallel  # only a build with cp > 1 ships context.py

            self.context = ContextParallel(cp_group, cp_kind)
        self.first, self.last = bool(first), bool(last)
        # Note [heterogeneous layouts] (hetero.py): each block its own tp degree, or all the same
        self.layouts = layouts
        block_tp = (group_size(tp_group),) * config.layers if layouts is None else layouts.layer_tp
        self.block_tp = {i: block_tp[i] for i in range(start, stop)}
        builders, plans = {}, {}
        for t in sorted(set(self.block_tp.values()) | {block_tp[start if start < stop else 0]}):
            group = tp_group if layouts is None else layouts.tp_group(t)
            plans[t] = TensorParallelPlan(tp_plan, config, tp_group=group, sequence_parallel=self.sp, grid=tp_grid)
            builders[t] = _Builder(plans[t], group, self.sp, tp_grid)
        # the embedding follows block 0, the head the last block (the embedding, when tied to it)
        self.embed_tp = block_tp[0]
        self.head_tp = self.embed_tp if config.tie_embeddings and self.first else block_tp[-1]
        if layouts is not None:
            tp_group = layouts.tp_group(self.embed_tp if self.first else block_tp[start])
            self.head_group = layouts.tp_group(self.head_tp)
            for t in (self.embed_tp, self.head_tp):
                if t not in builders:
                    group = layouts.tp_group(t)
                    plans[t] = TensorParallelPlan(tp_plan, config, tp_group=group, sequence_parallel=self.sp)
                    builders[t] = _Builder(plans[t], group, self.sp)
        else:
            self.head_group = tp_group
        self.tp_group, self.tp_grid = tp_group, tp_grid  # Note [2D tensor parallelism]: the grid, or None
        build = builders[self.embed_tp]
        plan = plans[self.embed_tp]
        if tp_grid is not None:  # the hidden state is split over R: no layer may stay whole
            whole = [m.name for m in describe(config).modules if m.style and plan.style(m.name) is None]
            if whole:
                raise ValueError(f"tp plan: 2D tensor parallelism (TP_SHAPE) splits every layer, but "
                                 f"{', '.join(whole[:3])} {'is' if len(whole) == 1 else 'are'} replicated")
        self._styles = {t: p.styles for t, p in plans.items()}  # check_parameter_count's, by degree
        V, C = config.padded_vocab, config.hidden
        self.vocab_parallel_embed = build.style("embed") == "vocab"
        # the head's own degree's plan (per-layer layouts: an untied head at tp 2 after an embedding at tp 1)
        self.vocab_parallel = builders[self.head_tp].style("head") == "vocab_head"
        if self.first and tp_grid is not None:
            from ..parallel.tensor.layers2d import Embedding2D, Positions2D

            self.embed = Embedding2D(V, C, grid=tp_grid, sequence_parallel=self.sp)
            if config.arch == "gpt":
                self.pos_embed = Positions2D(config.seq_len, C, grid=tp_grid, sequence_parallel=self.sp)
        elif self.first:
            if self.vocab_parallel_embed:
                self.embed = VocabParallelEmbedding(V, C, tp_group=tp_group, sequence_parallel=self.sp)
            else:
                self.embed = nn.Embedding(V, C)
            if config.arch == "gpt":
                self.pos_embed = nn.Embedding(config.seq_len, C)
                self.pos_embed.weight.sequence_parallel = self.sp
        self.layers = nn.ModuleDict({
            str(i): Block(config, i, builders[self.block_tp[i]], self.sp, recompute[i], int(sub_batches[i]), ep_group,
                etp_group)
            for i in range(start, stop)
        })
        for block in self.layers.values():
            block.attn.context = self.context
            if block.moe and self.context is not None:  # Note [MoE under context parallelism] (moe.py)
                block.mlp.context_group = self.context.group
        if self.last:
            self.final_norm = build.norm(C, rms=config.arch == "llama", eps=config.norm_eps)
            if tp_grid is not None and (not config.tie_embeddings or not self.first):
                from ..parallel.tensor.layers2d import Linear2D

                self.head = Linear2D(C, V, bias=False, grid=tp_grid, style="colwise",  # logits (B, T, V/C)
                                     sequence_parallel=self.sp)
                if config.tie_embeddings:  # Note [tied embeddings across stages]
                    self.head.init_name = "embed"
                    self.head.weight.pipeline_duplicate = True
                    self.head.weight.tied_across_stages = True
            elif not config.tie_embeddings or not self.first:
                rows = V // group_size(self.head_group) if self.vocab_parallel else V
                self.head = nn.Linear(C, rows, bias=False)
                self.head.full_shape = (V, C)
                if config.tie_embeddings:  # Note [tied embeddings across stages]
                    self.head.init_name = "embed"
                    self.head.weight.pipeline_duplicate = True
                    self.head.weight.tied_across_stages = True
                if self.vocab_parallel and group_size(self.head_group) > 1:
                    self.head.weight.tensor_parallel = True
                    self.head.tp_group = self.head_group  # where its shard starts (checkpoint_shards.py)
        if self.first and not self.last and config.tie_embeddings:
            self.embed.weight.tied_across_stages = True  # its grad is summed with the head copy's
        self.ep_group, self.etp_group = ep_group, etp_group  # moe.py's expert-parallel ranks (Note [expert dispatch])
        if layouts is not None:
            self._tag_layouts()
        check_parameter_count(self, sharded=plan.styles, layers=(start, stop))

    def _tag_layouts(self):
        """Each parameter's ``layer_tp``: the degree of the layer it belongs to (hetero.py)."""
        for name, p in self.named_parameters():
            if name.startswith("layers."):
                p.layer_tp = self.block_tp[int(name.split(".")[1])]
            elif name.startswith(("embed.", "pos_embed.")):
                p.layer_tp = self.embed_tp
            else:  # final_norm, head
                p.layer_tp = self.head_tp

    def run_blocks(self, x):
        """The transformer blocks of this model (or pipeline stage), in order, each with its
        own layout: runs of neighbouring blocks with the same sub-batches k > 1 go through
        ``overlap.run_blocks`` together (Note [the sub-batch schedule]); the others one by one."""
        return settle(*self.walk_blocks(x))

    def walk_blocks(self, x):
        """``run_blocks`` but giving (stream, pending delta), Note [pending residual]: the
        last block's MLP output is left for the final norm to add."""
        blocks = list(self.layers.values())
        delta = None
        # each block's tp degree: a block at tp 1 has no tp collective to hide and runs unsplit
        # (Note [heterogeneous layouts]: its own degree under per-layer layouts)
        degrees = [group_size(self.tp_group) if self.layouts is None else self.block_tp[int(block.index)]
                   for block in blocks]
        # a MoE block splits its own sub-batches, for the expert all-to-alls (moe_overlap.py)
        walked = [(block.sub_batches if t > 1 and not block.moe else 1, t) for block, t in zip(blocks, degrees)]
        start = 0
        while start < len(blocks):
            k, t = walked[start]
            stop = start + 1
            while stop < len(blocks) and walked[stop] == (k, t):
                stop += 1
            if k > 1:
                from ..parallel.tensor import overlap  # only a build that overlaps ships overlap.py

                group = self.tp_group if self.layouts is None else self.layouts.tp_group(t)
                if self.layouts is not None:  # into the run's layout (hetero.py): the stream whole
                    x, delta = self.reshard(settle(x, delta), blocks[start]), None
                x, delta = overlap.run_blocks(self, x, k, blocks[start:stop], delta, group=group)
            else:
                for layer in blocks[start:stop]:
                    if layer.recompute == "full" and torch.is_grad_enabled():
                        # Keep only the block's input; rerun the block (its collectives too) in backward.
                        x, delta = checkpoint(layer, self.reshard(settle(x, delta), layer), use_reentrant=False), None
                    elif self.layouts is not None:  # the stream is resharded whole
                        x, delta = layer(self.reshard(settle(x, delta), layer), pending=True)
                    else:
                        x, delta = layer(x, delta, pending=True)
            start = stop
        return x, delta

    def reshard(self, x, layer=None):
        """Activations into ``layer``'s layout (the head's when None), from the previous one's."""
        if self.layouts is None:
            return x
        t = self.head_tp if layer is None else self.block_tp[int(layer.index)]
        x = self.layouts.reshard(x, self._current_tp, t, sequence_parallel=self.sp)
        self._current_tp = t
        return x

    def sequence_rank(self) -> int:
        """Which T/tp shard of the sequence this rank holds under sp: its tp rank, or on a
        2D grid its column c (Note [2D sequence parallelism] in layers2d.py)."""
        return group_rank(self.tp_group) if self.tp_grid is None else self.tp_grid.col

    def head_weight(self):
        return self.embed.weight if self.config.tie_embeddings and self.first else self.head.weight

    def tied_weight(self):
        """This stage's copy of the tied embedding table, or None (Note [tied embeddings across stages])."""
        if not self.config.tie_embeddings or self.first == self.last:
            return None
        return self.embed.weight if self.first else self.head.weight

    def embed_tokens(self, tokens):
        if tokens.shape[1] > self.config.seq_len:
            raise ValueError(f"sequence of {tokens.shape[1]} tokens is longer than seq_len = {self.config.seq_len}")
        x = self.embed(tokens)  # (B, T, C), or (B, T/tp, C) under SP
        if self.sp and not self.vocab_parallel_embed:
            x = scatter_to_group(x, self.tp_group, 1)  # replicated table: keep our shard of T
        if self.config.arch == "gpt":
            T = x.shape[1]
            offset = self.sequence_rank() * T if self.sp else 0  # this shard's positions
            if self.slices is not None:
                offset += self.slices.start  # a token slice under terapipe (terapipe.py)
            if self.context is None:
                x = x + self.pos_embed.weight[offset : offset + T]
            else:  # this cp rank's tokens (its spans of seq_len), this tp shard of them under SP
                positions = self.context.positions(tokens.shape[1], x.device)[offset : offset + T]
                x = x + self.pos_embed.weight[positions]
        return F.dropout(x, self.config.dropout, self.training)

    def loss(self, x, targets, delta=None):
        """Mean loss of the stream ``x`` plus the last block's pending ``delta`` (Note [pending residual])."""
        x = self.final_norm(x) if delta is None else self.final_norm.add_norm(delta, x)[0]
        if self.tp_grid is not None:  # Note [2D tensor parallelism]: a colwise head, the loss over a row
            from ..parallel.tensor.layers2d import enter_row

            grid = self.tp_grid
            x = enter_row(x, grid, self.sp)  # (B, T, C/R); under sp gathered over the row (Note [2D sequence parallelism])
            logits = reduce_from_group(F.linear(x, self.head_weight()), grid.column_group)  # (B, T, V/C)
            loss = vocab_parallel_cross_entropy(
                logits, targets, tp_group=grid.row_group, vocab_size=self.config.vocab, kernels=self.fused
            )
        elif self.vocab_parallel:
            x = all_gather_from_group(x, self.head_group, 1) if self.sp else copy_to_group(x, self.head_group)
            logits = F.linear(x, self.head_weight())  # (B, T, V/tp)
            loss = vocab_parallel_cross_entropy(
                logits, targets, tp_group=self.head_group, vocab_size=self.config.vocab, kernels=self.fused
            )
        else:
            if self.sp:
                x = gather_from_group(x, self.head_group, 1)
            logits = F.linear(x, self.head_weight())  # (B, T, V)
            loss = vocab_parallel_cross_entropy(
                logits, targets, tp_group=None, vocab_size=self.config.vocab, kernels=self.fused
            )
        return loss.mean()

    def forward(self, x, targets=None):
        """Tokens (first stage) or hidden states → hidden states, or the mean loss (last stage)."""
        if self.layouts is not None:  # Note [heterogeneous layouts]: tokens come in the coarse layout
            self._current_tp = self.embed_tp if self.first else self.block_tp[min(self.block_tp)]
            if self.first:
                x = self.layouts.split_inputs(x, self.embed_tp)
        if self.first:
            x = self.embed_tokens(x)
        elif self.compute_dtype is not None:
            x = x.to(self.compute_dtype)  # a stage's input arrives in fp32 (pipeline.py)
        x, delta = self.walk_blocks(x)
        if not self.last:
            return settle(x, delta)
        if self.layouts is None:
            return self.loss(x, targets, delta)
        x = self.reshard(settle(x, delta))
        loss = self.loss(x, self.layouts.split_inputs(targets, self.head_tp))
        return self.layouts.coarse_loss(loss, self.head_tp)


def check_parameter_count(model: Transformer, *, sharded, layers) -> None:
    """Raise unless this stage holds exactly the parameters model_desc.py describes for it
    (``sharded``: the modules split over tp), so the model and its description cannot drift."""
    tp = group_size(model.tp_group)
    desc, ep = describe(model.config), group_size(model.ep_group) * group_size(model.etp_group)
    if model.tp_grid is not None:  # Note [2D tensor parallelism]: each value counted once over the grid
        expected = desc.stage_params(1, layers=layers, first=model.first, last=model.last, sharded={}, ep=ep)
        params = list(model.parameters())
        built = sum(p.numel() * tp // getattr(p, "tp_copies", tp) for p in params)
        if (built, len(params)) != (expected.elements, expected.tensors):
            raise RuntimeError(
                f"internal error in parc (runtime model): the tp grid {model.tp_grid.rows}×{model.tp_grid.cols} "
                f"holds {built:,} parameters in {len(params)} tensors per rank, but model_desc.py describes "
                f"{expected.elements:,} in {expected.tensors} for layers {layers[0]}..{layers[1]}"
            )
        return
    if model.layouts is None:
        expected = desc.stage_params(tp, layers=layers, first=model.first, last=model.last, sharded=sharded, ep=ep)
    else:  # Note [heterogeneous layouts]: each block, the embedding and the head at their own degree
        start = layers[0]
        styles = model._styles
        parts = [desc.stage_params(t, layers=(i, i + 1), first=False, last=False, sharded=styles[t], ep=ep)
                 for i, t in model.block_tp.items()]
        e, h = model.embed_tp, model.head_tp
        if e == h:
            parts.append(desc.stage_params(e, layers=(start, start), first=model.first, last=model.last,
                                           sharded=styles[e]))
        else:
            parts.append(desc.stage_params(e, layers=(start, start), first=model.first, last=False, sharded=styles[e]))
            parts.append(desc.stage_params(h, layers=(start, start), first=False, last=model.last, sharded=styles[h]))
        expected = type(parts[0])(elements=sum(p.elements for p in parts), tensors=sum(p.tensors for p in parts))
        tp = model.block_tp
    params = list(model.parameters())
    built = sum(p.numel() for p in params)
    if (built, len(params)) != (expected.elements, expected.tensors):
        raise RuntimeError(
            f"internal error in parc (runtime model): this rank built {built:,} parameters in "
            f"{len(params)} tensors, but model_desc.py describes {expected.elements:,} in "
            f"{expected.tensors} for layers {layers[0]}..{layers[1]} (first={model.first}, "
            f"last={model.last}, tp={tp}): runtime/models/model.py and runtime/layout/model_desc.py disagree"
        )


def use_kernels(model: nn.Module, kernels: str, device, fuse_residual: bool = True) -> nn.Module:
    """Route the norms, MLP activations, rotary, loss and the experts' permutation, combine
    and grouped GEMM (moe.py) to ``kernels``: "compiled" or "eager".

    "compiled" uses runtime/kernels' fused ops for ``device`` (C++ on CPU, Triton on
    CUDA) unless they cannot be had, in which case one line on stderr says so and the
    model stays eager; each residual add then runs inside the norm after it
    (``Norm.add_norm``) unless ``fuse_residual`` is False (a test compares the two).
    The norms, the residual norms, the activation and rotary each take the kernels only
    where they beat eager PyTorch at the model's size, chosen once here from its global
    shapes (Note [eager at small shapes] in kernels/dispatch.py). "eager" keeps plain
    PyTorch.
    """
    fused = select_kernels(kernels, device)
    config = next((m.config for m in model.modules() if isinstance(m, Transformer)), None)

    # the kinds that pay at this model's global size (kernel_sizes.py: the planner reads the same)
    taken = None if config is None else kinds_that_pay(config, cpu=torch.device(device).type == "cpu")

    def paying(kind, width=None):  # the ops if they pay at this model's size, else None (eager)
        if fused is None or config is None:
            return fused
        if width is None:
            return fused if kind in taken else None
        return fused if compiled_pays(kind, config.seq_len * width, device) else None

    for module in model.modules():
        if isinstance(module, Norm):
            norm = "rms_norm" if module.rms else "layer_norm"
            module.fused = paying(norm)
            module.fused_add = paying(f"add_{norm}") if fuse_residual else None
        elif isinstance(module, MLP):  # a dense MLP, or the shared experts (shared_experts · expert_ffn wide)
            module.fused = paying("swiglu" if module.llama else "bias_gelu", module.width)
        elif isinstance(module, Attention) and module.context is None:  # ring attention keeps its kernel
            module.fused = paying("rotary")
        # moe.py's modules say so themselves (a dense build does not ship moe.py)
        elif isinstance(module, (Attention, Transformer)) or getattr(module, "uses_kernels", False):
            module.fused = fused
    return model


def build_model(
    config, *, tp_group, sequence_parallel, tp_plan, seed, device, recompute="none", sub_batches=1,
    kernels="compiled", cp_group=None, cp_kind=None, ep_group=None, etp_group=None, layouts=None, materialize=True,
    tp_grid=None, init_on_device=None,
):
    """The model for this rank: built from the plan, initialized per Note [counter-based init].

    ``recompute``: "none"; "selective" (attention core recomputed in backward);
    "full" (each block recomputed from its input) — one mode, or a sequence with one
    per layer. ``sub_batches`` > 1: each micro-batch's blocks run as that many
    sub-batches whose tensor-parallel collectives overlap compute (``overlap.py``);
    one number, or one per layer. ``layouts``: a ``hetero.StageLayouts`` when the blocks
    have different tp degrees (Note [heterogeneous layouts]). ``kernels``: see ``use_kernels``. ``cp_group``: the
    ranks that split each sequence (``context.py``), ``cp_kind`` how attention sees it.
    ``materialize=False`` (ZeRO-3): the parameters stay on the meta device, without
    values, until ``fsdp.FullyShardedAdamW`` generates each rank's slice of them.
    ``tp_grid``: the R × C grid of the tp ranks under 2D tensor parallelism (``Mesh.tp_grid``,
    Note [2D tensor parallelism] in layers2d.py); None: 1D.
    """
    on_meta = not materialize or _generate_on(device, init_on_device)
    with torch.device("meta") if on_meta else contextlib.nullcontext():
        model = Transformer(
            config, tp_group=tp_group, sequence_parallel=sequence_parallel, tp_plan=tp_plan,
            recompute=recompute, sub_batches=sub_batches, cp_group=cp_group, cp_kind=cp_kind, ep_group=ep_group, etp_group=etp_group,
            layouts=layouts, tp_grid=tp_grid,
        )
    return _initialized(model, seed, device, kernels, materialize, init_on_device)


def _generate_on(device, init_on_device) -> bool:
    """Generate the initial values on ``device`` itself (param_init.materialize_on): by
    default on CUDA; ``init_on_device`` forces it either way (the CPU tests run it)."""
    return torch.device(device).type == "cuda" if init_on_device is None else bool(init_on_device)


def _initialized(model, seed, device, kernels, materialize, init_on_device=None):
    """Note [counter-based init]: this rank's shard generated now (on ``device`` itself
    where ``_generate_on`` says so), or (ZeRO-3) the seed and device kept for the
    optimizer that generates its slices."""
    if materialize and _generate_on(device, init_on_device):
        _check_meta_attributes(model)
        materialize_on(model, seed, device)
    elif materialize:
        initialize(model, seed)
        model = model.to(device)
    else:
        model.init_seed, model.init_device = seed, torch.device(device)
        _check_meta_attributes(model)
    return use_kernels(model, kernels, device)


def _check_meta_attributes(model) -> None:
    for module in model.modules():  # only parameters may wait on the meta device for their values
        for attr, value in vars(module).items():
            if isinstance(value, torch.Tensor) and value.is_meta:
                raise RuntimeError(f"internal error in parc (runtime model): {type(module).__name__}.{attr} "
                                   "was built on the meta device; make it on its device")


def build_stages(
    config, *, stages, pp_rank, pp_size, tp_group, sequence_parallel, tp_plan, seed, device,
    recompute="none", sub_batches=1, kernels="compiled", cp_group=None, cp_kind=None, ep_group=None, etp_group=None, layouts=None,
    placement="interleaved", materialize=True, tp_grid=None,
):
    """This pipeline rank's model chunks, one ``Transformer`` stage per chunk.

    ``stages`` is the literal ``PIPELINE_STAGES`` table of train.py: the layers
    ``(start, stop)`` of every virtual stage, in model order. With p pipeline ranks,
    chunk c of rank r is the virtual stage ``placement`` says (``placement.py``:
    Megatron's c·p + r, or ZB-V's V, or chimera's stage r and p-1-r of its two
    pipelines). Returns an ``nn.ModuleList`` of chunks, each with its ``stage_index``.

    Note [chimera's replicas]: under chimera every stage is built twice (on ranks r and
    p-1-r), from the same (seed, name) draws, so the replicas start equal; their
    gradients are summed (``pipeline.allreduce_replica_grads``) after backward, which
    makes them ``pipeline_replica`` late gradients (dp.py, Note [late gradients]), and
    the up pipeline's copy is a ``pipeline_duplicate``: counted once in the gradient
    norm, loaded but never saved by checkpoints.
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
        stage = build_stage(config, stages=stages, index=v, tp_group=tp_group, sequence_parallel=sequence_parallel,
                            tp_plan=tp_plan, seed=seed, device=device, recompute=recompute,
                            sub_batches=sub_batches, kernels=kernels, cp_group=cp_group, cp_kind=cp_kind,
                            ep_group=ep_group, etp_group=etp_group, layouts=layouts, materialize=materialize, tp_grid=tp_grid)
        stage.stage_index = v
        if placement == "chimera":  # Note [chimera's replicas]
            for param in stage.parameters():
                param.pipeline_replica = True
                if place.pipeline(chunk) == 1:
                    param.pipeline_duplicate = True
        chunks.append(stage)
    return chunks


def build_stage(config, *, stages, index, tp_group, sequence_parallel, tp_plan, seed, device, recompute,
                sub_batches=1, kernels="compiled", cp_group=None, cp_kind=None, ep_group=None, etp_group=None, layouts=None,
                materialize=True, tp_grid=None):
    on_meta = not materialize or _generate_on(device, None)
    with torch.device("meta") if on_meta else contextlib.nullcontext():
        model = Transformer(
            config, tp_group=tp_group, sequence_parallel=sequence_parallel, tp_plan=tp_plan,
            recompute=recompute, layers=stages[index], first=index == 0, last=index == len(stages) - 1,
            sub_batches=sub_batches, cp_group=cp_group, cp_kind=cp_kind, ep_group=ep_group, etp_group=etp_group,
            layouts=layouts, tp_grid=tp_grid,
        )
    return _initialized(model, seed, device, kernels, materialize)


def allreduce_sequence_parallel_grads(model: nn.Module, tp_group) -> None:
    """Sum over tp the grads of replicated parameters that saw only a sequence shard."""
    if group_size(tp_group) == 1:
        return
    grads = [p.grad for p in model.parameters() if getattr(p, "sequence_parallel", False) and p.grad is not None]
    if not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    with exposed():
        dist.all_reduce(flat, group=tp_group)
    offset = 0
    for g in grads:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()
