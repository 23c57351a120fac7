"""GPT and Llama decoders, built sharded from a literal tensor-parallel plan.

Takes: a ``ModelConfig``, the tp group, whether sequence parallelism is on, and the
plan table of train.py (module-name pattern → style). Gives: the model; calling it
with tokens and targets (B, T) returns the mean loss. Module and parameter names are
the same in every layout (``layers.0.attn.q_proj.weight`` …).

Note [init happens before sharding]: every parameter is drawn as the full tensor
from a generator seeded by (seed, parameter name), then this rank keeps its shard.
So every layout starts from the same numbers as one rank, which is what lets the
parity suite compare layouts number for number.
"""

from __future__ import annotations

import fnmatch
import math
import zlib
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from torch.utils.checkpoint import checkpoint

from .comm import all_gather_from_group, copy_to_group, gather_from_group, group_size
from .layers import (
    ColumnParallelLinear,
    RowParallelLinear,
    VocabParallelEmbedding,
    vocab_parallel_cross_entropy,
)

STYLES = ("colwise", "rowwise", "vocab", "vocab_head")
RECOMPUTE = ("none", "selective", "full")


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelConfig:
    arch: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    padded_vocab: int
    seq_len: int
    dropout: float = 0.0
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    tie_embeddings: bool = True


class _Builder:
    """Hands out layers for module names according to the plan, and records use."""

    def __init__(self, tp_plan, tp_group, sequence_parallel):
        self.plan = dict(tp_plan) if group_size(tp_group) > 1 else {}
        for pattern, style in self.plan.items():
            if style not in STYLES:
                raise ValueError(f"tp plan: {pattern!r} has unknown style {style!r}; styles: {STYLES}")
        self.used = set()
        self.group, self.sp = tp_group, sequence_parallel

    def style(self, name):
        for pattern, style in self.plan.items():
            if fnmatch.fnmatchcase(name, pattern.replace("*", "[0-9]*")):
                self.used.add(pattern)
                return style
        return None

    def linear(self, name, in_features, out_features, bias):
        style = self.style(name)
        if style == "colwise":
            return ColumnParallelLinear(in_features, out_features, bias=bias, tp_group=self.group, sequence_parallel=self.sp)
        if style == "rowwise":
            return RowParallelLinear(in_features, out_features, bias=bias, tp_group=self.group, sequence_parallel=self.sp)
        if style is None:
            return nn.Linear(in_features, out_features, bias=bias)
        raise ValueError(f"tp plan: {name} cannot be {style!r}")

    def check_all_used(self):
        unused = sorted(set(self.plan) - self.used)
        if unused:
            raise ValueError(f"tp plan: patterns matched no module: {unused}")


class Norm(nn.Module):
    """LayerNorm (gpt, with bias) or RMSNorm (llama); replicated over tp."""

    def __init__(self, hidden, *, rms, eps, sequence_parallel):
        super().__init__()
        self.rms, self.eps = rms, eps
        self.weight = nn.Parameter(torch.ones(hidden))
        self.bias = None if rms else nn.Parameter(torch.zeros(hidden))
        for p in self.parameters():
            p.sequence_parallel = sequence_parallel  # sees only a sequence shard under SP

    def forward(self, x):
        if self.rms:
            return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)
        return F.layer_norm(x, (x.shape[-1],), self.weight, self.bias, self.eps)


def rotary(x, theta):
    """Rotate (B, heads, T, D) by position (pairs of halves, as in Llama)."""
    T, D = x.shape[-2], x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, D, 2, dtype=torch.float32, device=x.device) / D))
    angles = torch.outer(torch.arange(T, dtype=torch.float32, device=x.device), inv)
    cos, sin = angles.cos().repeat(1, 2), angles.sin().repeat(1, 2)  # (T, D)
    first, second = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-second, first), dim=-1) * sin


class Attention(nn.Module):
    def __init__(self, config, prefix, build):
        super().__init__()
        bias = config.arch == "gpt"
        C, D = config.hidden, config.hidden // config.heads
        self.head_dim, self.llama, self.theta = D, config.arch == "llama", config.rope_theta
        self.q_proj = build.linear(f"{prefix}.q_proj", C, config.heads * D, bias)
        self.k_proj = build.linear(f"{prefix}.k_proj", C, config.kv_heads * D, bias)
        self.v_proj = build.linear(f"{prefix}.v_proj", C, config.kv_heads * D, bias)
        self.o_proj = build.linear(f"{prefix}.o_proj", config.heads * D, C, bias)
        self.dropout = config.dropout
        self.selective = False  # set by Transformer for recompute = "selective"

    def core(self, q, k, v):
        """softmax(q kᵀ / √D) v: the part selective recompute drops and redoes."""
        if self.llama:
            q, k = rotary(q, self.theta), rotary(k, self.theta)
        return F.scaled_dot_product_attention(
            q, k, v, is_causal=True, enable_gqa=q.shape[1] != k.shape[1],
            dropout_p=self.dropout if self.training else 0.0,
        )

    def forward(self, x):
        q = self.q_proj(x)  # (B, T, heads/tp · D)
        k, v = self.k_proj(x), self.v_proj(x)  # (B, T, kv_heads/tp · D)
        B, T = q.shape[:2]
        q, k, v = (t.view(B, T, -1, self.head_dim).transpose(1, 2) for t in (q, k, v))
        if self.selective and torch.is_grad_enabled():
            y = checkpoint(self.core, q, k, v, use_reentrant=False)
        else:
            y = self.core(q, k, v)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, -1))


class MLP(nn.Module):
    def __init__(self, config, prefix, build):
        super().__init__()
        self.llama = config.arch == "llama"
        bias = not self.llama
        if self.llama:
            self.gate_proj = build.linear(f"{prefix}.gate_proj", config.hidden, config.ffn, bias)
        self.up_proj = build.linear(f"{prefix}.up_proj", config.hidden, config.ffn, bias)
        self.down_proj = build.linear(f"{prefix}.down_proj", config.ffn, config.hidden, bias)

    def forward(self, x):
        if self.llama:
            return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))  # SwiGLU
        return self.down_proj(F.gelu(self.up_proj(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, config, index, build, sp):
        super().__init__()
        prefix, rms = f"layers.{index}", config.arch == "llama"
        self.attn_norm = Norm(config.hidden, rms=rms, eps=config.norm_eps, sequence_parallel=sp)
        self.attn = Attention(config, f"{prefix}.attn", build)
        self.mlp_norm = Norm(config.hidden, rms=rms, eps=config.norm_eps, sequence_parallel=sp)
        self.mlp = MLP(config, f"{prefix}.mlp", build)
        self.dropout = config.dropout

    def forward(self, x):  # (B, T, C), or (B, T/tp, C) under sequence parallelism
        x = x + F.dropout(self.attn(self.attn_norm(x)), self.dropout, self.training)
        return x + F.dropout(self.mlp(self.mlp_norm(x)), self.dropout, self.training)


class Transformer(nn.Module):
    def __init__(self, config, *, tp_group, sequence_parallel, tp_plan, recompute="none"):
        super().__init__()
        if recompute not in RECOMPUTE:
            raise ValueError(f"recompute must be one of {RECOMPUTE}, not {recompute!r}")
        self.config, self.tp_group, self.sp = config, tp_group, bool(sequence_parallel)
        self.recompute = recompute
        build = _Builder(tp_plan, tp_group, self.sp)
        V, C = config.padded_vocab, config.hidden
        embed_style, head_style = build.style("embed"), build.style("head")
        if embed_style == "vocab":
            self.embed = VocabParallelEmbedding(V, C, tp_group=tp_group, sequence_parallel=self.sp)
        elif embed_style is None:
            self.embed = nn.Embedding(V, C)
        else:
            raise ValueError(f"tp plan: embed cannot be {embed_style!r}")
        if config.arch == "gpt":
            self.pos_embed = nn.Embedding(config.seq_len, C)
            self.pos_embed.weight.sequence_parallel = self.sp
        self.layers = nn.ModuleList(Block(config, i, build, self.sp) for i in range(config.layers))
        self.final_norm = Norm(C, rms=config.arch == "llama", eps=config.norm_eps, sequence_parallel=self.sp)
        self.vocab_parallel = head_style == "vocab_head"
        if head_style not in (None, "vocab_head"):
            raise ValueError(f"tp plan: head cannot be {head_style!r}")
        if (embed_style == "vocab") != self.vocab_parallel and config.tie_embeddings:
            raise ValueError("tp plan: a tied head and embedding must both be vocab-parallel or neither")
        if not config.tie_embeddings:
            rows = V // group_size(tp_group) if self.vocab_parallel else V
            self.head = nn.Linear(C, rows, bias=False)
            self.head.full_shape = (V, C)
            if self.vocab_parallel and group_size(tp_group) > 1:
                self.head.weight.tensor_parallel = True
        build.check_all_used()
        for layer in self.layers:
            layer.attn.selective = recompute == "selective"

    def head_weight(self):
        return self.embed.weight if self.config.tie_embeddings else self.head.weight

    def forward(self, tokens, targets):
        x = self.embed(tokens)  # (B, T, C), or (B, T/tp, C) under SP
        if self.config.arch == "gpt":
            T = x.shape[1]
            offset = 0
            if self.sp:
                offset = dist.get_rank(self.tp_group) * T if group_size(self.tp_group) > 1 else 0
            x = x + self.pos_embed.weight[offset : offset + T]
        x = F.dropout(x, self.config.dropout, self.training)
        for layer in self.layers:
            if self.recompute == "full" and torch.is_grad_enabled():
                # Keep only the block's input; rerun the block (its collectives too) in backward.
                x = checkpoint(layer, x, use_reentrant=False)
            else:
                x = layer(x)
        x = self.final_norm(x)
        if self.vocab_parallel:
            x = all_gather_from_group(x, self.tp_group, 1) if self.sp else copy_to_group(x, self.tp_group)
            logits = F.linear(x, self.head_weight())  # (B, T, V/tp)
            loss = vocab_parallel_cross_entropy(logits, targets, tp_group=self.tp_group, vocab_size=self.config.vocab)
        else:
            if self.sp:
                x = gather_from_group(x, self.tp_group, 1)
            logits = F.linear(x, self.head_weight())  # (B, T, V)
            loss = vocab_parallel_cross_entropy(logits, targets, tp_group=None, vocab_size=self.config.vocab)
        return loss.mean()


def _generator(seed: int, name: str) -> torch.Generator:
    return torch.Generator().manual_seed((seed * 1_000_003 + zlib.crc32(name.encode())) % (2**63))


def full_init(name: str, shape, *, config: ModelConfig, seed: int) -> torch.Tensor:
    """The full (unsharded) initial value of parameter ``name``; layout-independent."""
    if name.endswith(".bias"):
        return torch.zeros(shape)
    if name.endswith("norm.weight"):
        return torch.ones(shape)
    std = 0.02
    if name.endswith(("o_proj.weight", "down_proj.weight")):
        std = 0.02 / math.sqrt(2 * config.layers)  # GPT-2's scaled residual projections
    return torch.empty(shape).normal_(0.0, std, generator=_generator(seed, name))


@torch.no_grad()
def initialize(model: Transformer, seed: int) -> None:
    for name, module in model.named_modules():
        if isinstance(module, Norm):
            continue
        if isinstance(module, (nn.Linear, nn.Embedding)) and not hasattr(module, "full_shape"):
            module.full_shape = tuple(module.weight.shape)
        if not hasattr(module, "full_shape"):
            continue
        weight = full_init(f"{name}.weight", module.full_shape, config=model.config, seed=seed)
        bias = None
        if getattr(module, "bias", None) is not None:
            bias = full_init(f"{name}.bias", (module.full_shape[0],), config=model.config, seed=seed)
        if hasattr(module, "load_full_"):
            module.load_full_(weight, bias)
        else:  # replicated, or the untied vocab-parallel head (rows sharded like the embedding)
            if module.weight.shape != weight.shape:
                weight = weight.chunk(group_size(model.tp_group))[dist.get_rank(model.tp_group)]
            module.weight.copy_(weight)
            if bias is not None:
                module.bias.copy_(bias)


def build_model(config, *, tp_group, sequence_parallel, tp_plan, seed, device, recompute="none"):
    """The model for this rank: built from the plan, initialized per Note [init happens before sharding].

    ``recompute``: "none"; "selective" (attention core recomputed in backward);
    "full" (each block recomputed from its input).
    """
    model = Transformer(
        config, tp_group=tp_group, sequence_parallel=sequence_parallel, tp_plan=tp_plan,
        recompute=recompute,
    )
    initialize(model, seed)
    return model.to(device)


def allreduce_sequence_parallel_grads(model: nn.Module, tp_group) -> None:
    """Sum over tp the grads of replicated parameters that saw only a sequence shard."""
    if group_size(tp_group) == 1:
        return
    grads = [p.grad for p in model.parameters() if getattr(p, "sequence_parallel", False) and p.grad is not None]
    if not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, group=tp_group)
    offset = 0
    for g in grads:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()
