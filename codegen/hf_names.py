"""parc's model ↔ Hugging Face's: the one table of names and layouts, read both ways.

Takes: a parc model config (``parc.json``'s ``model``, a dict of ``ModelConfig``'s
fields) or a Hugging Face ``config.json`` (a dict). Gives: ``links(config)``, which parc
tensors are which Hugging Face tensors (``Link``), with ``to_hf``/``from_hf`` converting
one link's tensors either way; and ``CONFIG_KEYS``/``FIXED``, which config key of
transformers holds which model key of parc, with ``hf_config`` (parc → config.json)
and ``parc_model`` (config.json → parc's model keys, each with the key it came from).
``parc export`` (codegen/cli/export.py) reads it one way, ``parc import``
(codegen/hf_import.py) the other, so a name or layout is written once.

Note [Hugging Face layouts]: GPT-2's checkpoints use Conv1D, whose weight is the
transpose of nn.Linear's, (in, out); and one fused ``c_attn`` of (C, 3C) holding q, k, v
side by side, so parc's q_proj/k_proj/v_proj weights are concatenated along the output
dim and transposed (biases concatenated). GPT-2 has no grouped-query attention: a gpt
model with kv_heads < heads has no gpt2 names. Llama keeps nn.Linear layouts and
separate projections. parc's rotary (model.py ``rotary``) rotates pairs of *halves* of
each head, which is Hugging Face's ``rotate_half``, so q_proj and k_proj are copied as
they are (Meta's original checkpoints interleave pairs instead, and HF's conversion
script permutes them; a parc checkpoint never needs that). A tied head has no tensor
of its own in either (both libraries tie ``lm_head`` to the embedding from the config).
parc's embedding and untied head have ``padded_vocab`` rows (Note [logical checkpoint
tensors]); Hugging Face's have ``vocab``: export drops the padding rows, import adds
them as zeros (they never reach the loss, which masks logits past ``vocab``).

Note [Mixtral names]: a llama with experts (runtime/parallel/expert/moe.py) is transformers'
MixtralForCausalLM: the router is ``block_sparse_moe.gate`` and expert j's gate, down and
up projections are ``block_sparse_moe.experts.j.w1``, ``w2`` and ``w3`` (slices of parc's
grouped (E, out, in) weights). Mixtral routes as parc's softmax router does (softmax, top-k,
renormalized) and drops nothing; a model Mixtral cannot hold (gpt with experts, dense
blocks between MoE ones, shared experts, a sigmoid router) has no names (``NoHfNames``).

Note [Mixtral's aux loss]: parc adds, in each MoE layer, ``aux_loss · E · Σ_e f_e · P_e``
with ``f_e`` the layer's tokens routed to e over ``N·top_k`` (runtime/parallel/expert/moe.py);
transformers' Mixtral computes one term for the whole model, the routed fractions and mean
probabilities pooled over every layer's tokens, with ``f_e`` over ``N`` (not ``N·top_k``),
times ``router_aux_loss_coef``. So ``router_aux_loss_coef = aux_loss · layers / top_k``
(``aux_coef``; import reads it back with ``aux_loss``): the same loss for one MoE layer, and
for several when their routing statistics agree; pooling (a product of means, not a mean of
products) makes them differ otherwise. It matters only to whoever trains further with
``output_router_logits = true``.

Note [Qwen names]: a llama with ``attention_bias`` (q, k, v biases, none on o) is
transformers' Qwen2ForCausalLM, whose attention always has exactly those; one with
``qk_norm`` (an RMSNorm of head_dim over each head of q and k before rotary) is
Qwen3ForCausalLM with ``attention_bias = false`` (Qwen3's and Llama's ``attention_bias``
put a bias on o_proj too, which parc's has not: a llama with both has no names). Every
llama-like config.json carries ``head_dim``: export writes it, import reads it (absent:
hidden / heads).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: torch loads when tensors are converted
    import torch


class NoHfNames(ValueError):
    """A model (or a config.json) one side cannot hold; the message names what differs."""


@dataclass(frozen=True, slots=True)
class Link:
    """Some parc tensors are some Hugging Face tensors.

    The parc tensors joined along dim 0 (several: GPT-2's q, k, v), cut to ``vocab`` rows
    (``vocab_rows``), transposed (``transposed``: Conv1D) are the one HF tensor; or, with
    several HF names, the one parc tensor's slices along dim 0 are they (Mixtral's experts).
    """

    parc: tuple[str, ...]
    hf: tuple[str, ...]
    transposed: bool = False
    vocab_rows: bool = False


GPT2_BLOCK = {  # parc name -> (HF name, transposed: Conv1D)
    "attn_norm.weight": ("ln_1.weight", False),
    "attn_norm.bias": ("ln_1.bias", False),
    "attn.o_proj.weight": ("attn.c_proj.weight", True),
    "attn.o_proj.bias": ("attn.c_proj.bias", False),
    "mlp_norm.weight": ("ln_2.weight", False),
    "mlp_norm.bias": ("ln_2.bias", False),
    "mlp.up_proj.weight": ("mlp.c_fc.weight", True),
    "mlp.up_proj.bias": ("mlp.c_fc.bias", False),
    "mlp.down_proj.weight": ("mlp.c_proj.weight", True),
    "mlp.down_proj.bias": ("mlp.c_proj.bias", False),
}
LLAMA_BLOCK = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn.q_proj.weight": "self_attn.q_proj.weight",
    "attn.k_proj.weight": "self_attn.k_proj.weight",
    "attn.v_proj.weight": "self_attn.v_proj.weight",
    "attn.o_proj.weight": "self_attn.o_proj.weight",
    "mlp_norm.weight": "post_attention_layernorm.weight",
    "mlp.gate_proj.weight": "mlp.gate_proj.weight",
    "mlp.up_proj.weight": "mlp.up_proj.weight",
    "mlp.down_proj.weight": "mlp.down_proj.weight",
}
QWEN_BLOCK = {  # model_type -> what its blocks add to LLAMA_BLOCK (Note [Qwen names])
    "qwen2": {f"attn.{p}_proj.bias": f"self_attn.{p}_proj.bias" for p in "qkv"},
    "qwen3": {"attn.q_norm.weight": "self_attn.q_norm.weight", "attn.k_norm.weight": "self_attn.k_norm.weight"},
}
MIXTRAL_EXPERT = {"gate_proj": "w1", "down_proj": "w2", "up_proj": "w3"}
"""parc's expert projection → Mixtral's (Note [Mixtral names])."""


def model_type(config: dict) -> str:
    """transformers' ``model_type`` of a parc model config: gpt2, llama or mixtral."""
    if config.get("experts", 0):
        _check_mixtral(config)
        return "mixtral"
    if config["arch"] == "gpt":
        if config["kv_heads"] != config["heads"]:
            raise NoHfNames(f"gpt2 has no grouped-query attention: kv_heads = {config['kv_heads']} < heads")
        return "gpt2"
    if config["arch"] == "llama":
        return _llama_type(config)
    raise NoHfNames(f"no Hugging Face names for arch {config['arch']!r}")


def _llama_type(config: dict) -> str:
    """llama, or Qwen2 (q/k/v biases) or Qwen3 (q/k norms): Note [Qwen names]."""
    bias, norm = config.get("attention_bias", False), config.get("qk_norm", False)
    if bias and norm:
        raise NoHfNames("attention_bias and qk_norm together: Qwen3's attention_bias also puts a bias on o_proj, "
                        "parc's does not")
    return "qwen2" if bias else "qwen3" if norm else "llama"


def _check_mixtral(config: dict) -> None:
    unlike = [words for words, differs in (
        ("gpt with experts: gpt2 has no mixture of experts", config["arch"] != "llama"),
        (f"moe_every = {config.get('moe_every')}: dense blocks between MoE ones", config.get("moe_every", 1) != 1),
        (f"shared_experts = {config.get('shared_experts')}", config.get("shared_experts", 0) != 0),
        (f"router = {config.get('router')}", config.get("router", "softmax") != "softmax"),
        (f"first_dense_layers = {config.get('first_dense_layers')}: dense blocks first",
         config.get("first_dense_layers", 0) != 0),
        (f"router_bias_update = {config.get('router_bias_update')}: a routing bias",
         config.get("router_bias_update", 0) != 0),
        ("attention_bias = true", config.get("attention_bias", False)),
        ("qk_norm = true", config.get("qk_norm", False)),
    ) if differs]
    if unlike:
        deepseek = any(config.get(k) for k in ("first_dense_layers", "router_bias_update", "shared_experts"))
        why = ("; DeepSeek-V3's class holds these only with multi-head latent attention, which parc does not build"
               if deepseek else "")
        raise NoHfNames(f"Mixtral cannot hold this model ({'; '.join(unlike)}){why}: no Hugging Face names for it")


def links(config: dict) -> tuple[Link, ...]:
    """Every parc tensor of the model ``config`` and the Hugging Face tensors it is, in model order."""
    kind = model_type(config)
    if kind == "gpt2":
        found = [Link(("embed.weight",), ("transformer.wte.weight",), vocab_rows=True),
                 Link(("pos_embed.weight",), ("transformer.wpe.weight",))]
        for i in range(config["layers"]):
            src, dst = f"layers.{i}.", f"transformer.h.{i}."
            found.append(Link(tuple(f"{src}attn.{p}_proj.weight" for p in "qkv"), (dst + "attn.c_attn.weight",),
                              transposed=True))
            found.append(Link(tuple(f"{src}attn.{p}_proj.bias" for p in "qkv"), (dst + "attn.c_attn.bias",)))
            found += [Link((src + name,), (dst + hf_name,), transposed=transposed)
                      for name, (hf_name, transposed) in GPT2_BLOCK.items()]
        found += [Link((f"final_norm.{p}",), (f"transformer.ln_f.{p}",)) for p in ("weight", "bias")]
    else:
        found = [Link(("embed.weight",), ("model.embed_tokens.weight",), vocab_rows=True)]
        for i in range(config["layers"]):
            block = LLAMA_BLOCK | QWEN_BLOCK.get(kind, {})
            found += [Link((f"layers.{i}.{name}",), (f"model.layers.{i}.{hf_name}",))
                      for name, hf_name in block.items() if not (kind == "mixtral" and name.startswith("mlp."))]
            if kind == "mixtral":
                found += _mixtral_block(i, config["experts"])
        found.append(Link(("final_norm.weight",), ("model.norm.weight",)))
    if not config["tie_embeddings"]:
        found.append(Link(("head.weight",), ("lm_head.weight",), vocab_rows=True))
    return tuple(found)


def _mixtral_block(i: int, experts: int) -> list[Link]:
    src, dst = f"layers.{i}.mlp.", f"model.layers.{i}.block_sparse_moe."
    found = [Link((src + "router.weight",), (dst + "gate.weight",))]
    for name, hf_name in MIXTRAL_EXPERT.items():  # grouped (E, out, in) ↔ E tensors (out, in)
        found.append(Link((f"{src}experts.{name}.weight",),
                          tuple(f"{dst}experts.{j}.{hf_name}.weight" for j in range(experts))))
    return found


def hf_shapes(link: Link, parc_shapes: list[tuple[int, ...]], vocab: int) -> list[tuple[int, ...]]:
    """The shapes of ``link``'s Hugging Face tensors, from its parc tensors' full shapes."""
    rows = sum(shape[0] for shape in parc_shapes)
    shape = (vocab if link.vocab_rows else rows, *parc_shapes[0][1:])
    if link.transposed:
        shape = shape[::-1]
    return [shape[1:]] * len(link.hf) if len(link.hf) > 1 else [shape]


def to_hf(link: Link, tensors: list[torch.Tensor], vocab: int) -> list[torch.Tensor]:
    """``link``'s parc tensors (full, padded vocab) → its Hugging Face tensors."""
    import torch  # here, not at import: every parc command loads this module

    joined = torch.cat(tensors, dim=0) if len(tensors) > 1 else tensors[0]
    if link.vocab_rows:
        joined = joined[:vocab]
    if link.transposed:
        joined = joined.t()
    return list(joined.unbind(0)) if len(link.hf) > 1 else [joined]


def from_hf(link: Link, tensors: list[torch.Tensor], parc_shapes: list[tuple[int, ...]]) -> list[torch.Tensor]:
    """``link``'s Hugging Face tensors → its parc tensors of ``parc_shapes`` (vocab padding rows zero)."""
    import torch

    joined = torch.stack(tensors) if len(tensors) > 1 else tensors[0]
    if link.transposed:
        joined = joined.t()
    if link.vocab_rows and joined.shape[0] < parc_shapes[0][0]:
        padding = joined.new_zeros((parc_shapes[0][0] - joined.shape[0], *joined.shape[1:]))
        joined = torch.cat([joined, padding])
    parts = joined.split([shape[0] for shape in parc_shapes]) if len(parc_shapes) > 1 else [joined]
    return [part.contiguous() for part in parts]


# ---- config.json ------------------------------------------------------------------

_LLAMA_KEYS = (
    ("vocab", "vocab_size"), ("seq_len", "max_position_embeddings"), ("hidden", "hidden_size"),
    ("layers", "num_hidden_layers"), ("heads", "num_attention_heads"), ("kv_heads", "num_key_value_heads"),
    ("ffn", "intermediate_size"), ("norm_eps", "rms_norm_eps"), ("rope_theta", "rope_theta"),
    ("tie_embeddings", "tie_word_embeddings"), ("head_dim", "head_dim"),
)
CONFIG_KEYS = {  # model_type -> ((parc model key, transformers config key), ...): one value, two names
    "gpt2": (
        ("vocab", "vocab_size"), ("seq_len", "n_positions"), ("hidden", "n_embd"), ("layers", "n_layer"),
        ("heads", "n_head"), ("ffn", "n_inner"), ("norm_eps", "layer_norm_epsilon"),
        ("dropout", "resid_pdrop"), ("dropout", "embd_pdrop"), ("dropout", "attn_pdrop"),
        ("tie_embeddings", "tie_word_embeddings"),
    ),
    "llama": _LLAMA_KEYS,
    "qwen2": _LLAMA_KEYS,
    "qwen3": _LLAMA_KEYS,
    "mixtral": _LLAMA_KEYS + (
        ("experts", "num_local_experts"), ("top_k", "num_experts_per_tok"), ("aux_loss", "router_aux_loss_coef"),
    ),
}
FIXED = {  # model_type -> {transformers config key: the one value parc's model has}
    "gpt2": {"architectures": ["GPT2LMHeadModel"], "activation_function": "gelu_new"},
    "llama": {"architectures": ["LlamaForCausalLM"], "hidden_act": "silu", "attention_bias": False,
              "mlp_bias": False, "attention_dropout": 0.0},
    "qwen2": {"architectures": ["Qwen2ForCausalLM"], "hidden_act": "silu", "attention_dropout": 0.0,
              "use_sliding_window": False},
    "qwen3": {"architectures": ["Qwen3ForCausalLM"], "hidden_act": "silu", "attention_bias": False,
              "attention_dropout": 0.0, "use_sliding_window": False},
    "mixtral": {"architectures": ["MixtralForCausalLM"], "hidden_act": "silu", "attention_dropout": 0.0,
                "router_jitter_noise": 0.0, "output_router_logits": False},
}
BASE_PREFIX = {"gpt2": "transformer.", "llama": "model.", "qwen2": "model.", "qwen3": "model.", "mixtral": "model."}
"""The base model's prefix, which older checkpoints (the original gpt2 on the Hub) leave out of
their names; transformers loads them either way, and so does ``parc import``."""
NOT_WEIGHTS = (".attn.bias", ".attn.masked_bias", ".rotary_emb.inv_freq")
"""Buffers some checkpoints hold beside the weights (GPT-2's causal mask, old Llamas' rotary
frequencies): derived from the config, not read."""
NOT_IMPORTED = {"output_router_logits"}
"""FIXED keys that do not change the model (whether the forward returns the router's logits)."""
ABSENT = {"tie_word_embeddings": True, "num_key_value_heads": None, "n_inner": None, "head_dim": None}
"""What a config.json without the key means (transformers' ``PretrainedConfig`` writes only
the keys that differ from its own defaults: tied; kv heads = heads; GPT-2's n_inner = 4·n_embd;
a head hidden / heads wide)."""
TRAITS = {"qwen2": (("attention_bias", True),), "qwen3": (("qk_norm", True),)}
"""The parc model keys a model_type implies (Note [Qwen names]): no config key holds them."""


def hf_config(config: dict) -> dict:
    """transformers' config keys for the parc model ``config`` (Note [Mixtral names]: its
    ``intermediate_size`` is each expert's ffn)."""
    kind = model_type(config)
    if kind == "mixtral":
        config = {**config, "ffn": config.get("expert_ffn") or config["ffn"]}
    config = {"head_dim": config["hidden"] // config["heads"]} | {k: v for k, v in config.items() if v is not None}
    keys = {hf_key: config[parc_key] for parc_key, hf_key in CONFIG_KEYS[kind]}
    if kind == "mixtral":  # Note [Mixtral's aux loss]
        keys["router_aux_loss_coef"] = aux_coef(config["aux_loss"], config["layers"], config["top_k"])
    extra = {"torch_dtype": "float32"} if kind != "gpt2" else {}
    return {"model_type": kind} | FIXED[kind] | keys | extra


def aux_coef(aux_loss: float, layers: int, top_k: int) -> float:
    """Mixtral's ``router_aux_loss_coef`` for parc's per-layer ``aux_loss`` (Note [Mixtral's aux loss])."""
    return aux_loss * layers / top_k


def aux_loss(coef: float, layers: int, top_k: int) -> float:
    """parc's per-layer ``aux_loss`` for Mixtral's ``router_aux_loss_coef``: ``aux_coef`` undone."""
    return coef * top_k / layers
