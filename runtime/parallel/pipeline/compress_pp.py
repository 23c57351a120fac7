"""Compressed pipeline backpropagation: the input gradients stages send back, as low rank.

Takes: the activation shape that travels between stages, ``compress_pp = lowrank(rank
= r, lazy_error = b)`` and the stages whose backward gradient leaves compressed
(``compress_stages``). Gives: ``LowRankBackprop``, which ``pipeline.PipelineExecutor``
asks, per message, whether a gradient from a stage is compressed (``compresses``),
how many numbers it is on the wire (``wire_numel``), and which ``encode``s it on the
sending stage and ``decode``s it on the receiving one. Before: each stage's backward.
After: the previous stage's backward, which runs on the decoded gradient.

Note [compressed backpropagation]: Optimus-CC (Song et al. 2023). The gradient of a
stage's input, (micro_batch, T, hidden), is a matrix M of (micro_batch·T) rows and
hidden columns, sent as P (rows × r, orthonormal columns) and Q (hidden × r) with
M ≈ P·Qᵀ: one power iteration from the Q of the previous micro-batch at this
boundary (warm start: consecutive micro-batches' gradients share their top subspace).
With ``lazy_error = true`` (lazy error propagation), what the approximation left out,
M − P·Qᵀ, is not sent now but added to the next micro-batch's gradient at the same
boundary (across steps too); only the sending stage holds it. It is off by default:
the next micro-batch is other sequences, so the earlier stages' weight gradients get
that error times *other* inputs, and on parc's convergence test (tests/parity/
test_compress.py: 2-layer GPT, pp 2, rank 4, 200 steps of docs/DESIGN.md) it ended
3.4% above the exact run's loss where plain low rank ended 2.6% below it (the
data-parallel error feedback, whose error belongs to the same weights, helps: compress.py). Optimus-CC
compresses the later stages and leaves those next to the embedding exact, where the
error hurts most; ``compress_stages`` chooses (its default: every stage but the first,
which sends nothing back). Numerics change (compress.py, Note [compression changes
numerics]).
"""

from __future__ import annotations

import torch

Q_SEED = 20230127
"""Seed of the first Q at each boundary (the sender's alone: the receiver only decodes)."""


class LowRankBackprop:
    def __init__(self, activation_shape, *, rank: int, stages, lazy_error: bool = False, device=None):
        self.shape = tuple(activation_shape)
        self.rows = 1
        for size in self.shape[:-1]:
            self.rows *= size
        self.cols = self.shape[-1]
        self.rank = min(rank, self.rows, self.cols)
        self.stages = frozenset(stages)
        self.lazy_error = bool(lazy_error)
        self.device = device
        self._q, self._error = {}, {}  # sending stage → warm-start Q (cols × r), carried error (rows × cols)

    def compresses(self, sender_stage: int) -> bool:
        """Does the input gradient ``sender_stage`` sends back travel compressed?"""
        return sender_stage in self.stages

    def wire_numel(self) -> int:
        return self.rank * (self.rows + self.cols)

    @torch.no_grad()
    def encode(self, sender_stage: int, grad: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        """P and Q of ``grad`` (plus the error carried at this boundary), flat, fp32.

        ``scale`` (fp16): what the loss was multiplied by this step. The carried error is kept
        in the loss's own units (multiplied back in here), so a step of another scale reads
        it right; a gradient that overflowed is sent as it is (inf/NaN: the receiving stage's
        gradients, hence the global norm, are then non-finite and the step is skipped) and
        leaves the warm-start Q and the error as they were (compress.py, Note [compression
        under fp16])."""
        matrix = grad.detach().to(torch.float32).reshape(self.rows, self.cols)
        if not bool(torch.isfinite(matrix).all()):
            return torch.full((self.wire_numel(),), float("nan"), device=matrix.device)
        if self.lazy_error and sender_stage in self._error:
            matrix = matrix + self._error[sender_stage] * scale
        q = self._q.get(sender_stage)
        if q is None:
            generator = torch.Generator().manual_seed(Q_SEED + sender_stage)
            q = torch.randn(self.cols, self.rank, generator=generator).to(matrix.device)
        p = torch.linalg.qr(matrix @ q, mode="reduced").Q  # (rows, r), orthonormal columns
        q = matrix.t() @ p  # (cols, r): P·Qᵀ is M's projection on span(P)
        self._q[sender_stage] = q  # warm start for the next micro-batch
        if self.lazy_error:  # Note [compressed backpropagation]: lazy; in the loss's units
            self._error[sender_stage] = (matrix - p @ q.t()) * (1.0 / scale)
        return torch.cat([p.reshape(-1), q.reshape(-1)]).contiguous()

    def decode(self, flat: torch.Tensor) -> torch.Tensor:
        """The gradient ``encode`` approximated, in the activation shape."""
        split = self.rows * self.rank
        p = flat[:split].view(self.rows, self.rank)
        q = flat[split:].view(self.cols, self.rank)
        return (p @ q.t()).view(self.shape)
