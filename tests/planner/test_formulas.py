"""The memory model's formulas: ZeRO's published figures, Korthikanti's activation
cases, and parc's own saved tensors counted in process (no torchrun)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from parc.codegen.planner.cost.layout import Accounting, Layout, rank_params, total_params
from parc.codegen.planner.cost.memory import (
    activation_bytes,
    korthikanti_layer_bytes,
    model_state_bytes,
)
from parc.dsl import load_text
from parc.runtime.train.memory import SavedActivations, param_bytes
from parc.runtime.models.model import ModelConfig, build_model
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))  # built.py
import built  # noqa: E402


@pytest.mark.parametrize("zero,gigabytes", [(0, 120.0), (1, 31.4), (2, 16.6), (3, 1.9)])
def test_zero_paper_figure_1(zero, gigabytes):
    """ZeRO (Rajbhandari et al.) Fig. 1: 7.5B parameters, N_d = 64, K = 12."""
    parts = model_state_bytes(7_500_000_000, 0, dp=64, zero=zero, accounting=Accounting.MEGATRON)
    assert round(sum(parts) / 1e9, 1) == gigabytes


def test_zero_parts_megatron():
    psi = 1_000_000
    assert model_state_bytes(psi, 7, dp=4, zero=0, accounting=Accounting.MEGATRON) == (2e6, 2e6, 12e6)
    assert model_state_bytes(psi, 7, dp=4, zero=2, accounting=Accounting.MEGATRON) == (2e6, 0.5e6, 3e6)


def test_zero_parts_parc_trainer():
    """fp32 weights and grads, AdamW's two moments and a 4-byte step per tensor at zero 0."""
    psi, tensors = 1001, 7
    assert model_state_bytes(psi, tensors, dp=2, zero=0, accounting=Accounting.PARC) == (4004, 4004, 8008 + 28)
    assert model_state_bytes(psi, tensors, dp=2, zero=1, accounting=Accounting.PARC) == (4004, 4004, 8 * 501)
    assert model_state_bytes(psi, tensors, dp=2, zero=2, accounting=Accounting.PARC) == (4004, 4 * 501, 8 * 501)


S, B, H, A, T = 2048, 1, 12288, 96, 8


@pytest.mark.parametrize(
    "tp,sp,recompute,expected",
    [
        (1, False, "none", S * B * H * (34 + 5 * A * S / H)),
        (T, False, "none", S * B * H * (10 + 24 / T + 5 * A * S / (H * T))),
        (T, True, "none", S * B * H / T * (34 + 5 * A * S / H)),
        (T, True, "selective", S * B * H / T * 34),
        (T, False, "selective", S * B * H * (10 + 24 / T)),
        (1, False, "full", 2 * S * B * H),
    ],
)
def test_korthikanti_table_2(tp, sp, recompute, expected):
    """Korthikanti et al. 2022, Table 2, with GPT-3's shape: bytes per layer."""
    got = korthikanti_layer_bytes(seq=S, micro_batch=B, hidden=H, heads=A, tp=tp, sp=sp, recompute=recompute)
    assert got == pytest.approx(expected, rel=1e-12)


def test_korthikanti_gpt3_magnitudes():
    """The paper's point: sp + selective cuts GPT-3's per-layer activations ~5× vs tp alone."""
    tp_only = korthikanti_layer_bytes(seq=S, micro_batch=B, hidden=H, heads=A, tp=T, sp=False, recompute="none")
    both = korthikanti_layer_bytes(seq=S, micro_batch=B, hidden=H, heads=A, tp=T, sp=True, recompute="selective")
    assert 4.5 < tp_only / both < 5.5


SPEC = """
model m {{
  arch = {arch}
  layers = {layers}
  hidden = 64
  heads = 4
  kv_heads = {kv}
  ffn = 192
  vocab = 256
  seq_len = 32
}}
mesh {{
  nodes = 1
  devices_per_node = 1
  device = cpu
}}
parallel {{
  dp = 1
  tp = 1
  pp = 1
  recompute = {recompute}
}}
train {{
  global_batch = 4
  micro_batch = 2
  steps = 1
  kernels = {kernels}
}}
"""


def _one_rank(arch, recompute, kernels, layers=3):
    kv = 4 if arch == "gpt" else 2
    spec = load_text(SPEC.format(arch=arch, kv=kv, recompute=recompute, kernels=kernels, layers=layers), "m.par")
    m = spec.model
    config = ModelConfig(
        arch=arch, layers=m.layers, hidden=m.hidden, heads=m.heads, kv_heads=m.kv_heads, ffn=m.ffn,
        vocab=m.vocab, padded_vocab=m.padded_vocab, seq_len=m.seq_len, tie_embeddings=m.tie_embeddings,
    )
    torch.manual_seed(0)
    model = built.build(config, tp_group=None, sequence_parallel=False, tp_plan={}, seed=1, device="cpu",
                        recompute=recompute, kernels=kernels)
    tokens = torch.randint(0, m.vocab, (spec.train.micro_batch, m.seq_len))
    meter = SavedActivations(model)
    with meter:
        model(tokens, tokens).backward()
    layout = Layout(dp=1, tp=1, pp=1, sp=False, zero=0, schedule="1f1b", chunks=1, recompute=recompute,
                    micro_batch=spec.train.micro_batch)
    return spec, layout, model, meter.peak


@pytest.mark.parametrize("arch", ["gpt", "llama"])
@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
@pytest.mark.parametrize("kernels", ["eager", "compiled"])
def test_parc_activations_match_saved_tensors(arch, recompute, kernels):
    spec, layout, model, measured = _one_rank(arch, recompute, kernels)
    predicted = activation_bytes(spec, layout, 0, Accounting.PARC)
    assert predicted == pytest.approx(measured, rel=0.02), (predicted, measured)


@pytest.mark.parametrize("arch", ["gpt", "llama"])
def test_parameter_count_is_the_runtime_model(arch):
    spec, layout, model, _ = _one_rank(arch, "none", "eager", layers=2)
    elements, tensors = rank_params(spec.model, layout, 0)
    assert elements * 4 == param_bytes(model)
    assert tensors == len(list(model.parameters()))
    assert total_params(spec.model) == elements


@pytest.mark.parametrize("arch", ["gpt", "llama"])
def test_model_flops_are_the_trainers(arch):
    from parc.codegen.planner.cost.time import model_flops_per_token
    from parc.runtime.train.metrics import flops_per_token

    spec, _, model, _ = _one_rank(arch, "none", "eager", layers=2)
    m = spec.model
    # the trainer counts from its own ModelConfig; N by hand: matmul weights and the unpadded head
    matmul = sum(p.numel() for name, p in model.named_parameters() if p.dim() == 2 and "embed" not in name)
    matmul += m.vocab * m.hidden if m.tie_embeddings else m.vocab * m.hidden - m.padded_vocab * m.hidden
    expected = 6.0 * matmul + 12.0 * m.layers * m.heads * m.head_dim * m.seq_len
    assert model_flops_per_token(spec) == flops_per_token(model.config) == expected


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_fp32_gradient_sums_by_zero_stage(zero):
    """runtime/optimizers/master.py, Note [fp32 accumulation], with bf16 parameters and 2 micro-batches
    against 1: zero 0/1 hand the fp32 sums over as the gradients (4 bytes an element, no
    sums beside them); zero 2 keeps them beside its buckets (4 bytes in buffers); zero 3
    reduce-scatters every pass into its fp32 shards (runtime/parallel/data/fsdp.py, Note [gradients of
    a unit]): neither."""
    from parc.codegen.planner.cost.memory import memory
    from parc.codegen.planner.search import fixed_layout
    from parc.dsl import load

    def row(global_batch):
        spec = load("examples/tiny.par", ["parallel.dp=2", "parallel.tp=2", "parallel.pp=1", f"parallel.zero={zero}",
                                          "train.precision=bf16", "train.micro_batch=1",
                                          f"train.global_batch={global_batch}"])
        layout = fixed_layout(spec)
        return memory(spec, layout).per_rank[0], rank_params(spec.model, layout, 0)[0]

    (one, params), (two, _) = row(2), row(4)
    assert two.params == one.params and two.optimizer == one.optimizer
    grads, buffers = two.grads - one.grads, two.buffers - one.buffers
    assert (grads, buffers) == {0: (2.0 * params, 0.0), 1: (2.0 * params, 0.0), 2: (0.0, 4.0 * params),
                                3: (0.0, 0.0)}[zero]
