"""The rules on the model's own shape (its name, heads, kv heads, top_k) and ``kv_replicas``:
the part of the rules the trainer runs itself (``ModelConfig``'s checks in model_desc.py, the tp
plan's kv heads), so a build ships these and ``rule_engine.py``, not ``constraints/``."""

from __future__ import annotations

import keyword

from .rule_engine import _violation, divisors, rule, some



@rule("PAR0114")
def model_name(name):
    if isinstance(name, str) and (keyword.iskeyword(name) or keyword.issoftkeyword(name)):
        return _violation("PAR0114", "model.name", f"`{name}` is a Python keyword and cannot name the model",
                          f"try `{name}_model`")
    return None



@rule("PAR0202")
def heads_divide_hidden(hidden, heads, head_dim=None):
    if head_dim is not None or hidden % heads == 0:  # a written head_dim sets the heads' width itself
        return None
    return _violation(
        "PAR0202", "model.heads",
        f"hidden = {hidden} is not divisible by heads = {heads} (head_dim = hidden / heads = {hidden / heads:g})",
        f"heads must divide hidden: one of {some(divisors(hidden), heads)}, or write model.head_dim",
    )



@rule("PAR0226")
def head_dim_even(head_dim, arch=None):
    """Rotary positions (llama) turn pairs of a head's features: head_dim must be even."""
    if arch == "gpt" or head_dim % 2 == 0:
        return None
    return _violation("PAR0226", "model.head_dim", f"head_dim = {head_dim} is odd: rotary positions (llama) "
                      "rotate pairs of a head's features", f"try head_dim = {head_dim + 1}")



@rule("PAR0227")
def llama_attention_traits(arch, qk_norm=None, attention_bias=None):
    """q/k RMSNorm and the q/k/v-only biases are llama's (Qwen2, Qwen3, OLMo-2); gpt keeps
    its LayerNorm blocks with every bias."""
    if arch != "gpt":
        return None
    written = [key for key, on in (("qk_norm", qk_norm), ("attention_bias", attention_bias)) if on]
    if not written:
        return None
    return _violation("PAR0227", tuple(f"model.{key}" for key in written),
                      f"model.{written[0]} = true is built for arch = llama only (gpt has every bias and no q/k norm)",
                      f"write arch = llama, or remove model.{written[0]}")



@rule("PAR0204")
def kv_heads_divide_heads(heads, kv_heads):
    if heads % kv_heads == 0:
        return None
    return _violation("PAR0204", "model.kv_heads", f"heads = {heads} is not divisible by kv_heads = {kv_heads}",
                      f"kv_heads must divide heads: one of {some(divisors(heads), kv_heads)}")



def kv_replicas(kv_heads: int, tp: int) -> int:
    """How many tp ranks hold each kv head (Note [KV replication] in ``kv_replication.py``): 1 when
    tp divides kv_heads (each rank its kv_heads / tp heads), tp / kv_heads when tp is a
    multiple of kv_heads (each rank one head, shared with its replicas); 0: neither."""
    if kv_heads % tp == 0:
        return 1
    return tp // kv_heads if tp % kv_heads == 0 else 0



@rule("PAR0230")
def top_k_within_experts(experts, top_k):
    if experts == 0 or top_k <= experts:
        return None
    return _violation("PAR0230", ("model.top_k", "model.experts"),
                      f"top_k = {top_k} is more than experts = {experts}",
                      f"each token goes to top_k distinct experts: top_k must be at most {experts}")



@rule("PAR0235")
def dense_layers_leave_moe(experts, layers, first_dense_layers):
    """``first_dense_layers = k`` makes blocks 0 .. k − 1 dense: some block must stay MoE."""
    if experts == 0 or first_dense_layers < layers:
        return None
    return _violation("PAR0235", ("model.first_dense_layers", "model.layers"),
                      f"first_dense_layers = {first_dense_layers} makes every one of the {layers} blocks dense, "
                      f"so the {experts} experts are never used",
                      f"first_dense_layers must be less than layers = {layers}: at most {layers - 1}")
