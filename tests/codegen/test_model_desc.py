"""One model description (runtime/layout/model_desc.py): train.py's docstring, the cost model and
the runtime model count the same parameters, for every example and the parity models with
grouped-query attention, on one rank and on every (tp, pipeline) rank of the layout."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from parc.codegen.planner.cost.layout import rank_params, total_params
from parc.codegen.lower import lower
from parc.codegen.passes.partition_layers import model_modules
from parc.codegen.render import render
from parc.codegen.planner.search import fixed_layout
from parc.dsl import load
import sys

from parc.runtime.parallel.tensor import layers, sharding, tp_plan
from parc.runtime.models import model, parallelize, pipeline_stages, transformer
from parc.runtime.layout import model_counts
from parc.runtime.layout.model_desc import ModelConfig, describe

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
import built  # noqa: E402  (tests/runtime/built.py)

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted(p.stem for p in (ROOT / "examples").glob("*.par"))
PARITY = ROOT / "tests" / "parity" / "specs"
GQA = ("model.kv_heads=2",)
CASES = [(f"examples/{name}.par", ()) for name in EXAMPLES] + [
    ("tests/parity/specs/gpt.par", GQA),  # tied
    ("tests/parity/specs/gpt.par", GQA + ("model.tie_embeddings=false",)),
    ("tests/parity/specs/llama.par", GQA),  # untied by default
    ("tests/parity/specs/llama.par", GQA + ("model.tie_embeddings=true",)),
]
def _even(pp: int, layers: int) -> str:
    return "[" + ", ".join([str(layers // pp)] * pp) + "]"


FIXED = {
    "gpt-1t": ("parallel.dp=48", "parallel.tp=8", "parallel.pp=8", "parallel.sp=true", "parallel.zero=1",
               "parallel.schedule=1f1b", "parallel.recompute=full", "parallel.overlap=none",
               f"parallel.stage_layers={_even(8, 128)}"),
    "gpt3-175b": ("parallel.dp=8", "parallel.tp=8", "parallel.pp=16", "parallel.sp=true", "parallel.zero=1",
                  "parallel.schedule=1f1b", "parallel.recompute=selective", "parallel.overlap=none",
                  f"parallel.stage_layers={_even(16, 96)}"),
}
"""A layout of the mesh for the examples that leave theirs to the planner: a parameter
count needs no plan search (gpt-1t's took minutes) and a short pipeline keeps the
schedule small; the planner's own winners are built in tests/test_check_build_contract.py."""
SMALL = 5_000_000
"""Models up to this many parameters are built and initialized on the CPU; larger ones on
the meta device (shapes only)."""


def _planned(path, overrides):
    spec = load(str(ROOT / path), overrides)
    return spec, lower(spec)


def _docstring_count(plan) -> int:
    title = render(plan)["train.py"].splitlines()[0]
    return int(re.search(r"with ([0-9,]+) parameters", title).group(1).replace(",", ""))


def _config(plan) -> ModelConfig:
    """The ModelConfig train.py builds: one keyword per model constant."""
    return ModelConfig(**{s.name.lower(): s.value for s in plan.model.settings})


def _one_rank_count(config: ModelConfig) -> int:
    if model_counts.parameters(describe(config)) <= SMALL:
        net = built.build(config, seed=1, kernels="eager")
    else:
        net = model.build_model(config)  # the plain model, on the meta device
    return sum(p.numel() for p in net.parameters())


@pytest.mark.parametrize("path,overrides", CASES, ids=[f"{p.split('/')[-1]}{''.join(o)}" for p, o in CASES])
def test_docstring_count_is_the_runtime_models(path, overrides):
    spec, plan = _planned(path, FIXED.get(Path(path).stem, ()) + overrides)
    config = _config(plan)
    assert spec.model.config == config
    counted = _one_rank_count(config)
    assert _docstring_count(plan) == counted == plan.model.parameters
    assert total_params(spec.model) == model_counts.parameters(spec.model.desc) == counted


def test_gqa_count_by_hand():
    """examples/tiny.par with kv_heads = 2: the q/k/v biases are (heads + 2·kv_heads)·head_dim."""
    _, plan = _planned("examples/tiny.par", GQA)
    C, D, F, L = 128, 32, 512, 4
    attn = C * 4 * D + 4 * D + 2 * (C * 2 * D + 2 * D) + 4 * D * C + C  # q, k, v, o with biases
    block = 4 * C + attn + C * F + F + F * C + C  # two LayerNorms, the MLP
    assert plan.model.parameters == L * block + 512 * C + 64 * C + 2 * C == 801_024


def _meta_stage(config, table, *, tp, stage, first, last, monkeypatch, sp):
    """One pipeline stage as a tp rank builds it (shapes only: the meta device, a fake group)."""
    for module in (transformer, sharding, layers, tp_plan):
        monkeypatch.setattr(module, "group_size", lambda group: 1 if group is None else tp)
    monkeypatch.setattr(layers, "group_rank", lambda group: 0)
    with torch.device("meta"):
        net = pipeline_stages.Stage(config, layers=stage, first=first, last=last)
    return parallelize.tensor(net, None if tp == 1 else object(), table, sequence_parallel=sp)


SHARDED = [(f"examples/{name}.par", ()) for name in ("tiny", "gpt2-small", "llama-7b")] + [
    ("tests/parity/specs/gpt.par", GQA + ("mesh.devices_per_node=4", "parallel.tp=2", "parallel.pp=2")),
    ("tests/parity/specs/llama.par", GQA + ("mesh.devices_per_node=4", "parallel.tp=2", "parallel.pp=2",
                                           "parallel.sp=true")),
]


@pytest.mark.parametrize("path,overrides", SHARDED, ids=[f"{p.split('/')[-1]}-{len(o)}" for p, o in SHARDED])
def test_every_rank_holds_what_the_cost_model_counts(path, overrides, monkeypatch):
    """Each pipeline rank's chunks, on one tp rank of train.py's TP_PLAN, hold
    ``rank_params`` elements and tensors: the planner's count is the runtime's."""
    spec, plan = _planned(path, overrides)
    layout = fixed_layout(spec)
    config = _config(plan)
    table = {rule.pattern: rule.style.value for rule in plan.tensor_parallel.sharded}
    stages = plan.pipeline.stage_layers
    for rank in range(layout.pp):
        elements = tensors = 0
        for v in range(rank, len(stages), layout.pp):
            net = _meta_stage(config, table, tp=layout.tp, stage=stages[v], first=v == 0,
                              last=v == len(stages) - 1, monkeypatch=monkeypatch, sp=layout.sp)
            params = list(net.parameters())
            elements += sum(p.numel() for p in params)
            tensors += len(params)
        assert rank_params(spec.model, layout, rank) == (elements, tensors), (path, rank)


def test_a_drift_fails_loudly():
    config = ModelConfig(arch="llama", layers=2, hidden=32, heads=4, kv_heads=2, ffn=64, vocab=64,
                         padded_vocab=64, seq_len=8, tie_embeddings=False)
    net = model.build_model(config)
    net.extra = torch.nn.Linear(2, 2, bias=False)  # a parameter the description does not know
    # 2 blocks of 2·32 (norms) + 2·32·32 + 2·16·32 (q, o, k, v) + 3·64·32 (MLP), embed, head, norm
    assert model_counts.parameters(describe(config)) == 2 * 9280 + 2 * 64 * 32 + 32 == 22_688
    with pytest.raises(RuntimeError, match=re.escape(
        "internal error in parc (runtime model): this rank built 22,692 parameters in 22 tensors, but "
        "model_desc.py describes 22,688 in 21 for layers 0..2 (first=True, last=True, tp=1)"
    )):
        model.check_parameter_count(net)


def test_tp_table_rows_are_the_descriptions_modules():
    spec, plan = _planned("examples/llama-7b.par", ())
    rows = model_modules(spec)
    assert [r.pattern for r in plan.tensor_parallel.rules] == [m.pattern for m in rows]
    assert [m.pattern for m in rows][:3] == ["embed", "layers.*.attn_norm", "layers.*.attn.q_proj"]
    assert tp_plan.module_names(_config(plan)) == [m.name for m in spec.model.desc.modules]


def test_blocks_are_entries_of_their_own():
    """Per-block facts come from each BlockDesc (where MoE adds its experts)."""
    desc = describe(ModelConfig(arch="gpt", layers=3, hidden=32, heads=4, kv_heads=2, ffn=64, vocab=64,
                                padded_vocab=64, seq_len=8))
    assert [b.index for b in desc.blocks] == [0, 1, 2]
    assert desc.blocks[2].modules[1].name == "layers.2.attn.q_proj"
    per_block = model_counts.block_params(desc, 0).elements
    assert desc.stage_params(layers=(1, 3), first=False, last=False).elements == 2 * per_block
    whole = desc.stage_params().elements
    head = model_counts.head_params(desc, weight=False).elements
    assert whole == 3 * per_block + model_counts.embed_params(desc).elements + head
    # the tied head's copy on a later stage (Note [tied embeddings across stages])
    assert desc.stage_params(layers=(3, 3), first=False, last=True) == model_counts.head_params(desc, weight=True)
    assert desc.flops_per_token() == sum(b.flops_per_token(8) for b in desc.blocks) + 6.0 * 64 * 32
