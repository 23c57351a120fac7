"""``parc export CKPT --to safetensors OUT``: full weights under Hugging Face's names.

The export is read back with safetensors and checked two ways: tensor by tensor
against the checkpoint's gathered parameters (padding rows dropped, GPT-2's Conv1D
transposes and fused c_attn), and by running Hugging Face's forward pass — written
here from transformers' definitions (Conv1D ``x @ W + b``, ``gelu_new``,
``rotate_half`` rotary, ``repeat_kv``) — on the exported tensors, which must give
the loss parc's model gives with the checkpoint's weights.
"""

from __future__ import annotations

import sys
from pathlib import Path

import argparse
import json
import os

import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from parc.codegen.cli import export as export_cmd
from parc.runtime.checkpoints import checkpoint, checkpoint_read
from parc.runtime.train import data
from parc.runtime.models import model

from .trainer import build, run
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))  # built.py
import built  # noqa: E402

VOCAB = 250


def parc(argv: list[str]) -> int:
    """``parc export ...`` through its own subcommand parser (as codegen/cli/__init__.py registers it)."""
    parser = argparse.ArgumentParser(prog="parc")
    export_cmd.register(parser.add_subparsers())
    args = parser.parse_args(argv)
    return args.func(args)


def parc_loss(ckpt, tokens, targets) -> float:
    info = checkpoint.read_info(checkpoint.resolve(str(ckpt)))
    net = built.build(model.ModelConfig(**info["model"]), tp_group=None, sequence_parallel=False,
                            tp_plan={}, seed=0, device=torch.device("cpu"))
    full = checkpoint_read.read_full(str(ckpt), "model.")
    net.load_state_dict({name[len("model."):]: t for name, t in full.items()})  # strict: every name
    net.eval()
    with torch.no_grad():
        return float(net(tokens, targets))


def gpt2_loss(w, config, tokens, targets) -> float:
    """transformers' GPT2LMHeadModel forward, from its checkpoint layout."""
    C, H = config["n_embd"], config["n_head"]
    T = tokens.shape[1]
    x = w["transformer.wte.weight"][tokens] + w["transformer.wpe.weight"][:T]
    for i in range(config["n_layer"]):
        p = f"transformer.h.{i}."
        h = F.layer_norm(x, (C,), w[p + "ln_1.weight"], w[p + "ln_1.bias"], config["layer_norm_epsilon"])
        q, k, v = (h @ w[p + "attn.c_attn.weight"] + w[p + "attn.c_attn.bias"]).split(C, dim=2)
        q, k, v = (t.view(*t.shape[:2], H, C // H).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(x.shape)
        x = x + y @ w[p + "attn.c_proj.weight"] + w[p + "attn.c_proj.bias"]
        h = F.layer_norm(x, (C,), w[p + "ln_2.weight"], w[p + "ln_2.bias"], config["layer_norm_epsilon"])
        h = F.gelu(h @ w[p + "mlp.c_fc.weight"] + w[p + "mlp.c_fc.bias"], approximate="tanh")
        x = x + h @ w[p + "mlp.c_proj.weight"] + w[p + "mlp.c_proj.bias"]
    x = F.layer_norm(x, (C,), w["transformer.ln_f.weight"], w["transformer.ln_f.bias"], config["layer_norm_epsilon"])
    logits = x @ w["transformer.wte.weight"].t()  # tie_word_embeddings
    return float(F.cross_entropy(logits.flatten(0, 1), targets.flatten()))


def mixtral_mlp(w, config, p, h):
    """transformers' MixtralSparseMoeBlock: softmax router, top-k renormalized, experts w2(silu(w1 x) · w3 x)."""
    tokens = h.reshape(-1, h.shape[-1])
    probs = F.softmax(tokens @ w[p + "block_sparse_moe.gate.weight"].t(), dim=-1, dtype=torch.float)
    weights, chosen = torch.topk(probs, config["num_experts_per_tok"], dim=-1)
    weights = weights / weights.sum(-1, keepdim=True)
    out = torch.zeros_like(tokens)
    for j in range(config["num_local_experts"]):
        e = f"{p}block_sparse_moe.experts.{j}."
        rows, slot = (chosen == j).nonzero(as_tuple=True)
        x = tokens[rows]
        y = (F.silu(x @ w[e + "w1.weight"].t()) * (x @ w[e + "w3.weight"].t())) @ w[e + "w2.weight"].t()
        out.index_add_(0, rows, y * weights[rows, slot, None])
    return out.view_as(h)


def llama_loss(w, config, tokens, targets) -> float:
    """transformers' LlamaForCausalLM (or MixtralForCausalLM) forward, from its checkpoint layout."""
    C, H, KV = config["hidden_size"], config["num_attention_heads"], config["num_key_value_heads"]
    D, T, eps = C // H, tokens.shape[1], config["rms_norm_eps"]
    inv_freq = 1.0 / (config["rope_theta"] ** (torch.arange(0, D, 2, dtype=torch.float32) / D))
    freqs = torch.outer(torch.arange(T, dtype=torch.float32), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()

    def rotate_half(t):
        return torch.cat((-t[..., D // 2:], t[..., : D // 2]), dim=-1)

    def rms(t, weight):
        return weight * (t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + eps))

    x = w["model.embed_tokens.weight"][tokens]
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        h = rms(x, w[p + "input_layernorm.weight"])
        q, k, v = (h @ w[p + f"self_attn.{n}_proj.weight"].t() for n in "qkv")
        q, k, v = (t.view(*t.shape[:2], -1, D).transpose(1, 2) for t in (q, k, v))
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k, v = (t.repeat_interleave(H // KV, dim=1) for t in (k, v))  # repeat_kv
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(x.shape)
        x = x + y @ w[p + "self_attn.o_proj.weight"].t()
        h = rms(x, w[p + "post_attention_layernorm.weight"])
        if config.get("model_type") == "mixtral":
            x = x + mixtral_mlp(w, config, p, h)
            continue
        gate, up = h @ w[p + "mlp.gate_proj.weight"].t(), h @ w[p + "mlp.up_proj.weight"].t()
        x = x + (F.silu(gate) * up) @ w[p + "mlp.down_proj.weight"].t()
    logits = rms(x, w["model.norm.weight"]) @ w["lm_head.weight"].t()
    return float(F.cross_entropy(logits.flatten(0, 1), targets.flatten()))


def umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def batch(seq_len):
    return data.SyntheticTokens(VOCAB, seq_len, seed=3).batch(range(4))


def test_export_gpt2_from_a_tensor_parallel_checkpoint(straight, tmp_path, capsys):
    ckpt = straight("tp2").checkpoints  # its latest: step 8, vocab rows split over tp
    out = tmp_path / "gpt2"
    assert parc(["export", str(ckpt), "--to", "safetensors", str(out)]) == 0
    weights, config = load_file(out / "model.safetensors"), json.loads((out / "config.json").read_text())
    full = checkpoint_read.read_full(str(ckpt), "model.")
    assert config["model_type"] == "gpt2" and config["vocab_size"] == VOCAB
    # no token ids of transformers' own (gpt2's 50256 is outside this vocab); both files readable alike
    assert config["bos_token_id"] is None and config["eos_token_id"] is None
    modes = {(out / name).stat().st_mode & 0o777 for name in ("model.safetensors", "config.json")}
    assert len(modes) == 1 and modes.pop() & 0o044 == 0o044 & ~umask(), modes
    assert len(weights) == 2 + 12 * config["n_layer"] + 2  # wte, wpe, 12 per block, ln_f; lm_head tied
    assert torch.equal(weights["transformer.wte.weight"], full["model.embed.weight"][:VOCAB])
    qkv = torch.cat([full[f"model.layers.1.attn.{p}_proj.weight"] for p in "qkv"]).t()
    assert torch.equal(weights["transformer.h.1.attn.c_attn.weight"], qkv)
    assert torch.equal(weights["transformer.h.0.mlp.c_fc.weight"], full["model.layers.0.mlp.up_proj.weight"].t())
    tokens, targets = batch(config["n_positions"])
    expected = parc_loss(ckpt, tokens, targets)
    assert abs(gpt2_loss(weights, config, tokens, targets) - expected) <= 1e-5 * expected


def test_export_llama_untied_head_to_a_file(tmp_path):
    build_dir = build("tp2", tmp_path / "build", spec="llama.par")
    ck = tmp_path / "ck"
    run(build_dir, 2, ["--steps", "2", "--checkpoint-dir", str(ck)])
    target = tmp_path / "out" / "llama.safetensors"
    assert parc(["export", str(ck), "--to", "safetensors", str(target)]) == 0
    weights = load_file(target)
    full = checkpoint_read.read_full(str(ck), "model.")
    info = checkpoint.read_info(checkpoint.resolve(str(ck)))["model"]
    assert info["kv_heads"] < info["heads"] and not info["tie_embeddings"]
    assert torch.equal(weights["lm_head.weight"], full["model.head.weight"][:VOCAB])
    assert torch.equal(weights["model.layers.0.self_attn.k_proj.weight"], full["model.layers.0.attn.k_proj.weight"])
    config = export_cmd.hf_config(info)
    tokens, targets = batch(config["max_position_embeddings"])
    expected = parc_loss(ck, tokens, targets)
    assert abs(llama_loss(weights, config, tokens, targets) - expected) <= 1e-5 * expected


def test_export_mixtral_from_an_expert_parallel_checkpoint(tmp_path):
    """Note [Mixtral names]: an ep2 checkpoint (each rank 2 of the 4 experts) → Mixtral's names."""
    build_dir = build("moe_ep2", tmp_path / "build", spec="llama.par")
    ck = tmp_path / "ck"
    run(build_dir, 2, ["--steps", "2", "--checkpoint-dir", str(ck)])
    out = tmp_path / "out"
    assert parc(["export", str(ck), "--to", "safetensors", str(out)]) == 0
    weights = load_file(out / "model.safetensors")
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "mixtral" and config["num_local_experts"] == 4
    assert config["num_experts_per_tok"] == 2
    full = checkpoint_read.read_full(str(ck), "model.")
    grouped = full["model.layers.1.mlp.experts.down_proj.weight"]
    assert torch.equal(weights["model.layers.1.block_sparse_moe.experts.3.w2.weight"], grouped[3])
    assert not any(".mlp." in name for name in weights)
    tokens, targets = batch(config["max_position_embeddings"])
    expected = parc_loss(ck, tokens, targets)
    assert abs(llama_loss(weights, config, tokens, targets) - expected) <= 1e-5 * expected


def test_export_of_a_folder_without_checkpoints_is_a_usage_error(tmp_path, capsys):
    assert parc(["export", str(tmp_path), "--to", "safetensors", str(tmp_path / "x")]) == 2
    assert "no complete checkpoint there" in capsys.readouterr().err


def test_a_model_trained_with_a_capacity_is_not_exported_as_dropless_mixtral(tmp_path, capsys):
    """Issue 31: Mixtral drops no tokens; a capacity-trained model is refused, or exported
    with --as-dropless and a warning."""
    build_dir = build("moe_ep2", tmp_path / "build", spec="llama.par", extra=("model.capacity_factor=1.25",))
    ck = tmp_path / "ck"
    run(build_dir, 2, ["--steps", "1", "--checkpoint-dir", str(ck)])
    capsys.readouterr()
    assert parc(["export", str(ck), "--to", "safetensors", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert "trained with capacity_factor = 1.25" in err and "pass --as-dropless" in err
    assert not (tmp_path / "out").exists()
    assert parc(["export", str(ck), "--to", "safetensors", str(tmp_path / "out"), "--as-dropless"]) == 0
    assert "parc export: warning: the model was trained with capacity_factor = 1.25" in capsys.readouterr().err


def test_mixtral_aux_loss_coefficient_is_converted():
    """Note [Mixtral's aux loss]: HF's pooled term is top_k × parc's per layer."""
    config = {"arch": "llama", "experts": 4, "top_k": 2, "aux_loss": 0.01, "layers": 6, "expert_ffn": None,
              "ffn": 64, "vocab": 100, "seq_len": 8, "hidden": 16, "heads": 2, "kv_heads": 2, "norm_eps": 1e-5,
              "rope_theta": 1e4, "tie_embeddings": False, "capacity_factor": None}
    assert abs(export_cmd.hf_config(config)["router_aux_loss_coef"] - 0.03) < 1e-12
    assert export_cmd.dropped_tokens(config) is None
    assert "capacity_factor = 1.5" in export_cmd.dropped_tokens({**config, "capacity_factor": 1.5})
    assert export_cmd.dropped_tokens({**config, "experts": 0, "capacity_factor": 1.5}) is None
