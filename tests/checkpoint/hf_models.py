"""Tiny Hugging Face folders written by the real ``transformers`` (random init, ``save_pretrained``).

gpt2 (tied head), llama (grouped-query attention 4/2, untied head, rope theta 5000,
norm eps 1e-6) and Mixtral (4 experts, top 2): each small enough for a CPU step in
well under a second, each with vocab 250 (parc pads it to 256). Dropout is 0, so a
trainer's step-1 loss is a plain forward of the same batch. ``hf_loss`` is
transformers' own forward and loss.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

VOCAB, SEQ = 250, 32


def configs() -> dict:
    attention = dict(vocab_size=VOCAB, max_position_embeddings=SEQ, hidden_size=32, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)
    return {
        "gpt2": transformers.GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=32, n_layer=2, n_head=4,
                                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                        bos_token_id=None, eos_token_id=None),
        "llama": transformers.LlamaConfig(**attention, intermediate_size=64, rope_theta=5000.0, rms_norm_eps=1e-6),
        "mixtral": transformers.MixtralConfig(**attention, intermediate_size=48, num_local_experts=4,
                                              num_experts_per_tok=2),
    }


def write(kind: str, folder: Path, *, seed: int = 0, **save) -> Path:
    """A ``kind`` model of random weights saved as transformers saves one."""
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(configs()[kind])
    model.save_pretrained(folder, **save)
    return folder


def hf_loss(folder: Path, inputs: torch.Tensor, targets: torch.Tensor) -> float:
    model = transformers.AutoModelForCausalLM.from_pretrained(folder)  # float32, as saved
    model.eval()
    with torch.no_grad():
        logits = model(inputs).logits
    return float(torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten()))
