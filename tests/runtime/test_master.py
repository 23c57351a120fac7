"""runtime/optimizers/master.py on one process: bf16/fp16 compute weights with fp32 masters."""

from __future__ import annotations

import pytest
import torch

from parc.runtime.parallel.data import dp
from parc.runtime.optimizers import master, optim
from parc.runtime.models import model
import built  # noqa: E402  (tests/runtime/built.py)


def _tiny(arch="gpt"):
    config = model.ModelConfig(
        arch=arch, layers=2, hidden=32, heads=4, kv_heads=4 if arch == "gpt" else 2, ffn=64, vocab=128,
        padded_vocab=128, seq_len=16, dropout=0.0, norm_eps=1e-5, rope_theta=1e4, tie_embeddings=arch == "gpt",
    )
    return built.build(config, tp_group=None, sequence_parallel=False, tp_plan={}, seed=3, device="cpu",
                             kernels="eager")


@pytest.mark.parametrize("arch", ["gpt", "llama"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_master_adamw_steps_fp32_masters_and_rounds_them_into_the_parameters(arch, dtype):
    reference, net = _tiny(arch), _tiny(arch)
    fp32 = {name: p.detach().clone() for name, p in reference.named_parameters()}
    opt = master.MasterAdamW(net, dtype=dtype, lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1, eps=1e-8)
    params = dict(net.named_parameters())
    assert {p.dtype for p in params.values()} == {dtype}
    for name, p in params.items():  # the masters start as the fp32 init, exactly
        assert torch.equal(opt.master_of[id(p)], fp32[name])
    tokens = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(0))
    loss = net(tokens, tokens)
    assert loss.dtype == torch.float32  # the cross-entropy stays fp32
    loss.backward()
    assert {p.grad.dtype for p in params.values()} == {dtype}
    norm = opt.unscale_and_clip(1.0, tp_group=None, grad_scale=4.0)
    assert all(p.grad is None for p in params.values())
    assert {m.grad.dtype for m in opt.masters} == {torch.float32}
    assert 0 < norm < float("inf")
    opt.step()
    for name, p in params.items():
        m = opt.master_of[id(p)]
        assert m.dtype == torch.float32 and not torch.equal(m, fp32[name])  # stepped in fp32
        assert torch.equal(p.detach(), m.to(dtype))  # the parameter is its master, rounded
    elements = sum(p.numel() for p in params.values())
    # fp32 master + two fp32 moments per element, and torch's 4-byte step per tensor
    assert opt.state_bytes() == 12 * elements + 4 * len(params)


def test_master_adamw_matches_fp32_adamw_when_the_values_are_representable():
    """With gradients and weights exactly representable in bf16, the masters' AdamW is
    torch's fp32 AdamW (optim.build_optimizer) to the bit."""
    a = torch.nn.Linear(4, 4, bias=False)
    with torch.no_grad():
        a.weight.copy_(torch.arange(16.0).view(4, 4) / 8)
    b = torch.nn.Linear(4, 4, bias=False)
    b.load_state_dict(a.state_dict())
    plain = optim.build_optimizer(a, lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1, eps=1e-8)
    opt = master.MasterAdamW(b, dtype=torch.bfloat16, lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1, eps=1e-8)
    grad = torch.full((4, 4), 0.5)
    a.weight.grad, b.weight.grad = grad.clone(), grad.to(torch.bfloat16)
    plain.step()
    opt.unscale_and_clip(0.0, tp_group=None)
    opt.step()
    assert torch.equal(opt.masters[0].detach(), a.weight.detach())


def _accumulated_grads(accumulations: int, micro_batches: int = 4):
    """The bf16 gradients after ``micro_batches`` backwards, and each backward's own gradient
    summed in fp64 (the fp32-accumulated reference, free of the accumulation's rounding)."""
    net = _tiny("llama")
    opt = master.MasterAdamW(net, dtype=torch.bfloat16, lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1, eps=1e-8,
                             accumulations=accumulations)
    params = dict(net.named_parameters())
    alone = _tiny("llama")  # the same bf16 weights, without the accumulation's hooks
    master.MasterAdamW(alone, dtype=torch.bfloat16, lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1, eps=1e-8)
    terms = dict(alone.named_parameters())
    reference = {name: torch.zeros(p.shape, dtype=torch.float64) for name, p in params.items()}
    generator = torch.Generator().manual_seed(1)
    batches = [torch.randint(0, 128, (2, 16), generator=generator) for _ in range(micro_batches)]
    for tokens in batches:  # each backward alone, on fresh gradients: the reference's terms
        alone(tokens, tokens).backward()
        for name, p in terms.items():
            reference[name] += p.grad.double()
            p.grad = None
    for tokens in batches:  # the step as the trainer runs it
        net(tokens, tokens).backward()
    grads = {name: dp.gradient_of(p).double() for name, p in params.items()}  # what the reducers read
    return grads, reference, opt


@pytest.mark.parametrize("micro_batches", [4])
def test_micro_batches_accumulate_in_fp32_and_reach_the_reducers_unrounded(micro_batches):
    """Note [fp32 accumulation]: after several micro-batches the reducers get the fp32 sum
    itself (``main_grad``), within fp32's rounding of the exact sum (relative error
    under 1e-6 overall); rounded once to bf16, as the reducers got it before, every element
    is within half a bf16 ulp (2^-8 relative) of it, which autograd's bf16 accumulation
    (accumulations = 1), rounding every partial sum, is not."""
    new, reference, opt = _accumulated_grads(micro_batches, micro_batches)
    old, reference_old, _ = _accumulated_grads(1, micro_batches)
    for name in reference:
        assert torch.equal(reference[name], reference_old[name])  # the same terms
    assert all(p.grad is None and p.main_grad.dtype == torch.float32 for p in opt.model_params)
    once = {name: g.to(torch.bfloat16).double() for name, g in new.items()}  # the old hand-over

    def error(grads):
        num = sum(float((grads[n] - reference[n]).pow(2).sum()) for n in reference)
        return (num / sum(float(reference[n].pow(2).sum()) for n in reference)) ** 0.5

    def beyond_one_rounding(grads):
        return sum(int(((grads[n] - ref).abs() > ref.abs() * 2.0**-8).sum()) for n, ref in reference.items())

    elements = sum(ref.numel() for ref in reference.values())
    print(f"\n{micro_batches} micro-batches, relative error vs the exact sum: fp32 sum handed over "
          f"{error(new):.3e}, rounded once to bf16 {error(once):.3e} ({beyond_one_rounding(once)} of {elements} "
          f"elements beyond one rounding), bf16 accumulation {error(old):.3e} ({beyond_one_rounding(old)})")
    assert error(new) < 1e-6 < error(once) < error(old)
    assert beyond_one_rounding(new) == beyond_one_rounding(once) == 0 < beyond_one_rounding(old)
    assert opt.accumulation.held_bytes() == 0  # the sums live from a step's first backward to its last
    squares = sum(float(g.pow(2).sum()) for g in new.values())
    opt.unscale_and_clip(0.0, tp_group=None)  # the masters take the fp32 sums as they are
    assert all(p.main_grad is None and p.grad is None for p in opt.model_params)
    assert sum(float(m.grad.double().pow(2).sum()) for m in opt.masters) == pytest.approx(squares, rel=1e-12)


@pytest.mark.parametrize("zero_stage", [1, 2, 3])
def test_sharded_optimizers_accumulate_in_fp32(zero_stage):
    """Note [fp32 accumulation] under ZeRO 1/2 (zero.ShardedAdamW: the fp32 sums handed
    over) and 3 (fsdp.FullyShardedAdamW: each pass reduce-scattered into fp32 shards), one
    rank: the fp32 gradient each keeps after 4 bf16 micro-batches is the exact sum of
    their gradients to fp32's rounding (under 1e-6 relative overall), not bf16's."""
    from parc.runtime.parallel.data import fsdp, zero

    micro_batches, hyper = 4, dict(lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1, eps=1e-8)
    alone = _tiny("llama")  # the terms, each backward on its own
    master.MasterAdamW(alone, dtype=torch.bfloat16, **hyper)
    net = _tiny("llama")
    if zero_stage == 3:
        opt = fsdp.FullyShardedAdamW(net, dp_group=None, tp_group=None, accumulations=micro_batches,
                                     compute_dtype=torch.bfloat16, **hyper)
        order = [p for unit in opt.units for p in unit.params]  # one rank: no padding
    else:
        opt = zero.ShardedAdamW(net, dp_group=None, tp_group=None, stage=zero_stage, accumulations=micro_batches,
                                compute_dtype=torch.bfloat16, **hyper)
        order = list(opt.params)
    names = {id(p): name for name, p in net.named_parameters()}
    terms = dict(alone.named_parameters())
    reference = {name: torch.zeros(p.shape, dtype=torch.float64) for name, p in terms.items()}
    generator = torch.Generator().manual_seed(1)
    batches = [torch.randint(0, 128, (2, 16), generator=generator) for _ in range(micro_batches)]
    for tokens in batches:
        alone(tokens, tokens).backward()
        for name, p in terms.items():
            reference[name] += p.grad.double()
            p.grad = None
    for tokens in batches:
        net(tokens, tokens).backward()
    opt.reduce_gradients_and_clip(1e6)
    at, num, den = 0, 0.0, 0.0
    for p in order:
        got = opt.grad[at : at + p.numel()].double().view(p.shape)
        ref = reference[names[id(p)]]
        assert torch.all((got - ref).abs() <= ref.abs() * 2.0**-8), names[id(p)]
        num, den = num + float((got - ref).pow(2).sum()), den + float(ref.pow(2).sum())
        at += p.numel()
    assert at == sum(p.numel() for p in order)
    assert (num / den) ** 0.5 < 1e-6
    assert all(p.grad is None and getattr(p, "main_grad", None) is None for p in order)
