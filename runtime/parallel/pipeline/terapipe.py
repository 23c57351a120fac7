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

Note [recompute in a slice]: under ``recompute = full`` or ``selective`` a slice's
backward reruns its checkpointed blocks (or attention cores), and the rerun must compute
what the forward computed: the slice's queries against the earlier slices' kept keys and
values and its own. So the slice's backward runs with the state's ``current`` set to
that slice and ``recomputing`` on: ``attend`` then attends as in forward (the kept
leaves of slices 0..j-1 are still there: their backwards come after j's) but keeps
nothing new, and a layer is found by its attention module (``attach`` numbers them), not
by the order of calls, which a rerun reverses. What a slice keeps between its forward
and its backward is then its blocks' inputs (full) or the attention inputs (selective),
plus the keys and values every later slice reads: those are kept whatever recompute says.

Note [experts in a slice]: a MoE block routes each slice's tokens as it comes (routing
is per token, so every token goes where one rank sends it), and the z-loss, a mean over
tokens, is the sum of the slices' parts. The load-balancing loss coeff·E·Σₑ fₑ·Pₑ is
not: fₑ, the share of the micro-batch's slots expert e got, is known only once the last
slice has run, and a slice's forward cannot wait for later slices. But fₑ is a count,
without gradient, so the loss's gradient reaches each token's probabilities as
coeff·E·fₑ/N, linear in them: each slice enters its probabilities' sums (per sequence
under ``aux_loss_scope = sequence``; summed over the tp ranks under sp) through
``_Deferred``, whose backward multiplies them by the micro-batch's coefficient, which
the last slice's forward sets from the counts every slice added. Every slice's backward
comes after that forward on its stage (Note [slices as units]), so each token's gradient
is one rank's, and the last slice's value carries the whole micro-batch's loss for the
log (the earlier ones' are 0). A capacity is not built with slices (PAR0264): its drop
ranking orders the whole micro-batch's tokens, later slices' included.

Note [slices under sequence parallelism]: under sp each tp rank holds T/tp tokens of
the stream between the blocks; a slice of n tokens travels and enters a stage as the
rank's n/tp of it, the tp rank r holding tokens start + r·n/tp .. start + (r+1)·n/tp of
the sequence (``Transformer.embed_tokens`` offsets the shard by the slice's start). So
each slice's length is a multiple of tp (rule PAR0267), and sp's gather before the
attention gives every tp rank the slice's n tokens for its heads: ``attend`` sees the
whole slice, as without sp, and the kept keys and values are the rank's heads of it.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ...distributed.comm import exposed, reduce_from_group


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
        self.current: tuple[int, int] | None = None  # (micro, slice) in forward or backward, else None
        self.recomputing = False  # in the slice's backward: a recompute's rerun (Note [recompute in a slice])
        self.kept: dict[tuple[int, int], dict] = {}  # (micro, slice) -> layer -> (k leaf, v leaf)
        self.produced: dict[tuple[int, int], dict] = {}  # (micro, slice) -> layer -> (k, v) in its graph
        self._layers: dict[int, int] = {}  # id(attention) -> its layer on this rank
        self.balance: dict[tuple[int, int], _Balance] = {}  # (micro, id(MoE block)) -> Note [experts in a slice]

    def attach(self, chunks) -> None:
        """Point every module of ``chunks`` that reads the slice (attention, the stage's
        positions, a MoE block's losses: a ``slices`` attribute) at this state."""
        from ...models.model import Attention

        for chunk in chunks:
            for module in chunk.modules():
                if hasattr(module, "slices"):
                    module.slices = self
                if isinstance(module, Attention):
                    self._layers[id(module)] = len(self._layers)

    @property
    def start(self) -> int:
        """The first token position of the slice in forward (0 when none is)."""
        return 0 if self.current is None else self.starts[self.current[1]]

    def forward(self, micro: int, slice_: int, run):
        """Run ``run()`` (a stage's forward) as slice ``slice_`` of micro-batch ``micro``."""
        self.current = (micro, slice_)
        self.kept[(micro, slice_)], self.produced[(micro, slice_)] = {}, {}
        try:
            return run()
        finally:
            self.current = None

    def attend(self, attention, q, k, v):
        """softmax(q kᵀ/√D) v of the slice in forward over the keys of slices 0..j (causal),
        q, k, v (B, heads, T_j, D); rotated at the slice's positions under llama."""
        micro, j = self.current
        layer = self._layers[id(attention)]
        start = self.starts[j]
        documents = attention.documents  # documents = separate: within documents (documents.py)
        rows = torch.arange(start, start + q.shape[-2], device=q.device)
        if attention.llama and documents is not None:
            from ...models.attention import rotary_at

            within = documents.positions(rows)
            q, k = rotary_at(q, attention.theta, within), rotary_at(k, attention.theta, within)
        elif attention.llama:
            q, k = attention.rotate(q, k, ((start, start + q.shape[-2]),))
        if not self.recomputing:  # a rerun in backward keeps nothing: its forward did
            self.produced[(micro, j)][layer] = (k, v)
            self.kept[(micro, j)][layer] = (k.detach().requires_grad_(True), v.detach().requires_grad_(True))
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
        produced, kept = self.produced.pop((micro, slice_)), self.kept[(micro, slice_)]
        for layer, (k, v) in produced.items():
            for t, leaf in zip((k, v), kept[layer]):
                if leaf.grad is not None:
                    tensors.append(t)
                    grads.append(leaf.grad)
        self.current, self.recomputing = (micro, slice_), True  # Note [recompute in a slice]
        try:
            torch.autograd.backward(tensors, grad_tensors=grads)
        finally:
            self.current, self.recomputing = None, False
        del self.kept[(micro, slice_)]  # every later slice's backward has run (reverse order)
        if slice_ == 0:  # the micro-batch's last backward here
            self.balance = {key: cell for key, cell in self.balance.items() if key[0] != micro}

    def idle(self) -> bool:
        """Has every slice's backward run (nothing kept)?"""
        return not self.kept and not self.produced and not self.balance

    def moe_losses(self, moe, logits, probs, experts, sequences: int, groups):
        """``MoEMLP.aux_losses`` of the slice in forward (Note [experts in a slice]): its
        part of the z-loss, and of the balance loss a term whose gradient is the micro-batch's."""
        micro, j = self.current
        (N, E), S = probs.shape, sequences
        of = torch.arange(N, device=probs.device) // (N // S)  # each token's sequence (rows sequence-major)
        slots = (of.repeat_interleave(moe.top_k) * E + experts.reshape(-1)).detach()
        counted = torch.zeros(S * E + 1, dtype=probs.dtype, device=probs.device).index_add_(
            0, slots, torch.ones_like(slots, dtype=probs.dtype))
        counted[-1] = N // S
        sums = torch.cat([torch.zeros(S, E, dtype=probs.dtype, device=probs.device).index_add(0, of, probs).reshape(-1),
                          torch.logsumexp(logits.float(), -1).square().sum()[None].to(probs.dtype)])
        for group in groups:  # sp: the tp ranks' shards of the slice
            with exposed():
                dist.all_reduce(counted, group=group)
            sums = reduce_from_group(sums, group)
        tokens = counted[-1] * sum(self.lengths) / self.lengths[j]  # of each sequence, every slice
        cell = self.balance.setdefault((micro, id(moe)), _Balance())
        if not self.recomputing:
            cell.add(counted[:-1], sums[:-1].detach())
            if j == len(self.lengths) - 1:
                cell.close(moe.aux_coeff * E / (tokens * moe.top_k * tokens * S))
        value = cell.value() if j == len(self.lengths) - 1 else probs.new_zeros(())
        return _Deferred.apply(sums[:-1], cell, value), moe.z_coeff * sums[-1] / (tokens * S)


class _Balance:
    """A micro-batch's balance loss on one MoE block, over its slices (Note [experts in a slice])."""

    def __init__(self):
        self.routed = self.probs = self.coefficient = None

    def add(self, routed, probs) -> None:
        self.routed = routed if self.routed is None else self.routed + routed
        self.probs = probs if self.probs is None else self.probs + probs

    def close(self, scale) -> None:
        """After the last slice: d loss / d (a sequence's probabilities' sum) = scale · routed."""
        self.coefficient = scale * self.routed

    def value(self):
        return torch.sum(self.coefficient * self.probs)


class _Deferred(torch.autograd.Function):
    """Forward: ``value``. Backward: the gradient times the micro-batch's coefficient for the
    slice's probabilities' sums (set by the last slice's forward, before any backward)."""

    @staticmethod
    def forward(ctx, sums, cell, value):
        ctx.cell = cell
        return value.detach().clone()

    @staticmethod
    def backward(ctx, grad):
        if ctx.cell.coefficient is None:
            raise RuntimeError("internal error in terapipe: a slice's backward ran before its micro-batch's last forward")
        return grad * ctx.cell.coefficient.to(grad.dtype), None, None
