"""``hetero.clip_grad_norm_`` under fp16 (``grad_scale``): the trainer of a per-layer layout
calls it with the loss scale, as every other clip (codegen/render_step.py ``grad_scale_kwargs``)."""

from __future__ import annotations

import types

import torch

from parc.runtime.optimizers import optim
from parc.runtime.parallel.data import hetero
from parc.runtime.layout.roles import assign


def _model(scale: float):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 6), torch.nn.Linear(6, 4))
    generator = torch.Generator().manual_seed(1)
    for p in model.parameters():
        assign(p, layer_tp=1)
        p.grad = torch.randn(p.shape, generator=generator) * scale
    return model


def test_grad_scale_is_divided_out_before_the_norm_and_the_clip():
    layouts = types.SimpleNamespace(stage_size=1)  # one rank: no group to sum over
    plain, scaled = _model(1.0), _model(2.0**12)
    want = hetero.clip_grad_norm_(plain, 0.5, layouts=layouts, stage_group=None)
    got = hetero.clip_grad_norm_(scaled, 0.5, layouts=layouts, stage_group=None, grad_scale=2.0**12)
    assert got == want
    assert want > 0.5  # the clip did scale the gradients
    for p, q in zip(plain.parameters(), scaled.parameters()):
        assert torch.equal(p.grad, q.grad)
    # the same norm as the uniform layout's clip of the same gradients
    assert optim.clip_grad_norm_(_model(2.0**12), 0.5, tp_group=None, grad_scale=2.0**12) == want
