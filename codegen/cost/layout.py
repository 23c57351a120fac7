"""A candidate layout and what each pipeline rank of it holds.

Takes: a ``Spec`` (model shape, batch) and a ``Layout`` (every degree and setting
filled in). Gives: ``Layout``, ``Accounting`` and ``stage_contents`` — per pipeline
rank, its layers and whether it holds the embedding, the head (or a tied copy) — and
``rank_params`` (elements and tensors of one rank's parameters, exactly as the
runtime's model builds them: ``runtime/model.py``, ``codegen/passes/partition_layers.py``).

Note [per-layer costs]: a layout may give each block its own recompute and overlap
(``recompute = [full, none, ...]``). Memory sums each pipeline rank's own blocks; time
costs each distinct block setting once and weighs it by how many blocks have it, so a
uniform layout costs exactly what it did. The pipeline's makespan takes the mean
block (its chunks are costed as equal).

Before: ``codegen/search.py`` or ``choose_layout``. After: ``cost/memory.py``, ``cost/time.py``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from parc.dsl.spec import Arch, ModelSpec


class Accounting(enum.Enum):
    """Which training program the model describes."""

    PARC = "parc"
    """parc's generated trainer: fp32 weights, gradients and AdamW state (bf16 is
    autocast), the tensors it saves for backward (flash attention: no s² term)."""
    MEGATRON = "megatron"
    """Megatron-LM's mixed precision (ZeRO paper: 2 + 2 + 12 bytes per parameter),
    Korthikanti et al.'s activation formulas (attention scores materialized)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Layout:
    dp: int
    tp: int
    pp: int
    sp: bool
    zero: int
    schedule: str
    """``gpipe``, ``1f1b`` or ``interleaved``."""
    chunks: int
    """Model chunks per pipeline rank (> 1 only when interleaved)."""
    recompute: str | tuple[str, ...]
    """``none``, ``selective`` or ``full``; or one per block (Note [per-layer costs])."""
    sub_batches: int | tuple[int, ...]
    """``overlap = sub_batch(k)``: k; ``overlap = none``: 1; or one per block."""
    micro_batch: int

    def block_settings(self, layers: int) -> tuple[tuple[str, int], ...]:
        """(recompute, sub_batches) of each of the model's ``layers`` blocks."""
        recompute = self.recompute if isinstance(self.recompute, tuple) else (self.recompute,) * layers
        sub_batches = self.sub_batches if isinstance(self.sub_batches, tuple) else (self.sub_batches,) * layers
        return tuple(zip(recompute, sub_batches))

    @property
    def per_layer(self) -> bool:
        return isinstance(self.recompute, tuple) or isinstance(self.sub_batches, tuple)

    @property
    def max_sub_batches(self) -> int:
        return max(self.sub_batches) if isinstance(self.sub_batches, tuple) else self.sub_batches

    def recompute_words(self) -> str | None:
        """``full``, or ``[full, none, ...]`` per layer; None when nothing is recomputed."""
        modes = self.recompute if isinstance(self.recompute, tuple) else (self.recompute,)
        if all(mode == "none" for mode in modes):
            return None
        return f"[{', '.join(modes)}]" if isinstance(self.recompute, tuple) else self.recompute

    def overlap_words(self) -> str | None:
        """``sub_batch(k)``, or ``overlap [sub_batch(2), none, ...]`` per layer; None without overlap."""
        if self.max_sub_batches <= 1:
            return None
        one = lambda k: f"sub_batch({k})" if k > 1 else "none"  # noqa: E731
        if isinstance(self.sub_batches, tuple):
            return f"overlap [{', '.join(one(k) for k in self.sub_batches)}]"
        return one(self.sub_batches)

    def grad_accum(self, global_batch: int) -> int:
        return global_batch // (self.micro_batch * self.dp)

    def describe(self) -> str:
        """The layout in the DSL's words, one line."""
        parts = [f"dp {self.dp}", f"tp {self.tp}", f"pp {self.pp}"]
        if self.pp > 1:
            parts.append(
                f"interleaved({self.chunks})" if self.schedule == "interleaved" else self.schedule
            )
        return " ".join(parts)


@dataclass(frozen=True, slots=True, kw_only=True)
class StageContents:
    """What one pipeline rank holds (all of its chunks together)."""

    layers: int
    embed: bool
    """Holds the token embedding (virtual stage 0)."""
    head: bool
    """Holds the final norm and loss (the last virtual stage)."""
    head_weight: bool
    """Holds a head matrix of its own (untied, or the tied copy on a later stage)."""


def rank_blocks(model: ModelSpec, layout: Layout, rank: int, stage_layers=None) -> list[int]:
    """The block indices pipeline rank ``rank`` holds (all of its chunks)."""
    stages = layout.pp * layout.chunks
    counts = stage_layers or [model.layers // stages] * stages
    starts = [sum(counts[:v]) for v in range(stages)]
    return [i for v in range(stages) if v % layout.pp == rank for i in range(starts[v], starts[v] + counts[v])]


def stage_contents(model: ModelSpec, layout: Layout, rank: int, stage_layers=None) -> StageContents:
    stages = layout.pp * layout.chunks
    counts = stage_layers or [model.layers // stages] * stages
    mine = [v for v in range(stages) if v % layout.pp == rank]
    embed, head = 0 in mine, stages - 1 in mine
    head_weight = head and (not model.tie_embeddings or stages > 1)
    return StageContents(
        layers=sum(counts[v] for v in mine), embed=embed, head=head, head_weight=head_weight
    )


def layer_params(model: ModelSpec, tp: int) -> tuple[int, int]:
    """(elements, tensors) of one transformer block on one tp rank."""
    C, D = model.hidden, model.head_dim
    q, kv, F = model.heads * D // tp, model.kv_heads * D // tp, model.ffn // tp
    if model.arch is Arch.GPT:
        norms = 4 * C  # two LayerNorms, weight and bias
        attn = C * (q + 2 * kv) + (q + 2 * kv) + q * C + C  # column biases split, row bias whole
        mlp = C * F + F + F * C + C
        return norms + attn + mlp, 4 + 8 + 4
    attn = C * (q + 2 * kv) + q * C
    mlp = 3 * C * F
    return 2 * C + attn + mlp, 2 + 4 + 3


def rank_params(model: ModelSpec, layout: Layout, rank: int, stage_layers=None) -> tuple[int, int]:
    """(elements, tensors) of pipeline rank ``rank``'s parameters on one tp rank."""
    contents = stage_contents(model, layout, rank, stage_layers)
    per_layer, tensors_per_layer = layer_params(model, layout.tp)
    elements, tensors = contents.layers * per_layer, contents.layers * tensors_per_layer
    gpt = model.arch is Arch.GPT
    vocab_rows = model.padded_vocab // layout.tp if layout.tp > 1 else model.padded_vocab
    if contents.embed:
        elements += vocab_rows * model.hidden
        tensors += 1
        if gpt:
            elements += model.seq_len * model.hidden
            tensors += 1
    if contents.head:
        elements += (2 if gpt else 1) * model.hidden
        tensors += 2 if gpt else 1
        if contents.head_weight:
            elements += vocab_rows * model.hidden
            tensors += 1
    return elements, tensors


def sequence_parallel_params(model: ModelSpec, layout: Layout, rank: int, stage_layers=None) -> int:
    """Elements of pipeline rank ``rank`` whose gradients are partial under sp (each tp
    rank saw a sequence shard): the norms, the row-parallel biases, gpt's positions
    (runtime/model.py, Note [sequence-parallel gradients]); 0 without sp."""
    if not layout.sp or layout.tp < 2:
        return 0
    contents = stage_contents(model, layout, rank, stage_layers)
    C, gpt = model.hidden, model.arch is Arch.GPT
    per_layer = (4 * C + 2 * C) if gpt else 2 * C  # two norms (weight, bias); o and down biases
    elements = contents.layers * per_layer
    if contents.embed and gpt:
        elements += model.seq_len * C
    if contents.head:
        elements += 2 * C if gpt else C
    return elements


def total_params(model: ModelSpec) -> int:
    """Parameters of the whole model (one copy of a tied embedding)."""
    one = Layout(
        dp=1, tp=1, pp=1, sp=False, zero=0, schedule="1f1b", chunks=1, recompute="none",
        sub_batches=1, micro_batch=1,
    )
    return rank_params(model, one, 0)[0]
