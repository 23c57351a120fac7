"""DeepSeek-style MoE on one rank: ``first_dense_layers`` and the router bias of
auxiliary-loss-free balancing (runtime/parallel/expert/router_bias.py)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from parc.codegen import hf_names
from parc.runtime.checkpoints import checkpoint_shards
from parc.runtime.layout.model_desc import ModelConfig, describe
from parc.runtime.parallel.expert import moe, router_bias

import built  # noqa: E402  (tests/runtime/built.py)


def config(**keys) -> ModelConfig:
    shape = dict(arch="llama", layers=3, hidden=16, heads=2, kv_heads=2, ffn=24, vocab=32, padded_vocab=32,
                 seq_len=8, experts=8, top_k=2)
    return ModelConfig(**(shape | keys))


def test_first_dense_layers_make_the_first_blocks_dense():
    cfg = config(first_dense_layers=1, shared_experts=1)
    assert [cfg.is_moe(i) for i in range(3)] == [False, True, True]
    assert [config(layers=6, first_dense_layers=1, moe_every=2).is_moe(i) for i in range(6)] == [
        False, False, True, False, True, False]  # as Hugging Face's DeepSeek-V3: i ≥ k and i % freq = 0
    model = built.build(cfg, seed=3, kernels="eager")  # checks its parameters against the description
    assert [isinstance(block.mlp, moe.MoEMLP) for block in model.layers.values()] == [False, True, True]
    assert [bool(b.experts) for b in describe(cfg).blocks] == [False, True, True]
    with pytest.raises(ValueError, match="first_dense_layers = 3 makes every one of the 3 blocks dense"):
        config(first_dense_layers=3)


def test_the_bias_chooses_the_experts_and_the_scores_weigh_them():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    bias = torch.tensor([-5.0, 0.0, 0.0, 0.0])  # expert 0 over-loaded: pushed out of the top 2
    experts, weights, _, probs = moe.route(logits, top_k=2, router="sigmoid", capacity_factor=None, bias=bias)
    assert experts.tolist() == [[1, 2]]
    chosen = logits.sigmoid()[0, [1, 2]]
    assert torch.allclose(weights[0], chosen / chosen.sum())  # unbiased
    plain = moe.route(logits, top_k=2, router="sigmoid", capacity_factor=None)
    assert torch.equal(probs, plain[3])  # the aux loss's probabilities ignore it too


def test_update_moves_each_bias_toward_the_mean_load():
    model = built.build(config(router_bias_update=0.25), seed=3, kernels="eager")
    tokens = {"layers.0": [10, 2, 4, 4, 4, 4, 2, 2], "layers.1": [4] * 8, "layers.2": [0, 0, 0, 0, 0, 0, 0, 32]}
    router_bias.update_router_bias(model, tokens)
    biases = [block.mlp.router_bias.tolist() for block in model.layers.values()]
    assert biases[0] == [-0.25, 0.25, 0.0, 0.0, 0.0, 0.0, 0.25, 0.25]  # mean 4: equal loads stay
    assert biases[1] == [0.0] * 8
    assert biases[2] == [0.25] * 7 + [-0.25]
    assert not any("router_bias" in name for name, _ in model.named_parameters())  # not trained
    saved = {piece.name: piece.tensor for piece in checkpoint_shards.buffer_pieces(model)}
    assert sorted(saved) == [f"model.layers.{i}.mlp.router_bias" for i in range(3)]
    assert saved["model.layers.0.mlp.router_bias"].tolist() == biases[0]


def test_bias_evens_a_skewed_routers_loads():
    cfg = config(layers=1, router="sigmoid", router_bias_update=0.01)
    model = built.build(cfg, seed=3, kernels="eager")
    layer = model.layers["0"].mlp
    with torch.no_grad():  # a router that prefers the low experts (inputs lean positive)
        layer.router.weight.add_(torch.linspace(0.05, -0.05, 8)[:, None] * torch.ones(16))
    x = torch.randn(4, 8, 16, generator=torch.Generator().manual_seed(0)) + 0.5
    ratios = []
    with torch.no_grad():
        for _ in range(20):
            layer(x)
            tokens = moe.step_metrics(model, cfg, micro_batches=1, stage_ranks=1, replicas=1, device="cpu")
            ratios.append(router_bias.load_ratio(tokens["expert_tokens"]["layers.0"]))
            router_bias.update_router_bias(model, tokens["expert_tokens"])
    assert ratios[0] > 2.0, ratios  # skewed before the bias moves
    assert max(ratios[-5:]) < 0.6 * ratios[0], ratios


def test_no_hugging_face_class_holds_it():
    record = dataclasses.asdict(config(first_dense_layers=1, router="sigmoid", router_bias_update=0.001))
    with pytest.raises(hf_names.NoHfNames) as refused:
        hf_names.links(record)
    assert str(refused.value) == (
        "Mixtral cannot hold this model (router = sigmoid; first_dense_layers = 1: dense blocks first; "
        "router_bias_update = 0.001: a routing bias); DeepSeek-V3's class holds these only with multi-head "
        "latent attention, which parc does not build: no Hugging Face names for it")


def test_a_checkpoint_keeps_the_biases(tmp_path):
    from parc.runtime.checkpoints.checkpoint import Checkpoints

    cfg = config(layers=2, first_dense_layers=1, router_bias_update=0.1)
    net = built.build(cfg, seed=3, kernels="eager")
    saver = Checkpoints(str(tmp_path), every=1, model=net, optimizer=torch.optim.AdamW(net.parameters()),
                        tp_group=None, config=cfg, layout="one rank", samples_per_step=1, rank=0, world_size=1,
                        device=torch.device("cpu"))
    bias = net.layers["1"].mlp.router_bias
    bias.copy_(torch.linspace(-0.3, 0.4, 8))
    path = saver.save(1)
    bias.zero_()
    assert saver.restore(path) == 1
    assert torch.equal(bias, torch.linspace(-0.3, 0.4, 8))


def test_the_sequence_wise_loss_is_each_sequences_loss_averaged():
    model = built.build(config(layers=1, aux_loss_scope="sequence", z_loss=0.001), seed=3, kernels="eager").double()
    layer = model.layers["0"].mlp
    x = torch.randn(3, 8, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(2))

    def losses(rows, sequences):
        logits = layer.router(rows.reshape(-1, 16))
        experts, _, _, probs = moe.route(logits, top_k=2, router="softmax", capacity_factor=None)
        return layer.aux_losses(logits, probs, experts, sequences=sequences)

    each = [losses(x[i : i + 1], 1) for i in range(3)]
    balance, z = losses(x, 3)
    assert torch.allclose(balance, sum(b for b, _ in each) / 3, rtol=1e-12)
    assert torch.allclose(z, sum(z for _, z in each) / 3, rtol=1e-12)
    assert not torch.allclose(balance, losses(x, 1)[0])  # not the micro-batch's
