"""The gradients of column linears sharing one input, for the autograd Functions that
overlap their collectives with them (sp_columns.GatheredColumns, overlap._ColumnLinears).

Takes: the outputs' gradients g_j, the weights W_j, the biases' dtypes and the input the
linears saw. Gives: the input gradient Σ_j g_j W_j and each weight's and bias's gradient.
Backward runs outside autocast: both compute in the gradients' dtype (bf16 under autocast,
as autocast's own linear would) and return each parameter's dtype.
"""

from __future__ import annotations


def input_grad(grads, weights):
    """Σ_j g_j W_j: the shared input's gradient, before its tp collective."""
    total = None
    for g, w in zip(grads, weights):
        part = g.matmul(w.to(g.dtype))
        total = part if total is None else total + part
    return total


def weight_grads(grads, weights, bias_dtypes, source) -> tuple[list, list]:
    """Each weight's gradient g_jᵀ·source and each bias's Σ g_j (None where a linear has no bias)."""
    flat_source = source.reshape(-1, source.shape[-1])
    grad_weights, grad_biases = [], []
    for g, w, bias_dtype in zip(grads, weights, bias_dtypes):
        flat = g.reshape(-1, g.shape[-1])
        grad_weights.append(flat.t().matmul(flat_source.to(flat.dtype)).to(w.dtype))
        grad_biases.append(None if bias_dtype is None else flat.sum(0).to(bias_dtype))
    return grad_weights, grad_biases
