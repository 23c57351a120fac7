"""Note [counter-based init]: any box or flat range equals the same part of the whole."""

from __future__ import annotations

import math

import pytest
import torch

from parc.runtime.models import param_init
from parc.runtime.models.param_init import fill_
import built  # noqa: E402  (tests/runtime/built.py)
import init_reference  # noqa: E402  (tests/runtime/init_reference.py)
from init_reference import full_init, init_values  # noqa: E402

Q = "layers.0.attn.q_proj.weight"


def test_boxes_and_ranges_are_parts_of_the_whole():
    full = full_init(Q, (64, 48), layers=2, seed=1)
    for offsets, shape in [((16, 0), (16, 48)), ((0, 24), (64, 24)), ((5, 7), (3, 11))]:
        box = init_values(Q, (64, 48), layers=2, seed=1, offsets=offsets, shape=shape)
        assert torch.equal(box, full[offsets[0]:offsets[0] + shape[0], offsets[1]:offsets[1] + shape[1]])
    experts = full_init("layers.0.moe.up.weight", (4, 6, 8), layers=2, seed=1)
    assert torch.equal(init_values("layers.0.moe.up.weight", (4, 6, 8), layers=2, seed=1,
                                   offsets=(2, 0, 0), shape=(2, 6, 8)), experts[2:])
    # a flat range of a column box (a ZeRO-style slice that crosses rows)
    part = torch.empty(50)
    fill_(part, Q, (64, 48), layers=2, seed=1, offsets=(0, 24), shape=(64, 24), start=37)
    assert torch.equal(part, full[:, 24:].reshape(-1)[37:87])


def test_chunking_does_not_change_values(monkeypatch):
    whole = full_init(Q, (40, 30), layers=2, seed=3)
    monkeypatch.setattr(param_init, "CHUNK", 7)
    assert torch.equal(full_init(Q, (40, 30), layers=2, seed=3), whole)


def test_rules_and_statistics():
    assert torch.equal(full_init("layers.0.attn.q_proj.bias", (8,), layers=2, seed=1), torch.zeros(8))
    assert torch.equal(full_init("layers.0.attn_norm.weight", (8,), layers=2, seed=1), torch.ones(8))
    q = full_init(Q, (256, 256), layers=2, seed=1)
    assert abs(q.std().item() - 0.02) < 0.0005 and abs(q.mean().item()) < 0.0005
    o = full_init("layers.0.attn.o_proj.weight", (256, 256), layers=8, seed=1)
    assert abs(o.std().item() - 0.02 / math.sqrt(16)) < 0.0002
    # another name or seed gives other, uncorrelated numbers
    k = full_init("layers.0.attn.k_proj.weight", (256, 256), layers=2, seed=1)
    other = full_init(Q, (256, 256), layers=2, seed=2)
    for x in (k, other):
        assert abs(torch.corrcoef(torch.stack([q.reshape(-1), x.reshape(-1)]))[0, 1].item()) < 0.02


def test_out_of_range_boxes_are_refused():
    with pytest.raises(ValueError, match="outside"):
        init_values(Q, (4, 4), layers=2, seed=1, offsets=(2, 0), shape=(3, 4))
    with pytest.raises(ValueError, match="outside the box"):
        fill_(torch.empty(5), Q, (4, 4), layers=2, seed=1, start=12)


@pytest.mark.parametrize("arch", ["gpt", "llama"])
def test_generated_on_the_device_equals_the_cpu_init(arch):
    """init_weights on the meta device's plain model: each parameter allocated and generated
    where it lives (param_init.materialize_on; on CUDA on the device, here on the CPU) — the
    same numbers as init_reference.initialize filling a model in place, bit for bit, ties kept."""
    from parc.runtime.models import model, transformer

    config = model.ModelConfig(
        arch=arch, layers=2, hidden=32, heads=4, kv_heads=4 if arch == "gpt" else 2, ffn=64, vocab=128,
        padded_vocab=128, seq_len=16, dropout=0.0, norm_eps=1e-5, rope_theta=1e4, tie_embeddings=arch == "gpt",
    )
    in_place = transformer.Transformer(config)  # one rank's layout, built on the CPU: norms 1 and 0
    init_reference.initialize(in_place, seed=5)
    nets = [in_place, built.build(config, seed=5, device="cpu", kernels="eager", init_on_device=True)]
    cpu, device = (dict(m.named_parameters()) for m in nets)
    assert cpu.keys() == device.keys()
    for name in cpu:
        assert not device[name].is_meta and torch.equal(cpu[name], device[name]), name
    assert len(list(nets[1].parameters())) == len(list(nets[0].parameters()))  # tied once in both
