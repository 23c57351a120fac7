"""Runtime pieces that need no process group: mesh math, data, schedule, loss, init, plan."""

import json
import math

import pytest
import torch
import torch.nn.functional as F

from parc.runtime.layout import axes as mesh_axes
from parc.runtime.train import data, metrics
from parc.runtime.parallel.data import dp
from parc.runtime.distributed import mesh
from parc.runtime.models import model
from parc.runtime.optimizers import optim
from parc.runtime.parallel.tensor import tp_plan
from parc.runtime.parallel.tensor.layers import vocab_parallel_cross_entropy
import built  # noqa: E402  (tests/runtime/built.py)
from init_reference import full_init  # noqa: E402  (tests/runtime/init_reference.py)

GPT = model.ModelConfig(arch="gpt", layers=2, hidden=32, heads=4, kv_heads=4, ffn=64, vocab=60,
                        padded_vocab=64, seq_len=8)
LLAMA = model.ModelConfig(arch="llama", layers=2, hidden=32, heads=4, kv_heads=2, ffn=64, vocab=60,
                          padded_vocab=64, seq_len=8, tie_embeddings=False)


def build(config, seed=1, plan=None):
    return built.build(config, tp_group=None, sequence_parallel=False, tp_plan=plan or {},
                             seed=seed, device="cpu")


# ---- mesh -------------------------------------------------------------------------


def test_mesh_coordinates_last_axis_fastest():
    axes = (("dp", 2), ("tp", 2))
    assert [mesh_axes.coordinates(r, axes) for r in range(4)] == [
        {"dp": 0, "tp": 0}, {"dp": 0, "tp": 1}, {"dp": 1, "tp": 0}, {"dp": 1, "tp": 1}]
    assert mesh.axis_ranks(3, axes, "tp") == (2, 3)
    assert mesh.axis_ranks(3, axes, "dp") == (1, 3)
    axes = (("pp", 2), ("dp", 3), ("tp", 2))
    assert mesh_axes.coordinates(11, axes) == {"pp": 1, "dp": 2, "tp": 1}
    assert mesh.axis_ranks(7, axes, "dp") == (7, 9, 11)
    assert mesh.axis_ranks(7, axes, "pp") == (1, 7)
    # a group over several axes: every rank that differs only along them
    assert mesh.axis_ranks(7, axes, "dp", "tp") == (6, 7, 8, 9, 10, 11)
    assert mesh.axis_ranks(7, axes, "pp", "tp") == (0, 1, 6, 7)
    assert mesh_axes.partition(axes, ("pp", "tp")) == ((0, 1, 6, 7), (2, 3, 8, 9), (4, 5, 10, 11))


def test_axes_registry_orders_the_mesh():
    assert mesh_axes.NAMES == ("pp", "dp", "cp", "tp")
    assert mesh_axes.mesh_axes({"tp": 2, "dp": 4}) == (("pp", 1), ("dp", 4), ("cp", 1), ("tp", 2))
    # cp between dp and tp: a tp group stays consecutive, a cp group strides over tp
    axes = mesh_axes.mesh_axes({"dp": 2, "cp": 2, "tp": 2})
    assert mesh_axes.group_ranks(5, axes, "cp") == (5, 7)
    assert mesh_axes.group_ranks(5, axes, ("dp", "cp")) == (1, 3, 5, 7)
    with pytest.raises(KeyError, match="no mesh axis 'xp'"):
        mesh_axes.axis("xp")


def test_mesh_of_one_rank_and_bad_meshes():
    one = mesh.Dist(0, 1, 0, torch.device("cpu"), None)
    grid = mesh.Mesh((("dp", 1), ("tp", 1)), one)
    assert grid.coords == {"dp": 0, "tp": 0} and grid.group("tp") is None and grid.ranks("dp") == (0,)
    with pytest.raises(ValueError, match=r"needs 4 processes, but WORLD_SIZE is 1"):
        mesh.Mesh((("dp", 2), ("tp", 2)), one)
    with pytest.raises(ValueError, match="distinct names"):
        mesh.Mesh((("tp", 1), ("tp", 1)), one)


def test_hsdp_expert_groups_split_edp_by_node(monkeypatch):
    """fsdp.py, Note [experts as units]: under zero_shard = node the experts shard over the edp
    ranks of a node and replicate across nodes. 2 nodes of 4 ranks, dp 8, ep 2: edp {0, 2, 4, 6}
    and {1, 3, 5, 7}; rank 5's shard group is {5, 7}, its replicas {1, 5}. Fake groups: the
    members each ``new_group`` call got, so the order every rank makes them in is seen too."""
    from types import SimpleNamespace
    from parc.runtime.parallel.data import fsdp_units

    made = []
    monkeypatch.setattr(fsdp_units.dist, "new_group", lambda ranks: made.append(tuple(ranks)) or tuple(ranks))
    monkeypatch.setattr(mesh.dist, "get_world_size", lambda: 8)
    grid = SimpleNamespace(axes=(("pp", 1), ("dp", 8), ("cp", 1), ("tp", 1)), rank=5)
    assert fsdp_units.expert_node_groups(grid, (2, 1), 4) == ((5, 7), (1, 5))
    assert made == [(0, 2), (4, 6), (0, 4), (2, 6), (1, 3), (5, 7), (1, 5), (3, 7)]
    made.clear()  # ep 4 over nodes of 2: one edp rank a node, replicated over both
    assert fsdp_units.expert_node_groups(grid, (4, 1), 2) == (None, (1, 5))
    with pytest.raises(ValueError, match="do not split evenly over nodes"):
        fsdp_units.expert_node_groups(grid, (2, 1), 3)


# ---- data -------------------------------------------------------------------------


def test_sample_indices_partition_each_step():
    for dp_size, accum in [(1, 4), (2, 2), (4, 1)]:
        for step in (1, 3):
            seen = [i for r in range(dp_size) for m in range(accum)
                    for i in data.sample_indices(step, m, micro_batch=2, grad_accum=accum, dp_rank=r,
                                                 dp_size=dp_size)]
            assert sorted(seen) == list(range((step - 1) * 8, step * 8))  # each index exactly once


def test_synthetic_data_is_deterministic_keyed_by_index_and_shifted():
    a = data.SyntheticTokens(100, 16, seed=1)
    b = data.SyntheticTokens(100, 16, seed=1)
    x1, y1 = a.batch([5, 9])
    x2, y2 = b.batch([5, 9])
    assert torch.equal(x1, x2) and torch.equal(y1, y2)
    assert x1.dtype == torch.int64 and x1.shape == (2, 16)
    assert torch.equal(x1[:, 1:], y1[:, :-1])
    assert torch.equal(a.batch([9])[0][0], x1[1])  # sample 9 whatever it is batched with
    assert not torch.equal(a.batch([6])[0], a.batch([5])[0])
    assert not torch.equal(data.SyntheticTokens(100, 16, seed=2).batch([5])[0], a.batch([5])[0])
    assert 0 <= int(x1.min()) and int(x1.max()) < 100


@pytest.mark.parametrize("dtype", ["uint16", "uint32"])
def test_token_file(tmp_path, dtype):
    path = tmp_path / "t.bin"
    ids = torch.arange(1000, dtype=torch.int64) + (70000 if dtype == "uint32" else 0)
    (ids.to(torch.int32) if dtype == "uint32" else ids.to(torch.int16)).numpy().tofile(path)
    tokens = data.TokenFile(str(path), 8, dtype, seed=2)
    x, y = tokens.batch([0, 1, 2])
    assert x.dtype == torch.int64 and x.shape == (3, 8)
    assert torch.equal(y[:, :-1], x[:, 1:])
    assert torch.equal(x[:, 1:] - x[:, :-1], torch.ones(3, 7, dtype=torch.int64))  # a contiguous window
    assert torch.equal(data.TokenFile(str(path), 8, dtype, seed=2).batch([1])[0][0], x[1])
    assert int(x.min()) >= int(ids[0]) and int(y.max()) <= int(ids[-1])


# ---- optim ------------------------------------------------------------------------


def test_lr_schedule():
    kw = dict(kind="cosine", peak_lr=1.0, warmup=2, total_steps=10, min_lr_ratio=0.1)
    assert optim.lr_at(1, **kw) == 0.5 and optim.lr_at(2, **kw) == 1.0
    assert optim.lr_at(6, **kw) == pytest.approx(0.55)  # half-way down the cosine
    assert optim.lr_at(10, **kw) == pytest.approx(0.1) and optim.lr_at(12, **kw) == pytest.approx(0.1)
    assert optim.lr_at(6, **dict(kw, kind="linear")) == pytest.approx(0.55)
    assert optim.lr_at(8, **dict(kw, kind="linear")) == pytest.approx(0.325)
    assert optim.lr_at(5, **dict(kw, kind="constant")) == 1.0
    assert optim.lr_at(1, **dict(kw, kind="linear", warmup=0)) == pytest.approx(0.91)  # decay from step 0
    with pytest.raises(ValueError, match="unknown lr schedule"):
        optim.lr_at(1, **dict(kw, kind="step"))


def test_optimizer_decays_matrices_only_and_clip_matches_torch():
    net = build(GPT)
    opt = optim.build_optimizer(net, lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1, eps=1e-8)
    decay, no_decay = opt.param_groups
    assert decay["weight_decay"] == 0.1 and all(p.dim() == 2 for p in decay["params"])
    assert no_decay["weight_decay"] == 0.0 and all(p.dim() == 1 for p in no_decay["params"])
    x, y = data.SyntheticTokens(GPT.vocab, GPT.seq_len, seed=0).batch([0, 1])
    net(x, y).backward()
    grads = [p.grad.clone() for p in net.parameters()]
    assert optim.clip_grad_norm_(net, 0, tp_group=None) == pytest.approx(
        float(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads]))), rel=1e-6)
    assert all(torch.equal(p.grad, g) for p, g in zip(net.parameters(), grads))  # 0: measure only
    ours = optim.clip_grad_norm_(net, 0.01, tp_group=None)
    clipped = [p.grad.clone() for p in net.parameters()]
    for p, g in zip(net.parameters(), grads):
        p.grad = g.clone()
    theirs = float(torch.nn.utils.clip_grad_norm_(net.parameters(), 0.01))
    assert ours == pytest.approx(theirs, rel=1e-6)
    for p, g in zip(net.parameters(), clipped):
        torch.testing.assert_close(g, p.grad)


def test_dp_helpers_are_identities_on_one_rank():
    net = build(GPT)
    x, y = data.SyntheticTokens(GPT.vocab, GPT.seq_len, seed=0).batch([0])
    net(x, y).backward()
    before = [p.grad.clone() for p in net.parameters()]
    dp.GradientBuckets(net, None, bucket_bytes=1024).all_reduce()
    assert all(torch.equal(p.grad, g) for p, g in zip(net.parameters(), before))
    assert dp.all_reduce_mean(2.5, None) == 2.5


# ---- loss, model, init ------------------------------------------------------------


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


def test_vocab_cross_entropy_is_stable_and_keeps_bf16_grads():
    logits = (torch.randn(1, 4, 8) * 1e4).to(torch.bfloat16).requires_grad_()  # exp would overflow
    targets = torch.randint(0, 8, (1, 4))
    loss = vocab_parallel_cross_entropy(logits, targets, tp_group=None, vocab_size=8)
    ref = F.cross_entropy(logits.float()[0], targets[0], reduction="none")
    assert loss.dtype == torch.float32 and torch.isfinite(loss).all()
    torch.testing.assert_close(loss[0], ref)
    loss.sum().backward()
    assert logits.grad.dtype == torch.bfloat16


@pytest.mark.parametrize("config", [GPT, LLAMA], ids=["gpt", "llama"])
def test_model_names_shapes_and_initial_loss(config):
    net = build(config)
    names = dict(net.named_parameters())
    assert "layers.1.attn.q_proj.weight" in names and "embed.weight" in names
    assert names["layers.0.attn.k_proj.weight"].shape == (config.kv_heads * 8, config.hidden)
    if config.arch == "gpt":
        assert "head.weight" not in names and "pos_embed.weight" in names  # tied head
        assert "layers.0.mlp.up_proj.bias" in names and "layers.0.attn_norm.bias" in names
    else:
        assert "head.weight" in names and "pos_embed.weight" not in names
        assert "layers.0.mlp.gate_proj.weight" in names and not any(n.endswith(".bias") for n in names)
    x, y = data.SyntheticTokens(config.vocab, config.seq_len, seed=0).batch([0, 1])
    loss = net(x, y)
    assert loss.shape == () and abs(loss.item() - math.log(config.vocab)) < 0.5
    with pytest.raises(ValueError, match="longer than seq_len"):
        net(torch.zeros(1, config.seq_len + 1, dtype=torch.int64), torch.zeros(1, config.seq_len + 1, dtype=torch.int64))


def test_init_is_keyed_by_name_and_seed():
    a, b, c = build(GPT, seed=1), build(GPT, seed=1), build(GPT, seed=2)
    for (name, p), (_, q), (_, r) in zip(a.named_parameters(), b.named_parameters(), c.named_parameters()):
        assert torch.equal(p, q), name
        if p.dim() >= 2:
            assert not torch.equal(p, r), name
        elif name.endswith("norm.weight"):
            assert torch.equal(p, torch.ones_like(p)), name
        else:
            assert torch.equal(p, torch.zeros_like(p)), name
    # a parameter's value depends on its name and shape, not on the rest of the model
    deeper = dict(build(model.ModelConfig(**{**{f: getattr(GPT, f) for f in GPT.__dataclass_fields__}, "layers": 3}))
                  .named_parameters())
    ours = dict(a.named_parameters())
    for name in ("embed.weight", "pos_embed.weight", "layers.1.attn.q_proj.weight", "layers.0.mlp.up_proj.weight"):
        assert torch.equal(ours[name], deeper[name]), name
    q = ours["layers.0.attn.q_proj.weight"]
    assert abs(q.std().item() - 0.02) < 0.002
    assert torch.equal(q, full_init("layers.0.attn.q_proj.weight", q.shape, layers=2, seed=1))


def test_model_config_errors():
    fields = {f: getattr(GPT, f) for f in GPT.__dataclass_fields__}
    with pytest.raises(ValueError, match="arch must be"):
        model.ModelConfig(**{**fields, "arch": "bert"})
    with pytest.raises(ValueError, match="heads = 4 is not divisible by kv_heads = 3"):
        model.ModelConfig(**{**fields, "kv_heads": 3})
    with pytest.raises(ValueError, match="padded_vocab = 32 < vocab = 60"):
        model.ModelConfig(**{**fields, "padded_vocab": 32})


# ---- the tp plan ------------------------------------------------------------------

FULL_PLAN = {
    "embed": "vocab", "head": "vocab_head",
    "layers.*.attn.q_proj": "colwise", "layers.*.attn.k_proj": "colwise",
    "layers.*.attn.v_proj": "colwise", "layers.*.attn.o_proj": "rowwise",
    "layers.*.mlp.up_proj": "colwise", "layers.*.mlp.down_proj": "rowwise",
}


def plan(table, config=GPT, *, tp=2, sp=False, monkeypatch):
    monkeypatch.setattr(tp_plan, "group_size", lambda group: tp)
    return tp_plan.TensorParallelPlan(table, config, tp_group=object(), sequence_parallel=sp)


def test_tp_plan_styles(monkeypatch):
    p = plan(FULL_PLAN, monkeypatch=monkeypatch)
    assert p.style("layers.1.attn.q_proj") == "colwise" and p.style("layers.0.mlp.down_proj") == "rowwise"
    assert p.style("embed") == "vocab" and p.style("final_norm") is None and p.style("pos_embed") is None
    assert plan(FULL_PLAN, tp=1, monkeypatch=monkeypatch).style("embed") is None  # one rank: plain
    only_layer_1 = {k.replace("*", "1"): v for k, v in FULL_PLAN.items() if "*" in k}
    p = plan(only_layer_1, monkeypatch=monkeypatch)
    assert p.style("layers.1.attn.q_proj") == "colwise" and p.style("layers.0.attn.q_proj") is None


@pytest.mark.parametrize("change, message", [
    ({"head": "rowwise_ish"}, r"'head' has unknown style 'rowwise_ish'; styles are colwise, rowwise, vocab, vocab_head"),
    ({"layers.*.attn.qkv": "colwise"}, r"pattern\(s\) \['layers.\*.attn.qkv'\] match no module of this gpt model"),
    ({"layers.*.mlp.gate_proj": "colwise"}, r"match no module of this gpt model"),
    ({"layers.*.attn.o_proj": "colwise"}, r"layers.0.attn.o_proj can only be 'rowwise', not 'colwise'"),
    ({"final_norm": "colwise"}, r"final_norm is replicated; it cannot be 'colwise'"),
    ({"head": None}, r"a tied head and embedding must both be vocab-parallel or neither"),
    ({"layers.*.attn.v_proj": None}, r"layers.0.attn is half sharded \(layers.0.attn.q_proj, layers.0.attn.k_proj, "
                                    r"layers.0.attn.o_proj\); shard all of q_proj, k_proj, v_proj, o_proj or none"),
])
def test_tp_plan_errors(change, message, monkeypatch):
    table = {k: v for k, v in {**FULL_PLAN, **change}.items() if v is not None}
    with pytest.raises(ValueError, match=message):
        plan(table, monkeypatch=monkeypatch)


def test_tp_plan_errors_that_depend_on_the_layout(monkeypatch):
    with pytest.raises(ValueError, match=r"tp = 3 neither divides kv_heads = 2 nor is a multiple of it"):
        plan({**FULL_PLAN, "layers.*.mlp.gate_proj": "colwise"}, LLAMA, tp=3, monkeypatch=monkeypatch)
    # tp = 4 > kv_heads = 2 replicates each kv head over 2 ranks (Note [KV replication])
    plan({**FULL_PLAN, "layers.*.mlp.gate_proj": "colwise"}, LLAMA, tp=4, monkeypatch=monkeypatch)
    blocks_replicated = {"embed": "vocab", "head": "vocab_head"}
    plan(blocks_replicated, monkeypatch=monkeypatch)  # fine without sequence parallelism
    with pytest.raises(ValueError, match=r"with sequence parallelism layers.0.attn must be sharded"):
        plan(blocks_replicated, sp=True, monkeypatch=monkeypatch)
    with pytest.raises(ValueError, match="unknown style"):  # checked on one rank too
        build(GPT, plan={"embed": "rows"})


# ---- learnable data, metrics ------------------------------------------------------


def test_loss_visibly_falls_in_20_steps_of_the_tiny_example():
    """examples/tiny.par's model, batch and optimizer on SyntheticTokens, one rank."""
    config = model.ModelConfig(arch="gpt", layers=4, hidden=128, heads=4, kv_heads=4, ffn=512, vocab=512,
                               padded_vocab=512, seq_len=64)
    net = build(config, seed=1234)
    opt = optim.build_optimizer(net, lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1, eps=1e-8)
    dataset = data.SyntheticTokens(config.vocab, config.seq_len, seed=1234)
    losses = []
    for step in range(1, 21):
        optim.set_lr(opt, optim.lr_at(step, kind="cosine", peak_lr=3e-4, warmup=2, total_steps=20,
                                      min_lr_ratio=0.1))
        x, y = dataset.batch(data.sample_indices(step, 0, micro_batch=16, grad_accum=1, dp_rank=0, dp_size=1))
        loss = net(x, y)
        loss.backward()
        optim.clip_grad_norm_(net, 1.0, tp_group=None)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    assert sum(losses[-3:]) / 3 < losses[0] - 1.0, losses


def test_flops_per_token():
    # 2 layers · (attn 4·32·32 + mlp 2·32·64) + head 60·32 = 18304 matmul weights
    assert metrics.flops_per_token(GPT) == 6.0 * 18304 + 12.0 * 2 * 4 * 8 * 8
    # llama: k/v are kv_heads·8 = 16 wide, and the MLP has three matrices
    assert metrics.flops_per_token(LLAMA) == 6.0 * (2 * (2 * 32 * 32 + 2 * 32 * 16 + 3 * 32 * 64) + 60 * 32) + 12.0 * 2 * 4 * 8 * 8


def test_metrics_logger_writes_jsonl(tmp_path, capsys):
    path = tmp_path / "m.jsonl"
    logger = metrics.MetricsLogger(str(path), enabled=True)
    record = dict(step=1, loss=2.5, grad_norm=0.75, lr=1e-3, tokens_per_s=1234.5, mfu=None,
                  peak_mem_bytes=metrics.peak_mem_bytes(torch.device("cpu")), step_time_s=0.25)
    logger.log(record)
    logger.log({**record, "step": 2, "mfu": 0.4})
    logger.close()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert lines[0] == record and lines[1]["mfu"] == 0.4 and record["peak_mem_bytes"] > 2**20
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 2 and "loss 2.5000" in out[0] and "mfu n/a" in out[0] and "mfu 40.0%" in out[1]
    quiet = metrics.MetricsLogger(str(tmp_path / "q.jsonl"), enabled=False)
    quiet.log(record)
    quiet.close()
    assert not (tmp_path / "q.jsonl").exists() and capsys.readouterr().out == ""
