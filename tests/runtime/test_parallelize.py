"""The plain model and its transforms (Note [the order of the transforms]).

The transforms run in one order, each at most once, on a model without values; the
generated train.py writes them in that order; the plain model is the one-rank model.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from parc.codegen.lower import lower
from parc.codegen.render import render
from parc.dsl import load
from parc.runtime.layout.layer_settings import SETTINGS
from parc.runtime.layout.transforms import ORDER, STEPS
from parc.runtime.models import model, parallelize

import built  # noqa: E402  (tests/runtime/built.py)

ROOT = Path(__file__).resolve().parents[2]
CONFIG = model.ModelConfig(arch="llama", layers=2, hidden=32, heads=4, kv_heads=2, ffn=64, vocab=64,
                           padded_vocab=64, seq_len=8, tie_embeddings=False)


def test_every_step_is_described_and_every_setting_is_a_step():
    assert set(STEPS) == set(ORDER)
    for entry in SETTINGS:  # Note [a per-layer setting is an entry]: its step is parallelize.<name>
        assert entry.name in ORDER and callable(getattr(parallelize, entry.name))
    for step in ORDER:
        assert callable(getattr(parallelize, step))
    from parc.codegen.features import FEATURES

    steps = [f.step for f in FEATURES if f.step]
    assert steps and set(steps) <= set(ORDER) and len(steps) == len(set(steps))  # one entry says each step's lines


def test_a_step_out_of_order_or_twice_is_refused():
    net = parallelize.recompute(model.build_model(CONFIG), "full")
    with pytest.raises(ValueError, match=r"parallelize.tensor after parallelize.recompute: the transforms run "
                                         r"in the order tensor, context, experts, recompute, overlap"):
        parallelize.tensor(net, None, {}, sequence_parallel=False)
    with pytest.raises(ValueError, match="parallelize.recompute after parallelize.recompute"):
        parallelize.recompute(net, "none")
    assert net.transforms == ("recompute",)


def test_a_model_with_values_is_not_transformed():
    net = model.init_weights(model.build_model(CONFIG), seed=1, device="cpu")
    with pytest.raises(ValueError, match="on a model with values: transform the plain model of build_model"):
        parallelize.tensor(net, None, {}, sequence_parallel=False)


def test_settings_reach_each_block():
    net = built.transform(model.build_model(CONFIG), recompute=["selective", "full"], sub_batches=[1, 2])
    blocks = list(net.layers.values())
    assert [b.recompute for b in blocks] == ["selective", "full"]
    assert [b.attn.selective for b in blocks] == [True, False]
    assert [b.splits for b in blocks] == [1, 2]
    with pytest.raises(ValueError, match="recompute must be one of"):
        parallelize.recompute(model.build_model(CONFIG), "some")


def test_the_plain_model_is_the_one_rank_model():
    """At tp = 1 the tensor step keeps every layer (the same parameters, the same loss)."""
    tokens = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(0))
    plain = model.init_weights(model.build_model(CONFIG), seed=3, device="cpu")
    split = built.build(CONFIG, seed=3, kernels="eager")
    assert [n for n, _ in plain.named_parameters()] == [n for n, _ in split.named_parameters()]
    assert torch.equal(model.use_kernels(plain, "eager", "cpu")(tokens, tokens), split(tokens, tokens))


@pytest.mark.parametrize("overrides", [
    ("mesh.devices_per_node=4", "parallel.tp=2", "parallel.sp=true", "parallel.cp=2", "parallel.cp_kind=ulysses",
     "parallel.recompute=selective", "parallel.overlap=sub_batch(2)"),
    ("mesh.devices_per_node=2", "parallel.pp=2", "parallel.recompute=[full, none]"),
])
def test_train_py_writes_the_steps_in_their_order(overrides):
    spec = load(str(ROOT / "tests" / "parity" / "specs" / "llama.par"), list(overrides))
    text = render(lower(spec))["train.py"]
    steps = re.findall(r"net = parallelize\.(\w+)\(", text)
    assert steps[0] == "tensor" and steps == sorted(steps, key=ORDER.index) and len(set(steps)) == len(steps)
    assert text.index("model.build_") < text.index("parallelize.tensor") < text.index("model.init_weights(")


def test_the_tensor_step_makes_its_layers_without_values(monkeypatch):
    """The swapped-in parallel layers are made on the meta device like the plain ones, so
    init_weights generates every value (a layer made with values would keep garbage)."""
    from parc.runtime.models import transformer
    from parc.runtime.parallel.tensor import layers, sharding, tp_plan

    for module in (sharding, layers, tp_plan, transformer):
        monkeypatch.setattr(module, "group_size", lambda group: 1 if group is None else 2)
    monkeypatch.setattr(layers, "group_rank", lambda group: 0)
    table = {"layers.*.attn.q_proj": "colwise", "layers.*.attn.k_proj": "colwise", "layers.*.attn.v_proj": "colwise",
             "layers.*.attn.o_proj": "rowwise", "layers.*.mlp.gate_proj": "colwise", "layers.*.mlp.up_proj": "colwise",
             "layers.*.mlp.down_proj": "rowwise"}
    net = parallelize.tensor(model.build_model(CONFIG), object(), table, sequence_parallel=True)
    assert type(net.layers["0"].attn.q_proj).__name__ == "ColumnParallelLinear"
    assert all(p.is_meta for p in net.parameters())
    net.layers["0"].attn.o_proj.weight = torch.nn.Parameter(torch.zeros(32, 16))  # as a step once did
    with pytest.raises(RuntimeError, match="layers.0.attn.o_proj.weight has values before init_weights"):
        model.init_weights(net, seed=1, device="cpu")


def test_train_py_reduces_expert_gradients_as_grad_reduce_says():
    """``train.grad_reduce = bf16`` reaches the experts' edp sum (moe.reduce_expert_grads), not
    only the dense buckets: one place decides the dtype, the renderer passes it to both."""
    sets = ["mesh.devices_per_node=2", "parallel.dp=2", "model.experts=4", "model.top_k=2", "parallel.ep=2"]
    spec = load(str(ROOT / "tests" / "parity" / "specs" / "llama.par"), sets + ["train.grad_reduce=bf16"])
    text = render(lower(spec))["train.py"]
    assert re.search(r"moe\.reduce_expert_grads\(\s*net, edp_group, data_ranks=DP, reduce_dtype=torch\.bfloat16", text)
    assert "reduce_dtype=torch.bfloat16" in text.split("grad_sync = dp.GradientBuckets(")[1].split(")")[0] + ")"
    plain = render(lower(load(str(ROOT / "tests" / "parity" / "specs" / "llama.par"), sets)))["train.py"]
    assert "reduce_dtype" not in plain.split("moe.reduce_expert_grads(")[1].split(")")[0]


def test_bf16_parameters_sum_expert_gradients_in_fp32_as_the_dense_ones():
    """Under precision = bf16 the dense buckets sum in fp32 (grad_reduce's default); the
    experts' edp sum did so in the gradients' bf16 until both asked one rule."""
    sets = ["mesh.devices_per_node=2", "parallel.dp=2", "model.experts=4", "model.top_k=2", "parallel.ep=2",
            "train.precision=bf16"]
    text = render(lower(load(str(ROOT / "tests" / "parity" / "specs" / "llama.par"), sets)))["train.py"]
    assert re.search(r"moe\.reduce_expert_grads\(\s*net, edp_group, data_ranks=DP, reduce_dtype=torch\.float32", text)
    assert "reduce_dtype=torch.float32" in text.split("grad_sync = dp.GradientBuckets(")[1].split(")")[0] + ")"
