"""Which fused ops pay at a model's size (Note [eager at small shapes] in kernels/dispatch.py).

Takes: a kind of fused op and the elements of one sequence's tensor for it (seq_len ×
hidden, or × the MLP's width), or a model's config. Gives: whether the kernels beat eager
PyTorch there (``pays``), and the kinds a model's norms, dense MLP and rotary take them
for (``kinds_that_pay``). Pure Python, no torch: ``kernels.dispatch.compiled_pays`` (which
``model.use_kernels`` asks for each module) and the planner's activation model
(runtime/layout/saved_elements.py, through codegen/planner/cost/memory.py) read the one table,
so what the trainer runs and what the planner predicts it saves follow one rule.
"""

from __future__ import annotations

import os

EAGER_BELOW = {  # elements of one sequence's tensor (Note [eager at small shapes]), CPU
    # eager / parc at 64², 128², 256², 512², 1024²: 0.64 0.76 0.94 0.95 1.89 (512²: 1.07
    # and 1.01 in two runs under load); eager CPU LayerNorm is one fused kernel each way,
    # ours are faster (3.6 + 4.1 µs against 4.7 + 7.1 at 64²) by less than the Function
    # costs until about 512² (bench/kernels.py: 2.99x eager at 8192×4096)
    "layer_norm": 1 << 20,
    "rms_norm": 0,  # 1.63 2.03 2.84 6.36 13.5: eager RMSNorm is several ops each way
    "add_layer_norm": 1 << 18,  # 0.69 0.81 1.01 1.20 1.65 (3.76x at 8192×4096)
    "add_rms_norm": 0,  # 1.41 1.67 2.31 9.94 13.1
    "swiglu": 1 << 16,  # seq_len × width: 0.78 0.88 1.12 1.29 3.07
    "bias_gelu": 1 << 14,  # seq_len × width: 0.95 1.48 2.39 3.10 3.73
    "rotary": 0,  # 1.95 2.27 2.41 2.74 5.76
}


def pays(kind: str, elements: int, *, cpu: bool) -> bool:
    """Whether ``kind`` takes the kernels at ``elements``; off the CPU always (Triton, not
    measured here). ``PARC_KERNELS_EAGER_BELOW`` replaces every size (0: always)."""
    if not cpu:
        return True
    below = os.environ.get("PARC_KERNELS_EAGER_BELOW")
    return elements >= (EAGER_BELOW[kind] if below is None else int(below))


def kinds_that_pay(config, *, cpu: bool) -> frozenset[str]:
    """The kinds of fused op a model with ``config`` (a ``ModelConfig``) takes
    the kernels for, as ``model.use_kernels`` chooses them for its norms (and the residual
    adds fused into them), its dense MLP's activation and rotary; with the kinds that
    have no size rule (the loss, the MoE permutation and combine) always."""
    norm, mlp = ("rms_norm", "swiglu") if config.arch == "llama" else ("layer_norm", "bias_gelu")
    widths = {norm: config.hidden, f"add_{norm}": config.hidden, mlp: config.ffn, "rotary": config.hidden}
    sized = {kind for kind, width in widths.items() if pays(kind, config.seq_len * width, cpu=cpu)}
    return frozenset(sized | {"cross_entropy", "moe"})
