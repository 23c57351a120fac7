"""Document separation (``model.documents = separate``): attention and positions stay
inside each document of a packed sequence, as Llama 3 trained.

Takes: each micro-batch's per-token document ids, (B, T) over the whole sequence
(``data``'s third tensor; ``Transformer.forward(..., documents=)`` hands them here).
Gives: ``Documents``, one object per model (or pipeline chunk) shared by its attention
modules and its embedding: ``positions`` (a token's position within its document, for
rotary and learned positions) and ``mask`` (causal and same document), both asked at
the global positions of the tokens a rank holds, so every attention path (plain, tp/sp,
cp ring/ulysses/all-gather, TeraPipe slices) builds its own part of one mask.

Note [document ids are global]: every rank holds the whole (B, T) id tensor of its
micro-batch, also a context-parallel rank that holds T/cp of the tokens and a later
pipeline stage that holds no tokens at all: ids are small (one int64 a token) and a
mask needs the keys' documents wherever the keys are. A rank asks with the global
positions of its queries and keys (``context.spans``, a slice's start, the sp shard's
offset), so no id travels with the activations. A sample's ids are nondecreasing
(documents are runs of tokens); a window that starts inside a document counts that
document's positions from the window's first token.

Note [documents under recompute]: the ids are state set per micro-batch, not an input
of the blocks, so a block rerun in backward (``recompute``) reads them again: the
micro-batch loop runs each micro-batch's backward right after its forward, and the
pipeline executor sets them again before each action of a micro-batch
(``PipelineExecutor._compute``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

KINDS = ("joined", "separate")
"""``model.documents``: ``joined`` (attention crosses documents: the default) or ``separate``."""


class Documents:
    """The current micro-batch's document ids, and what attention and positions ask of them."""

    def __init__(self):
        self.ids = None  # (B, T) int64, the whole sequence (Note [document ids are global])
        self.within = None  # (B, T): each token's position within its document
        self.made = {}  # the masks of this micro-batch, by what the caller named them: one for every layer

    def use(self, ids: torch.Tensor, device) -> None:
        """Set this micro-batch's ids, (B, T) (any device; moved to ``device``)."""
        ids = ids.to(device=device, dtype=torch.int64)
        T = ids.shape[1]
        index = torch.arange(T, device=device).expand_as(ids)
        starts = torch.ones_like(ids, dtype=torch.bool)
        starts[:, 1:] = ids[:, 1:] != ids[:, :-1]
        first = torch.where(starts, index, torch.zeros_like(index)).cummax(dim=1).values  # its document's first
        self.ids, self.within, self.made = ids, index - first, {}

    def _check(self):
        if self.ids is None:
            raise RuntimeError("model.documents = separate: the model ran without document ids "
                               "(pass documents= to its forward, from the data's third tensor)")

    def positions(self, positions: torch.Tensor) -> torch.Tensor:
        """(B, n) positions within their documents of the tokens at global ``positions`` (n,)."""
        self._check()
        return self.within[:, positions]

    def same(self, queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        """(B, 1, nq, nk) bool: the query at global position ``queries[i]`` and the key at
        ``keys[j]`` are in the same document (broadcasts over heads)."""
        self._check()
        return (self.ids[:, queries].unsqueeze(2) == self.ids[:, keys].unsqueeze(1)).unsqueeze(1)

    def mask(self, queries: torch.Tensor, keys: torch.Tensor, name=None) -> torch.Tensor:
        """(B, 1, nq, nk) bool: where a query may attend (key position ≤ its own, same document).
        ``name`` (hashable: the spans the positions came from) keeps it for the next layer."""
        def make():
            return self.same(queries, keys) & (keys.unsqueeze(0) <= queries.unsqueeze(1))

        return make() if name is None else self.remember(name, make)

    def attend(self, attn, q, k, v, kind, spans):
        """``attn.core`` (an ``Attention``) under documents = separate: this rank's queries
        (the global positions ``spans``) against the keys it sees, causal and within each
        query's document, rotated at their positions within their documents."""
        queries = span_positions(spans, q.device)
        if attn.llama:  # llama's rotary (only a llama build ships llama_attention.py)
            from .llama_attention import rotary_at

            within = self.positions(queries)
            q, k = rotary_at(q, attn.theta, within), rotary_at(k, attn.theta, within)
        dropout = attn.dropout if attn.training else 0.0
        if kind == "ring":  # eager, masked per block
            return attn.context.ring(q, k, v, None, documents=self, dropout=dropout)
        keys = queries
        if kind == "allgather":
            k, v = attn.context.gather(k), attn.context.gather(v)  # (B, kv_heads/tp, T, D)
            keys = torch.arange(k.shape[-2], device=q.device)
        mask = self.mask(queries, keys, name=(spans, k.shape[-2]))  # the same for every layer
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=q.shape[1] != k.shape[1],
                                              dropout_p=dropout)

    def remember(self, name, make):
        """``make()``, made once per micro-batch under ``name``: every layer attends alike
        (one mask kept, not one per layer for backward)."""
        if name not in self.made:
            self.made[name] = make()
        return self.made[name]


def span_positions(spans, device) -> torch.Tensor:
    """(n,) int64: the global positions of the runs ``spans`` ((start, stop), ...), in order."""
    return torch.cat([torch.arange(start, stop, device=device) for start, stop in spans])


def attach(model) -> None:
    """Give ``model`` (a ``Transformer`` stage) and its attention modules one shared
    ``Documents`` when its config separates documents; leave ``None`` otherwise."""
    shared = Documents() if model.config.documents == "separate" else None
    model.documents = shared
    for block in model.layers.values():
        block.attn.documents = shared
