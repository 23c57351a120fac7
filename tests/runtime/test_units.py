"""Runtime pieces that need no process group."""

import torch
import torch.nn.functional as F

from parc.runtime import data, mesh, model, optim
from parc.runtime.layers import vocab_parallel_cross_entropy


def test_mesh_coordinates_last_axis_fastest():
    axes = (("dp", 2), ("tp", 2))
    assert [mesh.coordinates(r, axes) for r in range(4)] == [
        {"dp": 0, "tp": 0}, {"dp": 0, "tp": 1}, {"dp": 1, "tp": 0}, {"dp": 1, "tp": 1}]
    assert mesh.axis_ranks(3, axes, "tp") == (2, 3)
    assert mesh.axis_ranks(3, axes, "dp") == (1, 3)


def test_sample_indices_partition_each_step():
    for dp_size, accum in [(1, 4), (2, 2), (4, 1)]:
        for step in (1, 3):
            seen = sorted(i for r in range(dp_size) for m in range(accum)
                          for i in data.sample_indices(step, m, micro_batch=2, grad_accum=accum, dp_rank=r, dp_size=dp_size))
            assert seen == list(range((step - 1) * 8, step * 8))


def test_synthetic_data_is_deterministic_and_shifted():
    a = data.SyntheticTokens(100, 16, seed=1)
    b = data.SyntheticTokens(100, 16, seed=1)
    x1, y1 = a.batch([5, 9])
    x2, y2 = b.batch([5, 9])
    assert torch.equal(x1, x2) and torch.equal(y1, y2)
    assert torch.equal(x1[:, 1:], y1[:, :-1])
    assert not torch.equal(a.batch([6])[0], a.batch([5])[0])


def test_token_file(tmp_path):
    path = tmp_path / "t.bin"
    torch.arange(1000, dtype=torch.int64).to(torch.int32).numpy().astype("uint16").tofile(path)
    tokens = data.TokenFile(str(path), 8, "uint16", seed=2)
    x, y = tokens.batch([0, 1])
    assert x.dtype == torch.int64 and x.shape == (2, 8)
    assert torch.equal(y[:, :-1], x[:, 1:]) and torch.equal(x[:, 1] - x[:, 0], torch.ones(2, dtype=torch.int64))


def test_lr_schedule():
    kw = dict(kind="cosine", peak_lr=1.0, warmup=2, total_steps=10, min_lr_ratio=0.1)
    assert optim.lr_at(1, **kw) == 0.5 and optim.lr_at(2, **kw) == 1.0
    assert abs(optim.lr_at(10, **kw) - 0.1) < 1e-12
    assert optim.lr_at(5, **dict(kw, kind="constant")) == 1.0


def test_vocab_cross_entropy_matches_torch_and_masks_padding():
    logits = torch.randn(2, 3, 8, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 6, (2, 3))
    ours = vocab_parallel_cross_entropy(logits, targets, tp_group=None, vocab_size=6)
    ref = F.cross_entropy(logits[..., :6].flatten(0, 1), targets.flatten(), reduction="none").view(2, 3)
    torch.testing.assert_close(ours, ref)
    ours.sum().backward()
    grad = logits.grad.clone()
    logits.grad = None
    ref.sum().backward()
    torch.testing.assert_close(grad, logits.grad)
    assert torch.all(grad[..., 6:] == 0)


def test_init_is_keyed_by_name_and_seed():
    cfg = model.ModelConfig(arch="gpt", layers=2, hidden=32, heads=4, kv_heads=4, ffn=64, vocab=64,
                            padded_vocab=64, seq_len=8)
    a = model.build_model(cfg, tp_group=None, sequence_parallel=False, tp_plan={}, seed=1, device="cpu")
    b = model.build_model(cfg, tp_group=None, sequence_parallel=False, tp_plan={}, seed=1, device="cpu")
    c = model.build_model(cfg, tp_group=None, sequence_parallel=False, tp_plan={}, seed=2, device="cpu")
    for (name, p), (_, q), (_, r) in zip(a.named_parameters(), b.named_parameters(), c.named_parameters()):
        assert torch.equal(p, q), name
        if p.dim() >= 2:
            assert not torch.equal(p, r), name
    names = [n for n, _ in a.named_parameters()]
    assert "layers.1.attn.q_proj.weight" in names and "embed.weight" in names and "head.weight" not in names
