"""Eager PyTorch references of the fused ops (autograd through plain torch ops).

Takes and gives the same tensors as the public functions of ``ops.py``; the tests
compare the compiled kernels against these, and the bench times them (eager and
under ``torch.compile``). Low-precision inputs are computed in fp32 and rounded
once, as the kernels do. ``rotary`` is ``llama_attention.py``'s ``rotary()`` (a test
keeps the two equal); ``rotary_tables`` is ops_llama.py's, shared with the kernels so both
rotate by the very same fp32 cos/sin values.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

_LOW = (torch.float16, torch.bfloat16)


def _up(t):
    return None if t is None else (t.float() if t.dtype in _LOW else t)


def layer_norm(x, weight, bias, eps):
    y = F.layer_norm(_up(x), (x.shape[-1],), _up(weight), _up(bias), eps)
    return y.to(x.dtype)


def rms_norm(x, weight, eps):
    return F.rms_norm(_up(x), (x.shape[-1],), _up(weight), eps).to(x.dtype)


def add_layer_norm(x, residual, weight, bias, eps):
    """(LayerNorm(h), h) with h = x + residual: the residual add before a norm."""
    h = x + residual
    return layer_norm(h, weight, bias, eps), h


def add_rms_norm(x, residual, weight, eps):
    """(RMSNorm(h), h) with h = x + residual."""
    h = x + residual
    return rms_norm(h, weight, eps), h


def bias_gelu(x, bias=None):
    """GeLU (tanh approximation, GPT-2) of ``x + bias``."""
    v = _up(x) if bias is None else _up(x) + _up(bias)
    return F.gelu(v, approximate="tanh").to(x.dtype)


def swiglu(gate, up):
    """silu(gate) · up."""
    return (F.silu(_up(gate)) * _up(up)).to(gate.dtype)


def rotary_one(x, theta, start=0):
    """Rotate (B, heads, T, D) by position (pairs of halves, Llama style).

    A bf16 x is rotated in fp32 and the result rounded back to bf16, as model.py's
    rotary() does (bf16/fp16 compute weights: q and k stay in the compute dtype); its
    gradient is formed in fp32 and rounded once (model.py's rounds each of the two terms).
    """
    from .ops_llama import rotary_tables  # the tables the fused rotary uses too (llama's ops)

    dtype, x = x.dtype, _up(x)
    cos, sin = rotary_tables(x.shape[-2], x.shape[-1], theta, x.device, start)
    cos, sin = cos.repeat(1, 2), sin.repeat(1, 2)  # (T, D)
    first, second = x.chunk(2, dim=-1)
    return (x * cos + torch.cat((-second, first), dim=-1) * sin).to(dtype)


def rotary(q, k, theta, start=0):
    return rotary_one(q, theta, start), rotary_one(k, theta, start)


def cross_entropy(logits, targets, vocab_size):
    """Per-token loss (fp32) over unsharded logits (..., V); columns ≥ vocab_size are padding."""
    logits = _up(logits)
    V = logits.shape[-1]
    if V > vocab_size:
        pad = torch.arange(V, device=logits.device) >= vocab_size
        logits = logits.masked_fill(pad, float("-inf"))
    lse = torch.logsumexp(logits, dim=-1)
    return lse - logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1)


# ---- block attention with log-sum-exp (ring attention's step) -----------------------


def _stats(q):
    """The dtype block attention accumulates in: fp64 for fp64 inputs, fp32 otherwise."""
    return torch.float64 if q.dtype == torch.float64 else torch.float32


def _scores(q, k, causal, scale, allowed=None):
    """q kᵀ · scale in the stats dtype, (B, H, Tq, Tk), k's heads repeated for grouped
    queries (query head h reads kv head h // (H / Hkv), as SDPA's ``enable_gqa``);
    ``causal``: Tq == Tk and query i sees keys 0..i; ``allowed`` (bool, broadcast to
    (B, H, Tq, Tk)): only there (documents = separate: the same document)."""
    k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    s = torch.matmul(q.to(_stats(q)), k.to(_stats(q)).transpose(-1, -2)) * scale
    if causal:
        T = q.shape[-2]
        s = s.masked_fill(torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    if allowed is not None:
        s = s.masked_fill(~allowed, float("-inf"))
    return s


def block_attention(q, k, v, causal, scale, allowed=None, keep=None):
    """softmax(q kᵀ · scale) v over one block of keys, and the rows' log-sum-exp.

    q (B, H, Tq, D), k and v (B, Hkv, Tk, D) → out (B, H, Tq, D) and lse (B, H, Tq), both
    in the stats dtype (fp32, fp64 for fp64): partial results over disjoint key blocks
    merge exactly by their lse (``ring.merge``). A row that ``allowed`` leaves no key
    gives output 0 and lse −∞ (it merges as nothing). ``keep`` (attention dropout, Note
    [ring attention with dropout]): the block's kept weights' factor, 0 or 1/(1 − p), which
    multiplies the probabilities before v; the lse is of the scores, dropout or not."""
    s = _scores(q, k, causal, scale, allowed)
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - (lse if allowed is None else lse.masked_fill(lse == float("-inf"), 0.0)).unsqueeze(-1))
    v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1).to(p.dtype)
    return torch.matmul(p if keep is None else p * keep, v), lse


def block_attention_backward(grad, q, k, v, out, lse, causal, scale, allowed=None, keep=None):
    """The gradients of one block's share of attention whose rows' final output and lse
    over all blocks are ``out`` and ``lse``: with P = exp(s − lse), delta = Σ_d grad · out and
    Z the dropout factor ``keep`` (1 without), dV = (Z P)ᵀ grad, dS = P (Z grad vᵀ − delta),
    dQ = dS k · scale, dK = dSᵀ q · scale; dK and dV summed over each kv head's group of
    query heads. All in the stats dtype."""
    group = q.shape[1] // k.shape[1]
    p = torch.exp(_scores(q, k, causal, scale, allowed) - lse.unsqueeze(-1))
    grad = grad.to(p.dtype)
    delta = (grad * out.to(p.dtype)).sum(-1)
    ks, vs = (t.repeat_interleave(group, dim=1).to(p.dtype) for t in (k, v))
    dv = torch.matmul((p if keep is None else p * keep).transpose(-1, -2), grad)
    dp = torch.matmul(grad, vs.transpose(-1, -2))
    ds = p * ((dp if keep is None else dp * keep) - delta.unsqueeze(-1))
    dq = torch.matmul(ds, ks) * scale
    dk = torch.matmul(ds.transpose(-1, -2), q.to(p.dtype)) * scale
    B, Hkv, Tk, D = k.shape
    return dq, dk.view(B, Hkv, group, Tk, D).sum(2), dv.view(B, Hkv, group, Tk, D).sum(2)


def permute_rows(x, index):
    """Rows ``x[index]`` (each routed slot's token, in expert order)."""
    return x[index]


def combine_rows(rows, index, weight, tokens: int):
    """Σ over rows i with index[i] = t of weight[i]·rows[i], for each of ``tokens`` tokens."""
    weighted = _up(rows) * _up(weight).unsqueeze(1)
    return torch.zeros(tokens, rows.shape[1], dtype=weighted.dtype, device=rows.device).index_add_(
        0, index, weighted).to(rows.dtype)


def grouped_mm(x, weight, counts):
    """Each run of ``counts[e]`` rows of ``x`` times ``weight[e]``ᵀ: (N, in) → (N, out)."""
    outs, start = [], 0
    for expert, count in enumerate(counts.tolist()):
        outs.append((_up(x[start : start + count]) @ _up(weight[expert]).t()).to(x.dtype))
        start += count
    return torch.cat(outs) if outs else x.new_empty(0, weight.shape[1])
