"""``parc export CKPT --to safetensors OUT``: a checkpoint's full weights under Hugging Face names.

Takes: a checkpoint folder written by a generated trainer (or a folder of them: its
latest complete one), read through torch.distributed.checkpoint in one process, and
its ``parc.json`` (the model config). Gives: ``OUT`` — a ``.safetensors`` file, or a
folder holding ``model.safetensors`` and a Hugging Face ``config.json`` — with the
vocab padding rows dropped and the names and layouts of ``transformers``' GPT2LMHeadModel
(gpt) or LlamaForCausalLM (llama); ``hf_state_dict`` is the conversion itself. A bad
checkpoint (``runtime/checkpoints/checkpoint_files.py``) or an OUT that cannot be written is one
line, exit 1, with nothing written; an existing export is replaced only with ``--force``.

Note [Hugging Face layouts]: GPT-2's checkpoints use Conv1D, whose weight is the
transpose of nn.Linear's, (in, out); and one fused ``c_attn`` of (C, 3C) holding q, k, v
side by side, so parc's q_proj/k_proj/v_proj weights are concatenated along the output
dim and transposed (biases concatenated). GPT-2 has no grouped-query attention: a gpt
model with kv_heads < heads cannot be exported as gpt2. Llama keeps nn.Linear
layouts and separate projections. parc's rotary (model.py ``rotary``) rotates pairs of
*halves* of each head, which is Hugging Face's ``rotate_half``, so q_proj and k_proj
are copied as they are (Meta's original checkpoints interleave pairs instead, and HF's
conversion script permutes them; a parc checkpoint never needs that). A tied head is
not written (both libraries tie ``lm_head`` to the embedding from the config).

Note [Mixtral names]: a llama with experts (runtime/parallel/expert/moe.py) is exported as transformers'
MixtralForCausalLM: the router is ``block_sparse_moe.gate`` and expert j's gate, down and
up projections are ``block_sparse_moe.experts.j.w1``, ``w2`` and ``w3`` (slices of parc's
grouped (E, out, in) weights). Mixtral routes as parc's softmax router does (softmax, top-k,
renormalized) and drops nothing; a model Mixtral cannot hold (gpt with experts, dense
blocks between MoE ones, shared experts, a sigmoid router) is an ``ExportError``. So is a
model trained with ``capacity_factor`` (each expert dropped the tokens past its capacity:
Mixtral, computing every token, would be another model) unless ``--as-dropless`` asks for
it anyway, with a warning.

Note [Mixtral's aux loss]: parc adds, in each MoE layer, ``aux_loss · E · Σ_e f_e · P_e``
with ``f_e`` the layer's tokens routed to e over ``N·top_k`` (runtime/parallel/expert/moe.py); transformers'
Mixtral computes one term for the whole model, the routed fractions and mean probabilities
pooled over every layer's tokens, with ``f_e`` over ``N`` (not ``N·top_k``), times
``router_aux_loss_coef``. The export writes ``router_aux_loss_coef = aux_loss · layers /
top_k``: the same loss for one MoE layer, and for several when their routing statistics
agree; pooling (a product of means, not a mean of products) makes them differ otherwise.
It matters only to whoever trains the export further with ``output_router_logits = true``.
"""

from __future__ import annotations

import json
import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: torch loads when exporting
    import torch

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


class ExportError(Exception):
    pass


def hf_state_dict(weights: dict[str, torch.Tensor], config: dict) -> dict[str, torch.Tensor]:
    """parc's full weights (logical names, padded vocab) → Hugging Face's, per Note [Hugging Face layouts]."""
    import torch  # here, not at import: every parc command loads this module

    vocab, layers = config["vocab"], config["layers"]
    out = {}
    if config["arch"] == "gpt":
        if config.get("experts", 0):
            raise ExportError("gpt2 has no mixture of experts: a gpt with experts has no Hugging Face names")
        if config["kv_heads"] != config["heads"]:
            raise ExportError(f"gpt2 has no grouped-query attention: kv_heads = {config['kv_heads']} < heads")
        out["transformer.wte.weight"] = weights["embed.weight"][:vocab]
        out["transformer.wpe.weight"] = weights["pos_embed.weight"]
        for i in range(layers):
            src, dst = f"layers.{i}.", f"transformer.h.{i}."
            qkv = [weights[f"{src}attn.{p}_proj.weight"] for p in "qkv"]
            out[dst + "attn.c_attn.weight"] = torch.cat(qkv, dim=0).t()  # (C, 3C)
            out[dst + "attn.c_attn.bias"] = torch.cat([weights[f"{src}attn.{p}_proj.bias"] for p in "qkv"])
            for name, (hf_name, transposed) in GPT2_BLOCK.items():
                tensor = weights[src + name]
                out[dst + hf_name] = tensor.t() if transposed else tensor
        out["transformer.ln_f.weight"] = weights["final_norm.weight"]
        out["transformer.ln_f.bias"] = weights["final_norm.bias"]
    elif config["arch"] == "llama":
        out["model.embed_tokens.weight"] = weights["embed.weight"][:vocab]
        experts = config.get("experts", 0)
        if experts:
            _check_mixtral(config)
        for i in range(layers):
            for name, hf_name in LLAMA_BLOCK.items():
                if not (experts and name.startswith("mlp.")):
                    out[f"model.layers.{i}.{hf_name}"] = weights[f"layers.{i}.{name}"]
            if experts:
                out.update(_mixtral_block(weights, i, experts))
        out["model.norm.weight"] = weights["final_norm.weight"]
    else:
        raise ExportError(f"no Hugging Face names for arch {config['arch']!r}")
    if not config["tie_embeddings"]:
        out["lm_head.weight"] = weights["head.weight"][:vocab]
    return {name: tensor.contiguous().clone() for name, tensor in out.items()}


NO_SPECIAL_TOKENS = {"bos_token_id": None, "eos_token_id": None}
"""A parc model has no tokenizer, so no begin/end-of-text ids: written as null, else
transformers takes its own defaults (gpt2: 50256, outside a small vocabulary, with a
warning on every load; llama: 1 and 2, ids that mean nothing here)."""


def hf_config(config: dict) -> dict:
    """A ``config.json`` for transformers with the same model."""
    return _hf_config(config) | NO_SPECIAL_TOKENS


def _hf_config(config: dict) -> dict:
    if config.get("experts", 0):  # Note [Mixtral names]
        return _hf_config({**config, "experts": 0}) | {
            "architectures": ["MixtralForCausalLM"], "model_type": "mixtral",
            "intermediate_size": config["expert_ffn"] or config["ffn"],
            "num_local_experts": config["experts"], "num_experts_per_tok": config["top_k"],
            # Note [Mixtral's aux loss]: parc's coefficient per layer → HF's pooled term
            "router_aux_loss_coef": config["aux_loss"] * config["layers"] / config["top_k"],
            "output_router_logits": False,
        }
    if config["arch"] == "gpt":
        return {
            "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
            "vocab_size": config["vocab"], "n_positions": config["seq_len"], "n_embd": config["hidden"],
            "n_layer": config["layers"], "n_head": config["heads"], "n_inner": config["ffn"],
            "activation_function": "gelu_new", "layer_norm_epsilon": config["norm_eps"],
            "resid_pdrop": config["dropout"], "embd_pdrop": config["dropout"], "attn_pdrop": config["dropout"],
            "tie_word_embeddings": config["tie_embeddings"],
        }
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": config["vocab"], "max_position_embeddings": config["seq_len"],
        "hidden_size": config["hidden"], "intermediate_size": config["ffn"],
        "num_hidden_layers": config["layers"], "num_attention_heads": config["heads"],
        "num_key_value_heads": config["kv_heads"], "hidden_act": "silu", "rms_norm_eps": config["norm_eps"],
        "rope_theta": config["rope_theta"], "attention_bias": False, "mlp_bias": False,
        "tie_word_embeddings": config["tie_embeddings"], "torch_dtype": "float32",
    }


MIXTRAL_EXPERT = {"gate_proj": "w1", "down_proj": "w2", "up_proj": "w3"}
"""parc's expert projection → Mixtral's (Note [Mixtral names])."""


def _check_mixtral(config: dict) -> None:
    unlike = [words for words, differs in (
        (f"moe_every = {config.get('moe_every')}: dense blocks between MoE ones", config.get("moe_every", 1) != 1),
        (f"shared_experts = {config.get('shared_experts')}", config.get("shared_experts", 0) != 0),
        (f"router = {config.get('router')}", config.get("router", "softmax") != "softmax"),
    ) if differs]
    if unlike:
        raise ExportError(f"Mixtral cannot hold this model ({'; '.join(unlike)}): no Hugging Face names for it")


def _mixtral_block(weights: dict, i: int, experts: int) -> dict:
    src, dst = f"layers.{i}.mlp.", f"model.layers.{i}.block_sparse_moe."
    out = {dst + "gate.weight": weights[src + "router.weight"]}
    for name, hf_name in MIXTRAL_EXPERT.items():
        grouped = weights[f"{src}experts.{name}.weight"]  # (E, out, in)
        for j in range(experts):
            out[f"{dst}experts.{j}.{hf_name}.weight"] = grouped[j]
    return out


def check_out(out: str, *, force: bool) -> None:
    """``OUT`` can be written; an export already there is overwritten only with ``--force``.

    ``ExportError`` otherwise: never a user's file silently replaced, never a write through a
    symlink to nothing, into a device (``/dev/null``), under a file or into a read-only folder.
    """
    from parc.runtime.paths import UnwritablePath, check_target

    folder = not out.endswith(".safetensors")
    try:
        check_target(out, folder=folder)
    except UnwritablePath as exc:
        raise ExportError(str(exc)) from None
    existing = [os.path.join(out, name) for name in FOLDER_FILES] if folder else [out]
    for path in existing:
        try:
            check_target(path, folder=False)  # a folder named model.safetensors, a symlink to nothing
        except UnwritablePath as exc:
            raise ExportError(str(exc)) from None
        if os.path.exists(path) and not force:
            raise ExportError(f"{path} exists: remove it, or pass --force to overwrite it")


FOLDER_FILES = ("model.safetensors", "config.json")
"""What an export into a folder writes (other files there are left alone)."""


def dropped_tokens(config: dict) -> str | None:
    """Why Mixtral would compute another model than the one trained: the capacity that
    dropped tokens (Note [Mixtral names]); None for a dropless or dense model."""
    capacity = config.get("capacity_factor")
    if not config.get("experts", 0) or capacity is None:
        return None
    return (f"the model was trained with capacity_factor = {capacity:g} (each expert dropped the tokens "
            "past its capacity), but Mixtral drops none: the export would compute another model")


def export(ckpt: str, out: str, *, force: bool = False, as_dropless: bool = False) -> str:
    """Write the export of checkpoint ``ckpt`` to ``out``; the safetensors file written.

    Nothing is written until the checkpoint has been read; each file is written beside
    its place and renamed into it. ``as_dropless``: export a model trained with a capacity
    anyway (``dropped_tokens``); else that is an ``ExportError``.
    """
    from parc.runtime.checkpoints import checkpoint  # torch, only when exporting

    from safetensors.torch import save_file

    check_out(out, force=force)
    path = checkpoint.resolve(ckpt)
    info = checkpoint.read_info(path)
    if drops := dropped_tokens(info["model"]):
        if not as_dropless:
            raise ExportError(f"{path}: {drops}; pass --as-dropless to export it as a dropless Mixtral anyway")
        print(f"parc export: warning: {drops} (--as-dropless)", file=sys.stderr)
    weights = {name[len("model."):]: t for name, t in checkpoint.read_full(path, "model.").items()}
    try:
        tensors = hf_state_dict(weights, info["model"])
    except KeyError as exc:
        raise ExportError(f"{path} has no tensor {exc.args[0]}, which its parc.json's model needs") from None
    except ExportError as exc:
        raise ExportError(f"{path}: {exc}") from None
    metadata = {"format": "pt", "parc_step": str(info["step"]), "parc_layout": info["layout"]}
    folder = not out.endswith(".safetensors")
    target = os.path.join(out, "model.safetensors") if folder else out
    os.makedirs(os.path.dirname(os.path.abspath(target)), exist_ok=True)
    temporary = os.path.join(os.path.dirname(os.path.abspath(target)), f".{os.path.basename(target)}.parc-tmp")
    save_file(tensors, temporary, metadata=metadata)
    os.chmod(temporary, 0o666 & ~_umask())  # safetensors makes it 0600; config.json has the umask's mode
    os.replace(temporary, target)
    if folder:
        config = os.path.join(out, "config.json")
        with open(config + ".parc-tmp", "w", encoding="utf-8") as file:
            json.dump(hf_config(info["model"]), file, indent=2, sort_keys=True)
            file.write("\n")
        os.replace(config + ".parc-tmp", config)
    return target


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def run(args) -> int:
    from parc.runtime.checkpoints.checkpoint_files import CheckpointError, NoCheckpoint

    if args.to != "safetensors":
        print(f"parc export: unknown format {args.to!r}: safetensors", file=sys.stderr)
        return 2
    if not os.path.exists(args.checkpoint) and not os.path.islink(args.checkpoint):
        print(f"parc export: {args.checkpoint}: no such checkpoint folder", file=sys.stderr)
        return 2
    try:
        target = export(args.checkpoint, args.out, force=args.force, as_dropless=args.as_dropless)
    except (ExportError, CheckpointError) as exc:
        print(f"parc export: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, NoCheckpoint) else 1
    except OSError as exc:  # the disk filled, the folder vanished while writing
        print(f"parc export: cannot write {args.out}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    print(f"wrote {target}")
    return 0


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "export",
        help="write a checkpoint's weights as safetensors with Hugging Face names",
        description=(
            "Gather the full weights of a checkpoint (any layout) into a safetensors file with "
            "Hugging Face's names for gpt2 or llama, vocab padding dropped. OUT ending in "
            ".safetensors is that file; otherwise a folder with model.safetensors and config.json."
        ),
    )
    parser.add_argument("checkpoint", metavar="CKPT", help="a checkpoint folder, or a folder of them (its latest)")
    parser.add_argument("--to", required=True, choices=["safetensors"], help="output format")
    parser.add_argument("out", metavar="OUT")
    parser.add_argument("--force", action="store_true", help="overwrite an export already at OUT")
    parser.add_argument("--as-dropless", action="store_true",
                        help="export a mixture of experts trained with capacity_factor as Mixtral, which drops "
                        "no tokens (a different model: warned)")
    parser.set_defaults(func=run)
