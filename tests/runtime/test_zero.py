"""ZeRO (runtime/parallel/data/zero.py): the optimizer state is really sharded, and the steps match AdamW.

Two gloo ranks (spawned here) split a batch, step ``ShardedAdamW`` and compare every
parameter with one process running ``torch.optim.AdamW`` (``optim.build_optimizer``)
on the whole batch; each rank's Adam moments must be exactly its slice.
"""

from __future__ import annotations

import json

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from parc.runtime.distributed import mesh
from parc.runtime.train import data
from parc.runtime.models import model
from parc.runtime.optimizers import optim
from parc.runtime.parallel.data import zero
import built  # noqa: E402  (tests/runtime/built.py)

CONFIG = model.ModelConfig(arch="llama", layers=1, hidden=32, heads=4, kv_heads=2, ffn=64, vocab=61,
                           padded_vocab=64, seq_len=8)
HYPER = dict(lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1, eps=1e-8)
STEPS, CLIP, NO_CLIP = 3, 0.5, 1e3


def _net():
    return built.build(CONFIG, tp_group=None, sequence_parallel=False, tp_plan={}, seed=3, device="cpu")


def _reference():
    net, tokens = _net(), data.SyntheticTokens(CONFIG.vocab, CONFIG.seq_len, seed=1)
    opt = optim.build_optimizer(net, **HYPER)
    norms = []
    for step in range(STEPS):
        # the two dp ranks' halves of the batch, each half's mean loss halved: the same
        # sum (g0 + g1) / 2 the dp reduction makes (scaling by 1/2 is exact in fp32), so
        # what is left between the two is the optimizer's doing, not the summation order
        for half in range(2):
            x, y = tokens.batch(list(range(4 * step + 2 * half, 4 * step + 2 * half + 2)))
            (net(x, y) * 0.5).backward()
        norms.append(optim.clip_grad_norm_(net, CLIP, tp_group=None))
        opt.step()
        opt.zero_grad(set_to_none=True)
    return net, norms


def _worker(rank, world, store_path, out_path, stage):
    _run(rank, world, store_path, out_path, stage)
    mesh.shutdown()  # after _run's objects are gone (Note [groups die before Python does])


def _run(rank, world, store_path, out_path, stage):
    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=world)
    torch.manual_seed(0)
    net, tokens = _net(), data.SyntheticTokens(CONFIG.vocab, CONFIG.seq_len, seed=1)
    opt = zero.ShardedAdamW(net, dp_group=dist.group.WORLD, tp_group=None, stage=stage, **HYPER)
    per_rank = 4 // world
    norms = []
    for step in range(STEPS):
        start = 4 * step + rank * per_rank
        x, y = tokens.batch(list(range(start, start + per_rank)))
        net(x, y).backward()
        norms.append(opt.reduce_gradients_and_clip(CLIP))
        if stage == 2:
            assert all(p.grad is None for p in net.parameters())
            assert opt.grad.numel() == opt.shard
        opt.step()
        opt.zero_grad()
    ref, ref_norms = _reference()
    diffs = {name: float((p - q).detach().abs().max()) for (name, p), (_, q) in zip(net.named_parameters(), ref.named_parameters())}
    result = dict(
        rank=rank, shard=opt.shard, numel=opt.numel, norms=norms, ref_norms=ref_norms, diffs=diffs,
        state_numel=[t.numel() for t in opt.state.values() if torch.is_tensor(t)],
        views=all(p.untyped_storage().data_ptr() == opt.flat.untyped_storage().data_ptr() for p in net.parameters()),
    )
    with open(f"{out_path}.{rank}", "w") as f:
        json.dump(result, f)


def test_zero_shards_state_and_matches_adamw(tmp_path):
    world, stage = 2, 2
    out = tmp_path / "result"
    mp.spawn(_worker, args=(world, str(tmp_path / "store"), str(out), stage), nprocs=world, join=True)
    results = [json.loads((tmp_path / f"result.{r}").read_text()) for r in range(world)]
    total = sum(p.numel() for p in _net().parameters())
    for r in results:
        assert r["numel"] == total and r["shard"] == -(-total // world)
        assert r["state_numel"] == [r["shard"], r["shard"]], "Adam moments must be this rank's slice only"
        assert r["views"], "parameters must live in the flat buffer"
        for got, want in zip(r["norms"], r["ref_norms"]):
            assert abs(got - want) <= 1e-5 * want
        assert max(r["diffs"].values()) < 2e-5, r["diffs"]
    assert results[0]["norms"] == results[1]["norms"]


@pytest.mark.parametrize("stage", [1, 2])
def test_zero_step_is_torch_adamw(stage):
    """Same gradients in, same parameters out, bit for bit: one rank, against
    ``optim.build_optimizer`` (adamw.py, Note [fused AdamW on shards]).

    No clipping here (the norm stays far under ``NO_CLIP``): ZeRO sums the squares
    over its flat slice, ``clip_grad_norm_`` tensor by tensor, so the two norms may
    differ in the last bit, and so would a clip scale. The updates themselves must
    then be the same bits; clipping is checked by the two-rank test above.
    """
    ref, net = _net(), _net()
    opt_ref = optim.build_optimizer(ref, **HYPER)
    opt = zero.ShardedAdamW(net, dp_group=None, tp_group=None, stage=stage, **HYPER)
    tokens = data.SyntheticTokens(CONFIG.vocab, CONFIG.seq_len, seed=1)
    for step in range(STEPS):
        x, y = tokens.batch(list(range(4 * step, 4 * step + 4)))
        ref(x, y).backward()
        net(x, y).backward()
        want = optim.clip_grad_norm_(ref, NO_CLIP, tp_group=None)
        got = opt.reduce_gradients_and_clip(NO_CLIP)
        assert want < NO_CLIP
        assert abs(got - want) <= 1e-6 * want
        opt_ref.step()
        opt_ref.zero_grad(set_to_none=True)
        opt.step()
        opt.zero_grad()
    for (name, p), (_, q) in zip(net.named_parameters(), ref.named_parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=0, msg=name)


def test_zero_refuses_stage_3():
    with pytest.raises(ValueError, match="stage"):
        zero.ShardedAdamW(_net(), dp_group=None, tp_group=None, stage=3, **HYPER)
