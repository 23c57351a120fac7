"""runtime/parallel/expert/moe.py on one rank: routing, the grouped experts, the aux losses, the counts.

Each against a plain reference written token by token here (Note [deterministic
dropless routing]), so the vectorized permutation cannot drift from its meaning.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from parc.runtime.parallel.expert import moe
from parc.runtime.models.transformer import Transformer
from parc.runtime.layout import model_counts
from parc.runtime.layout.model_desc import ModelConfig, describe

import built  # noqa: E402  (tests/runtime/built.py)


def config(**moe_keys) -> ModelConfig:
    keys = dict(experts=4, top_k=2)
    keys.update(moe_keys)
    return ModelConfig(arch=moe_keys.pop("arch", "llama"), layers=2, hidden=16, heads=2, kv_heads=2, ffn=24,
                       vocab=32, padded_vocab=32, seq_len=8, **{k: v for k, v in keys.items() if k != "arch"})


def test_ties_go_to_the_lower_expert_index():
    logits = torch.zeros(3, 4)
    logits[1, 2] = logits[1, 3] = 1.0  # experts 2 and 3 tie above the rest
    experts, weights, kept, _ = moe.route(logits, top_k=2, router="softmax", capacity_factor=None)
    assert experts.tolist() == [[0, 1], [2, 3], [0, 1]]
    assert torch.allclose(weights, torch.full((3, 2), 0.5))
    assert kept.all()


@pytest.mark.parametrize("router", ["softmax", "sigmoid"])
def test_weights_are_the_chosen_scores_renormalized(router):
    logits = torch.randn(6, 5, generator=torch.Generator().manual_seed(0))
    experts, weights, _, probs = moe.route(logits, top_k=3, router=router, capacity_factor=None)
    scores = logits.softmax(-1) if router == "softmax" else logits.sigmoid()
    for t in range(6):
        best = sorted(range(5), key=lambda e: (-float(scores[t, e]), e))[:3]
        assert experts[t].tolist() == best
        chosen = scores[t, best]
        assert torch.allclose(weights[t], chosen / chosen.sum())
    assert torch.allclose(probs.sum(-1), torch.ones(6))


def test_capacity_keeps_each_experts_best_scored_tokens():
    # every token prefers expert 0; capacity ceil(0.5 · 4 · 1 / 2) = 1: only the best stays
    logits = torch.tensor([[1.0, 0.0], [3.0, 0.0], [2.0, 0.0], [3.0, 0.0]])
    experts, _, kept, _ = moe.route(logits, top_k=1, router="softmax", capacity_factor=0.5)
    assert experts.squeeze(1).tolist() == [0, 0, 0, 0]
    assert kept.squeeze(1).tolist() == [False, True, False, False]  # token 1 ties token 3: the earlier


def reference_moe(layer: moe.MoEMLP, x: torch.Tensor) -> torch.Tensor:
    """Token by token: each through its top_k experts' own matrices, weighted."""
    tokens = x.reshape(-1, x.shape[-1])
    experts, weights, kept, _ = moe.route(layer.router(tokens), top_k=layer.top_k, router=layer.router_kind,
                                          capacity_factor=layer.capacity)
    rows = []
    for t in range(tokens.shape[0]):
        y = torch.zeros_like(tokens[t])
        for slot in range(layer.top_k):
            if not kept[t, slot]:
                continue
            e = int(experts[t, slot])
            up = layer.experts.up_proj.weight[e] @ tokens[t]
            if layer.llama:
                h = F.silu(layer.experts.gate_proj.weight[e] @ tokens[t]) * up
            else:
                h = F.gelu(up, approximate="tanh")
            y = y + weights[t, slot] * (layer.experts.down_proj.weight[e] @ h)
        if layer.shared_experts is not None:
            y = y + layer.shared_experts(tokens[t : t + 1])[0]
        rows.append(y)
    return torch.stack(rows).view_as(x)


def build(cfg: ModelConfig) -> Transformer:
    return built.build(cfg, seed=3, kernels="eager").double()


@pytest.mark.parametrize(
    "keys",
    [dict(), dict(arch="gpt"), dict(shared_experts=1), dict(router="sigmoid", top_k=1), dict(capacity_factor=0.6)],
    ids=["llama", "gpt", "shared", "sigmoid-top1", "capacity"],
)
def test_moe_mlp_matches_the_token_by_token_reference(keys):
    model = build(config(**keys))
    layer = model.layers["0"].mlp
    assert isinstance(layer, moe.MoEMLP)
    x = torch.randn(2, 8, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.allclose(layer(x), reference_moe(layer, x), atol=1e-12)


def test_eager_experts_under_bf16_autocast_match_fp32():
    """The eager path (CUDA's, and CPU's with kernels = eager) combines bf16 expert rows into
    the fp32 residual stream: it once failed there (index_add_ of bf16 into fp32)."""
    model = built.build(config(), seed=3, kernels="eager")
    layer = model.layers["0"].mlp
    assert layer.fused is None  # eager: no kernels selected
    x = torch.randn(2, 8, 16, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = layer(x)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            got = layer(x)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)


def test_bf16_expert_rows_padded_to_buckets_on_cpu():
    """Note [expert rows in buckets]: each expert's rows rounded up to ROW_BUCKET with zero
    rows, the real ones in order at ``real``; fp32 keeps its exact counts."""
    counts = torch.tensor([3, 0, 17, 16])
    x = torch.randn(36, 5, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    rows, padded, real = moe.bucketed_rows(x, counts)
    assert padded.tolist() == [16, 0, 32, 16]
    assert real.tolist() == [*range(3), *range(16, 33), *range(48, 64)]
    assert torch.equal(rows[real], x)
    keep = torch.ones(rows.shape[0], dtype=torch.bool)
    keep[real] = False
    assert rows[keep].abs().sum() == 0
    assert moe.bucketed_rows(x.float(), counts) is None


def test_bf16_experts_on_cpu_give_each_row_its_unpadded_value():
    """Padding to buckets (Note [expert rows in buckets]) changes no real row: the experts'
    output and the gradients equal, bit for bit, a loop over the experts at the exact counts."""
    model = built.build(config(), seed=3, kernels="eager")
    layer = model.layers["0"].mlp
    counts = torch.tensor([5, 0, 9, 2])
    x = torch.randn(16, 16, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16).requires_grad_()
    weights = [p.detach().to(torch.bfloat16).requires_grad_() for p in
               (layer.experts.gate_proj.weight, layer.experts.up_proj.weight, layer.experts.down_proj.weight)]
    for p, w in zip((layer.experts.gate_proj, layer.experts.up_proj, layer.experts.down_proj), weights):
        p.weight = torch.nn.Parameter(w.detach().clone())
    got = layer.run_experts(x, counts)
    got.float().square().sum().backward()
    want, start = [], 0
    for e, n in enumerate(counts.tolist()):
        rows = x[start : start + n]
        want.append(F.linear(F.silu(F.linear(rows, weights[0][e])) * F.linear(rows, weights[1][e]), weights[2][e]))
        start += n
    want = torch.cat(want)
    x_grad, x.grad = x.grad, None
    want.float().square().sum().backward()
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    torch.testing.assert_close(x_grad, x.grad, rtol=0, atol=0)
    for p, w in zip((layer.experts.gate_proj, layer.experts.up_proj, layer.experts.down_proj), weights):
        torch.testing.assert_close(p.weight.grad, w.grad, rtol=0, atol=0)


def test_aux_and_z_loss_reach_the_router_gradient_with_the_loss_scale():
    cfg = config(aux_loss=0.5, z_loss=0.25)
    model = build(cfg)
    layer = model.layers["0"].mlp
    layer.loss_scale = 1 / 4
    x = torch.randn(2, 8, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    layer(x).sum().backward()
    with_aux = layer.router.weight.grad.clone()
    layer.router.weight.grad = None
    # the same, with the aux losses written out by hand and added at weight 1/4
    tokens = x.reshape(-1, 16)
    logits = layer.router(tokens)
    experts, _, _, probs = moe.route(logits, top_k=2, router="softmax", capacity_factor=None)
    share = torch.bincount(experts.reshape(-1), minlength=4).double() / (16 * 2)
    balance = 0.5 * 4 * torch.sum(share * probs.mean(0))
    z = 0.25 * torch.logsumexp(logits, -1).square().mean()
    layer.aux_coeff = layer.z_coeff = 0.0
    (layer(x).sum() + (balance + z) / 4).backward()
    assert torch.allclose(layer.router.weight.grad, with_aux, atol=1e-12)


def test_metrics_count_routed_slots_and_skip_recompute():
    cfg = config()
    model = build(cfg)
    x = torch.randint(0, 32, (2, 8))
    model(x, x).backward()
    out = moe.step_metrics(model, cfg, micro_batches=1, stage_ranks=1, replicas=1, device="cpu")
    assert sorted(out["expert_tokens"]) == ["layers.0", "layers.1"]
    assert all(sum(counts) == 2 * 8 * 2 for counts in out["expert_tokens"].values())
    assert out["aux_loss"] > 0 and "z_loss" not in out
    # full recompute reruns the block in backward: the counts must not double
    for block in model.layers.values():
        block.recompute = "full"
    model(x, x).backward()
    again = moe.step_metrics(model, cfg, micro_batches=1, stage_ranks=1, replicas=1, device="cpu")
    assert again["expert_tokens"] == out["expert_tokens"]
    assert math.isclose(again["aux_loss"], out["aux_loss"], rel_tol=1e-12)


def test_description_counts_total_and_active_parameters():
    cfg = config(moe_every=2, shared_experts=1)
    model = build(cfg)  # Transformer checks its parameters against the description
    desc = describe(cfg)
    assert model_counts.parameters(desc) == sum(p.numel() for p in model.parameters())
    assert [cfg.is_moe(i) for i in range(2)] == [True, False]
    experts = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n)
    assert experts == 3 * 4 * 24 * 16
    assert model_counts.active_parameters(desc) == model_counts.parameters(desc) - experts // 2  # top 2 of 4
    dense = describe(config(experts=0))
    assert model_counts.active_parameters(dense) == model_counts.parameters(dense)
    # a token meets the router, the shared expert and 2 of the 4 experts
    assert desc.blocks[0].matmul_weights("mlp") == 4 * 16 + 3 * 24 * 16 + 2 * 3 * 24 * 16
    assert desc.blocks[1].matmul_weights("mlp") == 3 * 24 * 16  # dense: gate, up, down


def test_expert_gradients_follow_grad_reduce(monkeypatch):
    """``train.grad_reduce = bf16``: the experts' edp sum goes on the wire in bf16, as the
    dense buckets do, and comes back into the fp32 gradient divided there; fp32 otherwise."""
    from parc.runtime.parallel.data import zero

    sent = []

    def all_reduce(flat, group=None):
        sent.append(flat.dtype)
        flat.mul_(2)  # two edp ranks holding the same gradient

    monkeypatch.setattr(zero, "group_size", lambda group: 2)
    monkeypatch.setattr(zero.dist, "all_reduce", all_reduce)
    model = built.build(config(), seed=3, kernels="eager")
    experts = [model.layers["0"].mlp.experts.up_proj.weight]  # one rank: ep·etp = 1, the sum is the call's
    grad = torch.full_like(experts[0], 1.0 + 2.0**-10)  # not a bf16 number: rounding shows
    for dtype, want in ((None, 1.0 + 2.0**-10), (torch.bfloat16, 1.0)):
        experts[0].grad = grad.clone()
        zero.mean_of_group(experts[:1], object(), 2, reduce_dtype=dtype)
        assert experts[0].grad.dtype == torch.float32 and torch.all(experts[0].grad == want)
    assert sent == [torch.float32, torch.bfloat16]


def test_a_capacitys_token_indices_are_one_ranks_order(monkeypatch):
    """Note [capacity under sequence parallelism]: under ring cp 2 × sp 2 each rank's tokens
    carry their index in one rank's micro-batch: the ids ``data.context_chunk`` gives the
    cp rank, then the tp rank's contiguous shard of them; the four ranks' indices together
    are every token once."""
    from types import SimpleNamespace

    from parc.runtime.parallel.context.context import ContextParallel
    from parc.runtime.train import data

    B, T, cp, tp = 2, 16, 2, 2
    local = T // cp // tp
    ids = torch.arange(B * T).view(B, T)
    seen = []
    for c in range(cp):
        for r in range(tp):
            place = {"sp": (tp, r), "cp": (cp, c)}
            monkeypatch.setattr(moe, "group_size", lambda g: place[g][0] if g else 1)
            monkeypatch.setattr(moe, "group_rank", lambda g: place[g][1] if g else 0)
            context = object.__new__(ContextParallel)
            context.group, context.kind, context.size, context.rank = "cp", "ring", cp, c
            layer = SimpleNamespace(seq_group="sp", context_group="cp", context=context)
            groups, positions = moe.MoEMLP.shards(layer, (B, local), "cpu")
            chunk, _ = data.context_chunk(ids, ids, cp_rank=c, cp_size=cp, cp_kind="ring")
            assert groups == ["sp", "cp"]
            assert torch.equal(positions, chunk[:, r * local:(r + 1) * local].reshape(-1))
            seen.append(positions)
    assert torch.equal(torch.cat(seen).sort().values, torch.arange(B * T))
