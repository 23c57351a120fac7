"""Causal self-attention: separate q/k/v projections, rotary positions (llama), the core
as ``scaled_dot_product_attention`` or, under context parallelism, the strategy that
``parallelize.context`` set (ring, ulysses, all-gather: Note [context-parallel attention]
in context.py).

Takes: a ``ModelConfig``. Gives: ``Attention`` with plain ``nn.Linear`` projections (the
tensor transform swaps them for column/row-parallel ones); llama's rotary positions
(``rotary``, ``rotary_at``, given here by name) and q/k norms are llama_attention.py's.
Under ``model.documents = separate`` the core masks keys outside the query's document
and rotates each token at its position within its document (documents.py); the plain
``is_causal`` path is the one every other model takes. A head is ``config.head_dim``
wide (hidden / heads unless ``model.head_dim`` says); ``model.qk_norm`` normalizes each
head of q and k (``llama_attention.HeadNorm``) before rotary; ``model.attention_bias`` gives q, k
and v biases (o none).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from ..parallel.tensor.layers import project


def __getattr__(name: str):
    """``attention.rotary`` and ``rotary_at``, llama's rotary positions: llama_attention.py's,
    which only a llama build ships, given here by name (as ``model.build_stages``)."""
    if name in ("rotary", "rotary_at"):
        from . import llama_attention

        return getattr(llama_attention, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class Attention(nn.Module):
    fused = None  # see Norm

    def __init__(self, config):
        super().__init__()
        bias = config.arch == "gpt"
        columns_bias = bias or config.attention_bias  # Qwen2: q, k, v biases, none on o
        C, D = config.hidden, config.head_dim
        self.head_dim, self.llama, self.theta = D, config.arch == "llama", config.rope_theta
        self.q_proj = nn.Linear(C, config.heads * D, bias=columns_bias)
        self.k_proj = nn.Linear(C, config.kv_heads * D, bias=columns_bias)
        self.v_proj = nn.Linear(C, config.kv_heads * D, bias=columns_bias)
        self.o_proj = nn.Linear(config.heads * D, C, bias=bias)
        if config.qk_norm:  # Qwen3, OLMo-2: RMSNorm over each head's features, one weight for all heads
            from .llama_attention import HeadNorm  # llama's only (PAR0227): shipped with arch = llama

            self.q_norm = HeadNorm(D, eps=config.norm_eps)
            self.k_norm = HeadNorm(D, eps=config.norm_eps)
        else:
            self.q_norm = self.k_norm = None
        self.dropout = config.dropout
        self.selective = False  # recompute = "selective" (parallelize.recompute)
        self.context = None  # context.ContextParallel under cp > 1 (parallelize.context)
        self.slices = None  # a sliced pipeline's SliceState, set by its executor
        self.documents = None  # documents.Documents under documents = separate (documents.attach)

    def core(self, q, k, v):
        """softmax(q kᵀ / √D) v: the part selective recompute drops and redoes.

        Under cp = ring or allgather, q, k, v hold this rank's T/cp tokens: they are
        rotated at their global positions (``context.spans``), then ring attention runs or
        k and v are gathered (Note [context-parallel attention])."""
        if self.slices is not None and self.slices.current is not None:
            return self.slices.attend(self, q, k, v)  # a token slice of the sequence
        kind = None if self.context is None else self.context.kind
        spans = self.context.spans(q.shape[-2]) if kind in ("ring", "allgather") else ((0, q.shape[-2]),)
        if self.documents is not None:
            return self.documents.attend(self, q, k, v, kind, spans)  # documents.py
        if self.llama:
            q, k = self.rotate(q, k, spans)
        if kind == "ring":  # the compiled block attention, or eager (under dropout too)
            return self.context.ring(q, k, v, self.fused, dropout=self.dropout if self.training else 0.0)
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
        of global positions, each run rotated at its own start (llama_attention.py)."""
        from .llama_attention import rotate  # only a llama build ships llama_attention.py

        return rotate(self, q, k, spans)

    def mix(self, q, k, v):
        """Projections (B, T, heads/tp · D) → attention output (B, T, heads/tp · D), before o_proj.

        Splits the heads, runs the core (checkpointed under selective recompute) and
        joins them again; overlap.py calls it for each sub-batch too.
        """
        B, T = q.shape[:2]
        q, k, v = (t.view(B, T, -1, self.head_dim).transpose(1, 2) for t in (q, k, v))
        if self.q_norm is not None:  # per head, on this rank's tokens and heads, before rotary
            q, k = self.q_norm(q), self.k_norm(k)
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
