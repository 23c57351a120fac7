"""AdamW's fused update (runtime/optimizers/adamw.py, Note [fused AdamW on shards]): slices of a
flat buffer cut anywhere (zero.flat_adamw_) update bit for bit as the whole parameters do.

The parameters below (lengths not multiples of 64, a 64-multiple, a matrix and a vector) are
stepped whole by ``AdamW`` (``optim.build_optimizer``'s), and as ZeRO steps them: laid end to
end in one flat buffer, cut into "ranks" at awkward offsets and lengths (1, 7, 15, 17, 33,
1000+3), each slice with its own moments and ``flat_adamw_``. Params and both moments must agree
exactly after every step, weight decay on and off, the lr changing each step as the schedule's.
"""

from __future__ import annotations

import pytest
import torch

from parc.runtime.checkpoints import checkpoint_shards
from parc.runtime.optimizers import optim
from parc.runtime.parallel.data import zero

SHAPES = [(1003,), (7, 33), (15,), (17, 9), (128,), (64, 3), (1,)]
HYPER = dict(betas=(0.9, 0.95), eps=1e-8)
STEPS = 5


def _values(seed, scale):
    gen = torch.Generator().manual_seed(seed)
    # magnitudes over many decades, so every rounding path is taken
    return [torch.randn(s, generator=gen) * torch.logspace(-7, 1, torch.Size(s).numel()).view(s) * scale
            for s in SHAPES]


def _lr(step):
    return 1e-3 * (0.3 + step / STEPS)


def _cuts(total):
    # slices of length 1, 7, 15, 17, 33, 1003, 3, then 31s: under a vector width W of 8 or 16
    # most of a 31-slice's elements would take the kernel's vector path in one run, its scalar
    # tail in the other, but for the padding
    cuts = [0, 1, 8, 23, 40, 73, 1076, 1079]
    return cuts + list(range(1079 + 31, total, 31)) + [total]


@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_slices_of_a_flat_buffer_update_as_the_whole_parameters(weight_decay):
    whole = [torch.nn.Parameter(v) for v in _values(0, 1.0)]
    model = torch.nn.ParameterList(whole)
    opt = optim.build_optimizer(model, lr=_lr(1), weight_decay=weight_decay, **HYPER)

    flat = torch.cat([v.reshape(-1) for v in _values(0, 1.0)])
    decay = torch.cat([torch.full((p.numel(),), p.dim() >= 2) for p in whole])
    cuts = _cuts(flat.numel())
    ranks = [dict(lo=a, hi=b, runs=zero.decay_runs(decay[a:b]),
                  state={"step": 0, "exp_avg": torch.zeros(b - a), "exp_avg_sq": torch.zeros(b - a)})
             for a, b in zip(cuts, cuts[1:])]
    for step in range(1, STEPS + 1):
        grads = _values(step, 1e-2)
        for p, g in zip(whole, grads):
            p.grad = g.clone()
        optim.set_lr(opt, _lr(step))
        opt.step()
        flat_grad = torch.cat([g.reshape(-1) for g in grads])
        for r in ranks:
            zero.flat_adamw_(flat[r["lo"] : r["hi"]], flat_grad[r["lo"] : r["hi"]], r["state"], runs=r["runs"],
                              lr=_lr(step), weight_decay=weight_decay, **HYPER)
        for name in ("param", "exp_avg", "exp_avg_sq"):
            want = torch.cat([(p.detach() if name == "param" else opt.state[p][name]).reshape(-1) for p in whole])
            got = flat if name == "param" else torch.cat([r["state"][name] for r in ranks])
            assert torch.equal(got, want), (step, name, int((got != want).sum()))


def test_decay_runs_are_the_masks_runs():
    mask = torch.tensor([True, True, False, True, False, False])
    assert zero.decay_runs(mask) == ((0, 2, True), (2, 3, False), (3, 4, True), (4, 6, False))
    assert zero.decay_runs(torch.tensor([False])) == ((0, 1, False),)


def test_state_keys_and_a_checkpoints_state_resume():
    """torch's state keys (what checkpoints read and write); a fresh optimizer given a
    checkpoint's state (``prepare_state``: the step on the CPU, zero moments filled in) steps
    on from that step exactly as the optimizer it was taken from."""
    params = [torch.nn.Parameter(v) for v in _values(0, 1.0)]
    model = torch.nn.ParameterList(params)
    opt = optim.build_optimizer(model, lr=_lr(1), weight_decay=0.1, **HYPER)
    for step in (1, 2):
        for p, g in zip(params, _values(step, 1e-2)):
            p.grad = g
        opt.step()
    assert all(set(opt.state[p]) == {"step", "exp_avg", "exp_avg_sq"} for p in params)
    assert checkpoint_shards.optimizer_step(opt) == 2

    copies = [torch.nn.Parameter(p.detach().clone()) for p in params]
    resumed = optim.build_optimizer(torch.nn.ParameterList(copies), lr=_lr(1), weight_decay=0.1, **HYPER)
    checkpoint_shards.prepare_state(resumed, 2)
    for p, q in zip(params, copies):
        for moment in ("exp_avg", "exp_avg_sq"):
            resumed.state[q][moment].copy_(opt.state[p][moment])
    for p, q, g in zip(params, copies, _values(3, 1e-2)):
        p.grad, q.grad = g, g.clone()
    opt.step()
    resumed.step()
    assert checkpoint_shards.optimizer_step(resumed) == 3
    for p, q in zip(params, copies):
        assert torch.equal(p, q)
