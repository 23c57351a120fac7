"""TeraPipe in the model: a slice's attention over the keys and values of the earlier
slices of its sequence, kept per stage, and the backward through them.

Takes: a pipeline rank's chunks (``model.Transformer`` stages) and the slice lengths.
Gives: ``SliceState``, which the executor (``pipeline.PipelineExecutor``) opens around
each slice's forward (``forward``) and uses for its backward (``backward``);
``Attention.core`` and ``Transformer.embed_tokens`` ask it for the slice's positions and
the keys and values to attend to. Before: ``schedule_terapipe`` (the order of slices).
After: nothing.

Note [gradients through the kept keys and values]: slice j of a sequence attends to its
own keys and values and to those of slices 0..j-1 on the same stage (causal: key
position <= query position). Those earlier keys enter slice j's graph as *leaves*:
detached copies of what slice i computed, one per (micro-batch, slice, layer), shared
by every later slice, so slice j's backward leaves in their ``.grad`` its part of
dLoss/dK_i and dLoss/dV_i, summed over j by autograd. Backwards run in reverse slice
order (schedule_terapipe, Note [slices as units]), so when slice i's backward comes,
every later slice has added its part, and slice i's backward starts from its output's
gradient *and* from those leaf gradients on its own K_i, V_i, in one
``torch.autograd.backward`` call: each parameter accumulates once per slice, and the
gradient is the one-rank build's, summed in another order. Each slice keeps its own
graph until its backward (what the in-flight bound counts); a micro-batch's kept keys
and values go when its slice 0's backward is done.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def slice_lengths(seq_len: int, slices) -> tuple[int, ...]:
    """Token counts of the slices: ``slices`` equal parts of ``seq_len`` (an int), or the
    given lengths (a sequence summing to ``seq_len``)."""
    if isinstance(slices, int):
        if slices < 1 or seq_len % slices:
            raise ValueError(f"seq_len = {seq_len} does not split into {slices} equal slices")
        return (seq_len // slices,) * slices
    lengths = tuple(int(n) for n in slices)
    if sum(lengths) != seq_len or min(lengths) < 1:
        raise ValueError(f"slice lengths {lengths} do not sum to seq_len = {seq_len}")
    return lengths


class SliceState:
    """One pipeline rank's TeraPipe state: the slice running forward now, and the keys
    and values each earlier slice left (Note [gradients through the kept keys and values])."""

    def __init__(self, lengths):
        self.lengths = tuple(lengths)
        self.starts = tuple(sum(self.lengths[:j]) for j in range(len(self.lengths)))
        self.current: tuple[int, int] | None = None  # (micro, slice) in forward, else None
        self.kept: dict[tuple[int, int], list] = {}  # (micro, slice) -> per layer (k leaf, v leaf)
        self.produced: dict[tuple[int, int], list] = {}  # (micro, slice) -> per layer (k, v) in its graph
        self._layer = 0

    def attach(self, chunks) -> None:
        """Point every attention and stage of ``chunks`` at this state."""
        from ...models.model import Attention, Transformer

        for chunk in chunks:
            for module in chunk.modules():
                if isinstance(module, (Attention, Transformer)):
                    module.slices = self

    @property
    def start(self) -> int:
        """The first token position of the slice in forward (0 when none is)."""
        return 0 if self.current is None else self.starts[self.current[1]]

    def forward(self, micro: int, slice_: int, run):
        """Run ``run()`` (a stage's forward) as slice ``slice_`` of micro-batch ``micro``."""
        self.current, self._layer = (micro, slice_), 0
        self.kept[(micro, slice_)], self.produced[(micro, slice_)] = [], []
        try:
            return run()
        finally:
            self.current = None

    def attend(self, attention, q, k, v):
        """softmax(q kᵀ/√D) v of the slice in forward over the keys of slices 0..j (causal),
        q, k, v (B, heads, T_j, D); rotated at the slice's positions under llama."""
        micro, j = self.current
        layer, self._layer = self._layer, self._layer + 1
        start = self.starts[j]
        documents = attention.documents  # documents = separate: within documents (documents.py)
        rows = torch.arange(start, start + q.shape[-2], device=q.device)
        if attention.llama and documents is not None:
            from ...models.attention import rotary_at

            within = documents.positions(rows)
            q, k = rotary_at(q, attention.theta, within), rotary_at(k, attention.theta, within)
        elif attention.llama:
            q, k = attention.rotate(q, k, ((start, start + q.shape[-2]),))
        self.produced[(micro, j)].append((k, v))
        self.kept[(micro, j)].append((k.detach().requires_grad_(True), v.detach().requires_grad_(True)))
        earlier = [self.kept[(micro, i)][layer] for i in range(j)]
        keys = torch.cat([kv[0] for kv in earlier] + [k], dim=2)
        values = torch.cat([kv[1] for kv in earlier] + [v], dim=2)
        # query i (position start + i) sees keys 0 .. start + i (of its own document when separate)
        columns = torch.arange(keys.shape[-2], device=q.device)
        mask = columns[None, :] <= rows[:, None] if documents is None else documents.mask(
            rows, columns, name=("slice", micro, j))
        return F.scaled_dot_product_attention(
            q, keys, values, attn_mask=mask, enable_gqa=q.shape[1] != k.shape[1],
            dropout_p=attention.dropout if attention.training else 0.0,
        )

    def backward(self, micro: int, slice_: int, output, grad) -> None:
        """The backward of slice ``slice_`` of ``micro`` from its ``output`` (``grad``: its
        gradient, None for a loss), plus the gradients later slices left on its keys and
        values; then drops what it kept."""
        tensors, grads = [output], [grad]
        for (k, v), (k_leaf, v_leaf) in zip(self.produced.pop((micro, slice_)), self.kept[(micro, slice_)]):
            for t, leaf in ((k, k_leaf), (v, v_leaf)):
                if leaf.grad is not None:
                    tensors.append(t)
                    grads.append(leaf.grad)
        torch.autograd.backward(tensors, grad_tensors=grads)
        del self.kept[(micro, slice_)]  # every later slice's backward has run (reverse order)

    def idle(self) -> bool:
        """Has every slice's backward run (nothing kept)?"""
        return not self.kept and not self.produced
