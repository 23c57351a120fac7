"""ZeRO-3's gradients (runtime/parallel/data/fsdp.py, Note [gradients of a unit]) on one process: every
micro-batch's backward leaves no whole gradient behind, only the fp32 sharded accumulator,
and the step's gradient is autograd's accumulation of the same micro-batches."""

from __future__ import annotations

import pytest
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


@pytest.mark.parametrize("recompute", [None, "full"])
def test_split_backward_regathers_for_w_and_frees_after_b(recompute):
    """fsdp.py, Note [ZeRO-3 under a split backward]: on a last stage of two blocks, B leaves
    nothing gathered, every W gathers the units whose gradients it computes (they are
    whole when each gradient lands), frees them and reduces their gradients; the step's
    gradient is autograd's over the same micro-batches; with a full recompute, whose
    rerun inside B finds its block gathered."""
    from parc.runtime.parallel.pipeline.split_backward import backward_input, backward_weight

    config = model.ModelConfig(
        arch="llama", layers=3, hidden=32, heads=4, kv_heads=2, ffn=64, vocab=128, padded_vocab=128, seq_len=16,
        dropout=0.0, norm_eps=1e-5, rope_theta=1e4, tie_embeddings=False,
    )

    def stage():
        return built.build(config, seed=3, kernels="eager", stages=((0, 1), (1, 3)), pp_rank=1, pp_size=2,
                           recompute=recompute)

    micro_batches, reference, net = 3, stage(), stage()
    whole_when_landed = []
    for p in net.parameters():  # before the optimizer's own hooks, which free a finished unit
        p.register_post_accumulate_grad_hook(lambda p: whole_when_landed.append(p.untyped_storage().nbytes() > 0))
    opt = fsdp.FullyShardedAdamW(net, dp_group=None, tp_group=None, accumulations=micro_batches, **HYPER)
    hooks = net[0].split_backward_hooks
    generator = torch.Generator().manual_seed(1)
    data = [(torch.randn(2, 16, 32, generator=generator), torch.randint(0, 128, (2, 16), generator=generator))
            for _ in range(micro_batches)]
    pair = sum(sorted(unit.nbytes() for unit in opt.units)[-2:])  # 1 + prefetch units at once
    assert pair < sum(unit.nbytes() for unit in opt.units)
    owed = []
    for x, targets in data:  # every B first, then every W: the most a schedule owes
        x = x.clone().requires_grad_(True)
        loss = net[0](x, targets) / micro_batches
        opt._peak = 0  # the forward's (the root stays gathered through it) apart
        with hooks.inputs():
            owed.append(backward_input(loss, None, x, net.parameters())[1])
        assert opt.gathered_param_bytes() == 0 and opt._peak <= pair  # B gathered, and freed, each unit
        (reference[0](x.detach().requires_grad_(True), targets) / micro_batches).backward()
    assert opt.grad is None and all(p.grad is None for p in net.parameters())
    opt._peak = 0
    for debt in owed:
        backward_weight(debt, hooks)
        assert opt.gathered_param_bytes() == 0 and all(p.grad is None for p in net.parameters())
    assert len(whole_when_landed) == micro_batches * len(list(net.parameters())) and all(whole_when_landed)
    assert 0 < opt._peak <= pair
    opt.reduce_gradients_and_clip(1e6)
    names = {id(p): name for name, p in net.named_parameters()}
    want, at = dict(reference.named_parameters()), 0
    for p in [p for unit in opt.units for p in unit.params]:  # one rank: no padding
        torch.testing.assert_close(opt.grad[at : at + p.numel()].view(p.shape), want[names[id(p)]].grad,
                                   rtol=1e-6, atol=1e-7)
        at += p.numel()
