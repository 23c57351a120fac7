"""The fused ops as torch custom ops (``parc::...``) with registered autograd.

Takes: the compiled CPU module (``build.py``) and the Triton kernels
(``triton_ops.py``). Gives: forward and backward ops registered with
``torch.library.custom_op`` (each with a fake implementation, so they trace), their
autograd formulas (the backward is a kernel too, never autograd through the
reference), and the public functions: ``cross_entropy`` here; gpt's ``layer_norm`` and
``bias_gelu`` (``ops_gpt.py``), llama's ``rms_norm``, ``swiglu`` and ``rotary``
(``ops_llama.py``), ``block_attention`` with its backward, called by ring attention's own
autograd Function (``ops_ring.py``, ``ring.py``), and the experts' ``permute_rows``,
``combine_rows`` and ``grouped_mm`` (``ops_moe.py``), all read from this module (Note [ops
by feature]).

Each call enters its op through ``dispatch.call`` (Note [custom-op dispatch]).

Dispatch: CPU tensors run the C++ kernels, CUDA tensors the Triton ones. Setting
``PARC_TRITON_ON_CPU=1`` (with ``TRITON_INTERPRET=1``) sends CPU tensors to Triton's
interpreter: the Triton tests use it, nothing else should.

Note [vocab-sharded cross-entropy]: each rank holds columns [start, start + V/tp)
of the padded vocab. The stats kernel gives per row the local max m, the local
Σ exp(x − m) s and the target's logit (0 off its owner); three all-reduces over tp
give M = max m, S = Σ s·exp(m − M) and the target logit, so loss = M + log S −
target and lse = M + log S is all backward keeps besides the logits. The grad
kernel forms (exp(x − lse) − onehot)·grad per column: the probabilities exist only
inside that one pass.
"""

from __future__ import annotations

import importlib

import torch
from torch import Tensor

from ..distributed.comm import _all_reduce, group_rank
from .backend import _DEVICES, _backend, _row_stats, _stats_dtype  # noqa: F401
from .dispatch import call

import torch.distributed as dist



# ---- cross-entropy ----------------------------------------------------------------


@torch.library.custom_op("parc::cross_entropy_stats", mutates_args=(), device_types=_DEVICES)
def cross_entropy_stats(logits: Tensor, targets: Tensor, start: int, vocab_size: int) -> tuple[Tensor, Tensor, Tensor]:
    """Per row of this vocab slice: (max, Σ exp(x − max), target logit or 0); Note [vocab-sharded cross-entropy]."""
    row_max, sum_exp, picked = _backend(logits).cross_entropy_stats(logits, targets, start, vocab_size)
    return row_max, sum_exp, picked


@cross_entropy_stats.register_fake
def _(logits, targets, start, vocab_size):
    return _row_stats(logits), _row_stats(logits), _row_stats(logits)


@torch.library.custom_op("parc::cross_entropy_grad", mutates_args=(), device_types=_DEVICES)
def cross_entropy_grad(logits: Tensor, targets: Tensor, lse: Tensor, grad: Tensor, start: int, vocab_size: int) -> Tensor:
    """dlogits = (exp(x − lse) − onehot(target)) · grad on this slice; padding columns get 0."""
    return _backend(logits).cross_entropy_grad(logits, targets, lse, grad, start, vocab_size)


@cross_entropy_grad.register_fake
def _(logits, targets, lse, grad, start, vocab_size):
    return torch.empty_like(logits, memory_format=torch.contiguous_format)


class _CrossEntropy(torch.autograd.Function):
    """Note [vocab-sharded cross-entropy]: three all-reduces of (B, T) stats between two kernels."""

    @staticmethod
    def forward(ctx, logits, targets, group, vocab_size):
        start = group_rank(group) * logits.shape[-1]
        row_max, sum_exp, picked = call(cross_entropy_stats, logits, targets, start, vocab_size)
        peak = _all_reduce(row_max, group, op=dist.ReduceOp.MAX)
        total = _all_reduce(sum_exp * (row_max - peak).exp(), group)
        picked = _all_reduce(picked, group)
        lse = peak + total.log()
        ctx.save_for_backward(logits, targets, lse)
        ctx.start, ctx.vocab_size = start, vocab_size
        return lse - picked

    @staticmethod
    def backward(ctx, grad):
        logits, targets, lse = ctx.saved_tensors
        dlogits = call(cross_entropy_grad, logits, targets, lse, grad, ctx.start, ctx.vocab_size)
        return dlogits, None, None, None


def cross_entropy(logits: Tensor, targets: Tensor, *, vocab_size: int, tp_group=None) -> Tensor:
    """Per-token loss (fp32) from logits (..., V/tp) sharded over ``tp_group`` (None: one rank).

    Columns at or past ``vocab_size`` of the padded vocab are padding. Forward: three
    all-reduces over tp of per-row statistics; backward: local, no communication.
    """
    return _CrossEntropy.apply(logits, targets, tp_group, vocab_size)


# ---- the ops of each architecture and feature ----------------------------------------


# Note [ops by feature]: every fused op is read from this module (``select`` gives it; the
# norms, the MLP, attention, ``ring.py`` and ``moe.py`` call ``fused.<op>``), but the ops of
# one architecture (gpt's LayerNorm, its residual add + LayerNorm and GeLU; llama's RMSNorm,
# its residual add + RMSNorm, SwiGLU and rotary: add_norm.py), ring
# attention's block attention and the experts' ops each live in their own module, which a
# build ships only with its architecture or feature (``features.left_out``); a name of
# theirs asked of this module imports that module then.
_BY_MODULE = {
    "ops_gpt": ("layer_norm", "layer_norm_fwd", "layer_norm_bwd", "bias_gelu", "_bias_gelu", "bias_gelu_bwd",
                "add_layer_norm", "add_layer_norm_fwd", "add_layer_norm_bwd"),
    "ops_llama": ("rms_norm", "rms_norm_fwd", "rms_norm_bwd", "swiglu", "_swiglu", "swiglu_bwd", "rotary", "_rotary_qk",
                  "add_rms_norm", "add_rms_norm_fwd", "add_rms_norm_bwd"),
    "ops_ring": ("block_attention", "block_attention_backward", "block_attention_fwd", "block_attention_bwd"),
    "ops_moe": ("permute_rows", "combine_rows", "grouped_mm", "permute_rows_fwd", "permute_rows_bwd",
                "combine_rows_fwd", "combine_rows_bwd", "grouped_mm_fwd", "grouped_mm_bwd"),
}
ELSEWHERE = {name: module for module, names in _BY_MODULE.items() for name in names}


def __getattr__(name: str):
    if name not in ELSEWHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{ELSEWHERE[name]}", __package__), name)
