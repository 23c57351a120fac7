"""A model whose residual adds run inside the norms (Note [pending residual] in model.py)
trains exactly like one whose adds run apart, with the compiled kernels.

Both archs, with and without ``recompute = full`` (which settles the stream at each
block's input), one rank, fp32, AdamW: every step's loss and every parameter after
the last step are bit for bit equal, and the fused op really ran (2 per layer).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from parc.runtime.train import data
from parc.runtime.models import model
from parc.runtime.optimizers import optim
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))  # built.py
import built  # noqa: E402

CONFIGS = {
    "gpt": model.ModelConfig(arch="gpt", layers=2, hidden=32, heads=4, kv_heads=4, ffn=64, vocab=60,
                             padded_vocab=64, seq_len=8),
    "llama": model.ModelConfig(arch="llama", layers=2, hidden=32, heads=4, kv_heads=2, ffn=64, vocab=60,
                               padded_vocab=64, seq_len=8, tie_embeddings=False),
}
STEPS = 4


def train(config, recompute, fuse_residual):
    net = built.build(config, tp_group=None, sequence_parallel=False, tp_plan={}, seed=7, device="cpu",
                            recompute=recompute, kernels="compiled")
    model.use_kernels(net, "compiled", "cpu", fuse_residual=fuse_residual)
    opt = optim.build_optimizer(net, lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1, eps=1e-8)
    dataset = data.SyntheticTokens(config.vocab, config.seq_len, seed=7)
    losses = []
    for step in range(1, STEPS + 1):
        x, y = dataset.batch(data.sample_indices(step, 0, micro_batch=4, grad_accum=1, dp_rank=0, dp_size=1))
        loss = net(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.detach())
    return losses, dict(net.named_parameters())


@pytest.mark.parametrize("recompute", ["none", "full"])
@pytest.mark.parametrize("arch", ["gpt", "llama"])
def test_fused_residual_norms_train_bit_for_bit_like_unfused(ops, arch, recompute, monkeypatch):
    name = "add_rms_norm" if arch == "llama" else "add_layer_norm"
    calls = []
    original = getattr(ops, name)
    monkeypatch.setattr(ops, name, lambda *a: calls.append(1) or original(*a))
    fused_losses, fused_params = train(CONFIGS[arch], recompute, True)
    layers = CONFIGS[arch].layers
    # none: every norm but block 0's attention norm (its input is the embedding), 2 per layer;
    # full: each block's input is settled, so its MLP norm only, run twice (the recompute)
    per_step = 2 * layers
    assert len(calls) == STEPS * per_step, len(calls)
    calls.clear()
    plain_losses, plain_params = train(CONFIGS[arch], recompute, False)
    assert not calls
    for step, (a, b) in enumerate(zip(fused_losses, plain_losses), 1):
        assert torch.equal(a, b), (step, a.item(), b.item())
    for key in fused_params:
        assert torch.equal(fused_params[key], plain_params[key]), key
