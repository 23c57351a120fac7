"""The tensors parc's trainer saves for backward, in elements per token, from the shapes.

Takes: a ``ModelConfig`` and a block's description (``model_desc.BlockDesc``: heads,
kv heads, head dim, ffn) and the layout's tp, sp, recompute, micro-batch and kernels
(``compiled``: True, False, or the kinds of fused op that run, runtime/layout/kernel_sizes.py).
Gives: ``block_saved_elements`` and ``head_saved_elements``, which the planner's memory
model (``codegen/planner/cost/memory.py``) multiplies by tokens and bytes. Pure Python, no
torch; the planner's alone, so a build does not ship it.

Note [what parc's trainer saves]: the activations are the tensors autograd saves in
``runtime/models/model.py``, counted per token, in elements (h hidden, F ffn, a heads,
q = heads·head_dim (h unless ``model.head_dim`` is written), k = kv_heads·head_dim, t = tp):

  gpt block:   4h (residual x twice, each norm's output as the next linear's input)
               + q q + k + v k + attention output q + up F + gelu F, all /t
               + norm statistics 4 and log-sum-exp a/t (flash attention: no s² term)
  llama block: eager ops: 6h (RMSNorm saves x, x·rstd and its output) + rotated q q,
               k, v k, output q, under qk_norm 2(q + k) + a + kv_heads (the head norms' input,
               x·rstd and rstd), gate F, up F, silu F, product F (/t), rstd 2,
               lse a/t, cos/sin tables 4·T·D per micro-batch; compiled kernels
               (``train.kernels``, runtime/kernels): 4h (the fused norm saves x
               and rstd) and SwiGLU saves gate and up but not silu (3F), tables T·D
  sp:          the norms' tensors are /t, and so are the column linears' inputs: they
               save their shard and gather it again in backward (Note [sp inputs saved
               as shards] in runtime/parallel/tensor/layers.py).
  selective:   the attention core's lse and tables go; full: the block input only
               (h, or h/t under sp).
  MoE block:   no dense MLP; the experts' part: cost/experts.py's Note [what a MoE block saves].

  2D grid:     the tp ranks as R × C (Note [2D tensor parallelism] in layers2d.py): the
               stream and the norms hold h/R features, the column linears' outputs
               and the attention core out/C and heads/C, the same on the R ranks of a
               column (the attention's repeated copies). The 2D norm is eager whatever
               the kernels: it saves two tensors of h/R (LayerNorm: x − mean and the
               normalized x; RMSNorm: x and x·rstd) and one statistic, and its output is
               the column linears' input (h/R): 6h/R + 2, plus sharded/C, lse a/C and
               llama's tables as in 1D. Under sp (Note [2D sequence parallelism]) the
               norms run on T/C tokens: 4h/(R·C) + 2/C, and each region's all-gathered
               input is kept whole, 2h/R; full recompute keeps h/R (h/(R·C) under sp).

Those were read off ``saved_tensors_hooks`` on CPU and are checked against the
trainer's measurement in tests/planner. The working set of a recomputed layer and the
gradient flat buffers are real memory but not saved activations (cost/memory.py's
``buffers``); the model state is in cost/memory.py's Note [what parc's trainer holds].
"""

from __future__ import annotations


def takes(compiled, kind: str) -> bool:
    """Whether the fused ``kind`` of op runs: ``compiled`` is True (every kind), False
    (eager) or the kinds that pay at the model's size (``kernel_sizes.kinds_that_pay``);
    the experts' count reads it too (codegen/planner/cost/experts.py)."""
    return compiled if isinstance(compiled, bool) else kind in compiled


def block_saved_elements(
    config, block, *, tp: int, sp: bool, recompute: str, micro_batch: int, compiled: bool = True, grid=None,
) -> float:
    """Elements saved per token by one block (Note [what parc's trainer saves]), but for a
    MoE block's experts, router and combine, which the planner adds (cost/experts.py);
    ``grid``: (R, C) under 2D tensor parallelism with R > 1 (dense blocks only: experts
    are refused there), else None."""
    if grid is not None:
        return _grid_block(config, block, grid=grid, sp=sp, recompute=recompute, micro_batch=micro_batch,
                           compiled=compiled)
    dense = _dense_block(config, block, tp=tp, sp=sp, recompute=recompute, micro_batch=micro_batch,
                         compiled=compiled)
    if block.experts and recompute != "full":
        return dense - _dense_mlp(config, block, tp, compiled)
    return dense


def _dense_block(config, block, *, tp: int, sp: bool, recompute: str, micro_batch: int, compiled: bool) -> float:
    h, F, a, t = config.hidden, block.ffn, block.heads, tp
    k = block.kv_heads * block.head_dim
    q = _attention_width(config, block)
    if recompute == "full":
        return h / t if sp else h
    core_extra = a / t  # log-sum-exp of the flash attention
    if config.arch == "gpt":
        whole, stats = 4 * h, 4.0
        sharded = 2 * q + 2 * k + 2 * F
    else:  # the fused RMSNorm saves x and rstd, SwiGLU gate and up, rotary its (T, D/2) tables
        whole, stats = (4 * h if takes(compiled, "rms_norm") else 6 * h), 2.0
        sharded = 2 * q + 2 * k + (3 if takes(compiled, "swiglu") else 4) * F + _qk_norm(config, block)
        core_extra += (1 if takes(compiled, "rotary") else 4) * block.head_dim / micro_batch  # eager: (T, D) for q and k
    if recompute == "selective":
        core_extra = 0.0
    if sp:  # the norms' tensors, the column linears' inputs too (Note [sp inputs saved as shards])
        return (whole + stats) / t + sharded / t + core_extra
    return whole + stats + sharded / t + core_extra


def _sharded_and_core(config, block, *, recompute: str, micro_batch: int, compiled: bool) -> tuple[float, float]:
    """(the tensors split over the tp ranks that hold different heads and ffn columns, per
    token before that split; the attention core's extras on one rank of C = 1)."""
    F, a = block.ffn, block.heads
    k, q = block.kv_heads * block.head_dim, _attention_width(config, block)
    core = float(a)
    if config.arch == "gpt":
        sharded = 2 * q + 2 * k + 2 * F
    else:
        sharded = 2 * q + 2 * k + (3 if takes(compiled, "swiglu") else 4) * F + _qk_norm(config, block)
    return sharded, 0.0 if recompute == "selective" else core


def _grid_block(config, block, *, grid, sp: bool, recompute: str, micro_batch: int, compiled: bool) -> float:
    """A dense block on an R × C grid (Note [what parc's trainer saves], 2D grid)."""
    rows, cols = grid
    h = config.hidden
    if recompute == "full":
        return h / (rows * cols) if sp else h / rows
    sharded, core = _sharded_and_core(config, block, recompute=recompute, micro_batch=micro_batch, compiled=compiled)
    tables = 0.0
    if config.arch == "llama" and recompute != "selective":  # rotary's cos and sin, per micro-batch
        tables = (1 if takes(compiled, "rotary") else 4) * block.head_dim / micro_batch
    heads_part = sharded / cols + core / cols + tables
    if sp:
        return 4 * h / (rows * cols) + 2 / cols + 2 * h / rows + heads_part
    return 6 * h / rows + 2 + heads_part


def _attention_width(config, block) -> int:
    """heads · head_dim: q's features and the attention output's (hidden unless
    ``model.head_dim`` sets the heads' width)."""
    return block.heads * block.head_dim


def _qk_norm(config, block) -> float:
    """``model.qk_norm``: each RMSNorm over a head of q and k saves its input and x·rstd, and
    one rstd per head (eager ops: the head norms never take a compiled kernel)."""
    if not getattr(config, "qk_norm", False):
        return 0.0
    return 2.0 * (block.heads + block.kv_heads) * block.head_dim + block.heads + block.kv_heads


def _dense_mlp(config, block, tp: int, compiled: bool) -> float:
    """The F terms of a dense block's MLP per token on a tp rank (see above)."""
    if config.arch == "gpt":
        return 2 * block.ffn / tp
    return (3 if takes(compiled, "swiglu") else 4) * block.ffn / tp


def head_saved_elements(config, *, tp: int, sp: bool, compiled: bool = True, grid=None) -> float:
    """Elements saved per token by the final norm, the head and the loss (last stage);
    ``grid``: (R, C) under 2D tensor parallelism (the eager 2D norm, the logits' V/C)."""
    h, t = config.hidden, tp
    loss = 1.0 if takes(compiled, "cross_entropy") else 2.25  # int64 targets and the loss's statistics
    if grid is not None:
        rows, cols = grid
        norm = 2 * h / (rows * cols) + 1 / cols + h / rows if sp else 3 * h / rows + 1
        return norm + config.padded_vocab / cols + loss
    if config.arch == "gpt":
        norm = 2 * h + 2  # x and the output; mean and rstd
    else:
        norm = (2 * h if takes(compiled, "rms_norm") else 3 * h) + 1  # x, (x·rstd), the output; rstd
    if sp:
        norm = h + (norm - h) / t  # the norm runs on a shard; the head keeps the gathered input
    return norm + config.padded_vocab / t + loss
