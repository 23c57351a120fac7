"""ZeRO-3's gradients (runtime/parallel/data/fsdp.py, Note [gradients of a unit]) on one process: every
micro-batch's backward leaves no whole gradient behind, only the fp32 sharded accumulator,
and the step's gradient is autograd's accumulation of the same micro-batches."""

from __future__ import annotations

import torch

from parc.runtime.parallel.data import fsdp
from parc.runtime.models import model
import built  # noqa: E402  (tests/runtime/built.py)

HYPER = dict(lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1, eps=1e-8)


def _tiny():
    config = model.ModelConfig(
        arch="gpt", layers=2, hidden=32, heads=4, kv_heads=4, ffn=64, vocab=128, padded_vocab=128, seq_len=16,
        dropout=0.0, norm_eps=1e-5, rope_theta=1e4, tie_embeddings=True,
    )
    return built.build(config, tp_group=None, sequence_parallel=False, tp_plan={}, seed=3, device="cpu",
                             kernels="eager")


def test_each_micro_batch_is_reduced_into_the_shards_and_freed():
    micro_batches = 3
    reference, net = _tiny(), _tiny()
    opt = fsdp.FullyShardedAdamW(net, dp_group=None, tp_group=None, accumulations=micro_batches, **HYPER)
    generator = torch.Generator().manual_seed(1)
    batches = [torch.randint(0, 128, (2, 16), generator=generator) for _ in range(micro_batches)]
    for tokens in batches:
        net(tokens, tokens).backward()
        assert all(p.grad is None for p in net.parameters())  # packed, reduced and freed pass by pass
        assert opt.held_grad_bytes() == opt.flat.numel() * 4  # only the fp32 shards
        reference(tokens, tokens).backward()
    opt.reduce_gradients_and_clip(1e6)
    order = [p for unit in opt.units for p in unit.params]  # one rank: no padding
    names = {id(p): name for name, p in net.named_parameters()}
    want = dict(reference.named_parameters())
    at = 0
    for p in order:
        got = opt.grad[at : at + p.numel()].view(p.shape)
        torch.testing.assert_close(got, want[names[id(p)]].grad, rtol=1e-6, atol=1e-7)
        at += p.numel()
    assert at == opt.flat.numel()
